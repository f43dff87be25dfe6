"""What differs between the async SDK modules and their generated sync twins.

The sync modules (``client.py``, ``sandbox.py``) are generated from the async
ones by a table of token substitutions (``scripts/unasync_sdk.py``). Where the
two APIs must differ in shape, not only in ``async``/``await``, the async
source says so with a marker from here, and the script's table rewrites the
marker (``@sync_property``). Where they must differ in behaviour, the source
calls a helper from here that does the right thing for the function it is
given (:func:`concurrently`), so the same line reads correctly in both twins.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, overload

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
R = TypeVar("R")


def sync_property(method: F) -> F:
    """Mark a coroutine method whose sync twin is a read-only property.

    At run time it returns the method unchanged (``await sb.info()``); the
    generator turns ``@sync_property`` into ``@property`` (``sb.info``), since a
    property may do I/O in sync code but cannot be awaited.
    """
    return method


# The first overload is the async twin's call (``await concurrently(coro_fn,
# items)``), the second the sync twin's (``concurrently(fn, items)``). A
# coroutine function also matches the second, with another return type, which
# is what makes the overlap "unsafe" to mypy; the runtime check below is what
# tells them apart, so the overlap is intended.
@overload
def concurrently(  # type: ignore[overload-overlap]
    fn: Callable[[T], Coroutine[Any, Any, R]], items: Sequence[T], limit: int | None = None
) -> Coroutine[Any, Any, list[R]]: ...
@overload
def concurrently(fn: Callable[[T], R], items: Sequence[T], limit: int | None = None) -> list[R]: ...
def concurrently(fn: Callable[[T], Any], items: Sequence[T], limit: int | None = None) -> Any:
    """``[fn(item) for item in items]``, with the calls running at the same time.

    For a coroutine function (the async twin) it returns a coroutine that
    gathers the calls on the running loop; for a plain function (the sync twin)
    it runs each call in a thread of its own and returns the results. At most
    ``limit`` calls run at once (default: all). Results keep the order of
    ``items``; the first exception a call raises propagates (callers that
    want every outcome catch inside ``fn``).
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    if inspect.iscoroutinefunction(fn):
        return _gather(fn, items, limit)
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(limit or len(items), len(items))) as pool:
        return list(pool.map(fn, items))


async def _gather(
    fn: Callable[[T], Coroutine[Any, Any, R]], items: Sequence[T], limit: int | None
) -> list[R]:
    if limit is None:
        return list(await asyncio.gather(*(fn(item) for item in items)))
    gate = asyncio.Semaphore(limit)

    async def bounded(item: T) -> R:
        async with gate:
            return await fn(item)

    return list(await asyncio.gather(*(bounded(item) for item in items)))


async def asettle(value: Any) -> None:
    """Await ``value`` if a callback returned an awaitable (an ``async def`` callback).

    The async twin writes ``await _twins.asettle(callback(x))``; the generator
    turns that into ``_twins.settle(callback(x))`` for the sync twin, whose
    callbacks are plain functions.
    """
    if inspect.isawaitable(value):
        await value


def settle(value: Any) -> None:
    """The sync twin's :func:`asettle`: a callback's return value is ignored."""


__all__ = ["asettle", "concurrently", "settle", "sync_property"]
