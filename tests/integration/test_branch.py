"""BRANCH a running sandbox in each mode; fork grandchildren; lineage; failure modes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from forkd.controller.options import SpawnOptions
from forkd.controller.runtime import Runtime, SnapshotSpec
from forkd.errors import Conflict, InvalidRequest, NotFound, VMError
from forkd.vmm import branching

from .conftest import Loop, qemu_processes_of, soak

pytestmark = pytest.mark.vm

# Loads a 50 MiB random blob into PID 1's memory and onto the disk, and starts a
# counter that shows whether the guest is running.
LOAD = """
import hashlib, os, threading, time
blob = os.urandom(50 << 20)
with open('/root/blob.bin', 'wb') as f:
    f.write(blob)
os.sync()
counter = [0]
def _tick():
    while True:
        counter[0] += 1
        time.sleep(0.005)
threading.Thread(target=_tick, daemon=True).start()
hashlib.sha256(blob).hexdigest()
"""
MEM_HASH = "hashlib.sha256(blob).hexdigest()"
DISK_HASH = ["sh", "-c", "sha256sum /root/blob.bin | cut -d' ' -f1"]
# Cheap fingerprints for the isolation checks (hashing 50 MiB under TCG takes seconds).
MEM_PRINT = "(len(blob), blob[:32].hex(), blob[-32:].hex())"
DISK_PRINT = ["sh", "-c", "stat -c %s /root/blob.bin; head -c 32 /root/blob.bin | od -An -tx1"]


def counter(loop: Loop, rt: Runtime, sb_id: str) -> int:
    return int(loop.run(rt.eval(sb_id, "counter[0]"))["result"])


def assert_advancing(loop: Loop, rt: Runtime, sb_id: str) -> None:
    first = counter(loop, rt, sb_id)
    deadline = time.monotonic() + 30
    while counter(loop, rt, sb_id) <= first:
        assert time.monotonic() < deadline, "the source's counter stopped advancing"
        time.sleep(0.1)


def loaded_source(loop: Loop, rt: Runtime, tag: str, *, live_fork: bool = False):
    sb = loop.run(rt.spawn(tag, 1, SpawnOptions(live_fork=live_fork)))[0]
    res = loop.run(rt.eval(sb.id, LOAD, timeout_secs=300))
    assert res["exit_code"] == 0, res
    digest = res["result"].strip("'")
    assert loop.run(rt.exec(sb.id, DISK_HASH))["stdout"].strip() == digest
    return sb, digest


def wait_ready(loop: Loop, rt: Runtime, tag: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while rt.get_snapshot(tag).status != "ready":
        assert rt.get_snapshot(tag).status == "writing"
        assert time.monotonic() < deadline
        loop.run(_sleep(0.1))


async def _sleep(s: float) -> None:
    import asyncio

    await asyncio.sleep(s)


@pytest.mark.parametrize("mode", ["full", "diff", "live"])
def test_branch_grandchildren_inherit_and_stay_isolated(
    loop: Loop, runtime: Runtime, snapshot: str, mode: str
) -> None:
    src, digest = loaded_source(loop, runtime, snapshot, live_fork=(mode == "live"))
    try:
        snap = loop.run(runtime.branch(src.id, mode=mode))
        info = snap.info()
        assert info["tag"] == f"branch-{src.id}-1"
        assert info["branched_from"] == src.id
        assert info["status"] == "ready"
        assert info["pause_ms"] > 0
        print(f"\n{mode}: pause {info['pause_ms']:.1f} ms")
        assert_advancing(loop, runtime, src.id)  # the source runs on after the branch

        mem_print = loop.run(runtime.eval(src.id, MEM_PRINT))["result"]
        disk_print = loop.run(runtime.exec(src.id, DISK_PRINT))["stdout"]
        kids = loop.run(runtime.spawn(snap.tag, 3))
        for kid in kids:
            assert loop.run(runtime.eval(kid.id, MEM_HASH))["result"].strip("'") == digest
            assert loop.run(runtime.exec(kid.id, DISK_HASH))["stdout"].strip() == digest
        a = kids[0]
        assert loop.run(runtime.eval(a.id, "blob = b'changed in A'"))["exit_code"] == 0
        loop.run(runtime.exec(a.id, ["sh", "-c", "echo changed > /root/blob.bin; sync"]))
        fresh = loop.run(runtime.spawn(snap.tag, 1))[0]
        for other in (kids[1], kids[2], fresh, src):
            assert loop.run(runtime.eval(other.id, MEM_PRINT))["result"] == mem_print
            assert loop.run(runtime.exec(other.id, DISK_PRINT))["stdout"] == disk_print
        for kid in (*kids, fresh):
            loop.run(runtime.kill(kid.id))
    finally:
        loop.run(runtime.kill(src.id))
    # A branch outlives its source.
    kid = loop.run(runtime.spawn(snap.tag, 1))[0]
    assert loop.run(runtime.eval(kid.id, MEM_PRINT))["result"] == mem_print
    loop.run(runtime.kill(kid.id))
    loop.run(runtime.delete_snapshot(snap.tag))


def test_depth_three_and_lineage(loop: Loop, runtime: Runtime, snapshot: str) -> None:
    src, digest = loaded_source(loop, runtime, snapshot)
    b1 = loop.run(runtime.branch(src.id, tag="depth-1", mode="diff"))
    assert b1.parent_tag == snapshot
    b1_again = loop.run(runtime.branch(src.id, mode="diff"))
    assert b1_again.tag == f"branch-{src.id}-2"  # seq is per source and monotonic
    g = loop.run(runtime.spawn("depth-1", 1))[0]
    loop.run(runtime.eval(g.id, "level2 = 'set in the grandchild'"))
    b2 = loop.run(runtime.branch(g.id, tag="depth-2"))
    gg = loop.run(runtime.spawn("depth-2", 1))[0]
    b3 = loop.run(runtime.branch(gg.id, tag="depth-3"))
    ggg = loop.run(runtime.spawn(b3.tag, 1))[0]
    assert loop.run(runtime.eval(ggg.id, MEM_HASH))["result"].strip("'") == digest
    assert loop.run(runtime.eval(ggg.id, "level2"))["result"] == "'set in the grandchild'"
    assert loop.run(runtime.exec(ggg.id, DISK_HASH))["stdout"].strip() == digest
    assert b3.parent_tag == "depth-2"

    lineage = runtime.snapshot_lineage("depth-3")
    assert lineage["ancestors"] == ["depth-2", "depth-1", snapshot]
    # The source's second branch is layered on its first, like the grandchild's.
    assert set(runtime.snapshot_lineage("depth-1")["dependents"]) == {b1_again.tag, "depth-2", "depth-3"}
    assert b2.branched_from == g.id

    # Deleting a layer others stand on is refused, naming them; cascade removes the subtree.
    for sb in (g, gg, ggg, src):
        loop.run(runtime.kill(sb.id))
    with pytest.raises(Conflict, match="depth-2"):
        loop.run(runtime.delete_snapshot("depth-1"))
    loop.run(runtime.delete_snapshot("depth-1", cascade=True))
    for tag in ("depth-1", "depth-2", "depth-3", b1_again.tag):
        with pytest.raises(NotFound):
            runtime.get_snapshot(tag)
        assert not (runtime.data.snapshots / tag).exists()


def test_live_no_wait_reports_writing_then_ready(loop: Loop, runtime: Runtime, snapshot: str) -> None:
    src, digest = loaded_source(loop, runtime, snapshot, live_fork=True)
    try:
        snap = loop.run(runtime.branch(src.id, tag="live-nowait", mode="live", wait=False))
        assert snap.status == "writing"
        # The window the guest's disk writes waited (FIFREEZE..FITHAW) is reported beside the pause.
        freeze = runtime.get_snapshot("live-nowait").info()["fs_freeze_ms"]
        assert freeze > 0 and snap.pause_ms is not None
        assert runtime.get_snapshot("live-nowait").info()["status"] in ("writing", "ready")
        if runtime.get_snapshot("live-nowait").status == "writing":
            with pytest.raises(Conflict, match="still being written"):
                loop.run(runtime.spawn("live-nowait", 1))
        wait_ready(loop, runtime, "live-nowait")
        kid = loop.run(runtime.spawn("live-nowait", 1))[0]
        assert loop.run(runtime.eval(kid.id, MEM_HASH))["result"].strip("'") == digest
        loop.run(runtime.kill(kid.id))
    finally:
        loop.run(runtime.kill(src.id))
    loop.run(runtime.delete_snapshot("live-nowait"))


def test_branch_bad_requests(loop: Loop, runtime: Runtime, snapshot: str) -> None:
    sb = loop.run(runtime.spawn(snapshot, 1))[0]
    try:
        with pytest.raises(NotFound):
            loop.run(runtime.branch("sb-000000-0000"))
        with pytest.raises(Conflict, match="already exists"):
            loop.run(runtime.branch(sb.id, tag=snapshot))
        with pytest.raises(InvalidRequest, match="wait: false"):
            loop.run(runtime.branch(sb.id, mode="full", wait=False))
        with pytest.raises(Conflict, match="live_fork"):
            loop.run(runtime.branch(sb.id, mode="live"))
        with pytest.raises(InvalidRequest, match="mode"):
            loop.run(runtime.branch(sb.id, mode="sideways"))
        assert loop.run(runtime.ping(sb.id))["pong"] is True
    finally:
        loop.run(runtime.kill(sb.id))


def _nothing_registered(runtime: Runtime, tag: str) -> None:
    with pytest.raises(NotFound):
        runtime.get_snapshot(tag)
    assert not (runtime.data.snapshots / tag).exists()
    assert not [p for p in runtime.data.snapshots.iterdir() if p.name.startswith(f".{tag}.")]


def test_qemu_killed_mid_branch(loop: Loop, runtime: Runtime, snapshot: str, monkeypatch) -> None:
    sb = loop.run(runtime.spawn(snapshot, 1))[0]
    real = branching._freeze_disk

    async def kill_then_freeze(vm, *args, **kwargs):
        os.kill(vm.pid, signal.SIGKILL)
        await vm.process.wait_exit()
        return await real(vm, *args, **kwargs)

    monkeypatch.setattr(branching, "_freeze_disk", kill_then_freeze)
    with pytest.raises(VMError, match="died during the branch"):
        loop.run(runtime.branch(sb.id, tag="killed-mid"))
    _nothing_registered(runtime, "killed-mid")
    with pytest.raises(NotFound):
        runtime.get_sandbox(sb.id)
    assert not qemu_processes_of(Path(sb.dir))


def test_resume_failure_returns_the_snapshot(
    loop: Loop, runtime: Runtime, snapshot: str, monkeypatch
) -> None:
    sb = loop.run(runtime.spawn(snapshot, 1))[0]
    loop.run(runtime.eval(sb.id, "survivor = 42"))

    async def resume_fails(vm):
        os.kill(vm.pid, signal.SIGKILL)
        await vm.process.wait_exit()
        raise VMError("injected: cont failed")

    monkeypatch.setattr(branching, "resume", resume_fails)
    snap = loop.run(runtime.branch(sb.id, tag="resume-failed"))
    monkeypatch.undo()
    assert snap.status == "ready"
    assert snap.warning
    with pytest.raises(NotFound):
        runtime.get_sandbox(sb.id)  # reported dead and removed
    kid = loop.run(runtime.spawn("resume-failed", 1))[0]
    assert loop.run(runtime.eval(kid.id, "survivor"))["result"] == "42"
    loop.run(runtime.kill(kid.id))
    loop.run(runtime.delete_snapshot("resume-failed"))


@pytest.fixture
def small_fs_runtime(loop: Loop, data_dir):
    """A runtime whose snapshots directory is a small filesystem (the rest is not)."""
    from forkd.config import DataDir

    # A short path: QEMU's unix sockets live under it (108-byte limit).
    root = Path(tempfile.mkdtemp(prefix="fdfull-", dir="/tmp"))
    (root / "snapshots").mkdir()
    # ext4 on a loop device, like a real data disk. (Not tmpfs: on a full tmpfs a
    # child reading a hole of its private mem mapping gets SIGBUS.)
    image = root / "small.ext4"
    subprocess.run(["truncate", "-s", "700M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(root / "snapshots")], check=True)
    probe = data_dir.root / "host-probe.json"
    if probe.exists():
        (root / "host-probe.json").write_bytes(probe.read_bytes())
    rt = loop.run(Runtime.open(DataDir(root, data_dir.images)))
    try:
        yield rt
    finally:
        loop.run(rt.close())
        subprocess.run(["umount", "-l", str(root / "snapshots")], check=False)
        shutil.rmtree(root, ignore_errors=True)


def test_disk_full_during_branch_resumes_source(loop: Loop, small_fs_runtime: Runtime) -> None:
    rt = small_fs_runtime
    loop.run(rt.create_snapshot(SnapshotSpec(tag="small")))
    sb, _ = loaded_source(loop, rt, "small")
    snapshots = rt.data.snapshots
    free = os.statvfs(snapshots)
    filler = snapshots / "filler"
    # Leave ~8 MiB: far less than the branch's memory stream needs.
    subprocess.run(["fallocate", "-l", str(free.f_bavail * free.f_frsize - (8 << 20)), str(filler)],
                   check=True)
    try:
        with pytest.raises(VMError, match="No space left on device"):
            loop.run(rt.branch(sb.id, tag="no-room"))
        _nothing_registered(rt, "no-room")
        assert_advancing(loop, rt, sb.id)  # resumed
        assert loop.run(rt.ping(sb.id))["pong"] is True
    finally:
        filler.unlink()


CONSECUTIVE_BRANCHES = soak(4, 10)


@pytest.mark.soak
def test_many_consecutive_branches_and_deleting_one_under_a_live_source(
    loop: Loop, runtime: Runtime, snapshot: str
) -> None:
    """CONSECUTIVE_BRANCHES branches of one source (4 in make test, 10 in make stress) chain
    without limit, and a branch can be deleted while its source lives: the next branch still
    carries the whole disk."""
    src = loop.run(runtime.spawn(snapshot, 1))[0]
    tags = []
    try:
        for i in range(CONSECUTIVE_BRANCHES):
            loop.run(runtime.exec(src.id, ["sh", "-c", f"echo {i} > /root/step-{i}; sync"]))
            tags.append(loop.run(runtime.branch(src.id, mode="diff")).tag)
        assert runtime.get_snapshot(tags[-1]).parent_tag == tags[-2]
        # The newest branch is the base of the source's next one; delete it anyway.
        loop.run(runtime.delete_snapshot(tags.pop()))
        loop.run(runtime.exec(src.id, ["sh", "-c", "echo after > /root/after; sync"]))
        last = loop.run(runtime.branch(src.id, tag="after-delete", mode="diff"))
        assert last.parent_tag == tags[-1]
        kid = loop.run(runtime.spawn("after-delete", 1))[0]
        out = loop.run(runtime.exec(kid.id, ["sh", "-c", "cat /root/step-* /root/after"]))
        assert out["stdout"].split() == [*map(str, range(CONSECUTIVE_BRANCHES)), "after"]
        loop.run(runtime.kill(kid.id))
    finally:
        loop.run(runtime.kill(src.id))
    loop.run(runtime.delete_snapshot(tags[0], cascade=True))
    for tag in (*tags, "after-delete"):
        assert not (runtime.data.snapshots / tag).exists()
