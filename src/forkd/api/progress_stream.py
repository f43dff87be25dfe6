"""Long work whose progress a route streams as NDJSON: a template build, an image pull.

The work runs in a task of its own: a client that goes away stops watching, not the work
(its layers or image are still made). The events between the work and the stream are
bounded: when the queue is full, an event of the ``sheddable`` type is dropped, and any
other makes room by dropping the oldest one (the work never waits on a slow client). With
``report_dropped``, the stream ends by saying how many were dropped. An error found before
the first event is an ordinary answer (raised); one after it is the stream's last event.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi.responses import StreamingResponse

from forkd.errors import ForkdError

NDJSON = "application/x-ndjson"
QUEUE_EVENTS = 1024

Event = dict[str, Any]
Put = Callable[[Event | None], None]

_running: set[asyncio.Task[Any]] = set()  # running work, kept from the garbage collector


async def stream_progress(work: Callable[[Put], Awaitable[Any]], *, what: str, sheddable: str,
                          report_dropped: bool = False) -> StreamingResponse:
    """Start ``work(put)`` and stream what it puts; ``what`` names it in a cancellation's error."""
    queue: asyncio.Queue[Event | None] = asyncio.Queue(QUEUE_EVENTS)
    dropped = 0

    def put(event: Event | None) -> None:
        nonlocal dropped
        if queue.full():
            dropped += 1
            if event is not None and event["type"] == sheddable:
                return
            queue.get_nowait()  # anything else: make room by dropping the oldest line
        queue.put_nowait(event)

    async def run() -> None:
        try:
            await work(put)
        finally:
            put(None)

    task = asyncio.create_task(run())
    _running.add(task)
    task.add_done_callback(_running.discard)
    head = await queue.get()
    if head is None:  # it ended before its first event: an error found up front is an ordinary answer
        await asyncio.wait({task})
        task.result()

    async def lines() -> AsyncIterator[bytes]:
        event = head
        while event is not None:
            yield (json.dumps(event) + "\n").encode()
            event = await queue.get()
        await asyncio.wait({task})
        if report_dropped and dropped:
            yield (json.dumps({"type": "dropped", "lines": dropped}) + "\n").encode()
        error = _failure(task, what)
        if error is not None:
            yield (json.dumps({"type": "error", "error": error}) + "\n").encode()

    return StreamingResponse(lines(), media_type=NDJSON)


def _failure(task: asyncio.Task[Any], what: str) -> str | None:
    if task.cancelled():
        return f"the {what} was cancelled"
    exc = task.exception()
    if exc is None:
        return None
    return str(exc) if isinstance(exc, ForkdError) else f"{type(exc).__name__}: {exc}"


__all__ = ["NDJSON", "QUEUE_EVENTS", "stream_progress"]
