"""A scripted stand-in for the guest agent on a unix socket, for host-side client tests.

The real agent (``forkd.guest.agent.server.Agent``) answers correctly; this peer
is for what it never does on purpose: answer out of a chosen order, write stray
bytes, or drop the connection in the middle of a call. It runs in a thread of
its own, so it does not depend on the event loop of the client under test.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from forkd.guest import protocol

Request = dict[str, Any]


class AgentPeer:
    """Accepts one connection at ``path`` and hands each request line to ``on_request``.

    ``on_request(peer, request)`` answers through ``reply``, ``send_raw`` or
    ``close_connection``; without one, every request is answered ``{"echo": request}``.
    Every request received is kept in ``requests``, in order.
    """

    def __init__(self, path: Path, on_request: Callable[[AgentPeer, Request], None] | None = None) -> None:
        self.path = path
        self.on_request = on_request or (lambda peer, req: peer.reply(req, {"echo": req}))
        self.requests: list[Request] = []
        self.received = threading.Condition()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conn: socket.socket | None = None
        self._send_lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="agent-peer", daemon=True)
        self.error: BaseException | None = None  # what broke the peer itself, for the test to see

    def __enter__(self) -> AgentPeer:
        self._listener.bind(str(self.path))
        self._listener.listen(1)
        self._listener.settimeout(30)
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close_connection()
        self._listener.close()
        self._thread.join(timeout=10)

    # ------------------------------------------------------------ answering

    def send_raw(self, data: bytes) -> None:
        with self._send_lock:
            if self._conn is not None:
                self._conn.sendall(data)

    def reply(self, req: Request, result: Any = None, error: str | None = None) -> None:
        message = (
            protocol.ok_reply(req["id"], result) if error is None else protocol.error_reply(req["id"], error)
        )
        self.send_raw(protocol.encode(message))

    def close_connection(self) -> None:
        with self._send_lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def wait_for_requests(self, n: int, timeout: float = 10.0) -> list[Request]:
        with self.received:
            if not self.received.wait_for(lambda: len(self.requests) >= n, timeout):
                raise TimeoutError(f"the peer got {len(self.requests)} requests, not {n}")
            return list(self.requests)

    # -------------------------------------------------------------- serving

    def _serve(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:  # closed before anyone connected
            return
        self._conn = conn
        buf = b""
        try:
            while True:
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    return
                if not chunk:
                    return
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    req = json.loads(line)
                    with self.received:
                        self.requests.append(req)
                        self.received.notify_all()
                    self.on_request(self, req)
        except BaseException as exc:
            self.error = exc
            raise
