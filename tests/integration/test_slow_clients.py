"""Slow clients against a real ``forkd daemon`` process (no VM is booted).

Issue 38, high 4 (slowloris): 600 connections that each sent 9 bytes of a request line and
stopped held every one of the daemon's 512 client slots: uvicorn stops its keep-alive timer at
the first byte and has no head deadline, and the cap evicted only silent connections. So
``/healthz`` and authenticated calls failed for the whole hold. Now a begun head has
``--header-timeout`` seconds to complete (then 408 and close), and a partial head is evicted
first when the cap is reached.
"""

from __future__ import annotations

import json
import resource
import selectors
import socket
import time
from collections.abc import Iterator

import pytest

from forkd.api.connections import CONNECTION_SHARE

from .daemon_fixture import Daemon, new_daemon, shutdown_and_check, start_or_clean_up

HEADER_TIMEOUT = 3.0  # short, so the hold is a few seconds
FD_LIMIT = 1024  # the daemon's soft limit during the test: a cap of 256 client connections
PARTIAL = 300  # more than the cap, well under this host's limits


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    d = start_or_clean_up(new_daemon("fkd-slow-", extra_args=["--header-timeout", str(HEADER_TIMEOUT)]))
    try:
        yield d
    finally:
        shutdown_and_check(d)


def test_partial_request_heads_neither_stall_the_daemon_nor_stay(daemon: Daemon) -> None:
    assert daemon.proc is not None
    pid = daemon.proc.pid
    before = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (FD_LIMIT, before[1]))  # the soft limit only
    assert PARTIAL > FD_LIMIT // CONNECTION_SHARE
    partial: list[socket.socket] = []
    try:
        for _ in range(PARTIAL):
            s = socket.create_connection(("127.0.0.1", daemon.port), timeout=5)
            s.sendall(b"GET /heal")  # 9 bytes of a request line, then nothing
            partial.append(s)
        # While they hold: the daemon still answers, without and with a credential.
        with daemon.client(timeout=10) as c:
            assert c.get("/healthz").json() == {"ok": True}
            assert c.get("/v1/sandboxes").status_code == 200
        # Every partial connection is closed by the daemon: evicted for a newer one (no answer),
        # or answered 408 once its head timed out.
        answers: dict[int, bytes] = {}
        pending = selectors.DefaultSelector()
        for s in partial:
            pending.register(s, selectors.EVENT_READ)
        deadline = time.monotonic() + HEADER_TIMEOUT + 30  # a bound against a hang, not a measure
        while pending.get_map() and time.monotonic() < deadline:
            for key, _ in pending.select(timeout=1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(4096)
                except OSError:
                    data = b""
                if data:
                    answers[sock.fileno()] = answers.get(sock.fileno(), b"") + data
                    continue
                pending.unregister(sock)
        left = len(pending.get_map())
        pending.close()
        assert left == 0, f"{left} partial connections were never closed by the daemon"
        assert answers, "no partial connection was answered 408"
        for answer in answers.values():
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408 "), answer[:200]
            assert json.loads(body) == {"error": f"request head not complete within {HEADER_TIMEOUT:g} s"}
        with daemon.client(timeout=10) as c:
            assert c.get("/healthz").json() == {"ok": True}
    finally:
        for s in partial:
            s.close()
        resource.prlimit(pid, resource.RLIMIT_NOFILE, before)
