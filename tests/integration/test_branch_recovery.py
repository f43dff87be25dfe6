"""A daemon killed mid-branch (or mid fork of a running sandbox, which branches it): the next
start finishes or undoes what the branch had begun on its source (controller/branch.py
``Brancher.recover``).

The half-done state is made by hand, through the source's own QMP socket while no daemon
runs, exactly as the brancher leaves it when the kill lands after its disk cut
(``blockdev-snapshot-sync``) and during its migration (stopped before the switch-over), with
the marker the brancher writes before it touches QEMU: no test has to time a SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from forkd.vmm.qmp import QMP

from .conftest import Seeder
from .daemon_fixture import Daemon, evaluate, new_daemon, ok, shutdown_and_check, start_or_clean_up

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def daemon(snapshot: str, seed: Seeder) -> Iterator[Daemon]:
    d = new_daemon("fkbr-")
    seed(d.root, base=snapshot)  # the session's template: no boot of its own
    start_or_clean_up(d)
    try:
        yield d
    finally:
        shutdown_and_check(d)


async def _await_migration(qmp: QMP, status: str) -> None:
    deadline = time.monotonic() + 120
    while (await qmp.cmd("query-migrate")).get("status") != status:
        assert time.monotonic() < deadline, f"the migration did not reach {status}"
        await asyncio.sleep(0.05)


async def cut_short_branch(run_dir: Path, mode: str) -> None:
    """What a branch has done to its source when a kill lands after its disk cut: a diff-mode
    one waits at the switch-over; a full-mode one (a fork's) stopped the VM, and QEMU finished
    the migration by itself, leaving it stopped."""
    (run_dir / "branch-cut.json").write_text(json.dumps(
        {"mode": mode, "node": "disk1", "file": str(run_dir / "disk-1.qcow2"),
         "frozen": str(run_dir / "disk.qcow2")}))
    cut = {"node-name": "disk0", "snapshot-file": str(run_dir / "disk-1.qcow2"),
           "snapshot-node-name": "disk1", "format": "qcow2", "mode": "absolute-paths"}
    qmp = await QMP(run_dir / "qmp.sock", run_dir.name).connect(timeout=10)
    try:
        if mode == "diff":
            await qmp.cmd("migrate-set-capabilities", capabilities=[
                {"capability": "pause-before-switchover", "state": True}])
            await qmp.cmd("migrate", uri="exec:cat > /dev/null")
            await _await_migration(qmp, "pre-switchover")
            await qmp.cmd("blockdev-snapshot-sync", **cut)
        else:
            await qmp.cmd("stop")
            await qmp.cmd("blockdev-snapshot-sync", **cut)
            await qmp.cmd("migrate", uri="exec:cat > /dev/null")
            await _await_migration(qmp, "completed")
        assert (await qmp.cmd("query-status"))["status"] != "running"
    finally:
        await qmp.close()


@pytest.mark.parametrize("mode", ["diff", "full"])
def test_a_source_left_mid_branch_runs_again_on_the_overlay_its_qemu_writes(daemon: Daemon,
                                                                           mode: str) -> None:
    with daemon.client() as c:
        [sb] = ok(c.post("/v1/sandboxes", json={"snapshot_tag": "base"}, timeout=300))
        sb_id = sb["id"]
        assert evaluate(c, sb_id, "state = 'before the crash'; state") == "'before the crash'"
    run_dir = daemon.root / "sandboxes" / sb_id

    daemon.kill9()
    try:
        asyncio.run(cut_short_branch(run_dir, mode))
    finally:
        daemon.start()  # same data dir, token and port

    with daemon.client() as c:
        # The same VM runs again, its memory intact (not a 502 from a QEMU stuck mid-migration).
        assert ok(c.post(f"/v1/sandboxes/{sb_id}/ping"))["pong"] is True
        assert evaluate(c, sb_id, "state") == "'before the crash'"
        assert not (run_dir / "branch-cut.json").exists()
        out = ok(c.post(f"/v1/sandboxes/{sb_id}/exec",
                        json={"args": ["sh", "-c", "echo after > /root/after.txt && sync"]}))
        assert out["exit_code"] == 0, out
        # Its row follows the overlay QEMU writes since the cut: a branch of it works (it was a
        # 500 when the row still named disk.qcow2), and carries what was written after the restart.
        tag = f"after-crash-{mode}"
        branch = ok(c.post(f"/v1/sandboxes/{sb_id}/branch", json={"tag": tag}, timeout=300))
        assert branch["status"] == "ready", branch
        [child] = ok(c.post("/v1/sandboxes", json={"snapshot_tag": tag}, timeout=300))
        out = ok(c.post(f"/v1/sandboxes/{child['id']}/exec", json={"args": ["cat", "/root/after.txt"]}))
        assert out["stdout"] == "after\n", out
        assert evaluate(c, child["id"], "state") == "'before the crash'"
        for sandbox in (child["id"], sb_id):
            assert c.delete(f"/v1/sandboxes/{sandbox}").status_code == 204
