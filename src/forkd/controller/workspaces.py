"""Workspaces (forkd 0.5's ``/v1/workspaces``): a named sandbox that lives through suspend/resume.

A workspace is a name for one sandbox id. ``suspend`` and ``resume`` are the
``Suspender``'s pause and resume (the same mechanism as E2B's), so the sandbox
keeps its id across them. The status is read, not stored: ``running`` while the
sandbox is alive, ``suspended`` while it is paused, ``stale`` when it is neither
(killed, expired, or gone with a daemon that did not keep its sandboxes);
resuming a stale workspace starts a fresh sandbox from its source snapshot,
under the same id.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Final

from forkd.controller.child_specs import ChildSpec
from forkd.controller.options import SpawnOptions
from forkd.controller.results import WorkspaceReport, WorkspaceStatus
from forkd.controller.sandboxes import SandboxTable
from forkd.controller.spawner import Spawner
from forkd.controller.suspend import Suspender
from forkd.errors import Conflict, ForkdError, NotFound
from forkd.store.layout import check_tag
from forkd.store.records import WorkspaceRecord, now_unix
from forkd.store.rows.paused import PausedReader
from forkd.store.rows.workspaces import WorkspaceRows

RUNNING: Final = "running"
SUSPENDED: Final = "suspended"
STALE: Final = "stale"


class Workspaces:
    def __init__(self, workspaces: WorkspaceRows, paused: PausedReader, table: SandboxTable,
                 spawner: Spawner, suspender: Suspender, collect: Callable[[], Awaitable[object]],
                 wake: Callable[[str], Awaitable[object]]) -> None:
        self._workspaces = workspaces  # the workspaces table: only this owner writes it
        self._paused = paused
        self._table = table
        self._spawner = spawner
        self._suspender = suspender
        self._collect = collect  # drops the state snapshots nobody needs any more (Forker.collect)
        self._wake = wake  # a hibernated sandbox back in a VM (Hibernator.wake): a suspend branches it

    def _status(self, ws: WorkspaceRecord) -> WorkspaceStatus:
        # A hibernated sandbox (a row, no VM) counts as running: any request wakes it.
        if ws.sandbox_id in self._table or self._table.records.has(ws.sandbox_id):
            return RUNNING
        if self._paused.has(ws.sandbox_id):
            return SUSPENDED
        return STALE

    def info(self, ws: WorkspaceRecord) -> WorkspaceReport:
        """forkd 0.5's WorkspaceReport."""
        status = self._status(ws)
        out: WorkspaceReport = {"id": f"ws-{ws.name}", "name": ws.name, "source_snapshot_tag": ws.source_tag,
                               "status": status, "created_at_unix": ws.created_at_unix,
                               "last_active_unix": ws.last_active_unix}
        if status == RUNNING:
            out["live_sandbox_id"] = ws.sandbox_id
        if status == SUSPENDED:
            out["current_state_tag"] = self._paused.get(ws.sandbox_id).state_tag
        return out

    def get(self, name: str) -> WorkspaceRecord:
        return self._workspaces.get(check_tag(name))

    def all(self) -> list[WorkspaceRecord]:
        return self._workspaces.all()

    async def create(self, name: str, snapshot_tag: str, *, per_child_netns: bool = False,
                     memory_limit_mib: int | None = None) -> WorkspaceRecord:
        check_tag(name)
        if any(ws.name == name for ws in self._workspaces.all()):
            raise Conflict(f"workspace {name!r} already exists; delete it first")
        [record] = await self._spawner.spawn(snapshot_tag, 1, SpawnOptions(
            per_child_netns=per_child_netns, memory_limit_mib=memory_limit_mib))
        now = now_unix()
        ws = WorkspaceRecord(name=name, sandbox_id=record.id, source_tag=snapshot_tag, created_at_unix=now,
                             last_active_unix=now)
        try:
            self._workspaces.insert(ws)
        except ForkdError:
            await self._table.kill(record.id)  # another create of that name won the race
            raise
        return ws

    async def suspend(self, name: str, *, mode: str = "full") -> WorkspaceRecord:
        ws = self.get(name)
        if self._status(ws) != RUNNING:
            raise Conflict(f"workspace {name!r} is {self._status(ws)}, not running: only a running "
                           "workspace can be suspended")
        await self._wake(ws.sandbox_id)
        await self._suspender.pause(ws.sandbox_id, mode=mode)
        self._workspaces.touch(name, ws.sandbox_id)
        return self.get(name)

    async def resume(self, name: str) -> WorkspaceRecord:
        ws = self.get(name)
        status = self._status(ws)
        if status == RUNNING:
            raise Conflict(f"workspace {name!r} is already running (sandbox {ws.sandbox_id})")
        if status == SUSPENDED:
            await self._suspender.resume(ws.sandbox_id)
        else:  # stale: its sandbox is gone and no state was kept; start over from the source
            [outcome] = await self._spawner.spawn_each(ws.source_tag, [ChildSpec(sandbox_id=ws.sandbox_id)])
            if isinstance(outcome, ForkdError):
                raise outcome
        self._workspaces.touch(name, ws.sandbox_id)
        return self.get(name)

    async def delete(self, name: str) -> None:
        """Kill its sandbox, or forget its paused state and drop its state snapshot."""
        ws = self.get(name)
        status = self._status(ws)
        if status == RUNNING:
            await self._table.kill(ws.sandbox_id)
        elif status == SUSPENDED:
            with contextlib.suppress(NotFound):  # resumed or discarded meanwhile
                self._suspender.discard(ws.sandbox_id)
        self._workspaces.delete(name)
        await self._collect()


__all__ = ["RUNNING", "STALE", "SUSPENDED", "Workspaces"]
