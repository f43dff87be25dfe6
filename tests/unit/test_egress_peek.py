"""The egress inspector's parsers of a guest's first bytes: real ClientHellos and hostile ones."""

from __future__ import annotations

import ssl
import struct

import pytest

from forkd.host.egress_peek import MAX_PEEK, Peek, Verdict, peek_http, peek_tls


def _real_hello(server_hostname: str | None) -> bytes:
    """The ClientHello this host's OpenSSL sends, taken from a memory BIO (no socket)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    conn = ctx.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        conn.do_handshake()
    return outgoing.read()


def _ext(kind: int, payload: bytes) -> bytes:
    return struct.pack(">HH", kind, len(payload)) + payload


def _sni(name: bytes) -> bytes:
    entry = b"\x00" + struct.pack(">H", len(name)) + name
    return _ext(0, struct.pack(">H", len(entry)) + entry)


def _hello(extensions: bytes, *, session_id: bytes = b"") -> bytes:
    body = b"\x03\x03" + b"\x00" * 32 + bytes([len(session_id)]) + session_id
    body += b"\x00\x02\x13\x01" + b"\x01\x00" + struct.pack(">H", len(extensions)) + extensions
    hs = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + struct.pack(">H", len(hs)) + hs


def test_a_real_client_hello_names_its_server() -> None:
    hello = _real_hello("Files.PythonHosted.org")
    assert peek_tls(hello) == Peek(Verdict.NAME, "files.pythonhosted.org")


def test_a_real_client_hello_without_sni_names_nothing() -> None:
    assert peek_tls(_real_hello(None)) == Peek(Verdict.NO_NAME)


def test_every_truncation_of_a_hello_asks_for_more_or_is_refused_never_names() -> None:
    hello = _real_hello("pypi.org")
    for cut in range(len(hello)):
        assert peek_tls(hello[:cut]).verdict in (Verdict.NEED_MORE, Verdict.MALFORMED), cut
    # Short of its record, the hello is incomplete: read more, do not guess.
    assert peek_tls(hello[:-1]).verdict is Verdict.NEED_MORE


def test_ech_is_reported_so_it_can_be_refused() -> None:
    hello = _hello(_sni(b"public.example") + _ext(0xFE0D, b"\x00" * 40))
    assert peek_tls(hello) == Peek(Verdict.ECH)


@pytest.mark.parametrize(
    "hello",
    [
        _hello(_sni(b"a.example") + _sni(b"b.example")),  # the extension twice
        _hello(_sni(b"bad name.example")),  # not a DNS name
        _hello(_sni(b"\xff\xfe.example")),  # not ASCII
        _hello(_sni(b"a" * 300)),  # longer than a name can be
        _hello(_ext(0, b"\x00\x10\x00\x00\x03abc")),  # inner list longer than the extension
        _hello(_ext(0, b"\xff\xff")),  # extension announces more than it carries
        _hello(b"", session_id=b"x" * 33),  # session id over 32 bytes
        b"\x17\x03\x03\x00\x05hello",  # application data, not a handshake
        b"\x16\x03\x01\x40\x01" + b"\x00" * 16385,  # record over 2**14
        b"\x16\x02\x00\x00\x05\x01\x00\x00\x01\x00",  # SSLv2-era version
    ],
)
def test_hostile_hellos_are_malformed(hello: bytes) -> None:
    assert peek_tls(hello).verdict is Verdict.MALFORMED


def test_many_extensions_within_a_record_are_walked_to_the_name() -> None:
    padding = b"".join(_ext(0x7000 + i, b"") for i in range(3000))
    assert peek_tls(_hello(padding + _sni(b"api.example"))) == Peek(Verdict.NAME, "api.example")


def test_a_hello_beyond_one_record_is_refused_not_reassembled() -> None:
    padding = b"".join(_ext(0x7000 + i, b"") for i in range(5000))
    assert peek_tls(_hello(padding + _sni(b"api.example"))).verdict is Verdict.MALFORMED


def test_http_host_is_read_without_its_port() -> None:
    head = b"GET /simple/ HTTP/1.1\r\nUser-Agent: x\r\nHost: PyPI.org:80\r\n\r\n"
    assert peek_http(head) == Peek(Verdict.NAME, "pypi.org")
    assert peek_http(b"GET / HTTP/1.0\r\n\r\n") == Peek(Verdict.NO_NAME)


def test_http_truncated_asks_for_more_and_oversized_is_refused() -> None:
    head = b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n"
    for cut in range(len(head)):
        assert peek_http(head[:cut]).verdict in (Verdict.NEED_MORE, Verdict.MALFORMED), cut
    assert peek_http(head[:-1]).verdict is Verdict.NEED_MORE
    flood = b"GET / HTTP/1.1\r\n" + b"X-Pad: " + b"a" * MAX_PEEK
    assert peek_http(flood).verdict is Verdict.MALFORMED


@pytest.mark.parametrize(
    "head",
    [
        b"GET / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n",  # which one wins is ambiguous
        b"GET / HTTP/1.1\r\nHost : a.example\r\n\r\n",  # space before the colon (smuggling)
        b"GET / HTTP/1.1\r\nHost: a.example:99999x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a b.example\r\n\r\n",
        b"\x16\x03\x01\x00\x05hello\r\n\r\n",  # TLS on the HTTP port
        b"GET / HTTP/2.0\r\nHost: a.example\r\n\r\n",
        b"GET / HTTP/1.1\r\nno colon here\r\n\r\n",
    ],
)
def test_hostile_http_heads_are_malformed(head: bytes) -> None:
    assert peek_http(head).verdict is Verdict.MALFORMED
