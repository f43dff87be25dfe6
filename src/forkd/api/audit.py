"""Append-only audit log: one JSON line per HTTP request.

Records who called what and how it ended; deliberately never the
Authorization header, the query string or any body (they can carry secrets,
environment variables and code).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import IO, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)
# One encoder for every line: json.dumps with any non-default option builds a new one per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


class AuditLog:
    """A line-buffered append handle, opened on first use.

    Opening lazily keeps ``create_app`` free of filesystem side effects. Writes
    are a few hundred bytes to a local file, cheap enough to do on the event
    loop; the lock only matters if a worker thread ever logs too.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: IO[str] | None = None
        self._lock = threading.Lock()
        self._broken = False

    def write(self, record: dict[str, Any]) -> None:
        line = _ENCODER.encode(record) + "\n"
        with self._lock:
            if self._broken:
                return
            try:
                if self._fh is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    # 0600: the log names clients and the sandboxes they touched.
                    fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                    self._fh = os.fdopen(fd, "a", buffering=1, encoding="utf-8")
                self._fh.write(line)
            except OSError as exc:
                # An unwritable audit log must not take the API down with it;
                # say so once, loudly, and keep serving.
                self._broken = True
                log.error("audit log %s is not writable, auditing disabled: %s", self.path, exc)

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


def _client(scope: Scope) -> str | None:
    client = scope.get("client")
    return client[0] if client else None


class AuditMiddleware:
    """Outermost middleware, so 401s and 413s from the inner layers are logged too."""

    def __init__(self, app: ASGIApp, audit: AuditLog) -> None:
        self.app = app
        self.audit = audit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # if the app raises before starting a response

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            self.audit.write(
                {
                    "ts": round(time.time(), 3),
                    "method": scope.get("method"),
                    "path": scope.get("path"),
                    "status": status,
                    "latency_ms": round((time.perf_counter() - started) * 1000, 3),
                    "client": _client(scope),
                }
            )
