"""A hostile client against a real daemon process (issue 24): whatever it sends over
loopback, the daemon keeps serving everyone else. No traffic leaves the host."""

from __future__ import annotations

import os
import resource
import selectors
import socket
import time
from collections.abc import Iterator

import pytest

from forkd.api.connections import FIRST_REQUEST_SECS

from .daemon_fixture import Daemon, new_daemon, shutdown_and_check, start_or_clean_up


@pytest.fixture(scope="module")
def plain_daemon() -> Iterator[Daemon]:
    """A daemon with no snapshot: these tests need its HTTP side only, no VM."""
    daemon = start_or_clean_up(new_daemon("fkd-hc-"))
    try:
        yield daemon
    finally:
        shutdown_and_check(daemon)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_idle_connections_cannot_exhaust_the_daemons_fds(plain_daemon: Daemon) -> None:
    """Finding 6: 20,200 idle TCP connections used all 20,000 fds; /healthz and
    authenticated calls then timed out and the log filled with "Too many open files".
    Here the daemon's limit is lowered to 2,048 and 3,000 silent connections are opened."""
    assert plain_daemon.proc is not None
    pid = plain_daemon.proc.pid
    before = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (2048, before[1]))  # the soft limit only
    log_before = plain_daemon.log_path.stat().st_size
    silent: list[socket.socket] = []
    try:
        for _ in range(3000):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.settimeout(5)
            s.connect(("127.0.0.1", plain_daemon.port))
            silent.append(s)
        time.sleep(1)  # let the daemon accept what the kernel queued
        with plain_daemon.client(timeout=10) as c:
            assert c.get("/healthz").json() == {"ok": True}
            assert c.get("/v1/sandboxes").status_code == 200  # authenticated, too
        assert open_fds(pid) < 2048
        # The silent ones are closed by the daemon: evicted for newer ones, or timed out.
        deadline = time.monotonic() + FIRST_REQUEST_SECS + 10
        pending = selectors.DefaultSelector()  # epoll: these fds are past select()'s 1024
        for s in silent:
            pending.register(s, selectors.EVENT_READ)
        while pending.get_map() and time.monotonic() < deadline:
            for key, _ in pending.select(timeout=1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(1)
                except OSError:
                    data = b""
                assert data == b"", "the daemon answered a connection that sent nothing"
                pending.unregister(sock)
        left = len(pending.get_map())
        pending.close()
        assert left == 0, f"{left} silent connections were never closed by the daemon"
    finally:
        for s in silent:
            s.close()
        resource.prlimit(pid, resource.RLIMIT_NOFILE, before)
    with plain_daemon.log_path.open("rb") as log:
        log.seek(log_before)
        written = log.read()
    assert b"Too many open files" not in written
    assert len(written) < 64 * 1024, "the daemon's log grew by more than 64 KiB during the flood"


def test_a_slow_client_gets_its_answer(plain_daemon: Daemon) -> None:
    """The first-request timeout is for silence only: a request split over several
    writes within it is served as usual."""
    with socket.create_connection(("127.0.0.1", plain_daemon.port), timeout=10) as s:
        for part in (b"GET /healthz HTTP/1.1\r\n", b"Host: localhost\r\n", b"\r\n"):
            s.sendall(part)
            time.sleep(0.3)
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
