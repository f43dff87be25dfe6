"""Pause and resume: a sandbox stopped after a branch of its state, and started again from it.

One mechanism for E2B's ``pause`` / resume-by-``connect`` and forkd 0.5's
workspace ``suspend`` / ``resume``:

* pause: BRANCH the running sandbox to a state snapshot ``paused-<id>-<n>``
  (mode ``full`` by default: its state as of the request), record a
  ``PausedRecord`` (its spawn options and labels), then kill it. Its id is free,
  its memory and CPU given back; only the snapshot's files remain.
* resume: restore one child from the state snapshot *under the same id*, with
  the recorded options, labels and egress policy, and forget the record. The state snapshot
  becomes ``auto_delete``: the resumed child runs from it, and it goes once no
  sandbox runs from it and no snapshot depends on it (the next pause's state
  does, while that one is kept).
* discard (a kill while paused): forget the record and mark the state
  snapshot ``auto_delete``; the caller collects it.

A failed pause leaves the sandbox running (the branch resumed it) and nothing
recorded; a failed resume keeps the record and the snapshot, so it can be tried
again.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from forkd.controller.branch import Brancher
from forkd.controller.child_specs import ChildSpec
from forkd.controller.idle import IdlePauser
from forkd.controller.options import SpawnOptions
from forkd.controller.results import SandboxView
from forkd.controller.sandboxes import SandboxTable
from forkd.controller.snapshots import SnapshotStore
from forkd.controller.spawner import Spawner
from forkd.errors import Conflict, ForkdError, NotFound
from forkd.host.egress import EgressPolicy
from forkd.store.layout import check_sandbox_id
from forkd.store.records import PausedRecord, SandboxRecord, now_unix
from forkd.store.rows.paused import PausedRows
from forkd.store.rows.sandboxes import SandboxReader
from forkd.store.volume_spec import is_shared
from forkd.vmm import disk as disk_mod

log = logging.getLogger("forkd.suspend")

STATE_PREFIX = "paused-"


def disk_mib(record: SandboxRecord) -> int:
    """The size of a sandbox's guest disk, from its overlay's qcow2 header (0 if unreadable)."""
    try:
        return disk_mod.qcow2_virtual_size(Path(record.disk.file)) >> 20
    except (OSError, ForkdError):
        return 0


def view(record: SandboxRecord | PausedRecord, template: str) -> SandboxView:
    """A sandbox, running or paused, as the E2B layer describes it (a hibernated one is paused:
    E2B's ``connect`` and any envd traffic resume it)."""
    if isinstance(record, PausedRecord):
        return {"id": record.id, "template": template, "state": record.state.e2b,
                "started": record.started_unix,
                "ends": None, "vcpus": record.vcpus, "mem_mib": record.mem_mib, "disk_mb": record.disk_mib,
                "metadata": dict(record.metadata), "egress": EgressPolicy.from_info(record.egress).info(),
                "auto_resume": True, "volume_mounts": []}
    return {"id": record.id, "template": template, "state": record.state.e2b,
            "started": record.started_unix, "ends": record.expires_at_unix, "vcpus": record.config.vcpus,
            "mem_mib": record.config.mem_mib, "disk_mb": disk_mib(record), "metadata": dict(record.metadata),
            "egress": record.egress.info(),
            # A disk-only hibernation is woken by an explicit resume alone in E2B's terms.
            "auto_resume": record.auto_resume and (record.hibernation is None or record.hibernation.memory),
            "volume_mounts": [{"name": str(v["name"]), "path": str(v["mount"])}
                              for v in record.volumes if is_shared(v)]}


class Suspender:
    def __init__(self, paused: PausedRows, sandboxes: SandboxReader, table: SandboxTable, brancher: Brancher,
                 spawner: Spawner, store: SnapshotStore, idle: IdlePauser) -> None:
        self._paused = paused  # the paused_sandboxes table: only this owner writes it
        self._sandboxes = sandboxes
        self._idle = idle
        self._table = table
        self._brancher = brancher
        self._spawner = spawner
        self._store = store
        self._busy: set[str] = set()  # ids being paused or resumed right now

    @asynccontextmanager
    async def _exclusive(self, sandbox_id: str) -> AsyncIterator[None]:
        if sandbox_id in self._busy:
            raise Conflict(f"sandbox {sandbox_id} is being paused or resumed already; retry shortly")
        self._busy.add(sandbox_id)
        try:
            yield
        finally:
            self._busy.discard(sandbox_id)

    def template_of(self, record: SandboxRecord) -> str:
        """The snapshot a sandbox was first forked from, through its pauses and forks.

        A resumed sandbox runs from its state snapshot, a fork child from a fork
        snapshot; both are ``auto_delete``, snapshots nobody asked for by name.
        """
        tag = record.snapshot_tag
        for _ in range(256):  # lineage is a chain; the bound only guards a corrupt registry
            try:
                snap = self._store.get(tag)
            except NotFound:
                return tag
            if not snap.auto_delete or not snap.parent_tag:
                return tag
            tag = snap.parent_tag
        return tag

    def _state_tag(self, sandbox_id: str) -> str:
        n = 1
        while self._store.exists(f"{STATE_PREFIX}{sandbox_id}-{n}"):
            n += 1
        return f"{STATE_PREFIX}{sandbox_id}-{n}"

    async def pause(self, sandbox_id: str, *, mode: str = "full") -> PausedRecord:
        check_sandbox_id(sandbox_id)
        sandbox_id = self._table.resolve(sandbox_id)
        if self._paused.has(sandbox_id):
            if sandbox_id not in self._table:
                raise Conflict(f"sandbox {sandbox_id} is already paused")
            self.discard(sandbox_id)  # a daemon died mid-pause: the live sandbox wins
        async with self._exclusive(sandbox_id):
            self._table.get(sandbox_id)  # 404 / died, before anything is written
            record = self._sandboxes.get(sandbox_id)
            state = await self._brancher.branch(sandbox_id, self._state_tag(sandbox_id), mode, wait=True)
            paused = PausedRecord(
                id=sandbox_id, state_tag=state.tag, template=self.template_of(record),
                created_at_unix=record.created_at_unix, started_unix=record.started_unix,
                paused_at_unix=now_unix(),
                metadata=dict(record.metadata), memory_limit_mib=record.memory_limit_mib,
                cpu_limit=record.cpu_limit, pids_limit=record.pids_limit,
                # Its own forkd-<id> namespace (a snapshot with a NIC) comes back by itself; only a
                # forkd-child-<i> one was asked for.
                per_child_netns=record.per_child_netns, live_fork=record.live_fork,
                vcpus=record.config.vcpus, mem_mib=record.config.mem_mib, disk_mib=disk_mib(record),
                egress=record.egress.info(), idle_pause_secs=record.idle_pause_secs,
                disk_quota_mib=record.disk_quota_mib, idle_hibernate_secs=record.idle_hibernate_secs,
                hibernate_on_timeout=record.hibernate_on_timeout,
                hibernate_on_timeout_memory=record.hibernate_on_timeout_memory)
            # Recorded before the kill: a daemon that dies in between finds the sandbox
            # alive and paused, and a resume then keeps the live one (see resume).
            self._paused.insert(paused)
            try:
                await self._table.kill(sandbox_id)
            except ForkdError:
                self._paused.delete(sandbox_id)
                self._store.set_auto_delete(state.tag, True)
                raise
            log.info("paused %s into %s", sandbox_id, state.tag)
            return paused

    async def resume(self, sandbox_id: str) -> SandboxRecord:
        """Start a paused sandbox again, under its id; 404 if it is not paused."""
        check_sandbox_id(sandbox_id)
        async with self._exclusive(sandbox_id):
            paused = self._paused.get(sandbox_id)
            if sandbox_id in self._table:
                # It was never killed (a daemon died mid-pause): the live one wins.
                self._forget(paused)
                return self._sandboxes.get(sandbox_id)
            # A quota of 0 (none) stays none, rather than becoming the daemon's default.
            spec = ChildSpec(memory_limit_mib=paused.memory_limit_mib, metadata=dict(paused.metadata),
                             cpu_limit=paused.cpu_limit, pids_limit=paused.pids_limit, sandbox_id=sandbox_id,
                             disk_quota_mib=paused.disk_quota_mib or 0)
            [outcome] = await self._spawner.spawn_each(paused.state_tag, [spec], SpawnOptions(
                per_child_netns=paused.per_child_netns, live_fork=paused.live_fork,
                egress=EgressPolicy.from_info(paused.egress)))
            if isinstance(outcome, ForkdError):
                raise outcome
            self._paused.delete(sandbox_id)
            self._store.set_auto_delete(paused.state_tag, True)  # the child holds it from now on
            self._idle.apply([outcome], paused.idle_pause_secs)
            self._idle.apply_hibernate([outcome], paused.idle_hibernate_secs)
            # Not in its row yet: the caller's deadline (Runtime.resume) writes it with the timeout.
            outcome.hibernate_on_timeout = paused.hibernate_on_timeout
            outcome.hibernate_on_timeout_memory = paused.hibernate_on_timeout_memory
            log.info("resumed %s from %s", sandbox_id, paused.state_tag)
            return outcome

    def discard(self, sandbox_id: str) -> None:
        """Forget a paused sandbox; its state snapshot is left for the caller to collect."""
        paused = self._paused.get(sandbox_id)
        if sandbox_id in self._busy:
            raise Conflict(f"sandbox {sandbox_id} is being resumed; retry shortly")
        self._forget(paused)

    def _forget(self, paused: PausedRecord) -> None:
        self._paused.delete(paused.id)
        if self._store.exists(paused.state_tag):
            self._store.set_auto_delete(paused.state_tag, True)

    def get(self, sandbox_id: str) -> PausedRecord:
        return self._paused.get(check_sandbox_id(sandbox_id))

    def has(self, sandbox_id: str) -> bool:
        """Whether ``sandbox_id`` is paused (no id check: the caller checked it)."""
        return self._paused.has(sandbox_id)

    def all(self) -> list[PausedRecord]:
        return self._paused.all()

    def holding(self, tags: list[str]) -> list[str]:
        """The paused sandboxes whose state is one of ``tags`` (they need it to resume)."""
        wanted = set(tags)
        return [p.id for p in self._paused.all() if p.state_tag in wanted]


__all__ = ["STATE_PREFIX", "Suspender", "view"]
