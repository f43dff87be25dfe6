"""Pause/resume (``Suspender``) and workspaces on a real registry and sandbox table, with a
brancher and a spawner that only record: the rules, not the VMs (those: integration tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from forkd.controller.child_specs import ChildSpec
from forkd.controller.idle import IdlePauser
from forkd.controller.sandbox_events import SandboxEvents
from forkd.controller.sandboxes import SandboxTable
from forkd.controller.suspend import Suspender, view
from forkd.controller.tags import TagReservations
from forkd.controller.workspaces import Workspaces
from forkd.errors import Conflict, ForkdError, NotFound, VMError
from forkd.store.registry import PausedRecord, Registry, SandboxRecord, SnapshotRecord
from tests.unit.test_controller import FakeVM, _sandbox, _store

SB = "sb-abcdef-0000"


class StubBrancher:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.calls: list[tuple[str, str, str]] = []

    async def branch(self, sandbox_id: str, tag: str | None, mode: str, wait: bool = True) -> SnapshotRecord:
        assert tag is not None and wait
        self.calls.append((sandbox_id, tag, mode))
        parent = self.registry.sandboxes.get(sandbox_id).snapshot_tag
        record = SnapshotRecord(tag=tag, dir=f"/d/{tag}", created_at_unix=2, branched_from=sandbox_id,
                                parent_tag=parent)
        self.registry.snapshots.insert(record)
        return record


class StubSpawner:
    """Restores a child under the spec's id (as the real one does for a resume), or fails."""

    def __init__(self, table: SandboxTable, tmp_path: Path) -> None:
        self.table = table
        self.tmp_path = tmp_path
        self.fail: ForkdError | None = None
        self.specs: list[tuple[str, ChildSpec]] = []

    async def spawn_each(self, tag: str, specs: list[ChildSpec], options: Any = None) -> list[Any]:
        self.specs += [(tag, s) for s in specs]
        if self.fail is not None:
            return [self.fail]
        out = []
        for spec in specs:
            record = _sandbox(self.tmp_path, spec.sandbox_id or "sb-aaaaaa-0000", tag)
            record.metadata = dict(spec.metadata)
            self.table.add(record, FakeVM([]))  # type: ignore[arg-type]
            out.append(record)
        return out

    async def spawn(self, tag: str, n: int = 1, options: Any = None) -> list[SandboxRecord]:
        return await self.spawn_each(tag, [ChildSpec(sandbox_id=f"sb-bbbbbb-{i:04d}") for i in range(n)])


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[tuple[Registry, SandboxTable, Suspender, StubBrancher, StubSpawner]]:
    registry = Registry(tmp_path / "forkd.db")
    registry.snapshots.insert(SnapshotRecord(tag="py", dir="/d/py", created_at_unix=1))
    events = SandboxEvents()
    table = SandboxTable(registry.sandboxes, registry.aliases, registry.prefixes,
                         tmp_path / "sandboxes", events)
    store = _store(registry, tmp_path, TagReservations(registry.snapshots.has))
    brancher, spawner = StubBrancher(registry), StubSpawner(table, tmp_path)
    record = _sandbox(tmp_path, SB)
    record.metadata = {"team": "a"}
    table.add(record, FakeVM([]))  # type: ignore[arg-type]
    idle = IdlePauser(registry.sandboxes, table, events)
    suspender = Suspender(registry.paused, registry.sandboxes, table, brancher, spawner, store,  # type: ignore[arg-type]
                          idle)
    yield registry, table, suspender, brancher, spawner
    registry.close()


def test_pause_branches_records_and_stops_then_resume_keeps_the_id(parts: Any) -> None:
    registry, table, suspender, brancher, spawner = parts

    async def main() -> None:
        paused = await suspender.pause(SB)
        assert brancher.calls == [(SB, f"paused-{SB}-1", "full")]
        assert SB not in table and paused.template == "py" and paused.metadata == {"team": "a"}
        assert view(paused, paused.template)["state"] == "paused"
        with pytest.raises(Conflict, match="already paused"):
            await suspender.pause(SB)
        resumed = await suspender.resume(SB)
        assert resumed.id == SB and resumed.snapshot_tag == paused.state_tag
        assert spawner.specs[-1][1].metadata == {"team": "a"}
        assert registry.snapshots.get(paused.state_tag).auto_delete  # held by the child only
        assert suspender.template_of(registry.sandboxes.get(SB)) == "py"  # through the pause state
        with pytest.raises(NotFound):
            await suspender.resume(SB)
        # A second pause gets a state of its own: the first is still there (the child's base).
        again = await suspender.pause(SB)
        assert again.state_tag == f"paused-{SB}-2"

    asyncio.run(main())


def test_a_resumed_sandbox_keeps_its_idle_pause_policy(parts: Any) -> None:
    registry, _table, suspender, _brancher, _spawner = parts
    registry.sandboxes.set_idle_pause(SB, 7.0)

    async def main() -> None:
        assert (await suspender.pause(SB)).idle_pause_secs == 7.0
        assert registry.paused.get(SB).idle_pause_secs == 7.0  # through the registry (a restart)
        resumed = await suspender.resume(SB)
        assert resumed.idle_pause_secs == 7.0
        assert registry.sandboxes.get(SB).idle_pause_secs == 7.0

    asyncio.run(main())


def test_a_failed_resume_keeps_the_paused_sandbox(parts: Any) -> None:
    registry, _table, suspender, _brancher, spawner = parts

    async def main() -> None:
        paused = await suspender.pause(SB)
        spawner.fail = VMError("restore failed")
        with pytest.raises(VMError):
            await suspender.resume(SB)
        assert registry.paused.get(SB).state_tag == paused.state_tag
        assert not registry.snapshots.get(paused.state_tag).auto_delete
        spawner.fail = None
        assert (await suspender.resume(SB)).id == SB

    asyncio.run(main())


def test_discard_leaves_the_state_to_collect_and_a_stale_record_gives_way(parts: Any) -> None:
    registry, table, suspender, _brancher, _spawner = parts

    async def main() -> None:
        paused = await suspender.pause(SB)
        suspender.discard(SB)
        assert not registry.paused.has(SB) and registry.snapshots.get(paused.state_tag).auto_delete
        # A daemon that died mid-pause leaves a record beside a live sandbox: the live one wins.
        [live] = await _spawner.spawn_each("py", [ChildSpec(sandbox_id=SB)])
        stale = PausedRecord(id=SB, state_tag=paused.state_tag, template="py", created_at_unix=1,
                             paused_at_unix=2)
        registry.paused.insert(stale)
        assert (await suspender.resume(SB)).id == SB and SB in table and not registry.paused.has(SB)
        registry.paused.insert(stale)
        assert (await suspender.pause(SB)).state_tag == f"paused-{SB}-2"
        assert live.id == SB

    asyncio.run(main())


def test_workspaces_name_one_sandbox_through_suspend_and_resume(parts: Any, tmp_path: Path) -> None:
    registry, table, suspender, _brancher, spawner = parts
    collected: list[bool] = []

    async def collect() -> None:  # the Forker's collect: a deleted workspace's state snapshot goes
        collected.append(True)

    async def wake(_sandbox_id: str) -> bool:  # nothing here hibernates
        return False

    spaces = Workspaces(registry.workspaces, registry.paused, table, spawner, suspender,  # type: ignore[arg-type]
                        collect, wake)

    async def main() -> None:
        ws = await spaces.create("w1", "py")
        assert spaces.info(ws)["status"] == "running"
        with pytest.raises(Conflict, match="already exists"):
            await spaces.create("w1", "py")
        suspended = spaces.info(await spaces.suspend("w1"))
        assert suspended["status"] == "suspended" and suspended["current_state_tag"].startswith("paused-")
        with pytest.raises(Conflict, match="not running"):
            await spaces.suspend("w1")
        assert spaces.info(await spaces.resume("w1"))["live_sandbox_id"] == ws.sandbox_id
        await table.kill(ws.sandbox_id)
        assert spaces.info(spaces.get("w1"))["status"] == "stale"
        # A stale workspace starts over from its source, under the same id.
        assert spaces.info(await spaces.resume("w1"))["live_sandbox_id"] == ws.sandbox_id
        assert spawner.specs[-1][0] == "py"
        await spaces.delete("w1")
        assert ws.sandbox_id not in table and collected == [True]
        with pytest.raises(NotFound):
            spaces.get("w1")

    asyncio.run(main())
