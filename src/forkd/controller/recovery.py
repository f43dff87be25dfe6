"""Start-up after a restart (or a crash): re-adopt what survived, reap the rest.

Sandboxes whose QEMU is still alive are re-attached with their in-memory state
intact; dead ones lose their row, run directory and cgroup. Hibernated ones
keep their row and run directory (their saved state and disk) untouched; only
what a wake that a crash cut short left (its QEMU, its cgroup) goes.
Interrupted snapshot writes and run directories no row points at are removed.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path

from forkd.config import DataDir
from forkd.controller.sandboxes import SandboxTable, remove_cgroup
from forkd.controller.snapshots import SnapshotStore
from forkd.errors import ForkdError
from forkd.host.shm import ShmMemory
from forkd.store import layout
from forkd.store.layout import SnapshotDir
from forkd.vmm.machine import VM
from forkd.vmm.process import adopt, kill_pid_now, kill_qemus_under

log = logging.getLogger("forkd.recovery")


async def recover(data: DataDir, store: SnapshotStore, table: SandboxTable, shm: ShmMemory) -> None:
    for name in layout.remove_stale_staging(data.snapshots):
        log.warning("removed interrupted snapshot write %s", name)
    for snap in store.all():
        if snap.status == "writing" or not SnapshotDir(Path(snap.dir)).complete():
            log.warning("snapshot %s was not complete at restart; removing it", snap.tag)
            shutil.rmtree(snap.dir, ignore_errors=True)
            store.unregister(snap.tag)
    for sb in table.records.all():
        run_dir = Path(sb.dir)
        if sb.hibernation is not None:
            await _settle_hibernated(run_dir)
            continue
        process = adopt(sb.pid or 0, run_dir)
        if process is not None:
            try:
                # A pool member stays hidden; the pool keeper decides whether it goes back in.
                table.adopt(sb.id, await VM.attach(process, sb.config), pooled=sb.pooled)
                log.info("re-adopted sandbox %s (pid %s)", sb.id, sb.pid)
                continue
            except (ForkdError, OSError) as exc:
                log.warning("cannot re-adopt %s (%s); killing it", sb.id, exc)
        kill_pid_now(sb.pid or 0, run_dir)
        await remove_cgroup(sb.cgroup, sb.cgroup_extra)
        shutil.rmtree(run_dir, ignore_errors=True)
        table.forget(sb.id)
        log.info("reaped dead sandbox %s", sb.id)
    # Run dirs no row points at (a crash between mkdir and insert).
    known = {sb.id for sb in table.records.all()}
    for d in data.sandboxes.iterdir():
        if d.is_dir() and d.name not in known:
            with contextlib.suppress(OSError, ValueError):
                kill_pid_now(int((d / "pid").read_text()), d)
            with contextlib.suppress(OSError):
                # One path per line (v1: one per hierarchy); older daemons wrote one.
                paths = (d / "cgroup").read_text().split()
                if paths:
                    await remove_cgroup(paths[0], paths[1:])
            shutil.rmtree(d, ignore_errors=True)
    # QEMUs of this data dir that no row owns: a fork's children, a template boot or a branch
    # helper that a crash caught before their rows (or pid files) were written.
    adopted = {vm.pid for vm in (table.vm(i) for i in table.ids()) if vm is not None}
    for pid in kill_qemus_under(data.root, keep=adopted):
        log.warning("killed QEMU %d of this data dir that no sandbox owns (left by a crash)", pid)
    shm.prune(keep={sb.snapshot_tag for sb in table.records.all() if sb.live_fork})


async def _settle_hibernated(run_dir: Path) -> None:
    """A hibernated sandbox whose wake a crash cut short: its QEMU (pid file) and cgroup go.
    (A hibernation the crash cut short after its commit left its QEMU too: the data dir's
    sweep of unowned QEMUs kills it.)"""
    with contextlib.suppress(OSError, ValueError):
        kill_pid_now(int((run_dir / "pid").read_text()), run_dir)
    with contextlib.suppress(OSError):
        paths = (run_dir / "cgroup").read_text().split()
        if paths:
            await remove_cgroup(paths[0], paths[1:])
        (run_dir / "cgroup").unlink()
    for name in ("pid", "qmp.sock", "agent.sock"):
        with contextlib.suppress(OSError):
            (run_dir / name).unlink()
