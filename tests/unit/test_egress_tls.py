"""Header transforms and secrets at egress (host/egress_tls.py) over real sockets and real TLS: a
guest-side client that trusts only the sandbox's CA, the inspector, and an HTTPS server whose
certificate comes from a CA of the test's own (``$FORKD_EGRESS_CA_FILE``)."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import stat
from pathlib import Path
from typing import Any

import pytest

from forkd.host import egress_tls
from forkd.host.egress import EgressPolicy
from forkd.host.egress_inspect import Address, Inspector, ServeFn
from forkd.host.egress_tls import SandboxCA

SECRET = "s3cr3t-VALUE-9f8e"
POLICY = EgressPolicy.from_request(None, {
    "allow_out": ["api.test", "*.cdn.test", "plain.test"],
    "rules": {"api.test": [{"transform": {"headers": {"Authorization": "Bearer ${secrets.TOKEN}"}}},
                           {"transform": {"headers": {"X-Added": "1"}}}],
              "plain.test": [{}]}})


class Upstream:
    """An HTTPS (or plain) server that records every request it gets and answers ``ok <n>``."""

    def __init__(self) -> None:
        self.requests: list[tuple[bytes, dict[str, str], bytes]] = []

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = await r.readexactly(int(headers.get("content-length", "0")))
                self.requests.append((lines[0].encode(), headers, body))
                reply = f"ok {len(self.requests)}".encode()
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(reply), reply))
                await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()


async def _setup(tmp_path: Path, upstream: Upstream, *, tls: bool = True,
                 secrets: dict[str, str] | None = None
                 ) -> tuple[asyncio.Server, asyncio.Server, SandboxCA, list[tuple[Any, ...]]]:
    test_ca = SandboxCA.make("the test's own")
    (tmp_path / "test-ca.pem").write_text(test_ca.pem)
    server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0,
                                        ssl=test_ca.server_context("api.test") if tls else None)
    dst: Address = server.sockets[0].getsockname()[:2]
    sandbox_ca = SandboxCA.make("sb-test")
    log: list[tuple[Any, ...]] = []
    resolve = (secrets if secrets is not None else {"TOKEN": SECRET}).get

    def intercept(name: str, is_tls: bool) -> ServeFn | None:
        rule = POLICY.rule_for(name)
        if rule is None:
            return None
        return egress_tls.server_for(name, is_tls, rule=rule, ca=sandbox_ca, resolve=resolve,
                                     dial=lambda a: asyncio.open_connection(*a))

    inspector = Inspector(lambda name, d: POLICY.allows_connection(name, d[1]), lambda *e: log.append(e),
                          destination=lambda _s: dst, intercept=intercept)
    front = await asyncio.start_server(inspector.handle, "127.0.0.1", 0)
    return server, front, sandbox_ca, log


def _response(s: socket.socket) -> bytes:
    """One whole response (its head, then Content-Length bytes) read from ``s``."""
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(65536)
        if not chunk:
            return got
        got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    length = next((int(v) for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n")[1:])
                   if k.strip().lower() == b"content-length"), 0)
    while len(body) < length and (chunk := s.recv(65536)):
        body += chunk
    return head + b"\r\n\r\n" + body


def _client(front: asyncio.Server, ca: SandboxCA, name: str, requests: list[bytes]) -> list[bytes]:
    """A guest's client: trusts the sandbox's CA only, sends ``requests`` on one connection."""
    ctx = ssl.create_default_context(cadata=ca.pem)
    out = []
    with socket.create_connection(front.sockets[0].getsockname()[:2], timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname=name) as s:
        for req in requests:
            s.sendall(req)
            out.append(_response(s))
    return out


def test_a_rule_sets_its_headers_and_secrets_are_put_in_at_egress(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(egress_tls.CA_FILE_ENV, str(tmp_path / "test-ca.pem"))
    upstream = Upstream()

    async def go() -> tuple[list[bytes], list[tuple[Any, ...]]]:
        server, front, ca, log = await _setup(tmp_path, upstream)
        body = b'{"token": "${secrets.TOKEN}", "other": "${e2b.secrets.TOKEN}"}'
        got = await asyncio.to_thread(_client, front, ca, "api.test", [
            b"POST /v1/x HTTP/1.1\r\nHost: api.test\r\nAuthorization: guest's own\r\n"
            b"X-Echo: ${secrets.TOKEN}\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
            b"GET /two HTTP/1.1\r\nHost: api.test\r\nX-Missing: ${secrets.NOPE}\r\n\r\n"])
        for _ in range(500):  # the connection is logged once the inspector has seen it close
            if log:
                break
            await asyncio.sleep(0.01)
        front.close()
        server.close()
        return got, log

    replies, log = asyncio.run(go())
    assert replies[0].endswith(b"ok 1") and replies[1].endswith(b"ok 2")
    (line1, h1, b1), (line2, h2, _b2) = upstream.requests
    assert line1 == b"POST /v1/x HTTP/1.1" and line2 == b"GET /two HTTP/1.1"
    assert h1["authorization"] == f"Bearer {SECRET}"  # the rule's, over the guest's own
    assert h1["x-added"] == "1" and h1["x-echo"] == SECRET
    expected = f'{{"token": "{SECRET}", "other": "{SECRET}"}}'.encode()
    assert b1 == expected and h1["content-length"] == str(len(expected))  # re-framed
    assert h2["x-missing"] == "${secrets.NOPE}"  # no such secret: left as it was
    [(name, _dst, allowed, detail)] = log
    assert (name, allowed) == ("api.test", True)
    assert detail == "intercepted (header rule): 2 request(s); secrets put in: TOKEN; no such secret: NOPE"
    assert SECRET not in repr(log)


def test_a_name_without_a_rule_is_spliced_untouched_and_placeholders_stay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """x.cdn.test has no rule: its TLS is the server's own (the sandbox's CA is not involved)."""
    monkeypatch.setenv(egress_tls.CA_FILE_ENV, str(tmp_path / "test-ca.pem"))
    upstream = Upstream()

    async def go() -> tuple[str, list[tuple[Any, ...]]]:
        server, front, _ca, log = await _setup(tmp_path, upstream)
        test_ca = (tmp_path / "test-ca.pem").read_text()

        def client() -> str:
            ctx = ssl.create_default_context(cadata=test_ca)
            ctx.check_hostname = False  # the upstream's certificate names api.test
            with socket.create_connection(front.sockets[0].getsockname()[:2], timeout=10) as raw, \
                    ctx.wrap_socket(raw, server_hostname="x.cdn.test") as s:
                s.sendall(b"GET / HTTP/1.1\r\nHost: x.cdn.test\r\nX-T: ${secrets.TOKEN}\r\n\r\n")
                assert _response(s).endswith(b"ok 1")  # the server has read the request
                return str(s.getpeercert()["issuer"])
        issuer = await asyncio.to_thread(client)
        front.close()
        server.close()
        return issuer, log

    issuer, log = asyncio.run(go())
    assert "the test's own" in issuer
    assert upstream.requests[0][1]["x-t"] == "${secrets.TOKEN}"
    assert log[0][2:] == (True, "name allowed")


def test_plain_http_to_a_host_with_a_rule_is_refused(tmp_path: Path) -> None:
    """Over plain HTTP the guest could name the rule's host in Host on a connection to a server
    of its own (an address answered for another allowed name): nothing is sent, no secret is read."""
    upstream = Upstream()
    asked: list[str] = []

    async def go() -> tuple[bytes, list[tuple[Any, ...]]]:
        server, front, _ca, log = await _setup(tmp_path, upstream, tls=False,
                                               secrets=_Recording(asked))
        r, w = await asyncio.open_connection(*front.sockets[0].getsockname()[:2])
        w.write(b"GET / HTTP/1.1\r\nHost: plain.test\r\nX-T: ${secrets.TOKEN}\r\n\r\n")
        reply = await r.read()
        w.close()
        front.close()
        server.close()
        return reply, log

    reply, log = asyncio.run(go())
    assert reply == b"" and upstream.requests == [] and asked == []
    assert log[0][2] is False and "HTTPS only" in log[0][3]


class _Recording(dict[str, str]):
    """Secrets that note every name asked for (none are)."""

    def __init__(self, asked: list[str]) -> None:
        super().__init__(TOKEN=SECRET)
        self.asked = asked

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self.asked.append(key)
        return super().get(key, default)


def test_a_server_whose_certificate_does_not_verify_is_refused(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(egress_tls.CA_FILE_ENV, raising=False)  # the test's CA is not trusted
    upstream = Upstream()

    async def go() -> list[tuple[Any, ...]]:
        server, front, ca, log = await _setup(tmp_path, upstream)
        with pytest.raises((ConnectionError, ssl.SSLError, OSError)):
            await asyncio.to_thread(_client, front, ca, "api.test",
                                    [b"GET / HTTP/1.1\r\nHost: api.test\r\n\r\n"] * 2)
        front.close()
        server.close()
        return log

    log = asyncio.run(go())
    assert upstream.requests == []
    assert log[0][2] is False and "does not verify" in log[0][3]


def test_a_body_too_large_to_search_is_refused_with_413(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(egress_tls.CA_FILE_ENV, str(tmp_path / "test-ca.pem"))
    monkeypatch.setattr(egress_tls, "MAX_BODY", 1024)
    upstream = Upstream()

    async def go() -> list[bytes]:
        server, front, ca, _log = await _setup(tmp_path, upstream)
        got = await asyncio.to_thread(_client, front, ca, "api.test", [
            b"POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 4096\r\n\r\n" + b"x" * 4096])
        front.close()
        server.close()
        return got

    assert asyncio.run(go())[0].startswith(b"HTTP/1.1 413")
    assert upstream.requests == []


def test_a_sandboxes_ca_is_kept_private_and_loaded_again(tmp_path: Path) -> None:
    path = tmp_path / "sb-1.ca.pem"
    ca = SandboxCA.load_or_make(path, "sb-1")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again = SandboxCA.load_or_make(path, "sb-1")
    assert again.pem == ca.pem and "PRIVATE KEY" not in ca.pem
    assert ca.pem.startswith("-----BEGIN CERTIFICATE-----")


def test_rules_are_bounded_and_must_name_an_allowed_host() -> None:
    from forkd.errors import InvalidRequest

    def policy(rules: object, allow: list[str] | None = None) -> EgressPolicy:
        return EgressPolicy.from_request(None, {"allow_out": allow or ["api.test"], "rules": rules})

    assert POLICY.rule_for("api.test") is not None and POLICY.rule_for("x.cdn.test") is None
    assert dict(POLICY.rule_for("api.test").headers)["X-Added"] == "1"  # type: ignore[union-attr]
    assert POLICY.info()["rules"]["api.test"] == [{"transform": {"headers": {
        "Authorization": "Bearer ${secrets.TOKEN}", "X-Added": "1"}}}]
    assert EgressPolicy.from_info(POLICY.info()) == POLICY
    for bad, words in [
        ({"other.test": [{}]}, "add 'other.test' to network.allow_out"),
        ({"api.test:443": [{}]}, "without a port"),
        ({"10.0.0.1": [{}]}, "a DNS name"),
        ({"api.test": [{"transform": {"headers": {"Bad Name": "x"}}}]}, "not an HTTP header name"),
        ({"api.test": [{"transform": {"headers": {"X": "a\r\nInjected: 1"}}}]}, "without CR, LF or NUL"),
        ({"api.test": [{"transform": {"body": "x"}}]}, '"transform": {"headers"'),
        ({f"h{i}.test": [] for i in range(33)}, "at most 32 hosts"),
    ]:
        with pytest.raises(InvalidRequest, match=words.replace("(", r"\(").replace("{", r"\{")):
            policy(bad)
    assert policy({"*.cdn.test": [{}]}, ["*.cdn.test"]).rule_for("a.cdn.test") is not None
    assert policy({"*.cdn.test": [{}]}, ["*.cdn.test:443"]).rules  # the entry's ports do not matter
    assert policy({"a.cdn.test": [{}]}, ["*.cdn.test:443"]).rules  # a name the wildcard opens


def test_request_bodies_held_at_once_are_bounded_across_the_daemon(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the daemon-wide budget a request is 503, and what it held is given back."""
    monkeypatch.setenv(egress_tls.CA_FILE_ENV, str(tmp_path / "test-ca.pem"))
    monkeypatch.setattr(egress_tls, "BODIES", egress_tls._Budget(2048))
    upstream = Upstream()

    async def go() -> list[bytes]:
        server, front, ca, _log = await _setup(tmp_path, upstream)
        egress_tls.BODIES.used = 1024  # another connection's body, held meanwhile
        got = await asyncio.to_thread(_client, front, ca, "api.test", [
            b"POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 2000\r\n\r\n" + b"x" * 2000])
        egress_tls.BODIES.give(1024)
        front.close()
        server.close()
        return got

    assert asyncio.run(go())[0].startswith(b"HTTP/1.1 503")
    assert upstream.requests == [] and egress_tls.BODIES.used == 0


def test_a_server_that_closes_after_its_response_closes_the_guests_connection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As without the daemon in between: a client reading to the end gets its end."""
    monkeypatch.setenv(egress_tls.CA_FILE_ENV, str(tmp_path / "test-ca.pem"))

    class Closing(Upstream):
        async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await r.readuntil(b"\r\n\r\n")
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await w.drain()
            w.close()

    async def go() -> bytes:
        server, front, ca, _log = await _setup(tmp_path, Closing())

        def client() -> bytes:
            ctx = ssl.create_default_context(cadata=ca.pem)
            with socket.create_connection(front.sockets[0].getsockname()[:2], timeout=10) as raw, \
                    ctx.wrap_socket(raw, server_hostname="api.test") as s:
                s.sendall(b"GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")
                got = b""
                while chunk := s.recv(65536):  # to the end: times out if the end never comes
                    got += chunk
                return got
        got = await asyncio.to_thread(client)
        front.close()
        server.close()
        return got

    assert asyncio.run(go()).endswith(b"\r\n\r\nok")


def test_an_unreachable_destination_is_a_logged_refusal(tmp_path: Path) -> None:
    """The dial of an intercepted connection fails as the inspector's own splice does: logged."""
    async def go() -> list[tuple[Any, ...]]:
        server, front, ca, log = await _setup(tmp_path, Upstream())
        server.close()
        await server.wait_closed()  # nothing listens at the original destination any more
        with pytest.raises((ConnectionError, ssl.SSLError, OSError)):
            await asyncio.to_thread(_client, front, ca, "api.test",
                                    [b"GET / HTTP/1.1\r\nHost: api.test\r\n\r\n"] * 2)
        for _ in range(500):
            if log:
                break
            await asyncio.sleep(0.01)
        front.close()
        return log

    log = asyncio.run(go())
    assert log[0][0] == "api.test" and log[0][2:] == (False, "destination unreachable")
