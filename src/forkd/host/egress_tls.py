"""Header transforms and secrets at egress: a sandbox's requests to a host with a rule, rewritten
on their way out (issue 35, item 3).

Only connections whose name (TLS SNI or HTTP ``Host``) has a rule in the sandbox's policy
(``EgressPolicy.rule_for``) come here; every other connection the inspector lets through is
spliced untouched (host/egress_inspect.py). Plain HTTP to such a name is refused: nothing there
verifies that the address is the rule's host. For TLS:

* TLS is terminated with a certificate for that name, signed by the sandbox's own CA
  (``SandboxCA``: made for it alone, its key only on the host, in the daemon's network
  directory; its certificate is what the guest was given to trust, guest/agent/restore.py), and
  only HTTP/1.1 is offered (ALPN), so every request can be read;
* each request is read with h11 (its head bounded by h11, its body by ``MAX_BODY``), the rule's
  headers are set (replacing the guest's of the same name), and ``${secrets.NAME}`` (or E2B's
  ``${e2b.secrets.NAME}``) in a header value or the body becomes that secret's value, which only
  this module asks for (``resolve``) and only for this request; the body is re-framed with its
  new length;
* the request goes to the original destination over a TLS connection this module opens, which
  verifies the server's certificate for that name (the host's trust store, plus
  ``$FORKD_EGRESS_CA_FILE`` when set: a private or test CA); the response is streamed back as it
  comes.

The sandbox never holds a secret's value: it sends the placeholder, and the value is put in on
the host. What a server sends back is not scrubbed: a server that echoes the value returns it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import ipaddress
import os
import re
import ssl
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import h11
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from forkd.host.egress import HostRule
from forkd.host.egress_inspect import CONNECT_SECS, UNREACHABLE, Address, DialFn, ServeFn

CA_FILE_ENV = "FORKD_EGRESS_CA_FILE"
MAX_BODY = 1 << 20  # a request body read to resolve placeholders in it; larger: 413
# What every intercepted connection of the daemon may hold of request bodies at once (64 at most a
# sandbox, each up to MAX_BODY, times many sandboxes would be the host's memory): past it, 503.
BODY_BUDGET = 64 << 20
MAX_LEAVES = 64  # leaf contexts cached per sandbox
CHUNK = 65536
IDLE_SECS = 120.0  # a connection with no request or response bytes for this long is closed
_PLACEHOLDER = re.compile(rb"\$\{(?:e2b\.)?secrets\.([A-Za-z_][A-Za-z0-9_]{0,127})\}")

Resolve = Callable[[str], str | None]


class SandboxCA:
    """One sandbox's certificate authority: an EC P-256 key and a self-signed certificate, both
    made here; leaf certificates for the names it intercepts, made on demand and cached."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        self._key, self.cert = key, cert
        self._leaves: OrderedDict[str, ssl.SSLContext] = OrderedDict()

    @classmethod
    def make(cls, owner: str) -> SandboxCA:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"forkd egress CA of {owner}"[:64])])
        now = datetime.datetime.now(datetime.UTC)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=3650))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False,
                                             encipher_only=False, decipher_only=False), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .sign(key, hashes.SHA256()))
        return cls(key, cert)

    @classmethod
    def load_or_make(cls, path: Path, owner: str) -> SandboxCA:
        """The CA kept at ``path`` (key and certificate, 0600), made and written there if absent."""
        if path.exists():
            blob = path.read_bytes()
            key = serialization.load_pem_private_key(blob, password=None)
            if not isinstance(key, ec.EllipticCurvePrivateKey):
                raise ValueError(f"{path} holds no EC key")
            return cls(key, x509.load_pem_x509_certificate(blob))
        ca = cls.make(owner)
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(ca.key_pem())
            f.write(ca.cert.public_bytes(serialization.Encoding.PEM))
        tmp.replace(path)
        return ca

    def key_pem(self) -> bytes:
        """The CA's private key (for its 0600 file on the host only; never for a guest)."""
        return self._key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption())

    @property
    def pem(self) -> str:
        """The certificate the guest is given to trust (never the key)."""
        return self.cert.public_bytes(serialization.Encoding.PEM).decode()

    def server_context(self, name: str) -> ssl.SSLContext:
        """A TLS server context presenting a certificate for ``name`` (HTTP/1.1 only)."""
        ctx = self._leaves.get(name)
        if ctx is not None:
            self._leaves.move_to_end(name)
            return ctx
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(name))
        except ValueError:
            san = x509.DNSName(name)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name[:64])]))
                .issuer_name(self.cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=30))
                .add_extension(x509.SubjectAlternativeName([san]), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                               critical=False)
                .sign(self._key, hashes.SHA256()))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.set_alpn_protocols(["http/1.1"])
        # ssl loads a chain only from a file: an anonymous memory file, never on disk.
        fd = os.memfd_create("forkd-leaf", os.MFD_CLOEXEC)
        try:
            os.write(fd, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
            os.write(fd, cert.public_bytes(serialization.Encoding.PEM))
            os.write(fd, self.cert.public_bytes(serialization.Encoding.PEM))
            ctx.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        self._leaves[name] = ctx
        while len(self._leaves) > MAX_LEAVES:
            self._leaves.popitem(last=False)
        return ctx


def upstream_context() -> ssl.SSLContext:
    """How the daemon checks the real server: the host's trust store, plus ``$FORKD_EGRESS_CA_FILE``
    (one context per setting: loading the host's store takes about 20 ms of CPU)."""
    return _upstream_context(os.environ.get(CA_FILE_ENV) or None)


@functools.lru_cache(maxsize=4)
def _upstream_context(extra: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.set_alpn_protocols(["http/1.1"])
    if extra:
        ctx.load_verify_locations(cafile=extra)
    return ctx


class _TlsServerSide:
    """TLS over an asyncio stream pair whose first bytes (the ClientHello) were already read."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 ctx: ssl.SSLContext) -> None:
        self._reader, self._writer = reader, writer
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = ctx.wrap_bio(self._in, self._out, server_side=True)

    async def _flush(self) -> None:
        if pending := self._out.read():
            self._writer.write(pending)
            await self._writer.drain()

    async def _fill(self) -> bool:
        data = await asyncio.wait_for(self._reader.read(CHUNK), IDLE_SECS)
        if not data:
            self._in.write_eof()
            return False
        self._in.write(data)
        return True

    async def handshake(self, first: bytes) -> None:
        self._in.write(first)
        while True:
            try:
                self._tls.do_handshake()
                await self._flush()
                return
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._fill():
                    raise ConnectionError("the guest closed during the TLS handshake") from None

    async def read(self) -> bytes:
        while True:
            try:
                return self._tls.read(CHUNK)
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._fill():
                    return b""
            except ssl.SSLZeroReturnError:
                return b""

    async def write(self, data: bytes) -> None:
        self._tls.write(data)
        await self._flush()


class _Budget:
    """Bytes held across the daemon's intercepted connections (one event loop: no lock needed)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0

    def take(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n


BODIES = _Budget(BODY_BUDGET)


@dataclass
class Outcome:
    """What an intercepted connection did: for the sandbox's network log (names, never values)."""

    requests: int = 0
    secrets: set[str] = field(default_factory=set)
    unknown: set[str] = field(default_factory=set)
    refused: str | None = None

    def verdict(self) -> tuple[bool, str]:
        """Whether it went through, and the network log's words for it."""
        if self.refused is not None:
            return False, self.refused
        detail = f"intercepted (header rule): {self.requests} request(s)"
        if self.secrets:
            detail += f"; secrets put in: {', '.join(sorted(self.secrets))}"
        if self.unknown:
            detail += f"; no such secret: {', '.join(sorted(self.unknown))}"
        return True, detail


def resolve_placeholders(data: bytes, resolve: Resolve, outcome: Outcome) -> bytes:
    """``data`` with each ``${secrets.NAME}`` of a known secret replaced by its value."""
    def one(m: re.Match[bytes]) -> bytes:
        name = m.group(1).decode()
        value = resolve(name)
        if value is None:
            outcome.unknown.add(name)
            return m.group(0)
        outcome.secrets.add(name)
        return value.encode()
    return _PLACEHOLDER.sub(one, data)


def rewrite_headers(headers: list[tuple[bytes, bytes]], rule: HostRule, resolve: Resolve,
                    outcome: Outcome, body_length: int | None) -> list[tuple[bytes, bytes]]:
    """The request's headers as they leave: the rule's set over the guest's of the same names,
    placeholders resolved in every value, and the body framed by ``body_length`` when given."""
    replaced = {k.lower().encode() for k, _ in rule.headers}
    framing = {b"content-length", b"transfer-encoding"} if body_length is not None else set()
    out = [(k, v) for k, v in headers if k.lower() not in replaced | framing]
    out += [(k.encode(), v.encode()) for k, v in rule.headers]
    out = [(k, resolve_placeholders(v, resolve, outcome)) for k, v in out]
    if body_length is not None:
        out.append((b"Content-Length", str(body_length).encode()))
    return out


async def _next_event(conn: h11.Connection, source: _TlsServerSide | asyncio.StreamReader) -> object:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        if isinstance(source, asyncio.StreamReader):
            data = await asyncio.wait_for(source.read(CHUNK), IDLE_SECS)
        else:
            data = await source.read()
        conn.receive_data(data)


def server_for(name: str, tls: bool, *, rule: HostRule, ca: SandboxCA, resolve: Resolve,
               dial: DialFn) -> ServeFn:
    """The inspector's way to serve a connection to ``name``, a host with ``rule``."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes,
                    dst: Address) -> tuple[bool, str]:
        done = await intercept(reader, writer, head, tls=tls, name=name, dst=dst, rule=rule, ca=ca,
                               resolve=resolve, dial=dial)
        return done.verdict()
    return serve


async def _next_request(server: h11.Connection, guest: _TlsServerSide,
                        up_r: asyncio.StreamReader) -> object:
    """The guest's next request, or None once the server closes the connection (or both sides
    idle): a server that closes after its response closes the guest's connection too, as it would
    have without the daemon in between."""
    while True:
        event = server.next_event()
        if event is not h11.NEED_DATA:
            return event
        read = asyncio.ensure_future(guest.read())
        closed = asyncio.ensure_future(up_r.read(1))
        done, _ = await asyncio.wait({read, closed}, timeout=IDLE_SECS, return_when=asyncio.FIRST_COMPLETED)
        for task in (closed, read):
            if task not in done:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError, ssl.SSLError, OSError):
                    await task
        if read not in done:
            return None
        server.receive_data(read.result())


async def intercept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes, *,
                    tls: bool, name: str, dst: Address, rule: HostRule, ca: SandboxCA,
                    resolve: Resolve, dial: DialFn) -> Outcome:
    """Serve one intercepted guest connection (``head``: its first bytes, already read) until
    either side closes; what it did is returned for the log."""
    outcome = Outcome()
    if not tls:
        # Over plain HTTP nothing says the address is the rule's host: the guest may have resolved
        # another allowed name to a server of its own and named the rule's host in Host. Its
        # headers and secrets go only where TLS verifies the host's certificate.
        outcome.refused = (f"{name} has a header rule: it is reached over HTTPS only (over plain HTTP "
                           "its headers and secrets would go to an unverified server)")
        return outcome
    guest = _TlsServerSide(reader, writer, ca.server_context(name))
    try:
        await guest.handshake(head)
    except (ssl.SSLError, ConnectionError, TimeoutError) as exc:
        outcome.refused = f"the guest's TLS handshake failed: {str(exc)[:160]}"
        return outcome
    try:
        up_r, up_w = await asyncio.wait_for(dial(dst), CONNECT_SECS)
    except (OSError, TimeoutError):
        outcome.refused = UNREACHABLE  # as the inspector's own splice says it
        return outcome
    try:
        await up_w.start_tls(upstream_context(), server_hostname=name)
        await _relay(guest, up_r, up_w, rule, resolve, outcome)
    except ssl.SSLCertVerificationError as exc:
        outcome.refused = f"the server's certificate for {name} does not verify: {exc.verify_message}"
    except (h11.ProtocolError, ssl.SSLError, ConnectionError, TimeoutError, OSError) as exc:
        if outcome.requests == 0:
            outcome.refused = f"{type(exc).__name__}: {str(exc)[:160]}"
    finally:
        up_w.close()
        with contextlib.suppress(OSError, ConnectionError, ssl.SSLError):
            await up_w.wait_closed()
    return outcome


async def _relay(guest: _TlsServerSide, up_r: asyncio.StreamReader, up_w: asyncio.StreamWriter,
                 rule: HostRule, resolve: Resolve, outcome: Outcome) -> None:
    server, client = h11.Connection(h11.SERVER), h11.Connection(h11.CLIENT)

    async def to_guest(*events: h11.Event) -> None:
        for e in events:
            if (data := server.send(e)) is not None:
                await guest.write(data)

    async def upstream(*events: h11.Event) -> None:
        for e in events:
            if (data := client.send(e)) is not None:
                up_w.write(data)
        await up_w.drain()

    async def refuse(status: int, why: str) -> None:
        await to_guest(h11.Response(status_code=status, headers=[(b"Content-Length", b"0"),
                                                                 (b"Connection", b"close")]),
                       h11.EndOfMessage())
        outcome.refused = why

    while True:
        request = await _next_request(server, guest, up_r)
        if not isinstance(request, h11.Request):
            return  # the guest closed between requests, or the server did
        body = b""
        try:
            while not isinstance(event := await _next_event(server, guest), h11.EndOfMessage):
                if not isinstance(event, h11.Data):
                    return
                if len(body) + len(event.data) > MAX_BODY:
                    return await refuse(413, f"a request body over {MAX_BODY} bytes")
                if not BODIES.take(len(event.data)):
                    return await refuse(503, "the daemon holds as many request bodies as it may at once")
                body += event.data
        finally:
            BODIES.give(len(body))
        body = resolve_placeholders(body, resolve, outcome)
        has_body = bool(body) or any(k.lower() in (b"content-length", b"transfer-encoding")
                                     for k, _ in request.headers)
        headers = rewrite_headers(list(request.headers), rule, resolve, outcome,
                                  len(body) if has_body else None)
        await upstream(h11.Request(method=request.method, target=request.target, headers=headers,
                                   http_version="1.1"), *([h11.Data(data=body)] if body else []),
                       h11.EndOfMessage())
        outcome.requests += 1
        response = await _next_event(client, up_r)
        while isinstance(response, h11.InformationalResponse):
            response = await _next_event(client, up_r)
        if not isinstance(response, h11.Response):
            return
        await to_guest(h11.Response(status_code=response.status_code, reason=response.reason,
                                    headers=list(response.headers)))
        while not isinstance(event := await _next_event(client, up_r), h11.EndOfMessage):
            if not isinstance(event, h11.Data):
                return
            await to_guest(h11.Data(data=event.data))
        await to_guest(h11.EndOfMessage())
        if server.our_state is not h11.DONE or client.our_state is not h11.DONE \
                or server.their_state is not h11.DONE or client.their_state is not h11.DONE:
            return
        server.start_next_cycle()
        client.start_next_cycle()
