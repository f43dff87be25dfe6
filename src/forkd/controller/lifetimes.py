"""Sandbox lifetimes: ``timeout_secs`` at spawn or fork, extended by ``POST .../timeout``.

The ``DeadlineKeeper`` owns every sandbox's deadline. A deadline is an absolute wall
clock time (``expires_at_unix``) kept in the sandbox's registry row, so it
survives a daemon restart: ``start`` (run by ``Runtime.open`` after recovery)
kills the sandboxes that expired while no daemon ran before the API serves
anything, and schedules the rest.

One background task sleeps until the earliest deadline (or until a deadline
changes, which wakes it) and kills what is due through ``SandboxTable.kill``,
i.e. with the sandbox's lock, as ``DELETE`` would: QEMU, cgroup, run directory
and row all go. It never polls: with no deadline it sleeps until woken. The
sleep is capped (``MAX_SLEEP_SECS``) only so that a wall-clock step (NTP)
cannot postpone a kill by more than that.

Warm-pool members never expire: they get a deadline only when a spawn claims
them (the spawn's own ``timeout_secs``, counted from the claim).
``set_timeout`` follows E2B's ``set_timeout``: the new deadline is
now + ``timeout_secs``, whether that is sooner or later than the old one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from forkd import bounds
from forkd.controller.background import cancel_and_wait
from forkd.controller.sandbox_events import SandboxEvents
from forkd.controller.sandboxes import SandboxTable
from forkd.errors import Conflict, ForkdError, GuestError, NotFound, NotHibernatable
from forkd.store.records import SandboxRecord
from forkd.store.rows.sandboxes import ExpiryRows

log = logging.getLogger("forkd.lifetimes")

# Upper bound on one sleep, so a wall-clock step cannot delay a kill by more.
MAX_SLEEP_SECS = 60.0
# An expired sandbox that was busy when it was to be hibernated is tried again this much later.
HIBERNATE_RETRY_SECS = 2.0
# ... and one whose hibernation failed otherwise (a full disk), this much later.
HIBERNATE_FAILED_RETRY_SECS = 30.0


class Hibernate(Protocol):
    """``Hibernator.hibernate``: ``memory`` False keeps the disk alone."""

    def __call__(self, sandbox_id: str, *, memory: bool = True) -> Awaitable[object]: ...


class DeadlineKeeper:
    def __init__(self, sandboxes: ExpiryRows, table: SandboxTable, events: SandboxEvents,
                 clock: Callable[[], float] = time.time, *, hibernate: Hibernate | None = None) -> None:
        """``hibernate``: where a due sandbox spawned with ``hibernate_on_timeout`` goes
        (``Hibernator.hibernate``; with ``memory=False`` for one whose ``hibernate_on_timeout_memory``
        is False); None: it is killed like any other."""
        self._sandboxes = sandboxes
        self._table = table
        self._clock = clock
        self._deadlines: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._hibernate = hibernate
        events.on_removed(self.after_removed)

    # ----------------------------------------------------------------- life

    async def start(self) -> None:
        """Adopt the deadlines in the registry; kill what already expired; start the task."""
        for sb in self._sandboxes.all():
            if sb.expires_at_unix is not None and not sb.pooled:
                self._deadlines[sb.id] = sb.expires_at_unix
        await self._reap_due()  # before the API serves: an expired sandbox is never seen alive
        self._task = asyncio.create_task(self._run(), name="forkd-reaper")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    # -------------------------------------------------------------- deadlines

    def apply(self, records: Iterable[SandboxRecord], timeout_secs: float | None, *,
              hibernate: bool = False, memory: bool = True, auto_resume: bool = True) -> None:
        """Give freshly spawned (or claimed, or forked) sandboxes ``timeout_secs`` to live;
        ``hibernate``: then hibernate them rather than kill them (``memory`` False: to their disk
        alone, E2B's filesystem-only pause); ``auto_resume`` False: once
        hibernated, E2B traffic does not wake them (E2B's ``autoResume``), only a resume."""
        records = list(records)
        if not auto_resume:
            for record in records:
                record.auto_resume = False
                self._sandboxes.set_auto_resume(record.id, False)
        if timeout_secs is None:
            return
        bounds.SANDBOX_TIMEOUT_SECS.check(timeout_secs)
        expires = self._clock() + timeout_secs
        for record in records:
            record.expires_at_unix = expires
            if hibernate:
                record.hibernate_on_timeout, record.hibernate_on_timeout_memory = True, memory
                self._sandboxes.set_hibernate_on_timeout(record.id, True, memory)
            self._set(record.id, expires)

    def set_timeout(self, sandbox_id: str, timeout_secs: float) -> float:
        """The sandbox now expires ``timeout_secs`` from now (sooner or later than before);
        0: now (E2B's ``set_timeout(0)``, which SDK users call to pause or kill at once)."""
        if timeout_secs != 0:
            bounds.SANDBOX_TIMEOUT_SECS.check(timeout_secs)
        sandbox_id = self._table.resolve(sandbox_id)
        if not self._sandboxes.has(sandbox_id):
            raise NotFound(f"sandbox {sandbox_id!r} is not alive")
        expires = self._clock() + timeout_secs
        self._set(sandbox_id, expires)
        return expires

    def deadline(self, sandbox_id: str) -> float | None:
        return self._deadlines.get(sandbox_id)

    def _set(self, sandbox_id: str, expires: float) -> None:
        self._sandboxes.set_expiry(sandbox_id, expires)
        self._deadlines[sandbox_id] = expires
        self._wake.set()

    async def after_removed(self, record: SandboxRecord) -> None:
        """``SandboxEvents.removed`` hook: a killed sandbox has no deadline any more."""
        self._deadlines.pop(record.id, None)

    # ------------------------------------------------------------------ task

    def next_sleep(self) -> float:
        """Seconds until the earliest deadline (capped), 0 if one is due."""
        if not self._deadlines:
            return MAX_SLEEP_SECS
        return max(0.0, min(MAX_SLEEP_SECS, min(self._deadlines.values()) - self._clock()))

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.next_sleep())
            await self._reap_due()

    async def _reap_due(self) -> None:
        now = self._clock()
        due = [sb_id for sb_id, t in self._deadlines.items() if t <= now]
        for sb_id in due:
            del self._deadlines[sb_id]
        # Concurrently: one sandbox whose kill waits out a branch must not delay the others.
        results = await asyncio.gather(*(self._kill(sb_id) for sb_id in due), return_exceptions=True)
        for sb_id, result in zip(due, results, strict=True):
            if isinstance(result, BaseException) and not isinstance(result, NotFound):
                log.error("could not reap expired sandbox %s: %s", sb_id, result)

    async def _kill(self, sandbox_id: str) -> None:
        try:
            record = self._sandboxes.get(sandbox_id)
        except NotFound:
            return
        if record.hibernate_on_timeout and self._hibernate is not None:
            if record.hibernation is None:
                try:
                    memory = record.hibernate_on_timeout_memory
                    log.info("sandbox %s expired; hibernating it%s", sandbox_id,
                             "" if memory else " (disk only)")
                    await self._hibernate(sandbox_id, memory=memory)
                except (GuestError, NotHibernatable) as exc:  # its QEMU died, or it cannot be
                    log.warning("expired sandbox %s cannot be hibernated (%s); killing it", sandbox_id, exc)
                    await self._table.kill(sandbox_id)
                    return
                except Conflict as exc:  # busy right now: it runs on, and is tried again shortly
                    log.info("expired sandbox %s not hibernated yet: %s", sandbox_id, exc)
                    self._set(sandbox_id, self._clock() + HIBERNATE_RETRY_SECS)
                    return
                except (ForkdError, OSError) as exc:  # e.g. a full disk: its state is worth a retry
                    log.error("could not hibernate expired sandbox %s (%s); trying again in %.0f s",
                              sandbox_id, exc, HIBERNATE_FAILED_RETRY_SECS)
                    self._set(sandbox_id, self._clock() + HIBERNATE_FAILED_RETRY_SECS)
                    return
            # Hibernated, it has no deadline: a wake (E2B's connect) gives it a new one.
            self._sandboxes.set_expiry(sandbox_id, None)
            return
        log.info("sandbox %s expired; killing it", sandbox_id)
        await self._table.kill(sandbox_id)
