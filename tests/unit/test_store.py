"""forkd.store: the SQLite registry's typed records and the snapshot directory layout."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

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
    registry.sandboxes.insert(sb)
    assert registry.sandboxes.get(SB) == sb
    chain = DiskChain(node="disk1", file="/x/disk-1.qcow2", parent_tag="b1",
                      pending_layers=["/x/disk.qcow2"])
    registry.sandboxes.set_disk_chain(SB, chain)
    assert registry.sandboxes.get(SB).disk == chain
    snap = SnapshotRecord(tag="b1", dir="/d/b1", created_at_unix=2, status="writing", mode="live",
                          source_layers=["/x/disk.qcow2"], parent_tag="py")
    registry.snapshots.insert(snap)
    assert registry.snapshots.get("b1") == snap
    registry.snapshots.set_status("b1", "failed", error="boom")
    got = registry.snapshots.get("b1")
    assert (got.status, got.error) == ("failed", "boom")
    with pytest.raises(Conflict):
        registry.snapshots.insert(snap)


def test_sandboxes_are_listed_in_their_order_of_creation(registry: Registry, tmp_path: Path) -> None:
    """By start time, and in the order they were made within one second (E2B's newest-first list
    needs it; issue 20), not by their random ids."""
    from dataclasses import replace

    base = _sandbox(tmp_path)
    for sb_id, when in (("sb-ffffff-0000", 5), ("sb-000000-0000", 5), ("sb-777777-0000", 4)):
        registry.sandboxes.insert(replace(base, id=sb_id, created_at_unix=when))
    listed = [sb.id for sb in registry.sandboxes.all()]
    assert listed == ["sb-777777-0000", "sb-ffffff-0000", "sb-000000-0000"]


def test_a_scan_reads_the_same_order_in_batches_from_after_a_cursor(registry: Registry, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``scan`` (one page of GET /v1/sandboxes) reads ``all()``'s order a batch at a time, across
    batch edges and ties in the second, and starts after a given id; an id with no row is 404."""
    from dataclasses import replace

    import forkd.store.rows.sandboxes as rows

    monkeypatch.setattr(rows, "SCAN_BATCH", 3)
    base = _sandbox(tmp_path)
    for i in range(10):
        registry.sandboxes.insert(replace(base, id=f"sb-{(7 * i) % 10:06x}-0000", created_at_unix=i // 4))
    order = [sb.id for sb in registry.sandboxes.all()]
    assert [sb.id for sb in registry.sandboxes.scan()] == order
    for k, after in enumerate(order):
        assert [sb.id for sb in registry.sandboxes.scan(after)] == order[k + 1:]
    with pytest.raises(NotFound, match="list again"):
        next(registry.sandboxes.scan("sb-abcdef-0000"))


def test_registry_survives_reopening(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "forkd.db")
    reg.sandboxes.insert(_sandbox(tmp_path))
    assert reg.sandboxes.next_branch_seq(SB) == 1
    reg.close()
    reg = Registry(tmp_path / "forkd.db")
    assert reg.sandboxes.next_branch_seq(SB) == 2  # never reused across a restart
    reg.sandboxes.delete(SB)
    with pytest.raises(NotFound):
        reg.sandboxes.get(SB)
    with pytest.raises(NotFound):
        reg.sandboxes.next_branch_seq(SB)
    reg.close()


def test_rows_written_before_typed_disk_chains_still_load(registry: Registry, tmp_path: Path) -> None:
    registry.sandboxes.insert(_sandbox(tmp_path))
    old_meta = ('{"config": {"mem_mib": 512, "vcpus": 1, "accel": "tcg", "cpu": "max"}, '
                '"disk_node": "disk2", "disk_file": "/x/disk-2.qcow2", "disk_parent_tag": "b1", '
                '"pending_layers": ["/x/disk.qcow2"]}')
    with registry._lock:
        registry._db.execute("UPDATE sandboxes SET meta = ? WHERE id = ?", (old_meta, SB))
    assert registry.sandboxes.get(SB).disk == DiskChain("disk2", "/x/disk-2.qcow2", "b1", ["/x/disk.qcow2"])


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


def test_a_discarded_snapshot_dir_cannot_be_brought_back_by_a_late_writer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed lazy import removes its snapshot while the first child's restore-chunks record
    may still be written into it. With a plain rmtree, a file written between its listing and its
    last rmdir left the unregistered directory behind, and the next import of the tag was refused
    (409 "cannot be compared"). ``discard`` renames it aside first: the late write finds no
    directory, and nothing is left."""
    snapshots = tmp_path / "snapshots"
    snap = layout.publish(layout.staging_dir(snapshots, "base"), snapshots, "base").path
    (snap / "mem").write_bytes(b"x")
    late: list[str] = []
    real_rmdir = os.rmdir

    def rmdir_after_a_late_write(path: Any, *args: Any, **kwargs: Any) -> None:
        try:  # the child's record, by the snapshot's own path, just before the last rmdir
            (snap / "restore-chunks.json").write_text("{}")
            late.append("written")
        except FileNotFoundError:
            late.append("no directory")
        real_rmdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "rmdir", rmdir_after_a_late_write)
    layout.discard(snap)
    monkeypatch.undo()
    assert late and set(late) == {"no directory"}, late
    assert sorted(p.name for p in snapshots.iterdir()) == []
    layout.discard(snap)  # already gone: nothing to do


def test_a_long_tags_staging_leaves_room_for_a_helpers_sockets(tmp_path: Path) -> None:
    """E2B's template tags run long (alias.v1-<32 hex>): a BRANCH to such a tag failed, its helper's
    qmp.sock under the staging folder was over the 107 bytes a unix socket's path may hold."""
    tag = "e2b-tags-test.v1-" + "d" * 32 + "x" * 15  # 64 characters, the most a tag holds
    staging = layout.staging_dir(tmp_path, tag)
    assert staging.path.name.startswith(".e2b-tags-test.v1-ddddd") and ".tmp-" in staging.path.name
    # Under the default data dir, the helper's socket fits.
    assert len(f"/var/lib/forkd/snapshots/{staging.path.name}/helper/qmp.sock") <= 107
    assert layout.remove_stale_staging(tmp_path) == [staging.path.name]


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
    assert registry.prefixes.claim("sb-abc123") is True
    assert registry.prefixes.claim("sb-abc123") is False
    registry.close()
    again = Registry(tmp_path / "forkd.db")
    assert again.prefixes.claim("sb-abc123") is False
    again.close()


def test_the_prefixes_of_an_older_registrys_ids_count_as_issued(tmp_path: Path) -> None:
    old = Registry(tmp_path / "old.db")
    old.aliases.set("sb-0a0a0a-0001", "sb-0b0b0b-0000")
    with old._lock:  # an older registry had no such table: forget what set_alias recorded
        old._db.execute("DELETE FROM issued_prefixes")
    old.close()
    reopened = Registry(tmp_path / "old.db")
    assert not reopened.prefixes.claim("sb-0a0a0a") and not reopened.prefixes.claim("sb-0b0b0b")
    reopened.close()


def test_the_sandbox_table_draws_again_on_a_used_prefix(registry: Registry, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from forkd.controller.sandbox_events import SandboxEvents
    from forkd.controller.sandboxes import SandboxTable

    draws = iter(["sb-111111", "sb-111111", "sb-222222"])
    monkeypatch.setattr(layout, "new_batch_prefix", lambda host_id=None: next(draws))
    table = SandboxTable(registry.sandboxes, registry.aliases, registry.prefixes,
                         tmp_path / "sandboxes", SandboxEvents())
    assert table.new_batch_prefix() == "sb-111111"
    assert table.new_batch_prefix() == "sb-222222"  # the second draw was a repeat


def test_the_listed_count_leaves_unclaimed_pool_members_out(registry: Registry, tmp_path: Path) -> None:
    from dataclasses import replace

    base = _sandbox(tmp_path)
    for i, pooled in enumerate((False, True, False, True, True)):
        registry.sandboxes.insert(replace(base, id=f"sb-00000{i}-0000", pooled=pooled))
    assert registry.sandboxes.count_listed() == 2
    claimed = registry.sandboxes.get("sb-000001-0000")
    claimed.pooled = False
    registry.sandboxes.save(claimed)
    assert registry.sandboxes.count_listed() == 3


def test_reads_kept_parse_once_until_a_write(registry: Registry, tmp_path: Path) -> None:
    """The daemon's start reads every row a dozen times: inside ``reads_kept`` all() parses once
    and hands the same records out until a write; outside it, every call reads the table again."""
    from dataclasses import replace

    base = _sandbox(tmp_path)
    for i in range(3):
        registry.sandboxes.insert(replace(base, id=f"sb-00000{i}-0000"))
    rows = registry.sandboxes
    assert rows.all()[0] is not rows.all()[0]
    with rows.reads_kept():
        first = rows.all()
        assert rows.all()[0] is first[0] and rows.all() is not first  # a new list of the same records
        rows.set_expiry("sb-000000-0000", 123.0)
        again = rows.all()
        assert again[0] is not first[0] and again[0].expires_at_unix == 123.0
        rows.delete("sb-000001-0000")
        assert [sb.id for sb in rows.all()] == ["sb-000000-0000", "sb-000002-0000"]
    assert rows.all()[0] is not rows.all()[0]


def test_pool_membership_moves_from_meta_to_its_column_on_open(tmp_path: Path) -> None:
    """A registry an older forkd wrote kept ``pooled`` in the row's meta; opening it adds the
    column and fills it from there, so a pool member stays one (and stays out of the count)."""
    import json
    import sqlite3
    from dataclasses import replace

    reg = Registry(tmp_path / "forkd.db")
    reg.sandboxes.insert(_sandbox(tmp_path))
    reg.sandboxes.insert(replace(_sandbox(tmp_path), id="sb-000001-0000"))
    reg.close()
    db = sqlite3.connect(tmp_path / "forkd.db")
    db.execute("ALTER TABLE sandboxes DROP COLUMN pooled")  # as an older forkd made the table
    meta = json.loads(db.execute("SELECT meta FROM sandboxes WHERE id = ?", (SB,)).fetchone()[0])
    db.execute("UPDATE sandboxes SET meta = ? WHERE id = ?", (json.dumps({**meta, "pooled": True}), SB))
    db.commit()
    db.close()
    reg = Registry(tmp_path / "forkd.db")
    assert reg.sandboxes.get(SB).pooled and not reg.sandboxes.get("sb-000001-0000").pooled
    assert reg.sandboxes.count_listed() == 1
    reg.close()
