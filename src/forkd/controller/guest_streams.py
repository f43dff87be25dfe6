"""Event streams from a sandbox's agent: bounded per sandbox, typed, and ended exactly once.

Processes (``processes.py``) and kernel cells (``kernel_cells.py``) both turn
an ``AgentStream`` of raw guest dicts into checked events. What they share
lives here: each sandbox may hold only so many streams open at once (each one
holds up to a flow-control window of the daemon's memory), a stream that ends
or breaks gives its slot back once, and a broken stream is explained by the
sandbox's kill or death when that is what broke it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from forkd.controller.agent_gateway import AgentGateway
from forkd.errors import Busy, ForkdError, GuestError
from forkd.guest.client import AgentStream

E = TypeVar("E")


class StreamSlots:
    """How many streams each sandbox has open, bounded by ``limit``."""

    def __init__(self, agents: AgentGateway, limit: int, what: str, when_full: str) -> None:
        self._agents = agents
        self._limit = limit
        self._what = what  # "process streams", for the 429's message
        self._when_full = when_full  # what the caller can do about it
        self._open: dict[str, int] = {}

    async def open(self, sandbox_id: str, opener: Callable[[], Awaitable[AgentStream]]) -> AgentStream:
        """``opener()``'s stream, in one of ``sandbox_id``'s slots (``Busy`` if none is free)."""
        if self._open.get(sandbox_id, 0) >= self._limit:
            raise Busy(f"sandbox {sandbox_id!r} already has {self._limit} {self._what}; {self._when_full}")
        self._open[sandbox_id] = self._open.get(sandbox_id, 0) + 1
        try:
            return await opener()
        except BaseException:
            self.closed(sandbox_id)
            raise

    def closed(self, sandbox_id: str) -> None:
        left = self._open.get(sandbox_id, 0) - 1
        if left > 0:
            self._open[sandbox_id] = left
        else:
            self._open.pop(sandbox_id, None)

    def explain(self, sandbox_id: str, exc: GuestError) -> GuestError:
        """``exc``, or the sandbox's kill or death if that is what broke the stream."""
        return self._agents.explain(sandbox_id, exc)


class GuestEvents(Generic[E]):
    """``async for event in events``; ``aclose()`` stops watching. Subclasses say what an event is."""

    def __init__(self, slots: StreamSlots, sandbox_id: str, stream: AgentStream) -> None:
        self._slots = slots
        self._sandbox_id = sandbox_id
        self._stream = stream
        self._done = False

    # ------------------------------------------------------------ what subclasses say

    def _event(self, raw: dict[str, Any]) -> E:
        """The checked event for what the guest sent (``GuestError`` if it makes no sense)."""
        raise NotImplementedError

    def _is_last(self, event: E) -> bool:
        raise NotImplementedError

    async def _next_raw(self) -> dict[str, Any]:
        return await self._stream.__anext__()

    def _broken(self) -> None:
        """The stream failed: by default stop counting it; a subclass may also stop the guest's side."""
        self._finish()

    def _on_close(self) -> None:
        """Closed before its last event (a caller that went away)."""

    # ------------------------------------------------------------ the stream

    def __aiter__(self) -> GuestEvents[E]:
        return self

    async def __anext__(self) -> E:
        if self._done:
            raise StopAsyncIteration
        try:
            event = self._event(await self._next_raw())
        except StopAsyncIteration:
            self._finish()
            raise
        except GuestError as exc:
            self._broken()
            raise self._slots.explain(self._sandbox_id, exc) from exc
        except ForkdError:
            self._broken()
            raise
        if self._is_last(event):
            self._finish()
        return event

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            self._slots.closed(self._sandbox_id)

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """Stop watching (idempotent)."""
        if self._done:
            return
        self._finish()
        self._stream.close()
        self._on_close()
