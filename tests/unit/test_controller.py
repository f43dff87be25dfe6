"""The controller's owners, with a real SQLite registry and fake VMs (no QEMU)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from forkd.controller.branch import Brancher
from forkd.controller.sandbox_events import SandboxEvents
from forkd.controller.sandboxes import SandboxTable
from forkd.controller.snapshots import SnapshotStore
from forkd.controller.tags import TagReservations
from forkd.errors import Conflict, GuestError, InvalidRequest, NotFound
from forkd.host.accel import Accel, VMConfig
from forkd.host.shm import ShmMemory
from forkd.store.registry import DiskChain, Registry, SandboxRecord, SnapshotRecord
from forkd.vmm import branching

CONFIG = VMConfig(512, 1, Accel.tcg())
SB = "sb-abcdef-0000"


@dataclass
class FakeProcess:
    running: bool = True
    dir: Path = Path("/nonexistent")

    def alive(self) -> bool:
        return self.running


@dataclass
class FakeQMPClient:
    commands: list[str] = field(default_factory=list)

    async def cmd(self, command: str, **_args: Any) -> dict[str, Any]:
        self.commands.append(command)
        return {}


@dataclass
class FakeVM:
    """What the table and the brancher use of a VM; records how it ends."""

    events: list[str]
    process: FakeProcess = field(default_factory=FakeProcess)
    qmp: FakeQMPClient = field(default_factory=FakeQMPClient)
    paused: bool = False
    pid: int = 4242

    async def destroy(self) -> None:
        self.events.append("destroyed" + (" while paused" if self.paused else ""))
        self.process.running = False

    async def call(self, action: str, timeout: float | None = 60, **_args: Any) -> dict[str, Any]:
        if not self.process.running:
            raise GuestError("guest agent connection closed")
        return {"action": action}


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    reg = Registry(tmp_path / "forkd.db")
    yield reg
    reg.close()


def _sandbox(tmp_path: Path, sb_id: str = SB, tag: str = "py") -> SandboxRecord:
    run_dir = tmp_path / "sandboxes" / sb_id
    run_dir.mkdir(parents=True, exist_ok=True)
    return SandboxRecord(id=sb_id, snapshot_tag=tag, dir=str(run_dir), created_at_unix=1, config=CONFIG,
                         disk=DiskChain.fresh(run_dir, tag), pid=4242)


# ------------------------------------------------------------------ tags


def test_tag_reservations_are_exclusive() -> None:
    existing = {"py"}
    tags = TagReservations(lambda t: t in existing)
    with pytest.raises(Conflict, match="already exists"):
        tags.reserve("py")
    with pytest.raises(InvalidRequest, match="invalid tag"):
        tags.reserve("../etc")
    with tags.reserved("b1"):
        assert tags.in_flight("b1")
        with pytest.raises(Conflict, match="already being written"):
            tags.reserve("b1")
    assert not tags.in_flight("b1")


# ------------------------------------------------------------------ snapshot store


def _store(registry: Registry, tmp_path: Path, tags: TagReservations | None = None) -> SnapshotStore:
    tags = tags or TagReservations(lambda _t: False)
    return SnapshotStore(registry.snapshots, registry.snapshot_names,
                         tmp_path / "snapshots", tags, ShmMemory(tmp_path))


def test_lineage_and_deletion_plan(registry: Registry, tmp_path: Path) -> None:
    for tag, parent in (("py", None), ("b1", "py"), ("b2", "b1"), ("c1", "py")):
        registry.snapshots.insert(
            SnapshotRecord(tag=tag, dir=f"/d/{tag}", created_at_unix=1, parent_tag=parent))
    store = _store(registry, tmp_path)
    assert store.dependents("py") == ["b1", "c1", "b2"]
    lineage = store.lineage("b2", [SB])
    assert (lineage["ancestors"], lineage["dependents"], lineage["sandboxes"]) == (["b1", "py"], [], [SB])
    with pytest.raises(Conflict, match="dependent snapshots"):
        store.deletion_plan("py", cascade=False, force=False)
    # force kills sandboxes; it does not orphan dependents (forking one would fail later).
    with pytest.raises(Conflict, match="force=true alone does not"):
        store.deletion_plan("py", cascade=False, force=True)
    assert store.deletion_plan("py", cascade=True, force=False) == ["b2", "c1", "b1", "py"]
    with pytest.raises(NotFound):
        store.deletion_plan("nope", cascade=False, force=False)


def test_a_tag_being_written_cannot_be_deleted(registry: Registry, tmp_path: Path) -> None:
    registry.snapshots.insert(SnapshotRecord(tag="b1", dir="/d/b1", created_at_unix=1, status="writing"))
    tags = TagReservations(lambda _t: False)
    tags.reserve("b1")
    with pytest.raises(Conflict, match="still being written"):
        _store(registry, tmp_path, tags).deletion_plan("b1", cascade=False, force=False)


def test_forkable_refuses_writing_and_failed(registry: Registry, tmp_path: Path) -> None:
    registry.snapshots.insert(SnapshotRecord(tag="w", dir="/d/w", created_at_unix=1, status="writing"))
    registry.snapshots.insert(SnapshotRecord(tag="f", dir="/d/f", created_at_unix=1, status="failed",
                                            error="disk full"))
    store = _store(registry, tmp_path)
    with pytest.raises(Conflict, match="still being written"):
        store.forkable("w")
    with pytest.raises(Conflict, match="failed and cannot be forked: disk full"):
        store.forkable("f")


# ------------------------------------------------------------------ sandbox table


def test_table_lookups_and_death(registry: Registry, tmp_path: Path) -> None:
    table = SandboxTable(registry.sandboxes, registry.aliases, registry.prefixes,
                         tmp_path / "sandboxes", SandboxEvents())
    vm = FakeVM([])
    table.add(_sandbox(tmp_path), vm)  # type: ignore[arg-type]
    assert table.get(SB) is vm
    with pytest.raises(NotFound):
        table.get("sb-000000-0001")
    with pytest.raises(InvalidRequest):
        table.get("../../etc")
    vm.process.running = False
    with pytest.raises(GuestError, match="has died"):
        table.get(SB)
    asyncio.run(table.kill(SB))
    assert not registry.sandboxes.has(SB) and not (tmp_path / "sandboxes" / SB).exists()
    with pytest.raises(NotFound):
        asyncio.run(table.kill(SB))


def test_a_killed_sandbox_is_gone_to_every_lookup_before_its_qemu_ends(
        registry: Registry, tmp_path: Path) -> None:
    """Kill during run_code: the QEMU's end breaks the client's stream, and E2B's SDK then asks
    /health. By then every lookup (the envd routes' get_sandbox included) must say not found,
    so the SDK reports a killed sandbox rather than a raw protocol error."""
    from types import SimpleNamespace

    from forkd.controller.runtime import Runtime

    table = SandboxTable(registry.sandboxes, registry.aliases, registry.prefixes,
                         tmp_path / "sandboxes", SandboxEvents())
    seen: list[str] = []

    class EndingVM(FakeVM):
        async def destroy(self) -> None:  # the moment the guest's streams end
            rt = SimpleNamespace(sandboxes=table, _with_state=lambda record: record)
            for lookup in (table.resolve, table.get, lambda i: Runtime.get_sandbox(rt, i)):  # type: ignore[arg-type]
                try:
                    lookup(SB)
                    seen.append("found")
                except NotFound:
                    seen.append("not found")
            await super().destroy()

    table.add(_sandbox(tmp_path), EndingVM([]))  # type: ignore[arg-type]
    asyncio.run(table.kill(SB))
    assert seen == ["not found"] * 3
    assert not registry.sandboxes.has(SB)
    with pytest.raises(NotFound):
        table.get(SB)


def test_kill_during_a_branch_waits_for_the_pause_window(
        registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kill that arrives mid-branch waits until the source has resumed, then removes it:
    never a paused QEMU left behind, never a half-registered snapshot."""
    events: list[str] = []
    vm = FakeVM(events)
    paused = asyncio.Event()

    async def capture(source: FakeVM, mode: str, *, new_disk: Path, stream: Path, **_kw: Any) -> Any:
        source.paused = True
        events.append("paused")
        paused.set()
        await asyncio.sleep(0.2)  # the pause window
        new_disk.write_bytes(b"")
        stream.write_bytes(b"stream")
        source.paused = False
        events.append("resumed")
        return branching.BranchCapture(200.0, Path(_kw["frozen_disk"]), new_disk, _kw["new_node"], stream)

    async def convert(_run_dir: Path, _config: VMConfig, *, mem_path: Path, state_path: Path,
                      **_kw: Any) -> float:
        events.append("converted")
        mem_path.write_bytes(b"m")
        state_path.write_bytes(b"s")
        return 0.01

    def copy_layers(layers: list[Path], base: Path, disk: Path, final_dir: Path) -> list[Path]:
        events.append("disk copied")
        disk.write_bytes(b"d")
        return [disk]

    monkeypatch.setattr(branching, "capture", capture)
    monkeypatch.setattr(branching, "stream_to_snapshot", convert)
    monkeypatch.setattr("forkd.vmm.disk.copy_layers", copy_layers)

    snapshots = tmp_path / "snapshots"
    (snapshots / "py").mkdir(parents=True)
    registry.snapshots.insert(SnapshotRecord(tag="py", dir=str(snapshots / "py"), created_at_unix=1))
    hooks = SandboxEvents()
    table = SandboxTable(registry.sandboxes, registry.aliases, registry.prefixes,
                         tmp_path / "sandboxes", hooks)
    tags = TagReservations(lambda t: registry.snapshots.has(t))
    store = _store(registry, tmp_path, tags)
    brancher = Brancher(registry.sandboxes, snapshots, table, hooks, store, tags)
    table.add(_sandbox(tmp_path), vm)  # type: ignore[arg-type]

    async def main() -> None:
        branch = asyncio.create_task(brancher.branch(SB, "b1", "full"))
        await paused.wait()
        kill = asyncio.create_task(table.kill(SB))
        await asyncio.sleep(0.05)
        assert not kill.done(), "the kill must wait for the pause window"
        await kill
        events.append("kill returned")
        record = await branch
        assert record.status == "ready"

    asyncio.run(main())
    assert events.index("resumed") < events.index("destroyed") < events.index("kill returned")
    assert "destroyed while paused" not in events
    assert not registry.sandboxes.has(SB)
    assert registry.snapshots.get("b1").status == "ready"
    assert not tags.in_flight("b1")


def test_the_open_files_limit_is_raised_to_the_hard_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    from forkd.host import fdlimit

    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (1024, 524288))
    monkeypatch.setattr(resource, "setrlimit", lambda _which, limits: calls.append(limits))
    assert fdlimit.raise_fd_limit() == 524288 and calls == [(524288, 524288)]
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (4096, 4096))
    assert fdlimit.raise_fd_limit() == 4096 and len(calls) == 1


def test_a_snapshots_names_stand_for_it_and_go_with_it(registry: Registry, tmp_path: Path) -> None:
    """E2B's template tags: more names of one snapshot, in the registry, dropped with the snapshot."""
    for tag in ("web.v1", "web.v2"):
        registry.snapshots.insert(SnapshotRecord(tag=tag, dir=f"/d/{tag}", created_at_unix=1))
    store = _store(registry, tmp_path)
    store.name("web.prod", "web.v1")
    store.name("web.latest", "web.v1")
    assert store.resolve("web.prod") == "web.v1" and store.resolve("web.v2") == "web.v2"
    assert store.resolve("web.nope") == "web.nope"  # not a name: the caller's get says 404
    assert [n for n, _ in store.names("web.v1")] == ["web.prod", "web.latest"]
    store.name("web.prod", "web.v2")  # a name moves
    assert store.resolve("web.prod") == "web.v2"
    with pytest.raises(Conflict, match="own tag"):
        store.name("web.v2", "web.v1")
    with pytest.raises(NotFound):
        store.name("web.x", "web.v9")
    store.remove("web.v1")
    assert store.names("web.v1") == [] and store.resolve("web.latest") == "web.latest"
    assert store.unname("web.prod") and not store.unname("web.prod")
