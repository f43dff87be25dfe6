"""Resource limits enforced by the API layer: request bodies (size, JSON nesting), routing and
credential headers given once, and branch concurrency."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from forkd import bounds, jsondepth
from forkd.errors import Busy, Conflict

# Requests the middleware lets through unread: a route that streams its body and
# applies its own limit (file uploads).
Exempt = Callable[[Scope], bool]
# The error body for a status and message: forkd's {"error"}, or another API's own shape.
ErrorShape = Callable[[int, str], dict[str, object]]


def forkd_error(_status: int, message: str) -> dict[str, object]:
    return {"error": message}


async def send_error(send: Send, status: int, message: str, shape: ErrorShape = forkd_error) -> None:
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


def replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app ``body`` (read and checked already) in one message,
    then passes on what the client sends next (only ever a disconnect)."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class BodySizeLimitMiddleware:
    """Answer 413 ``{"error"}`` to request bodies larger than ``max_bytes``, and 400 to bodies
    whose JSON nests deeper than ``max_depth``.

    Every forkd request body is a small JSON document, so the body is read in
    full here (up to the limit), scanned (``forkd.jsondepth``: whatever its
    Content-Type, since some routes parse JSON regardless) and replayed to the
    app. That way the limits also hold for chunked uploads without
    Content-Length, and both answers are sent before any route code or parser
    sees the body. Requests for which ``exempt`` says so (file uploads, which
    stream under their own limit, and Connect calls, which
    ``api.e2b.connect_bounds`` bounds) pass through unread.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, exempt: Exempt | None = None,
                 shape: ErrorShape = forkd_error, max_depth: int = bounds.MAX_JSON_DEPTH) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.exempt = exempt
        self.shape = shape
        self.max_depth = max_depth

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
                    await send_error(send, 400, "invalid Content-Length header", self.shape)
                    return
                if declared > self.max_bytes:
                    await send_error(send, 413, self._too_large(), self.shape)
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
                await send_error(send, 413, self._too_large(), self.shape)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if jsondepth.too_deep(body, self.max_depth):
            await send_error(send, 400, jsondepth.refusal(self.max_depth), self.shape)
            return

        await self.app(scope, replaying(body, receive), send)


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


# Headers that route a request or carry its credentials, or say how to read its body: each may
# come once. With two, a check could read one copy and a handler the other (issue 24: sandbox A's
# token checked against a last E2b-Sandbox-Id while the handler acted in the first, sandbox B's).
SINGLE_HEADERS = frozenset({
    b"authorization", b"x-api-key", b"x-access-token", b"e2b-traffic-access-token",
    b"e2b-sandbox-id", b"e2b-sandbox-port", b"content-type", b"content-encoding",
    b"connect-content-encoding", b"grpc-encoding",
})
# The error shape a request is answered in (forkd's, E2B's REST or Connect shape).
ShapeOf = Callable[[Scope], ErrorShape]


def repeated_header(scope: Scope) -> str | None:
    """The first of ``SINGLE_HEADERS`` that a request carries more than once, if any."""
    seen: set[bytes] = set()
    for name, _ in scope.get("headers", ()):
        if name in SINGLE_HEADERS:
            if name in seen:
                return str(name.decode("latin-1"))
            seen.add(name)
    return None


class SingleHeadersMiddleware:
    """Answer 400 to a request that repeats a routing or credential header (``SINGLE_HEADERS``).

    It runs before anything reads those headers (the E2B dispatcher, the auth
    checks), so every later reader, however it picks among copies, sees the one value.
    """

    def __init__(self, app: ASGIApp, shape_of: ShapeOf = lambda _scope: forkd_error) -> None:
        self.app = app
        self.shape_of = shape_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            name = repeated_header(scope)
            if name is not None:
                await send_error(send, 400, f"the {name} header is given more than once; send it once",
                                  self.shape_of(scope))
                return
        await self.app(scope, receive, send)
