"""Sandbox lifetimes with real VMs: an expired sandbox's QEMU, cgroup and run dir go,
also when the daemon was down at the deadline.

Deadlines are a few seconds; the waits poll with a generous ceiling (a kill
under TCG on a busy host takes a while), so the assertions are about what is
left, not about latency.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import pytest

from forkd.config import DataDir
from forkd.controller.options import SpawnOptions
from forkd.controller.runtime import Runtime
from forkd.host import cgroups
from forkd.store.registry import SandboxRecord, SnapshotRecord

from .conftest import Loop, images_dir

pytestmark = pytest.mark.vm

GRACE_SECS = 15.0  # ceiling on how long after its deadline a sandbox may still be seen


def limit() -> int | None:
    """A memory limit (so the child has a cgroup to check) where the host can set one."""
    return 512 if os.geteuid() == 0 and cgroups.detect() != "none" else None


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def gone(rt: Runtime, sb: SandboxRecord) -> bool:
    return (not rt.registry.sandboxes.has(sb.id) and not alive(sb.pid) and not Path(sb.dir).exists()
            and not (sb.cgroup and Path(sb.cgroup).exists()))


def wait_gone(loop: Loop, rt: Runtime, sb: SandboxRecord, deadline: float) -> float:
    """Seconds after ``deadline`` at which ``sb`` was entirely gone."""
    while not gone(rt, sb):
        assert time.time() < deadline + GRACE_SECS, f"{sb.id} still there {GRACE_SECS} s after expiry"
        loop.run(asyncio.sleep(0.1))
    return time.time() - deadline


def test_an_expired_sandbox_is_killed_with_its_qemu_and_cgroup(
    loop: Loop, runtime: Runtime, snapshot: str
) -> None:
    doomed, kept = loop.run(runtime.spawn(snapshot, 2,
                                          SpawnOptions(memory_limit_mib=limit(), timeout_secs=5)))
    try:
        assert doomed.expires_at_unix is not None
        assert runtime.get_sandbox(doomed.id).info()["expires_at_unix"] == round(doomed.expires_at_unix, 3)
        runtime.set_timeout(kept.id, 600)  # extended: must outlive its sibling
        assert alive(doomed.pid) and (doomed.cgroup is None or Path(doomed.cgroup).is_dir())
        late = wait_gone(loop, runtime, doomed, doomed.expires_at_unix)
        print(f"\nexpired sandbox gone {late:.2f} s after its deadline")
        assert loop.run(runtime.ping(kept.id))["pong"] is True
        assert runtime.get_sandbox(kept.id).expires_at_unix is not None
    finally:
        for sb in (doomed, kept):
            if runtime.registry.sandboxes.has(sb.id):
                loop.run(runtime.kill(sb.id))


def test_a_sandbox_that_expires_while_the_daemon_is_down_is_reaped_on_restart(
    loop: Loop, runtime: Runtime, snapshot: str
) -> None:
    # A scratch data dir directly under /tmp: QEMU's sockets live under it (108 bytes), and an
    # xdist worker's tmp_path is longer than that allows.
    data = DataDir(DataDir.scratch("fkl-").root, images_dir())
    rt = loop.run(Runtime.open(data))
    try:
        # The session's snapshot, hard-linked (its files are never written): no template boot.
        src = runtime.get_snapshot(snapshot)
        dst = data.snapshots / snapshot
        shutil.copytree(src.dir, dst, copy_function=os.link)
        rt.registry.snapshots.insert(SnapshotRecord(tag=snapshot, dir=str(dst),
                                                   created_at_unix=src.created_at_unix))
        doomed, kept = loop.run(rt.spawn(snapshot, 2, SpawnOptions(memory_limit_mib=limit(), timeout_secs=3)))
        rt.set_timeout(kept.id, 600)
        loop.run(rt.close(keep_sandboxes=True))  # the daemon goes away; the VMs keep running
        assert doomed.expires_at_unix is not None
        loop.run(asyncio.sleep(max(0.0, doomed.expires_at_unix - time.time()) + 0.5))
        assert alive(doomed.pid), "nobody should have killed it while no daemon ran"
        rt = loop.run(Runtime.open(data))
        # Killed during open, before the runtime could serve anything.
        assert gone(rt, doomed), "the expired sandbox survived the restart"
        assert [sb.id for sb in rt.list_sandboxes()] == [kept.id]  # re-adopted, deadline kept
        assert rt.reaper.deadline(kept.id) == rt.get_sandbox(kept.id).expires_at_unix
        assert loop.run(rt.ping(kept.id))["pong"] is True
    finally:
        # Whatever failed, a runtime on this data dir kills what is left (the first one may
        # have closed with keep_sandboxes).
        loop.run(rt.close())
        if any(data.sandboxes.iterdir()):  # left running by close(keep_sandboxes=True)
            loop.run(loop.run(Runtime.open(data)).close())
        shutil.rmtree(data.root, ignore_errors=True)
    assert not alive(kept.pid) and not (kept.cgroup and Path(kept.cgroup).exists())
