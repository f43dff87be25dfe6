"""api/connections.py: the log-repeat filter and the connection cap (the socket side is
tests/integration/test_hostile_client.py, against a real daemon)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import socket
import threading
import time
from collections.abc import Awaitable, Callable

import pytest
import uvicorn

from forkd.api import connections
from forkd.api.connections import CONNECTION_SHARE, MIN_CONNECTIONS, LogRepeatFilter, connection_cap


def record(msg: str, name: str = "asyncio") -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, None, None)


def test_a_repeated_line_is_written_once_per_window_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(connections.time, "monotonic", lambda: clock[0])
    flt = LogRepeatFilter(window=10)
    assert flt.filter(record("socket.accept() out of system resource"))
    assert not any(flt.filter(record("socket.accept() out of system resource")) for _ in range(1000))
    assert flt.filter(record("another message"))  # other lines are not held back
    clock[0] = 10.5
    late = record("socket.accept() out of system resource")
    assert flt.filter(late)
    assert "1000 more like this" in late.getMessage()


def test_the_cap_is_a_share_of_the_fd_limit() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert connection_cap() == max(MIN_CONNECTIONS, soft // CONNECTION_SHARE)


def test_one_record_gets_one_decision_on_every_handler() -> None:
    """The filter sits on several handlers; each must let the same record through."""
    flt = LogRepeatFilter(window=10)
    first = record("token file is readable by others")
    assert [flt.filter(first) for _ in range(3)] == [True, True, True]
    again = record("token file is readable by others")
    assert [flt.filter(again) for _ in range(3)] == [False, False, False]


def test_the_daemon_serves_httptools_guarded() -> None:
    assert connections.http_protocol() is connections.GuardedHttpToolsProtocol
    assert connections.http_protocol("h11") is connections.GuardedH11Protocol


def test_writes_of_one_loop_turn_leave_as_one() -> None:
    """A response's head and body (two writes) reach the transport once, in order."""

    class Transport:
        def __init__(self) -> None:
            self.written: list[bytes] = []
            self.closed = False

        def write(self, data: bytes) -> None:
            self.written.append(data)

        def is_closing(self) -> bool:
            return self.closed

        def close(self) -> None:
            self.closed = True

        def get_extra_info(self, name: str) -> str:
            return f"info:{name}"

    async def run() -> Transport:
        transport = Transport()
        writer = connections._CoalescingWriter(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
        writer.write(b"HTTP/1.1 200 OK\r\n\r\n")
        writer.write(b"body")
        assert transport.written == []  # held until the loop turns
        await asyncio.sleep(0)
        assert transport.written == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
        writer.write(b"x" * connections._CoalescingWriter.FLUSH_BYTES)  # a large write is not held
        assert len(transport.written) == 2
        writer.write(b"last")
        writer.close()  # flushes before closing
        assert transport.written[-1] == b"last" and transport.closed
        assert writer.get_extra_info("peername") == "info:peername"
        return transport

    asyncio.run(run())


def _serve(port: int, parser: str = "httptools", head_timeout: float = connections.HEAD_TIMEOUT_SECS,
           hold: threading.Event | None = None) -> uvicorn.Server:
    """A uvicorn server on the daemon's protocol; ``/hold`` answers once ``hold`` is set."""
    Send = Callable[[dict[str, object]], Awaitable[None]]

    async def app(scope: dict[str, object], receive: object, send: Send) -> None:
        if scope["type"] != "http":
            return
        while scope["path"] == "/hold" and hold is not None and not hold.is_set():
            await asyncio.sleep(0.02)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    config = uvicorn.Config(app, host="127.0.0.1", port=port,
                            http=connections.http_protocol(parser, head_timeout),
                            lifespan="off", log_level="error", access_log=False)
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    return server


def _exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        with contextlib.suppress(OSError):  # the server closed while we still wrote: read its answer
            sock.sendall(data)
        chunks = []
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)


def test_a_request_head_over_the_bound_is_refused_with_431_and_serving_goes_on() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = _serve(port)
    try:
        ok = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        assert _exchange(port, ok).startswith(b"HTTP/1.1 200")
        headers = b"".join(b"X-%d: %s\r\n" % (i, b"v" * 60) for i in range(400))
        many = b"GET / HTTP/1.1\r\nHost: x\r\n" + headers
        long_url = b"GET /" + b"a" * (connections.MAX_HEAD_BYTES + 1) + b" HTTP/1.1\r\nHost: x\r\n\r\n"
        for head in (many + b"\r\n", long_url):
            answer = _exchange(port, head)
            assert answer.startswith(b"HTTP/1.1 431"), answer[:80]
            head_lines, body = answer.split(b"\r\n\r\n", 1)
            assert f"content-length: {len(body)}".encode() in head_lines
            error = json.loads(body)["error"]
            assert error.startswith("request line and headers exceed")
        assert _exchange(port, ok).startswith(b"HTTP/1.1 200")
        # Pipelined: both answers, whole and in order, through the coalescing writer.
        two = b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\n" + ok
        assert _exchange(port, two).count(b"HTTP/1.1 200 OK\r\n") == 2
    finally:
        server.should_exit = True


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("parser", connections.HTTP_PARSERS)
def test_a_head_not_complete_in_time_is_answered_408_and_closed(parser: str) -> None:
    """Issue 38 (slowloris): uvicorn's keep-alive timer stops at the first byte of a head."""
    port = _free_port()
    server = _serve(port, parser, head_timeout=0.5)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"GET /heal")
            answer = b""
            while chunk := s.recv(4096):  # the server closes it: recv ends
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert json.loads(body) == {"error": "request head not complete within 0.5 s"}
        # A head that completes in time is served as before, and the deadline is per head.
        ok = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        assert _exchange(port, ok).startswith(b"HTTP/1.1 200")
    finally:
        server.should_exit = True


def test_requests_without_a_credential_leave_a_reserve(monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests in flight that anyone can make (no credential, not /healthz) take at most
    ``open_share`` of the cap; past it one is answered 503, and /healthz and a request with
    a credential are still served."""
    monkeypatch.setattr(connections, "connection_cap", lambda: MIN_CONNECTIONS)
    share = connections.open_share(MIN_CONNECTIONS)
    assert 0 < share < MIN_CONNECTIONS
    hold = threading.Event()
    port = _free_port()
    server = _serve(port, hold=hold)
    held: list[socket.socket] = []
    try:
        for _ in range(share):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
            held.append(s)
        deadline = time.monotonic() + 10
        while sum(1 for t in server.server_state.tasks if not t.done()) < share:
            assert time.monotonic() < deadline, "the held requests did not start"
            time.sleep(0.02)
        close = b"Host: x\r\nConnection: close\r\n\r\n"
        refused = _exchange(port, b"GET /other HTTP/1.1\r\n" + close)
        head, _, body = refused.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 "), refused[:200]
        assert "connection cap" in json.loads(body)["error"]
        for reserved in (b"GET /healthz HTTP/1.1\r\n" + close,
                         b"GET /other HTTP/1.1\r\nAuthorization: Bearer t\r\n" + close,
                         b"GET /other HTTP/1.1\r\nX-API-Key: k\r\n" + close):
            assert _exchange(port, reserved).startswith(b"HTTP/1.1 200"), reserved
        assert sum(1 for t in server.server_state.tasks if not t.done()) == share  # still held
        hold.set()
        for s in held:  # released, they are answered
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
        assert _exchange(port, b"GET /other HTTP/1.1\r\n" + close).startswith(b"HTTP/1.1 200")
    finally:
        hold.set()
        for s in held:
            s.close()
        server.should_exit = True


@pytest.mark.parametrize("seconds", [0.0, -1.0, float("nan"), 601.0])
def test_a_header_timeout_out_of_range_is_refused_before_serving(seconds: float) -> None:
    from forkd.api.server import validate_settings
    from forkd.api.settings import ConfigError, Settings

    with pytest.raises(ConfigError, match="--header-timeout"):
        validate_settings(Settings(header_timeout=seconds))
