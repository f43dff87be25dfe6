"""What happens to live sandboxes, told to whoever must react: one typed hook per event.

``Runtime`` makes one ``SandboxEvents`` first and passes it to each owner at
construction, and each owner subscribes itself there (its ``__init__``): no one
wires hooks onto another owner afterwards. The owners that *cause* an event fire
it (the table tears a sandbox down, the agent gateway runs a request, the owners
of exec/eval/processes/cells finish a turn of work); the owners that *react*
subscribe:

* ``removed``: a sandbox was torn down (the fork collector, the pool keeper,
  networks, deadlines, idle pauses, disk quotas, hibernation forget it);
* ``turn_done``: a turn of work a caller asked of a sandbox ended (auto-checkpoints);
* ``killing``: a kill is about to take the sandbox's lock (a live branch finishes
  copying the source's RAM first);
* ``during`` / ``wake_locked``: activity, one watcher (idle pauses resume a paused one);
* ``wake``: a request to a hibernated sandbox wakes it first, one waker (hibernation).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from forkd.store.records import SandboxRecord

log = logging.getLogger("forkd.sandboxes")

RemovedHook = Callable[[SandboxRecord], Awaitable[None]]
SandboxHook = Callable[[str], Awaitable[None]]


class Activity(Protocol):
    """Who must know when a sandbox is used (controller/idle.py pauses idle ones)."""

    def during(self, sandbox_id: str) -> AbstractAsyncContextManager[None]:
        """Around one agent request of ``sandbox_id`` (resumes it first if it was paused)."""
        ...

    async def wake_locked(self, sandbox_id: str) -> None:
        """Resume ``sandbox_id`` if paused; the caller holds its lock (a branch about to capture it)."""
        ...


class Sleepers(Protocol):
    """Who wakes hibernated sandboxes (controller/hibernation.py)."""

    async def wake(self, sandbox_id: str) -> bool:
        """Wake ``sandbox_id`` if it is hibernated (True once it runs); False if it is not."""
        ...


class _NoActivity:
    @contextlib.asynccontextmanager
    async def during(self, sandbox_id: str) -> AsyncIterator[None]:
        yield

    async def wake_locked(self, sandbox_id: str) -> None:
        return None


class SandboxEvents:
    def __init__(self) -> None:
        self._removed: list[RemovedHook] = []
        self._turns: list[SandboxHook] = []
        self._kill_guards: list[SandboxHook] = []
        self._activity: Activity = _NoActivity()
        self._sleepers: Sleepers | None = None

    # ------------------------------------------------------------- subscribe

    def on_removed(self, hook: RemovedHook) -> None:
        """Await ``hook(record)`` after every sandbox torn down from now on (in subscription order)."""
        self._removed.append(hook)

    def after_turn(self, hook: SandboxHook) -> None:
        """Await ``hook(sandbox_id)`` after every turn of work a caller asked of a sandbox (an exec,
        an eval, a started process or a code cell), before it answers: auto-checkpoints count them."""
        self._turns.append(hook)

    def before_kill(self, guard: SandboxHook) -> None:
        """Await ``guard(sandbox_id)`` before every kill takes the sandbox's lock.

        The brancher uses it to let a live ``wait: false`` branch finish copying the
        source's RAM: killing the QEMU mid-copy would lose a snapshot the user asked for.
        """
        self._kill_guards.append(guard)

    def watch_activity(self, activity: Activity) -> None:
        """Every agent request from now on runs inside ``activity.during`` (one watcher)."""
        self._activity = activity

    def wake_with(self, sleepers: Sleepers) -> None:
        """From now on a request to a hibernated sandbox wakes it first (one waker)."""
        self._sleepers = sleepers

    # ------------------------------------------------------------------ fire

    async def removed(self, record: SandboxRecord) -> None:
        """A sandbox was torn down: every hook hears it, whatever the others do."""
        for hook in self._removed:
            try:
                await hook(record)
            except Exception:  # a hook's failure must not fail the kill that already happened
                log.exception("after removing %s", record.id)

    async def turn_done(self, sandbox_id: str) -> None:
        """One turn of work was asked of ``sandbox_id`` (each owner of such work calls this)."""
        for hook in self._turns:
            await hook(sandbox_id)

    async def killing(self, sandbox_id: str) -> None:
        """A kill of ``sandbox_id`` is about to take its lock."""
        for guard in self._kill_guards:
            await guard(sandbox_id)

    def during(self, sandbox_id: str) -> AbstractAsyncContextManager[None]:
        """Around one agent request (or relay) of ``sandbox_id``."""
        return self._activity.during(sandbox_id)

    async def wake_locked(self, sandbox_id: str) -> None:
        """Make sure ``sandbox_id`` runs before the caller, holding its lock, uses its VM directly."""
        await self._activity.wake_locked(sandbox_id)

    async def wake(self, sandbox_id: str) -> bool:
        """Wake ``sandbox_id`` if it is hibernated (False if it is not, or no one can)."""
        if self._sleepers is None:
            return False
        return await self._sleepers.wake(sandbox_id)


__all__ = ["Activity", "SandboxEvents", "Sleepers"]
