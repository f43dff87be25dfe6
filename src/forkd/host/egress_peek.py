"""Bounded parsers of the first bytes of a guest's connection: a TLS ClientHello's SNI, an HTTP/1 Host.

The egress inspector (issue 35, item 2) decides by name whether a guest's TCP connection may reach
its original destination, before a byte is forwarded. Those first bytes come from a hostile guest,
so these parsers look at no more than ``MAX_PEEK`` bytes, check every length against what is left
before reading, and answer "need more" rather than guess on a short read. They parse structure
only: no cryptography, no decryption, nothing of the handshake is answered.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

# A TLS record carries at most 2**14 bytes of plaintext (RFC 8446 §5.1); a ClientHello larger than
# one full record is refused rather than reassembled without end.
MAX_PEEK = 16384 + 5
_HANDSHAKE = 0x16
_CLIENT_HELLO = 0x01
_EXT_SERVER_NAME = 0x0000
# encrypted_client_hello (draft-ietf-tls-esni): the real name is encrypted; SNI shows only the
# outer (public) name, so a connection carrying it cannot be checked by name and is refused.
_EXT_ECH = 0xFE0D
_HOST_NAME = 0x00
_MAX_NAME = 253
# A DNS name as it may appear in SNI or Host: labels of letters, digits, hyphens, underscores.
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_NAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*$")


class Verdict(enum.Enum):
    NAME = "name"  # a name was read
    NO_NAME = "no_name"  # complete, but names no server
    ECH = "ech"  # TLS with an encrypted ClientHello: the name cannot be seen
    NEED_MORE = "need_more"  # well-formed so far; read more bytes (up to MAX_PEEK)
    MALFORMED = "malformed"  # not this protocol, or a length that lies


@dataclass(frozen=True, slots=True)
class Peek:
    verdict: Verdict
    name: str | None = None


class _Short(Exception):
    """The buffer ended before a length it announced."""


class _Bad(Exception):
    """A field is out of range."""


class _Reader:
    """A cursor over bytes that raises instead of reading past its end."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def take(self, n: int) -> bytes:
        if self._pos + n > len(self._data):
            raise _Short
        out = self._data[self._pos : self._pos + n]
        self._pos += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int.from_bytes(self.take(2), "big")

    def u24(self) -> int:
        return int.from_bytes(self.take(3), "big")

    def vec(self, length_bytes: int) -> bytes:
        n = int.from_bytes(self.take(length_bytes), "big")
        return self.take(n)

    @property
    def left(self) -> int:
        return len(self._data) - self._pos


def _normalise(raw: bytes) -> str | None:
    """A name as the policy compares it (lower case, no trailing dot), or None if it is not one."""
    try:
        name = raw.decode("ascii").lower().rstrip(".")
    except UnicodeDecodeError:
        return None
    return name if len(name) <= _MAX_NAME and _NAME.match(name) else None


def peek_tls(data: bytes) -> Peek:
    """The SNI of the ClientHello that starts ``data``, read within one TLS record."""
    data = data[:MAX_PEEK]
    if data and data[0] != _HANDSHAKE:
        return Peek(Verdict.MALFORMED)
    try:
        rec = _Reader(data)
        rec.u8()
        if rec.u8() != 0x03:  # legacy_record_version major: 3 for SSL3.0..TLS1.3
            raise _Bad
        rec.u8()
        length = rec.u16()
        if length == 0 or length > 16384:
            raise _Bad
        body = rec.take(length)
    except _Short:
        return Peek(Verdict.NEED_MORE)
    except _Bad:
        return Peek(Verdict.MALFORMED)
    try:
        return _client_hello(_Reader(body))
    except (_Short, _Bad):
        # The handshake must fit its record: one split over records is refused, not reassembled.
        return Peek(Verdict.MALFORMED)


def _client_hello(r: _Reader) -> Peek:
    if r.u8() != _CLIENT_HELLO:
        raise _Bad
    hs = _Reader(r.take(r.u24()))
    hs.take(2 + 32)  # legacy_version, random
    if len(hs.vec(1)) > 32:  # legacy_session_id
        raise _Bad
    suites = hs.vec(2)
    if not suites or len(suites) % 2:
        raise _Bad
    hs.vec(1)  # legacy_compression_methods
    if hs.left == 0:
        return Peek(Verdict.NO_NAME)  # a hello without extensions names no server
    exts = _Reader(hs.vec(2))
    name: str | None = None
    seen: set[int] = set()
    while exts.left:
        kind = exts.u16()
        payload = exts.vec(2)
        if kind in seen:  # RFC 8446 §4.2: an extension appears at most once
            raise _Bad
        seen.add(kind)
        if kind == _EXT_ECH:
            return Peek(Verdict.ECH)
        if kind == _EXT_SERVER_NAME:
            name = _server_name(_Reader(payload))
    return Peek(Verdict.NAME, name) if name is not None else Peek(Verdict.NO_NAME)


def _server_name(r: _Reader) -> str:
    names = _Reader(r.vec(2))
    if r.left:
        raise _Bad
    found: str | None = None
    while names.left:
        kind = names.u8()
        raw = names.vec(2)
        if kind != _HOST_NAME:
            continue
        if found is not None:  # RFC 6066 §3: at most one host_name
            raise _Bad
        found = _normalise(raw)
        if found is None:
            raise _Bad
    if found is None:
        raise _Bad
    return found


_REQUEST_LINE = re.compile(rb"^[A-Z]{1,16} [\x21-\x7e]{1,8192} HTTP/1\.[01]$")


def peek_http(data: bytes) -> Peek:
    """The Host of the HTTP/1 request head that starts ``data`` (without its port)."""
    data = data[:MAX_PEEK]
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return Peek(Verdict.MALFORMED if len(data) >= MAX_PEEK else Verdict.NEED_MORE)
    lines = data[:end].split(b"\r\n")
    if not _REQUEST_LINE.match(lines[0]):
        return Peek(Verdict.MALFORMED)
    host: bytes | None = None
    for line in lines[1:]:
        field, sep, value = line.partition(b":")
        if not sep or field != field.strip() or not field:
            return Peek(Verdict.MALFORMED)
        if field.lower() == b"host":
            if host is not None:  # two Hosts: which one the server honours is not ours to guess
                return Peek(Verdict.MALFORMED)
            host = value.strip()
    if host is None:
        return Peek(Verdict.NO_NAME)
    hostname, _, port = host.partition(b":")
    if port and not (port.isdigit() and len(port) <= 5):
        return Peek(Verdict.MALFORMED)
    name = _normalise(hostname)
    return Peek(Verdict.NAME, name) if name is not None else Peek(Verdict.MALFORMED)
