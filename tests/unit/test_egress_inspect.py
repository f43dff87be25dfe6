"""The egress inspector over real sockets: a name decides whether the guest's bytes reach the server."""

from __future__ import annotations

import asyncio
import socket
import ssl

import pytest

from forkd.host.egress_inspect import Address, Inspector, Limits

Entry = tuple[str | None, Address, bool, str]


async def _echo_server() -> tuple[asyncio.Server, Address, list[bytes]]:
    seen: list[bytes] = []

    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        data = await r.read(65536)
        seen.append(data)
        w.write(b"echo:" + data[:8])
        await w.drain()
        w.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[:2], seen


def _hello(name: str) -> bytes:
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    conn = ctx.wrap_bio(incoming, outgoing, server_hostname=name)
    with pytest.raises(ssl.SSLWantReadError):
        conn.do_handshake()
    return outgoing.read()


async def _through(payload: bytes, *, limits: Limits | None = None) -> tuple[bytes, list[Entry], list[bytes]]:
    upstream, addr, seen = await _echo_server()
    log: list[Entry] = []

    def destination(_sock: socket.socket) -> Address:
        return addr  # nft's redirect is not here; the original destination is the echo server

    inspector = Inspector(
        lambda name, _dst: name.endswith(".allowed.test"),
        lambda *entry: log.append(entry),
        limits,
        destination,
    )
    front = await asyncio.start_server(inspector.handle, "127.0.0.1", 0)
    r, w = await asyncio.open_connection(*front.sockets[0].getsockname()[:2])
    w.write(payload)
    await w.drain()
    reply = await r.read()
    w.close()
    front.close()
    upstream.close()
    return reply, log, seen


def test_an_allowed_sni_is_spliced_to_its_destination() -> None:
    hello = _hello("api.allowed.test")
    reply, log, seen = asyncio.run(_through(hello))
    assert reply == b"echo:" + hello[:8]
    assert seen == [hello]
    assert [(e[0], e[2], e[3]) for e in log] == [("api.allowed.test", True, "name allowed")]


def test_a_disallowed_sni_on_the_same_address_is_refused_and_logged() -> None:
    reply, log, seen = asyncio.run(_through(_hello("evil.example")))
    assert reply == b""
    assert seen == []
    assert [(e[0], e[2], e[3]) for e in log] == [("evil.example", False, "name not allowed")]


def test_http_is_checked_by_host() -> None:
    ok = b"GET / HTTP/1.1\r\nHost: www.allowed.test\r\n\r\n"
    assert asyncio.run(_through(ok))[0] == b"echo:GET / HT"
    bad = b"GET / HTTP/1.1\r\nHost: other.example\r\n\r\n"
    reply, log, seen = asyncio.run(_through(bad))
    assert (reply, seen, log[0][3]) == (b"", [], "name not allowed")


def test_a_guest_that_sends_nothing_is_cut_off_not_waited_for() -> None:
    reply, log, seen = asyncio.run(_through(b"GET / HTTP/1.1\r\n", limits=Limits(first_bytes_s=0.2)))
    assert (reply, seen) == (b"", [])
    assert log[0][2:] == (False, "no name within the time allowed")


def test_garbage_is_refused_with_its_reason() -> None:
    reply, log, seen = asyncio.run(_through(b"\x00\x01garbage\r\n\r\n"))
    assert (reply, seen) == (b"", [])
    assert log[0][3].startswith("first bytes are neither")


def test_connections_past_the_cap_are_refused() -> None:
    async def scenario() -> list[Entry]:
        log: list[Entry] = []
        inspector = Inspector(
            lambda *_: True, lambda *e: log.append(e), Limits(max_connections=1), lambda _s: ("127.0.0.1", 9)
        )
        front = await asyncio.start_server(inspector.handle, "127.0.0.1", 0)
        port = front.sockets[0].getsockname()[1]
        _r1, w1 = await asyncio.open_connection("127.0.0.1", port)  # held open, sends nothing
        while inspector.open_connections < 1:  # the first is being inspected before the second comes
            await asyncio.sleep(0.01)
        r2, w2 = await asyncio.open_connection("127.0.0.1", port)
        assert await r2.read() == b""
        w1.close()
        w2.close()
        front.close()
        return log

    log = asyncio.run(scenario())
    assert (None, ("", 0), False, "too many connections open") in log


def test_a_guest_dialling_the_inspector_itself_is_refused_and_close_ends_what_it_holds() -> None:
    async def scenario() -> tuple[list[Entry], bytes, int]:
        log: list[Entry] = []
        front_addr: list[Address] = []
        inspector = Inspector(lambda *_: True, lambda *e: log.append(e),
                              destination=lambda sock: front_addr[0])  # not redirected: itself
        front = await asyncio.start_server(inspector.handle, "127.0.0.1", 0)
        front_addr.append(front.sockets[0].getsockname()[:2])
        r, w = await asyncio.open_connection(*front_addr[0])
        refused = await r.read()
        w.close()
        # A connection being inspected (it sends nothing) ends when the inspector closes.
        slow = Inspector(lambda *_: True, lambda *e: log.append(e), destination=lambda _s: ("127.0.0.1", 9))
        back = await asyncio.start_server(slow.handle, "127.0.0.1", 0)
        r2, w2 = await asyncio.open_connection(*back.sockets[0].getsockname()[:2])
        while slow.open_connections < 1:
            await asyncio.sleep(0.01)
        await slow.close()
        assert await asyncio.wait_for(r2.read(), 5) == b""
        open_after = slow.open_connections
        w2.close()
        front.close()
        back.close()
        return log, refused, open_after

    log, refused, open_after = asyncio.run(scenario())
    assert refused == b"" and open_after == 0
    assert log[0][2:] == (False, "no original destination")
