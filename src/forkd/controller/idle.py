"""Idle pauses: a sandbox spawned with ``idle_pause_secs`` is paused once idle that long.

Opt-in per spawn and off by default: a child with background work (a server, a
training loop) must never be stopped behind its user's back. A paused child
(QMP ``stop``) costs no CPU at all; its next request of any kind (exec, eval,
ping, files, a branch or a fork of it) resumes it first, transparently: QMP
``cont``, then the agent steps the guest's clock to the host's (it stood still
while the vCPUs were stopped; nothing was cloned, so nothing is reseeded).

``IdlePauser`` owns, for every sandbox with a policy: its idle limit (kept in
the sandbox's registry row, so a restart keeps it), when it was last used, the
requests in flight and whether it is paused. It watches activity in one place
(``SandboxEvents.watch_activity``, at its construction): every agent call runs
inside ``during``, and the events' ``wake_locked`` (called by the Brancher
under the sandbox's lock before a capture) resumes a paused source.

One background task sleeps until the next sandbox is due and pauses it under
the sandbox's lock, so a pause never overlaps a branch's pause window or a
kill, and only while no request is in flight and no migration (a live
branch's background copy) runs. After a restart, ``start`` takes the policies
back from the registry and asks each QEMU whether it is paused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass

from forkd import bounds
from forkd.controller.background import cancel_and_wait
from forkd.controller.sandbox_events import SandboxEvents
from forkd.controller.sandboxes import SandboxTable
from forkd.errors import ForkdError
from forkd.store.records import SandboxRecord
from forkd.store.rows.sandboxes import IdlePauseRows

log = logging.getLogger("forkd.idle")

# A resumed guest answers its clock step in milliseconds; this only catches a wedged one.
WAKE_TIMEOUT_SECS = 30.0
# Upper bound on one sleep of the pause task (it is woken whenever a policy changes).
MAX_SLEEP_SECS = 60.0


@dataclass
class _Idle:
    limit: float | None  # seconds of no activity before a pause; None: never paused
    last: float  # monotonic time of the last activity
    in_flight: int = 0
    paused: bool = False
    hibernate_after: float | None = None  # seconds of no activity before a hibernation

    def due(self, now: float) -> tuple[bool, bool]:
        """Whether it is due for a pause, and for a hibernation (nothing in flight)."""
        if self.in_flight:
            return False, False
        idle = now - self.last
        return (not self.paused and self.limit is not None and idle >= self.limit,
                self.hibernate_after is not None and idle >= self.hibernate_after)

    def next_due(self, now: float) -> float | None:
        """Seconds until its next pause or hibernation, if it has one coming."""
        if self.in_flight:
            return None
        times = [self.last + limit - now for limit in (None if self.paused else self.limit,
                                                       self.hibernate_after) if limit is not None]
        return min(times) if times else None


class IdlePauser:
    def __init__(self, sandboxes: IdlePauseRows, table: SandboxTable, events: SandboxEvents,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._sandboxes = sandboxes
        self._table = table
        self._clock = clock
        self._idle: dict[str, _Idle] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.pauses = 0  # counters for /metrics
        self.resumes = 0
        # Who hibernates a sandbox idle for its ``idle_hibernate_secs`` (controller/hibernation.py).
        self._hibernate: Callable[[str], Awaitable[object]] | None = None
        events.watch_activity(self)
        events.on_removed(self.after_removed)

    def hibernate_with(self, hibernate: Callable[[str], Awaitable[object]]) -> None:
        """From now on sandboxes idle for their ``idle_hibernate_secs`` go to ``hibernate(id)``
        (the Hibernator says so at its construction: it needs this pauser, so it comes later)."""
        self._hibernate = hibernate

    # ----------------------------------------------------------------- life

    async def start(self) -> None:
        """Take the policies back from the registry (re-adopted sandboxes) and start the task."""
        for sb in self._sandboxes.all():
            if (sb.idle_pause_secs is None and sb.idle_hibernate_secs is None) or sb.pooled \
                    or sb.id not in self._table:
                continue
            entry = self._idle[sb.id] = _Idle(sb.idle_pause_secs, self._clock(),
                                              hibernate_after=sb.idle_hibernate_secs)
            vm = self._table.vm(sb.id)
            with contextlib.suppress(ForkdError, OSError):
                entry.paused = vm is not None and await vm.is_paused()
        self._task = asyncio.create_task(self._run(), name="forkd-idle-pauser")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    # ------------------------------------------------------------- policies

    def apply(self, records: Iterable[SandboxRecord], idle_pause_secs: float | None) -> None:
        """Freshly spawned (or claimed) sandboxes are paused after ``idle_pause_secs`` idle."""
        if idle_pause_secs is None:
            return
        bounds.IDLE_PAUSE_SECS.check(idle_pause_secs)
        for record in records:
            record.idle_pause_secs = idle_pause_secs
            self._sandboxes.set_idle_pause(record.id, idle_pause_secs)
            self.track(record)

    def apply_hibernate(self, records: Iterable[SandboxRecord], idle_hibernate_secs: float | None) -> None:
        """Freshly spawned (or forked, or claimed) sandboxes are hibernated after that long idle."""
        if idle_hibernate_secs is None:
            return
        bounds.IDLE_HIBERNATE_SECS.check(idle_hibernate_secs)
        for record in records:
            record.idle_hibernate_secs = idle_hibernate_secs
            self._sandboxes.set_idle_hibernate(record.id, idle_hibernate_secs)
            self.track(record)

    def track(self, record: SandboxRecord) -> None:
        """Watch a running sandbox by its record's policies (a woken one: idle from now)."""
        if record.idle_pause_secs is None and record.idle_hibernate_secs is None:
            return
        self._idle[record.id] = _Idle(record.idle_pause_secs, self._clock(),
                                      hibernate_after=record.idle_hibernate_secs)
        self._wake.set()

    def forget(self, sandbox_id: str) -> None:
        """A hibernated sandbox is not watched until it runs again (``track``)."""
        self._idle.pop(sandbox_id, None)

    def paused(self, sandbox_id: str) -> bool:
        entry = self._idle.get(sandbox_id)
        return entry is not None and entry.paused

    def counts(self) -> dict[str, int]:
        """Sandboxes with a policy, how many are paused now, pauses and resumes so far."""
        return {"tracked": len(self._idle), "paused": sum(e.paused for e in self._idle.values()),
                "pauses": self.pauses, "resumes": self.resumes}

    async def after_removed(self, record: SandboxRecord) -> None:
        """``SandboxEvents.removed`` hook."""
        self._idle.pop(record.id, None)

    # ------------------------------------------------- the activity watcher

    @contextlib.asynccontextmanager
    async def during(self, sandbox_id: str) -> AsyncIterator[None]:
        """Around one agent request: resume the sandbox first if paused; no pause meanwhile."""
        entry = self._idle.get(sandbox_id)
        if entry is None:
            yield
            return
        entry.in_flight += 1  # before any await: a pause starting now sees it and backs off
        try:
            if entry.paused:
                async with self._table.lock(sandbox_id):
                    await self._resume(sandbox_id, entry)
            yield
        finally:
            entry.in_flight -= 1
            entry.last = self._clock()
            self._wake.set()

    async def wake_locked(self, sandbox_id: str) -> None:
        """Resume a paused sandbox whose lock the caller holds (a branch about to capture it)."""
        entry = self._idle.get(sandbox_id)
        if entry is None:
            return
        if entry.paused:
            await self._resume(sandbox_id, entry)
        entry.last = self._clock()
        self._wake.set()

    async def _resume(self, sandbox_id: str, entry: _Idle) -> None:
        if not entry.paused:  # another request resumed it while this one waited for the lock
            return
        vm = self._table.get(sandbox_id)  # 404 / 502 for a sandbox that is gone or dead
        await vm.resume()
        entry.paused = False
        self.resumes += 1
        # The guest's clock stood still while its vCPUs were stopped.
        await vm.await_or_exit(vm.step_clock(WAKE_TIMEOUT_SECS), WAKE_TIMEOUT_SECS + 5,
                               "the resumed guest agent (clock step)")

    # ----------------------------------------------------------------- task

    def next_sleep(self) -> float:
        """Seconds until the next running sandbox with nothing in flight is due (capped)."""
        now = self._clock()
        due = [t for e in self._idle.values() if (t := e.next_due(now)) is not None]
        return max(0.0, min([MAX_SLEEP_SECS, *due]))

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.next_sleep())
            await self.pause_due()
            await self.hibernate_due()

    async def pause_due(self) -> list[str]:
        """Pause every sandbox idle for its limit with nothing in flight; the ids paused."""
        now = self._clock()
        due = [sb_id for sb_id, e in self._idle.items() if e.due(now)[0]]
        results = await asyncio.gather(*(self._pause(sb_id) for sb_id in due), return_exceptions=True)
        for sb_id, result in zip(due, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("could not pause idle sandbox %s: %s", sb_id, result)
                entry = self._idle.get(sb_id)
                if entry is not None:
                    entry.last = self._clock()  # try again one idle period later
        return [sb_id for sb_id in due if self.paused(sb_id)]

    async def hibernate_due(self) -> list[str]:
        """Hibernate every sandbox idle for its ``idle_hibernate_secs``; the ids hibernated."""
        hibernate = self._hibernate
        now = self._clock()
        due = [sb_id for sb_id, e in self._idle.items() if e.due(now)[1]]
        if hibernate is None or not due:
            return []
        results = await asyncio.gather(*(hibernate(sb_id) for sb_id in due), return_exceptions=True)
        done: list[str] = []
        for sb_id, result in zip(due, results, strict=True):
            if not isinstance(result, BaseException):
                done.append(sb_id)
                continue
            # Busy meanwhile (409), or it failed: it runs on, and is tried one idle period later.
            log.info("idle sandbox %s not hibernated: %s", sb_id, result)
            entry = self._idle.get(sb_id)
            if entry is not None:
                entry.last = self._clock()
        return done

    async def _pause(self, sandbox_id: str) -> None:
        async with self._table.lock(sandbox_id):
            entry = self._idle.get(sandbox_id)
            vm = self._table.vm(sandbox_id)
            # Re-checked under the lock: a request may have started, a kill removed it.
            if (entry is None or vm is None or not entry.due(self._clock())[0]
                    or not vm.process.alive()):
                return
            if await vm.migrating():
                entry.last = self._clock()  # a live branch is still copying: look again later
                return
            await vm.pause()
            entry.paused = True
            self.pauses += 1
            log.info("sandbox %s idle for %.0f s: paused", sandbox_id, entry.limit)


__all__ = ["IdlePauser"]
