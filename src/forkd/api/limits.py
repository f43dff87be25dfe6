"""Resource limits enforced by the API layer: request body size and branch concurrency."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from forkd.errors import Busy, Conflict

# Requests the middleware lets through unread: a route that streams its body and
# applies its own limit (file uploads).
Exempt = Callable[[Scope], bool]
# The error body for a status and message: forkd's {"error"}, or another API's own shape.
ErrorShape = Callable[[int, str], dict[str, object]]


def forkd_error(_status: int, message: str) -> dict[str, object]:
    return {"error": message}


async def _send_error(send: Send, status: int, message: str, shape: ErrorShape = forkd_error) -> None:
    body = json.dumps(shape(status, message)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodySizeLimitMiddleware:
    """Answer 413 ``{"error"}`` to request bodies larger than ``max_bytes``.

    Every forkd request body is a small JSON document, so the body is read in
    full here (up to the limit) and replayed to the app. That way the limit
    also holds for chunked uploads without Content-Length, and the 413 is sent
    before any route code runs. Requests for which ``exempt`` says so (file
    uploads, which stream under their own limit) pass through unread.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, exempt: Exempt | None = None,
                 shape: ErrorShape = forkd_error) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.exempt = exempt
        self.shape = shape

    def _too_large(self) -> str:
        return f"request body exceeds the {self.max_bytes}-byte limit"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (self.exempt is not None and self.exempt(scope)):
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await _send_error(send, 400, "invalid Content-Length header", self.shape)
                    return
                if declared > self.max_bytes:
                    await _send_error(send, 413, self._too_large(), self.shape)
                    return

        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # client went away mid-upload; nothing to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _send_error(send, 413, self._too_large(), self.shape)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            # After the body, the app only ever waits for a disconnect.
            return await receive()

        await self.app(scope, replay, send)


class BranchGate:
    """At most ``limit`` BRANCH calls at once, and never two for the same tag.

    Which tags are being written is the runtime's to know (one reservation set
    for every writer); the gate asks it first, so a same-tag request gets 409
    even when the daemon is also at its cap: retrying later will not help that
    caller. Checks and bookkeeping happen with no ``await`` in between, so on a
    single event loop they are atomic without a lock.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("branch concurrency must be at least 1")
        self.limit = limit
        self.active = 0

    @contextmanager
    def enter(self, tag: str | None, in_flight: Callable[[str], bool]) -> Iterator[None]:
        if tag is not None and in_flight(tag):
            raise Conflict(f"a branch to tag {tag!r} is already in flight")
        if self.active >= self.limit:
            raise Busy(f"daemon is at its branch concurrency cap ({self.limit}); retry after a short delay")
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1
