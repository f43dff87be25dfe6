"""Hibernation: a running sandbox to disk, its QEMU, cgroup and network released; woken on use.

``POST /v1/sandboxes/{id}/hibernate``, an idle policy (``idle_hibernate_secs``,
controller/idle.py) and E2B's ``autoPause`` (a deadline that hibernates instead
of killing, controller/lifetimes.py) all end in ``Hibernator.hibernate``:

* under the sandbox's lock, with no request under way (``AgentGateway.busy``):
  stop the VM, write its device state and the guest pages it changed since its
  restore (a diff against its snapshot's memory, compressed: vmm/hibernation.py,
  host/memdiff.py) into ``<run dir>/hibernation.tmp``, rename it ``hibernation``;
* rewrite its row: hibernated, no pid, no cgroup (``SandboxTable.park``: the commit);
* kill its QEMU, remove its cgroup, take its network off the host but keep its
  lease (controller/network.py ``park``): its namespace name, address and
  egress rules are its own until it is killed.

Its disk layers stay in its run directory, untouched.

A disk-only hibernation (``memory=False``: the forkd API's ``memory: false``,
E2B's ``pause(keep_memory=False)``) keeps nothing else: the guest syncs its
filesystems, the VM is stopped (QEMU flushes its disk caches) and killed, and
its row says ``memory: false``. Its wake cold-boots its template's kernel and
initramfs on its own disk overlay (``TemplateBuilder.cold_boot``, the same
command line: warm imports, the guest's network) under the same id, address
and egress rules, and waits for the guest agent as a template boot does: files
survive, processes, kernels and memory do not, and the guest's ``boot_id`` is
new. Whether its template can still be booted (its image there, not rebuilt)
is checked before the VM is stopped: 409, and it runs on.

Any request to it
(``AgentGateway.for_call``: exec, eval, files, processes, code, E2B's envd
traffic and ``connect``) wakes it first: one wake per sandbox at a time, which
every concurrent request awaits (``wake``). A wake makes the cgroup and
network again, starts a QEMU from the same snapshot, writes the saved pages
into its RAM, loads the device state, steps the guest's clock, and only then
rewrites the row (``SandboxTable.unpark``) and removes the files.

A memory wake first checks each saved file against the BLAKE2b digest taken
when it was written (vmm/hibernation.py ``verify``): one that changed on disk
is refused (500, naming the file) before anything is made for it.

A failed hibernation leaves the sandbox running (its VM is resumed) and nothing
recorded; a failed wake (a cold boot that fails too) kills the QEMU it started
and keeps the files and the row, so it can be tried again.
A daemon killed in the middle: before the row's commit, the sandbox is
re-adopted running (``start`` removes the partial files and resumes it); after
it, recovery keeps the hibernated row and its files and kills any QEMU of it.

Not for ``live_fork`` sandboxes (their RAM is shared memory, not a private
mapping of the snapshot's file) nor ``per_child_netns`` ones (their namespace
is the host's ``forkd-child-<i>``, not theirs to keep): 409.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
import time
from collections import deque
from pathlib import Path
from typing import Any, Protocol

from forkd.controller import volumes
from forkd.controller.agent_gateway import AgentGateway
from forkd.controller.idle import IdlePauser
from forkd.controller.network import Networks
from forkd.controller.sandbox_events import SandboxEvents
from forkd.controller.sandboxes import SandboxTable, remove_cgroup
from forkd.controller.shared_volumes import SharedVolumes
from forkd.controller.snapshots import Forkable, SnapshotStore
from forkd.controller.templates import ColdBoot
from forkd.errors import Conflict, ForkdError, NotFound, NotHibernatable
from forkd.host import cgroups
from forkd.store.layout import check_sandbox_id
from forkd.store.records import Hibernation, SandboxRecord
from forkd.vmm import hibernation as mechanics

log = logging.getLogger("forkd.hibernation")

SAVED_DIR = "hibernation"  # in the run directory: the saved state of a hibernated sandbox
PARTIAL_DIR = "hibernation.tmp"  # being written
CGROUP_FILE = "cgroup"  # in the run directory: the cgroup paths of its QEMU (as the spawner writes)
LATENCIES_KEPT = 256  # recent wake and hibernation times, for /metrics


class DiskWatch(Protocol):
    """Who enforces disk quotas on live VMs (controller/disk_quota.py)."""

    async def limit(self, record: SandboxRecord) -> None: ...

    async def after_removed(self, record: SandboxRecord) -> None: ...


class ColdBoots(Protocol):
    """How a child of a snapshot boots afresh on its disk (controller/templates.py)."""

    def cold_boot(self, snap: Forkable) -> ColdBoot: ...


def saved_bytes(record: SandboxRecord) -> int:
    """What a hibernated sandbox's saved state takes on disk (0 if it is not hibernated)."""
    h = record.hibernation
    return 0 if h is None else h.memory_bytes + h.devices_bytes


class Hibernator:
    def __init__(self, table: SandboxTable, agents: AgentGateway, events: SandboxEvents, store: SnapshotStore,
                 networks: Networks, idle: IdlePauser, disks: DiskWatch, boots: ColdBoots,
                 shared: SharedVolumes | None = None) -> None:
        self._table = table
        self._shared = shared  # serves a woken sandbox's shared volumes again
        self._agents = agents  # only to ask whether a request is under way (``busy``)
        self._boots = boots
        self._store = store
        self._networks = networks
        self._idle = idle
        self._disks = disks
        self._waking: dict[str, asyncio.Task[None]] = {}
        # The hibernated sandboxes and the bytes each one's saved state takes (their rows say so
        # too; this keeps lookups and /metrics off the registry with thousands of rows).
        self._asleep: dict[str, int] = {}
        self.hibernations = 0  # counters for /metrics
        self.wakes = 0
        self.wake_failures = 0
        self.wake_ms: deque[float] = deque(maxlen=LATENCIES_KEPT)
        self.pause_ms: deque[float] = deque(maxlen=LATENCIES_KEPT)
        events.wake_with(self)  # every request to a hibernated sandbox wakes it first
        events.on_removed(self.after_removed)
        idle.hibernate_with(self.hibernate_idle)  # a cycle: this needs the pauser, so it comes later

    # ----------------------------------------------------------------- life

    async def start(self) -> None:
        """After recovery: the hibernated sandboxes are known again; a sandbox re-adopted running
        whose hibernation a dead daemon had begun (no commit) loses the partial files and runs on."""
        for sb in self._table.records.all():
            if sb.hibernation is not None:
                self._asleep[sb.id] = saved_bytes(sb)
                continue
            run_dir = Path(sb.dir)
            partial = [d for d in (run_dir / SAVED_DIR, run_dir / PARTIAL_DIR) if d.exists()]
            if not partial:
                continue
            for d in partial:
                shutil.rmtree(d, ignore_errors=True)
            vm = self._table.vm(sb.id)
            if vm is not None and not self._idle.paused(sb.id):
                with contextlib.suppress(ForkdError, OSError):
                    if await vm.is_paused():
                        await vm.resume()
                        log.warning("sandbox %s was stopped by a hibernation a previous daemon did not "
                                    "finish; it runs again", sb.id)

    async def stop(self) -> None:
        """The daemon stops: a wake under way is cancelled (its new QEMU killed; it stays hibernated)."""
        for task in list(self._waking.values()):
            task.cancel()
        await asyncio.gather(*self._waking.values(), return_exceptions=True)

    def counts(self) -> dict[str, Any]:
        return {"hibernated": len(self._asleep), "hibernations": self.hibernations, "wakes": self.wakes,
                "wake_failures": self.wake_failures, "hibernated_bytes": sum(self._asleep.values())}

    async def after_removed(self, record: SandboxRecord) -> None:
        """``SandboxEvents.removed`` hook: a killed hibernated sandbox took its files along."""
        self._asleep.pop(record.id, None)

    # ------------------------------------------------------------- hibernate

    def check_supported(self, record: SandboxRecord) -> None:
        """409 for a sandbox this design cannot hibernate, saying why."""
        if record.live_fork:
            raise NotHibernatable(
                f"sandbox {record.id!r} is a live_fork sandbox: its RAM is shared memory, not a private "
                "copy of its snapshot's, so it cannot be hibernated as a diff; use pause (a branch) instead")
        if record.per_child_netns:
            raise NotHibernatable(
                f"sandbox {record.id!r} lives in the host's namespace {record.netns}, which is not its own "
                "to release and make again: per_child_netns sandboxes cannot be hibernated")

    async def hibernate(self, sandbox_id: str, *, idle: bool = False, memory: bool = True) -> SandboxRecord:
        """Hibernate a running sandbox; its record. 409 if hibernated already, busy, or unsupported.

        ``idle``: the idle policy asks; a sandbox that became busy meanwhile is left alone
        (``Conflict``, which the idle pauser takes as "later"). ``memory=False``: disk only; its
        wake cold-boots it (409 now if its template could not be booted again).
        """
        check_sandbox_id(sandbox_id)
        sandbox_id = self._table.resolve(sandbox_id)
        if self._table.hidden(sandbox_id):
            raise NotFound(f"sandbox {sandbox_id!r} is not alive")
        record = self._table.records.get(sandbox_id)
        if record.hibernation is not None:
            raise Conflict(f"sandbox {sandbox_id!r} is hibernated already")
        self.check_supported(record)
        async with self._table.lock(sandbox_id):
            vm = self._table.get(sandbox_id)  # 404, or 502 for one whose QEMU died
            if self._agents.busy(sandbox_id) or await vm.migrating():
                raise Conflict(f"sandbox {sandbox_id!r} has requests or a live branch under way; "
                               "hibernate it once they end")
            record = self._table.records.get(sandbox_id)
            snap = self._store.forkable(record.snapshot_tag)
            if not memory:
                self._boots.cold_boot(snap)  # 409 while it still runs, rather than at its wake
            run_dir = Path(record.dir)
            partial, saved = run_dir / PARTIAL_DIR, run_dir / SAVED_DIR
            started = time.monotonic()
            try:
                for d in (partial, saved):
                    shutil.rmtree(d, ignore_errors=True)
                # Disk only, it stays empty: a daemon that dies before the commit finds it, and
                # runs the stopped sandbox on (start).
                partial.mkdir()
                if memory:
                    captured = await mechanics.capture(vm, snap.dir.mem, partial)
                    partial.rename(saved)
                    hibernation = Hibernation(
                        at_unix=time.time(), pages=captured.pages, memory_bytes=captured.memory_bytes,
                        devices_bytes=captured.devices_bytes, pause_ms=captured.stopped_ms,
                        digests=captured.digests)
                else:
                    hibernation = Hibernation(at_unix=time.time(), pages=0, memory_bytes=0, devices_bytes=0,
                                              pause_ms=await mechanics.flush(vm), memory=False)
                cgroup, cgroup_extra = record.cgroup, record.cgroup_extra
                record.hibernation = hibernation
                record.pid, record.cgroup, record.cgroup_extra = None, None, []
                self._table.park(record)  # the commit
                self._asleep[sandbox_id] = saved_bytes(record)
                shutil.rmtree(partial, ignore_errors=True)  # disk only: the empty marker
            except BaseException:
                shutil.rmtree(partial, ignore_errors=True)
                shutil.rmtree(saved, ignore_errors=True)
                with contextlib.suppress(ForkdError, OSError):
                    await vm.resume()  # save_devices stopped it
                raise
            self._idle.forget(sandbox_id)
            await self._disks.after_removed(record)  # its quota watcher followed the old VM
            await vm.destroy()
            await remove_cgroup(cgroup, cgroup_extra)
            (run_dir / CGROUP_FILE).unlink(missing_ok=True)
            if record.network is not None:
                await self._networks.park(record.network)
            for name in ("qmp.sock", "agent.sock", "pid"):
                (run_dir / name).unlink(missing_ok=True)
            self.hibernations += 1
            self.pause_ms.append(hibernation.pause_ms)
            log.info("hibernated %s%s%s: %d pages in %.1f MiB, %.0f ms stopped, %.0f ms in all", sandbox_id,
                     " (idle)" if idle else "", "" if memory else " (disk only)", hibernation.pages,
                     saved_bytes(record) / (1 << 20), hibernation.pause_ms,
                     (time.monotonic() - started) * 1000)
            return record

    async def hibernate_idle(self, sandbox_id: str) -> None:
        """The idle policy's call (``IdlePauser.hibernate_with``)."""
        await self.hibernate(sandbox_id, idle=True)

    # ------------------------------------------------------------------ wake

    def hibernated(self, sandbox_id: str) -> bool:
        return sandbox_id in self._asleep

    def asleep_with_memory(self, sandbox_id: str) -> bool:
        """Hibernated with its memory and without volumes (so it can be forked without a wake:
        controller/hibernated_branch.py), and not waking now."""
        if not self.hibernated(sandbox_id) or sandbox_id in self._waking:
            return False
        record = self._table.records.get(sandbox_id)
        return record.hibernation is not None and record.hibernation.memory and not record.volumes

    async def wake(self, sandbox_id: str) -> bool:
        """Wake ``sandbox_id`` if it is hibernated (every concurrent caller awaits the same wake);
        False if it is not hibernated. A failed wake raises, and leaves it hibernated."""
        task = self._waking.get(sandbox_id)
        if task is None:
            if not self.hibernated(sandbox_id):
                return False
            task = asyncio.create_task(self._wake(sandbox_id), name=f"forkd-wake:{sandbox_id}")
            self._waking[sandbox_id] = task
            task.add_done_callback(lambda _: self._waking.pop(sandbox_id, None))
        await asyncio.shield(task)  # a caller that gives up does not cancel the others' wake
        return True

    async def _wake(self, sandbox_id: str) -> None:
        async with self._table.lock(sandbox_id):
            if sandbox_id in self._table:
                return
            record = self._table.records.get(sandbox_id)  # 404: killed while we waited
            if record.hibernation is None:
                return
            started = time.monotonic()
            how = "woke" if record.hibernation.memory else "cold-booted"
            try:
                record = await self._restart(record)
            except BaseException:
                self.wake_failures += 1
                raise
            self.wakes += 1
            elapsed = (time.monotonic() - started) * 1000
            self.wake_ms.append(elapsed)
            log.info("%s %s in %.0f ms", how, sandbox_id, elapsed)
        self._idle.track(record)
        if record.disk_quota_mib:
            try:
                await self._disks.limit(record)
            except (ForkdError, OSError) as exc:
                log.warning("woken sandbox %s: its disk quota could not be armed again: %s", sandbox_id, exc)

    async def _restart(self, record: SandboxRecord) -> SandboxRecord:
        snap = self._store.forkable(record.snapshot_tag)
        run_dir = Path(record.dir)
        assert record.hibernation is not None  # the caller checked
        if record.hibernation.memory:
            # Before anything is made for it: a file that changed on disk is refused (500, naming
            # it), and the sandbox stays hibernated with its files, as after any failed wake.
            if record.hibernation.digests:
                await asyncio.to_thread(mechanics.verify, run_dir / SAVED_DIR, record.hibernation.digests)
            else:
                log.warning("sandbox %s was hibernated by a forkd that recorded no digests: its files "
                            "are loaded unchecked", record.id)
        cgroup: cgroups.CgroupHandle | None = None
        launcher: list[str] = []
        try:
            if any(v is not None for v in (record.memory_limit_mib, record.cpu_limit, record.pids_limit)):
                cgroup = cgroups.create(record.id, record.memory_limit_mib, cpu=record.cpu_limit,
                                        pids=record.pids_limit)
                # Before QEMU exists: a daemon that dies now still finds it (recovery).
                (run_dir / CGROUP_FILE).write_text("".join(f"{p}\n" for p in cgroup.paths))
                launcher += cgroup.launcher()
            if record.network is not None:
                # Its address may be a new one (its old index taken meanwhile): the row says so.
                record.network = await self._networks.unpark(record.network)
                launcher += self._networks.launcher(record.network)
            # Its volumes come back on its own layers (they mirror its disk's), nodes renamed as its disk's.
            drives = volumes.drives_for(record.volumes, Path(record.disk.file), mechanics.ACTIVE_NODE,
                                        snap.dir)
            if record.hibernation.memory:
                vm = await mechanics.wake(run_dir, record.config, mem_path=snap.dir.mem,
                                          snapshot_state=snap.dir.state, disk=Path(record.disk.file),
                                          saved=run_dir / SAVED_DIR, tap=record.tap, launcher=launcher,
                                          volumes=drives)
            else:
                boot = self._boots.cold_boot(snap)
                vm = await mechanics.cold_boot(run_dir, record.config, mem_path=snap.dir.mem,
                                               disk=Path(record.disk.file), kernel=boot.kernel,
                                               initrd=boot.initrd, append=boot.append, tap=record.tap,
                                               launcher=launcher, volumes=drives)
                try:
                    await volumes.mount_in_guest(vm, record.volumes)  # a new boot: mounted afresh
                except BaseException:
                    await vm.destroy()
                    raise
        except BaseException:
            if cgroup is not None:
                cgroup.remove()
                (run_dir / CGROUP_FILE).unlink(missing_ok=True)
            if record.network is not None:
                with contextlib.suppress(ForkdError, OSError):
                    await self._networks.park(record.network)
            raise
        record.hibernation = None
        # The new QEMU opened its active layer (with its chain behind it) as node "disk0", whatever
        # name a branch had given it in the old one (branches name theirs disk<seq>, seq >= 1).
        record.disk = dataclasses.replace(record.disk, node=mechanics.ACTIVE_NODE)
        record.pid = vm.pid
        record.cgroup = str(cgroup.path) if cgroup is not None else None
        record.cgroup_extra = [str(p) for p in cgroup.extra] if cgroup is not None else []
        record.timings = {**record.timings, **{f"wake_{k}": v for k, v in vm.timings.items()}}
        self._table.unpark(record, vm)  # the commit
        self._asleep.pop(record.id, None)
        shutil.rmtree(run_dir / SAVED_DIR, ignore_errors=True)
        if self._shared is not None:
            # Served again before anyone asks: a cold boot mounts them afresh, a memory wake keeps its
            # mounts and hands its unanswered ops to this daemon again.
            try:
                await self._shared.attach(record.id, vm, record.volumes)
            except ForkdError as exc:
                log.warning("sandbox %s woke, but its shared volumes could not be mounted: %s",
                            record.id, exc)
        return record


__all__ = ["PARTIAL_DIR", "SAVED_DIR", "Hibernator", "saved_bytes"]
