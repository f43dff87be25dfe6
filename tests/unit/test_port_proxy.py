"""The port proxy: which Host names a sandbox port, the inbound half of a sandbox's network
policy (who may come in, and the Host the guest sees), and the relay's bounds (the request-target,
a client that hangs up, a client that does not read) against local servers standing in for a
guest's ports. The relaying to real VMs runs in tests/integration/test_ways_in.py."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import re
import select
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, cast

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from forkd.api import connections
from forkd.api.e2b.tokens import AccessTokens
from forkd.api.port_proxy import PortClients, PortProxy, request_target, target, upstream_url
from forkd.api.ws_relay import WS_QUEUE_FRAMES
from forkd.errors import InvalidRequest, NotFound
from forkd.host.egress import EgressPolicy
from forkd.store.records import PoolKey

if TYPE_CHECKING:
    from forkd.controller.runtime import Runtime


def host(value: str) -> dict[str, object]:
    return {"type": "http", "headers": [(b"accept", b"*/*"), (b"host", value.encode())]}


@pytest.mark.parametrize(("value", "wanted"), [
    ("8000-sb-1a2b3c-0000.forkd.localhost:8889", (8000, "sb-1a2b3c-0000")),
    ("1-x.example.com", (1, "x")),
    ("65535-sb-h1-abcdef-0001.sandboxes.example.com", (65535, "sb-h1-abcdef-0001")),
])
def test_a_host_of_port_dash_id_names_that_sandboxs_port(value: str, wanted: tuple[int, str]) -> None:
    assert target(host(value)) == wanted


@pytest.mark.parametrize("value", [
    "127.0.0.1:8889", "localhost:8889", "forkd.example.com", "8000-sb.", "0-sb.example.com",
    "65536-sb.example.com", "080-sb.example.com", "8000-.example.com", "8000-sb-1:80", "-8000-sb.x",
])
def test_the_daemons_own_hosts_are_not_port_traffic(value: str) -> None:
    assert target(host(value)) is None
    assert target({"type": "http", "headers": []}) is None


def test_the_inbound_policy_is_off_by_default_and_round_trips() -> None:
    default = EgressPolicy.from_request(None, None)
    assert not default.allow_public_traffic and default.mask_request_host is None
    policy = EgressPolicy.from_request(False, {"allow_public_traffic": True,
                                               "mask_request_host": "custom.example.com:${PORT}"})
    assert policy.request_host(8080) == "custom.example.com:8080"
    assert EgressPolicy.from_info(policy.info()) == policy
    # It opens no outbound traffic, so a sandbox without a NIC may carry it.
    assert policy.is_default and not policy.leaves_host([])
    # Pools match on the rules alone.
    assert PoolKey("t", egress=policy).outbound() == PoolKey("t")


@pytest.mark.parametrize("network", [
    {"allow_public_traffic": "yes"},
    {"mask_request_host": "evil\r\nX-Injected: 1"},
    {"mask_request_host": "a b"},
    {"mask_request_host": 7},
    {"mask_request_host": "x" * 300},
])
def test_a_bad_inbound_setting_is_a_clear_400(network: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest, match="network\\."):
        EgressPolicy.from_request(None, network)


# ------------------------------------------------------------ the relay, served as the daemon serves it
# PortProxy in a real uvicorn (the daemon's guarded httptools protocol, its WebSocket implementation),
# in front of a stand-in runtime whose sandbox's address is this host's loopback: local servers
# stand in for the guest's ports, so what the proxy connects to, reads and closes is visible.

SB = "sb-proxy-0000"
FRAME = 8 << 20  # a large WebSocket message, as the guest of issue 38's probe sent


@dataclasses.dataclass
class StandIn:
    """A running sandbox as the proxy reads it: public ports, at 127.0.0.1."""

    id: str = SB
    ip: str = "127.0.0.1"
    hibernation: object | None = None
    auto_resume: bool = True
    egress: EgressPolicy = dataclasses.field(
        default_factory=lambda: EgressPolicy.from_request(None, {"allow_public_traffic": True}))


class StandInRuntime:
    def get_sandbox(self, sandbox_id: str) -> StandIn:
        if sandbox_id != SB:
            raise NotFound(f"no sandbox {sandbox_id}")
        return StandIn()

    @contextlib.asynccontextmanager
    async def relaying(self, sandbox_id: str) -> AsyncIterator[StandIn]:
        yield self.get_sandbox(sandbox_id)


async def not_port_traffic(scope: Scope, receive: Receive, send: Send) -> None:
    raise AssertionError(f"not for the proxy: {scope}")


@pytest.fixture(scope="module")
def proxy() -> Iterator[int]:
    """The daemon's port proxy on a free port; its port."""
    app = PortProxy(not_port_traffic, runtime=lambda: cast("Runtime", StandInRuntime()),
                    tokens=AccessTokens(b"k" * 32), api_token=None, max_body_bytes=1 << 20,
                    clients=PortClients())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off",
                                           http=connections.http_protocol(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield port
    server.should_exit = True
    thread.join(timeout=30)


def ask(proxy: int, head: bytes) -> tuple[int, bytes]:
    """A raw request to the proxy (nothing between: no client library tidies the target); the
    status and the body of its answer."""
    with socket.create_connection(("127.0.0.1", proxy), timeout=20) as sock:
        sock.sendall(head)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer:
                head_part, _, body = answer.partition(b"\r\n\r\n")
                length = re.search(rb"(?im)^content-length: *(\d+)", head_part)
                if length and len(body) >= int(length[1]):
                    break
    head_part, _, body = answer.partition(b"\r\n\r\n")
    return int(head_part.split()[1]), body


@pytest.mark.parametrize(("scope", "wanted"), [
    ({"path": "/a b", "raw_path": b"/a%20b", "query_string": b"x=1&y=%2F"}, b"/a%20b?x=1&y=%2F"),
    ({"path": "/", "raw_path": b"/", "query_string": b""}, b"/"),
    ({"path": "//h:22/x", "raw_path": b"//h:22/x", "query_string": b""}, b"//h:22/x"),
    ({"path": "/\xe9", "raw_path": b"/\xc3\xa9#", "query_string": b"q=\xff"}, b"/%C3%A9%23?q=%FF"),
    ({"path": "*", "raw_path": b"*", "query_string": b""}, None),
    ({"path": "*@127.0.0.1:22/", "raw_path": b"*@127.0.0.1:22/", "query_string": b""}, None),
    ({"path": "127.0.0.1:22", "raw_path": b"127.0.0.1:22", "query_string": b""}, None),
])
def test_only_an_origin_form_target_is_relayed_and_the_url_keeps_the_guests_host(
        scope: dict[str, object], wanted: bytes | None) -> None:
    got = request_target(scope)
    assert got == wanted
    if got is not None:
        url = upstream_url("http", "10.0.0.2", 8000, got)
        assert (url.host, url.port, url.raw_path) == ("10.0.0.2", 8000, got)


def test_a_target_that_is_not_origin_form_is_a_400_and_connects_nowhere(proxy: int) -> None:
    """Issue 38, HIGH 2 and 11: ``*@127.0.0.1:<port>/`` pasted after the guest's address reached
    any port of the host; ``OPTIONS *`` was a 500."""
    with socket.create_server(("127.0.0.1", 0)) as host_port:
        port = host_port.getsockname()[1]
        for line in (f"GET *@127.0.0.1:{port}/ HTTP/1.1", "OPTIONS * HTTP/1.1",
                     f"GET *@127.0.0.1:{port}/?a=b HTTP/1.1"):
            try:
                status, body = ask(proxy, f"{line}\r\nHost: {port}-{SB}.localhost\r\n\r\n".encode())
            except TimeoutError:  # no answer: the proxy waits on whatever it connected to
                status, body = 0, b"{}"
            reached, _, _ = select.select([host_port], [], [], 0)
            assert not reached, f"{line}: the proxy connected to the host's port {port}"
            assert status == 400, (line, body)
            assert "origin-form" in json.loads(body)["error"]


def test_a_relayed_path_and_query_reach_the_guest_as_sent(proxy: int) -> None:
    with guest_http() as guest:
        status, body = ask(proxy, (f"GET /a%20b//c?x=1&y=%2F HTTP/1.1\r\n"
                                   f"Host: {guest.port}-{SB}.localhost\r\n\r\n").encode())
    assert status == 200 and body == b"GET /a%20b//c?x=1&y=%2F HTTP/1.1", body


def test_a_missing_sandbox_answers_as_e2bs_proxy_does(proxy: int) -> None:
    """Issue 38, LOW 20: E2B's SDK reads the proxy's ``{"message", "sandboxId", "code"}``; forkd's
    own clients read ``error``."""
    status, body = ask(proxy, b"GET / HTTP/1.1\r\nHost: 8000-sb-gone-0000.localhost\r\n\r\n")
    got = json.loads(body)
    assert status == 502
    assert got["code"] == 502 and got["sandboxId"] == "sb-gone-0000"
    assert "was not found" in got["message"] and got["error"] == got["message"]


def test_a_relay_stops_reading_the_guest_when_its_client_hangs_up(proxy: int) -> None:
    """Issue 38, MEDIUM 6: clients that read 64 KiB of an endless response and hung up left their
    relays reading it (CPU, the sandbox held awake, the daemon's shutdown waiting)."""
    with guest_http() as guest:
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", proxy), timeout=20) as sock:
                sock.sendall(f"GET /endless HTTP/1.1\r\nHost: {guest.port}-{SB}.localhost\r\n\r\n".encode())
                got = 0
                while got < 64 << 10:
                    chunk = sock.recv(65536)
                    assert chunk, "the relay ended before the client had 64 KiB"
                    got += len(chunk)
        # The guest sees each of its connections closed by the proxy (a generous deadline: only
        # "eventually" is asserted; today's relays never close them).
        deadline = time.monotonic() + 60
        while guest.streams_closed < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (guest.streams_closed, guest.streams_open) == (3, 0)


def test_a_websocket_relay_reads_the_guest_only_as_fast_as_its_client_reads(proxy: int) -> None:
    """Issue 38, MEDIUM 5: a guest writing 16 MiB messages to a client that never read grew the
    daemon by hundreds of MiB. Now the relay reads ahead of its client at most a few messages
    (WS_QUEUE_FRAMES queued, one on its way, one in uvicorn's buffer) plus what the kernel's
    socket buffers hold; and the stream is whole once the client reads."""
    count = 24
    with guest_websocket(count) as guest, socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)  # the client reads nothing
        sock.settimeout(30)
        sock.connect(("127.0.0.1", proxy))
        sock.sendall((f"GET /ws HTTP/1.1\r\nHost: {guest.port}-{SB}.localhost\r\nUpgrade: websocket\r\n"
                      "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                      "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        buffered = b""
        while b"\r\n\r\n" not in buffered:
            buffered += sock.recv(4096)
        head, _, buffered = buffered.partition(b"\r\n\r\n")
        assert head.split()[1] == b"101", head
        # Until the guest can send no more (its count stops growing), or has sent it all.
        deadline, still, last = time.monotonic() + 120, 0, -1
        while still < 6 and time.monotonic() < deadline:
            time.sleep(0.5)
            still, last = (still + 1, last) if guest.sent == last else (0, guest.sent)
        kernel = sum(int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[2])
                     for name in ("tcp_rmem", "tcp_wmem"))  # the most the daemon's two sockets hold
        # Held by the relay: WS_QUEUE_FRAMES + 1 queued (the queue pauses reading past its mark),
        # one half-read, one on its way to uvicorn, one in uvicorn's buffer; and one to spare.
        # websockets' default queue alone held 16 (168 MiB read ahead here before the fix).
        bound = (WS_QUEUE_FRAMES + 5) * FRAME + kernel + (1 << 20)
        assert guest.sent <= bound, f"{guest.sent >> 20} MiB read ahead of the client (bound {bound >> 20})"
        assert guest.sent < count * FRAME  # the bound held it, not the end of the stream
        # Then the client reads: every message arrives, whole.
        reader = sock.makefile("rb")
        got = [read_message(reader, buffered if i == 0 else b"") for i in range(count)]
        assert [len(m) for m in got] == [FRAME] * count
        assert [m[:8] for m in got] == [i.to_bytes(8, "big") for i in range(count)]


def read_message(reader: BinaryIO, pending: bytes) -> bytes:
    """One unfragmented binary message from the server (unmasked), ``pending`` read already."""
    data = io.BytesIO(pending)

    def take(n: int) -> bytes:
        out = data.read(n)
        while len(out) < n:
            more = reader.read(n - len(out))
            assert more, "the connection closed"
            out += more
        return out

    first, second = take(2)
    assert first == 0x82, hex(first)
    size = second & 0x7F
    if size == 126:
        size = int.from_bytes(take(2), "big")
    elif size == 127:
        size = int.from_bytes(take(8), "big")
    return take(size)


class GuestServer:
    def __init__(self, port: int) -> None:
        self.port = port
        self.sent = 0
        self.streams_open = 0
        self.streams_closed = 0


@contextlib.contextmanager
def guest_http() -> Iterator[GuestServer]:
    """A guest's HTTP server: ``/endless`` streams for ever (counting the streams the proxy
    closes), any other path answers its own request line."""
    listener = socket.create_server(("127.0.0.1", 0))
    guest = GuestServer(listener.getsockname()[1])
    lock = threading.Lock()

    def serve(conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            line = head.split(b"\r\n", 1)[0]
            if b" /endless " not in line:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(line), line))
                return
            with lock:
                guest.streams_open += 1
            chunk = b"10000\r\n" + b"x" * 0x10000 + b"\r\n"
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                while True:
                    conn.sendall(chunk)
            except OSError:  # the proxy closed it
                with lock:
                    guest.streams_open -= 1
                    guest.streams_closed += 1

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                threading.Thread(target=serve, args=(listener.accept()[0],), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield guest
    finally:
        listener.close()


@contextlib.contextmanager
def guest_websocket(count: int) -> Iterator[GuestServer]:
    """A guest's WebSocket server that sends ``count`` messages of FRAME bytes to each client,
    counting the bytes its sends got rid of."""
    from websockets.asyncio.server import ServerConnection, serve

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10)  # what the guest's kernel holds
    listener.bind(("127.0.0.1", 0))
    # Listening before the server's thread runs: a connection that comes first waits in the backlog
    # (refused, the proxy would turn the client away with a 403).
    listener.listen(16)
    guest = GuestServer(listener.getsockname()[1])
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def handler(ws: ServerConnection) -> None:
        payload = bytearray(FRAME)
        for i in range(count):
            payload[:8] = i.to_bytes(8, "big")
            await ws.send(bytes(payload))
            guest.sent += FRAME
        await ws.wait_closed()

    async def run() -> None:
        async with serve(handler, sock=listener, max_size=None, compression=None):
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), daemon=True)
    thread.start()
    try:
        yield guest
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
