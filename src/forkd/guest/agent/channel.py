"""The agent's side of the wire: every message to the host goes through one ``Channel``.

Its own module because four jobs send (the serve loop, the worker threads, the
process I/O thread, the evaluator) and each message must be written whole,
bounded, and accounted for: a reply ends its request, an event does not.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from forkd.guest import protocol


class Channel:
    """Writes messages to the host, one line each, never longer than ``MAX_REPLY_LINE``.

    It also knows which requests still await their reply (``open``), so that the
    serve loop can wait for them at end of input (``wait_idle``).
    """

    def __init__(self, max_line: int = protocol.MAX_REPLY_LINE) -> None:
        self.out_fd = -1
        self.max_line = max_line
        self._write_lock = threading.Lock()
        self._open: set[Any] = set()
        self._idle = threading.Condition()

    # ---------------------------------------------------------- bookkeeping

    def opened(self, req_id: Any) -> None:
        """A request with an id was accepted: it awaits one reply (or ``forget``)."""
        with self._idle:
            self._open.add(req_id)

    def forget(self, req_id: Any) -> None:
        """A request that will never be answered (a stream the host detached)."""
        with self._idle:
            self._open.discard(req_id)
            if not self._open:
                self._idle.notify_all()

    def wait_idle(self) -> None:
        """Block until every accepted request has been answered or forgotten."""
        with self._idle:
            while self._open:
                self._idle.wait()

    # -------------------------------------------------------------- sending

    def event(self, req_id: Any, ev: dict[str, Any]) -> None:
        self._write(protocol.encode(protocol.event(req_id, ev)))

    def send_line(self, line: bytes) -> None:
        """An event its sender encoded itself (to know its size first); at most ``max_line``."""
        if len(line) <= self.max_line:
            self._write(line)

    def reply(self, req_id: Any, result: Any) -> None:
        self.send_reply(protocol.ok_reply(req_id, result))

    def error(self, req_id: Any, message: str, kind: str | None = None) -> None:
        self.send_reply(protocol.error_reply(req_id, message, kind))

    def send_reply(self, reply: dict[str, Any]) -> None:
        """A final reply: written (or replaced by an error if too long), and its request closed."""
        data = protocol.encode(reply)
        if len(data) > self.max_line:
            data = protocol.encode(protocol.error_reply(
                reply.get("id"), f"the reply is larger than the agent's {self.max_line}-byte limit"))
        self._write(data)
        self.forget(reply.get("id"))

    def _write(self, data: bytes) -> None:
        with self._write_lock:
            view = memoryview(data)
            while view:
                try:
                    n = os.write(self.out_fd, view)
                except InterruptedError:
                    continue
                except OSError:
                    return  # host not connected: the message is lost, as the connection is
                view = view[n:]
