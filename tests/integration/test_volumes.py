"""Volumes on real VMs: a snapshot attaches a named copy volume and a read-only host directory;
children fork copy-on-write views of it, a BRANCH carries what was written forward, a read-only
volume refuses writes, and a guest cannot grow a volume past its size on the host.

One template boot for the module (a volume is part of a snapshot's device configuration, so the
session's shared templates cannot carry one)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from forkd.controller.options import SpawnOptions
from forkd.controller.runtime import Runtime, SnapshotSpec
from forkd.errors import Conflict
from forkd.store.layout import volume_file
from forkd.store.volume_spec import VolumeMount

from .conftest import SNAPSHOT_RECIPE, Loop

pytestmark = pytest.mark.vm

SIZE_MIB = 32
TAG = "vol-tpl"


def sh(loop: Loop, rt: Runtime, sb_id: str, script: str, user: str | None = None) -> tuple[int, str]:
    res = loop.run(rt.exec(sb_id, ["sh", "-c", script], timeout_secs=120, user=user))
    return res["exit_code"], (res["stdout"] + res["stderr"]).strip()


@pytest.fixture(scope="module")
def template(loop: Loop, runtime: Runtime, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    fixtures = tmp_path_factory.mktemp("fixtures")
    (fixtures / "seed.txt").write_text("from the host\n")
    loop.run(runtime.volumes.create("vdata", size_mib=SIZE_MIB))
    loop.run(runtime.create_snapshot(SnapshotSpec(
        tag=TAG, **SNAPSHOT_RECIPE, warm_imports=[],
        volumes=[VolumeMount(mount="/mnt/data", name="vdata"),
                 VolumeMount(mount="/fixtures", host_path=str(fixtures), read_only=True, size_mib=16)],
        # Written by the template (setup runs as root): every child starts from it.
        setup=[["sh", "-c", "echo parent > /mnt/data/v.txt && chown user: /mnt/data/v.txt"]])))
    yield TAG
    with contextlib.suppress(Exception):
        loop.run(runtime.delete_snapshot(TAG, cascade=True, force=True))
    with contextlib.suppress(Exception):
        runtime.volumes.delete("vdata")


def test_the_snapshot_records_its_volumes_and_the_volume_names_it(loop: Loop, runtime: Runtime, template: str,
                                                                  tmp_path: Path) -> None:
    info = runtime.get_snapshot(template).info()
    assert [(v["mount"], v["read_only"], v["fork"]) for v in info["volumes"]] == [
        ("/mnt/data", False, "copy"), ("/fixtures", True, "copy")]
    assert runtime.volumes.info(runtime.volumes.get("vdata"))["snapshots"] == [template]
    with pytest.raises(Conflict, match=template):
        runtime.volumes.delete("vdata")
    # Exported as the snapshot holds it (what its template wrote), and as the volume was made.
    loop.run(runtime.volumes.export("vdata", str(tmp_path / "snap"), snapshot=template))
    assert (tmp_path / "snap" / "v.txt").read_text() == "parent\n"
    loop.run(runtime.volumes.export("vdata", str(tmp_path / "made")))
    assert not (tmp_path / "made" / "v.txt").exists()


def test_five_children_each_write_their_own_copy(loop: Loop, runtime: Runtime, template: str) -> None:
    children = loop.run(runtime.spawn(template, 5))
    try:
        assert [v["mount"] for v in children[0].info()["volumes"]] == ["/mnt/data", "/fixtures"]
        for i, sb in enumerate(children):  # as the sandbox's user: the volume's root is theirs
            script = f"echo child-{i} > /mnt/data/v.txt && touch /mnt/data/new-{i}"
            code, out = sh(loop, runtime, sb.id, script, user="user")
            assert code == 0, out
        for i, sb in enumerate(children):
            assert sh(loop, runtime, sb.id, "cat /mnt/data/v.txt") == (0, f"child-{i}")
        # The snapshot's copy is unchanged: a new child reads what the template wrote.
        [fresh] = loop.run(runtime.spawn(template, 1))
        children.append(fresh)
        assert sh(loop, runtime, fresh.id, "cat /mnt/data/v.txt") == (0, "parent")
        # A read-only volume is shared as it is, and refuses writes.
        assert sh(loop, runtime, fresh.id, "cat /fixtures/seed.txt") == (0, "from the host")
        code, out = sh(loop, runtime, fresh.id, "echo x > /fixtures/new.txt")
        assert code != 0 and "Read-only file system" in out
    finally:
        for sb in children:
            loop.run(runtime.kill(sb.id))


def test_a_branch_carries_the_volume_forward(loop: Loop, runtime: Runtime, template: str) -> None:
    """The seeds' flow: write to the volume, BRANCH, and grandchildren see the file."""
    [src] = loop.run(runtime.spawn(template, 1))
    grandchildren = []
    try:
        assert sh(loop, runtime, src.id, "echo before-branch > /mnt/data/b.txt")[0] == 0
        branch = loop.run(runtime.branch(src.id, "vol-branch"))
        assert [v["mount"] for v in branch.info()["volumes"]] == ["/mnt/data", "/fixtures"]
        # Written after the branch: only the source has it.
        assert sh(loop, runtime, src.id, "echo after-branch > /mnt/data/b.txt")[0] == 0
        grandchildren = loop.run(runtime.spawn("vol-branch", 2))
        for g in grandchildren:
            assert sh(loop, runtime, g.id, "cat /mnt/data/b.txt /mnt/data/v.txt") == \
                (0, "before-branch\nparent")
        assert sh(loop, runtime, grandchildren[0].id, "echo g0 > /mnt/data/b.txt")[0] == 0
        assert sh(loop, runtime, grandchildren[1].id, "cat /mnt/data/b.txt") == (0, "before-branch")
        assert sh(loop, runtime, src.id, "cat /mnt/data/b.txt") == (0, "after-branch")
        # Its volume layer stands on the template's, like its disk: the template cannot go first.
        with pytest.raises(Conflict, match="dependent"):
            loop.run(runtime.delete_snapshot(template))
    finally:
        for sb in [src, *grandchildren]:
            loop.run(runtime.kill(sb.id))
        loop.run(runtime.delete_snapshot("vol-branch"))


def test_a_live_branch_freezes_the_volume_with_the_root_filesystem(loop: Loop, runtime: Runtime,
                                                                   template: str) -> None:
    """A live BRANCH (vCPUs running) of a sandbox with a writable volume: the guest freezes the
    volume's filesystem with its root's around the cut, so the branch's children read what was
    written before it, can write there (their copy is thawed), and the source goes on writing."""
    [src] = loop.run(runtime.spawn(template, 1, SpawnOptions(live_fork=True)))
    children = []
    try:
        assert sh(loop, runtime, src.id, "echo before-live > /mnt/data/l.txt")[0] == 0
        branch = loop.run(runtime.branch(src.id, "vol-live", "live"))
        assert branch.mode == "live" and branch.fs_freeze_ms is not None
        assert sh(loop, runtime, src.id, "echo after-live > /mnt/data/l.txt && cat /mnt/data/l.txt") == \
            (0, "after-live")
        children = loop.run(runtime.spawn("vol-live", 1))
        assert sh(loop, runtime, children[0].id, "cat /mnt/data/l.txt") == (0, "before-live")
        assert sh(loop, runtime, children[0].id, "echo child > /mnt/data/l.txt && cat /mnt/data/l.txt") == \
            (0, "child")
    finally:
        for sb in [src, *children]:
            loop.run(runtime.kill(sb.id))
        with contextlib.suppress(Exception):
            loop.run(runtime.delete_snapshot("vol-live"))


def test_a_guest_cannot_grow_a_volume_past_its_size(loop: Loop, runtime: Runtime, template: str) -> None:
    [sb] = loop.run(runtime.spawn(template, 1))
    try:
        code, out = sh(loop, runtime, sb.id,
                       f"dd if=/dev/zero of=/mnt/data/fill bs=1M count={2 * SIZE_MIB} conv=fsync")
        assert code != 0 and "No space left on device" in out
        overlay = volume_file(Path(sb.dir) / "disk.qcow2", 0)
        # The child's own layer holds what it wrote, bounded by the volume's size (plus qcow2's
        # metadata: its tables for a 32 MiB disk are a few 64 KiB clusters).
        assert (SIZE_MIB // 2) << 20 < overlay.stat().st_size <= (SIZE_MIB + 2) << 20
    finally:
        loop.run(runtime.kill(sb.id))


@pytest.mark.parametrize("memory", [True, False], ids=["memory", "disk-only"])
def test_hibernation_keeps_the_volume(loop: Loop, runtime: Runtime, template: str, memory: bool) -> None:
    [sb] = loop.run(runtime.spawn(template, 1))
    try:
        assert sh(loop, runtime, sb.id, "echo kept > /mnt/data/h.txt")[0] == 0
        loop.run(runtime.hibernation.hibernate(sb.id, memory=memory))
        assert runtime.get_sandbox(sb.id).hibernation is not None
        assert loop.run(runtime.hibernation.wake(sb.id))
        # Woken on its own layers; a disk-only wake cold-booted and mounted them again.
        assert sh(loop, runtime, sb.id, "cat /mnt/data/h.txt /fixtures/seed.txt") == \
            (0, "kept\nfrom the host")
        code, out = sh(loop, runtime, sb.id, "echo x > /fixtures/new.txt")
        assert code != 0 and "Read-only file system" in out
    finally:
        loop.run(runtime.kill(sb.id))
