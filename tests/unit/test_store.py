"""forkd.store: the SQLite registry's typed records and the snapshot directory layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from forkd.errors import Conflict, InvalidRequest, NotFound
from forkd.host.accel import Accel, VMConfig
from forkd.store import layout
from forkd.store.registry import DiskChain, Registry, SandboxRecord, SnapshotRecord

SB = "sb-abcdef-0000"


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    reg = Registry(tmp_path / "forkd.db")
    yield reg
    reg.close()


def _sandbox(tmp_path: Path) -> SandboxRecord:
    run_dir = tmp_path / "sandboxes" / SB
    return SandboxRecord(id=SB, snapshot_tag="py", dir=str(run_dir), created_at_unix=1,
                         config=VMConfig(512, 1, Accel.tcg()), disk=DiskChain.fresh(run_dir, "py"), pid=4242)


def test_registry_round_trips_typed_records(registry: Registry, tmp_path: Path) -> None:
    sb = _sandbox(tmp_path)
    sb.cgroup, sb.tap, sb.timings = "/sys/fs/cgroup/forkd/x", "tap0", {"ready_s": 0.2}
    registry.insert_sandbox(sb)
    assert registry.get_sandbox(SB) == sb
    chain = DiskChain(node="disk1", file="/x/disk-1.qcow2", parent_tag="b1",
                      pending_layers=["/x/disk.qcow2"])
    registry.set_disk_chain(SB, chain)
    assert registry.get_sandbox(SB).disk == chain
    snap = SnapshotRecord(tag="b1", dir="/d/b1", created_at_unix=2, status="writing", mode="live",
                          source_layers=["/x/disk.qcow2"], parent_tag="py")
    registry.insert_snapshot(snap)
    assert registry.get_snapshot("b1") == snap
    registry.set_snapshot_status("b1", "failed", error="boom")
    got = registry.get_snapshot("b1")
    assert (got.status, got.error) == ("failed", "boom")
    with pytest.raises(Conflict):
        registry.insert_snapshot(snap)


def test_registry_survives_reopening(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "forkd.db")
    reg.insert_sandbox(_sandbox(tmp_path))
    assert reg.next_branch_seq(SB) == 1
    reg.close()
    reg = Registry(tmp_path / "forkd.db")
    assert reg.next_branch_seq(SB) == 2  # never reused across a restart
    reg.delete_sandbox(SB)
    with pytest.raises(NotFound):
        reg.get_sandbox(SB)
    with pytest.raises(NotFound):
        reg.next_branch_seq(SB)
    reg.close()


def test_rows_written_before_typed_disk_chains_still_load(registry: Registry, tmp_path: Path) -> None:
    registry.insert_sandbox(_sandbox(tmp_path))
    old_meta = ('{"config": {"mem_mib": 512, "vcpus": 1, "accel": "tcg", "cpu": "max"}, '
                '"disk_node": "disk2", "disk_file": "/x/disk-2.qcow2", "disk_parent_tag": "b1", '
                '"pending_layers": ["/x/disk.qcow2"]}')
    with registry._lock:
        registry._db.execute("UPDATE sandboxes SET meta = ? WHERE id = ?", (old_meta, SB))
    assert registry.get_sandbox(SB).disk == DiskChain("disk2", "/x/disk-2.qcow2", "b1", ["/x/disk.qcow2"])


def test_staging_is_published_atomically_and_never_overwrites(tmp_path: Path) -> None:
    snapshots = tmp_path / "snapshots"
    staging = layout.staging_dir(snapshots, "py")
    staging.write_meta({"tag": "py"})
    assert not staging.complete()
    for path in (staging.mem, staging.state, staging.disk):
        path.write_bytes(b"x")
    assert staging.complete()
    final = layout.publish(staging, snapshots, "py")
    assert final.read_meta() == {"tag": "py"} and not staging.path.exists()
    again = layout.staging_dir(snapshots, "py")
    with pytest.raises(OSError):
        layout.publish(again, snapshots, "py")
    assert layout.remove_stale_staging(snapshots) == [again.path.name]
    assert sorted(p.name for p in snapshots.iterdir()) == ["py"]


@pytest.mark.parametrize("bad", ["", ".hidden", "-x", "a/b", "../x", "x" * 65, "a b"])
def test_bad_tags_are_refused_before_any_path_is_built(bad: str) -> None:
    with pytest.raises(InvalidRequest, match="invalid tag"):
        layout.check_tag(bad)


def test_sandbox_ids_are_checked() -> None:
    assert layout.check_sandbox_id(SB) == SB
    for bad in ("../sb-abcdef-0000", "sb/abcdef", ".sb", "-sb", "sb abc", "sb,x", "a" * 49, ""):
        with pytest.raises(InvalidRequest):
            layout.check_sandbox_id(bad)


def test_an_id_prefix_is_issued_once_per_data_dir(registry: Registry, tmp_path: Path) -> None:
    """Nothing keyed by a sandbox id (E2B access tokens are HMACs of it) may come to name a
    later sandbox: a prefix this data dir issued is never issued again, across restarts."""
    assert registry.claim_prefix("sb-abc123") is True
    assert registry.claim_prefix("sb-abc123") is False
    registry.close()
    again = Registry(tmp_path / "forkd.db")
    assert again.claim_prefix("sb-abc123") is False
    again.close()


def test_the_prefixes_of_an_older_registrys_ids_count_as_issued(tmp_path: Path) -> None:
    old = Registry(tmp_path / "old.db")
    old.set_alias("sb-0a0a0a-0001", "sb-0b0b0b-0000")
    with old._lock:  # an older registry had no such table: forget what set_alias recorded
        old._db.execute("DELETE FROM issued_prefixes")
    old.close()
    reopened = Registry(tmp_path / "old.db")
    assert not reopened.claim_prefix("sb-0a0a0a") and not reopened.claim_prefix("sb-0b0b0b")
    reopened.close()


def test_the_sandbox_table_draws_again_on_a_used_prefix(registry: Registry, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from forkd.controller.sandboxes import SandboxTable

    draws = iter(["sb-111111", "sb-111111", "sb-222222"])
    monkeypatch.setattr(layout, "new_batch_prefix", lambda host_id=None: next(draws))
    table = SandboxTable(registry, tmp_path / "sandboxes")
    assert table.new_batch_prefix() == "sb-111111"
    assert table.new_batch_prefix() == "sb-222222"  # the second draw was a repeat
