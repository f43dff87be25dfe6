"""Forking children: claim their host resources, restore them, register them.

All or nothing: a batch that cannot start in full is torn down, so the caller
never holds ids it did not see. Per child the spawner makes its network (a
namespace of its own when the snapshot has a NIC, or with ``per_child_netns``;
controller/network.py), a cgroup (``memory_limit_mib``, ``cpu_limit``,
``pids_limit``), gives it a copy-on-write disk overlay and restores it with
``VM.restore``. A child that stays silent after its restore
is retried once with a fresh QEMU: nothing has been handed out yet, so that is
safe.

Before restoring, a spawn claims what a warm pool (``PoolSource``, i.e.
controller/pools.py) holds for the same snapshot and options; the pool keeper
in turn restores its members here (``restore_member``) and waits for
foreground spawns to end first (``wait_idle``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
import time
from pathlib import Path
from typing import Protocol

from forkd import bounds
from forkd.config import DataDir
from forkd.controller import volumes
from forkd.controller.capacity import HostCapacity
from forkd.controller.child_specs import ChildSpec, child_specs
from forkd.controller.host_accel import HostAccelerator
from forkd.controller.network import NetRequest, Networks
from forkd.controller.options import SpawnOptions
from forkd.controller.sandboxes import SandboxTable
from forkd.controller.shared_volumes import SharedVolumes
from forkd.controller.snapshots import Forkable, SnapshotStore
from forkd.errors import BootTimeout, ForkdError, InvalidRequest, VMError
from forkd.host import cgroups, memdiff, pagecache
from forkd.host import netns as netns_mod
from forkd.host.accel import check_compatible
from forkd.host.egress import EgressPolicy
from forkd.host.netplan import ChildNet
from forkd.host.shm import ShmMemory
from forkd.store import restore_chunks
from forkd.store.records import DiskChain, PoolKey, SandboxRecord
from forkd.store.volume_spec import is_shared
from forkd.vmm import console
from forkd.vmm.disk import clone_overlay
from forkd.vmm.machine import VM

log = logging.getLogger("forkd.spawner")

# Restoring is CPU-bound under TCG; more in flight than this only thrashes 2 cores.
SPAWN_PARALLELISM = 8
# Restore attempts per child when its guest stays silent after the restore.
RESTORE_ATTEMPTS = 2



class PoolSource(Protocol):
    """Where a spawn looks first for children already restored (controller/pools.py)."""

    async def claim(self, tag: str, children: list[ChildSpec], options: SpawnOptions
                    ) -> list[SandboxRecord | None]:
        """A claimed, resumed, reseeded child per spec a pool could serve; None for the rest."""
        ...


class DiskLimits(Protocol):
    """Who enforces children's disk quotas (controller/disk_quota.py)."""

    def quota_for(self, asked: int | None) -> int | None:
        """The quota (MiB) a child that asked for ``asked`` gets; None: none."""
        ...

    async def limit(self, record: SandboxRecord) -> None:
        """Enforce ``record.disk_quota_mib`` on the live child from now on."""
        ...


class MissingSnapshots(Protocol):
    """Where a spawn of a tag this host lacks looks for it (controller/travel.py: the object store)."""

    async def ensure_local(self, tag: str) -> None:
        """Bring ``tag`` here if it can be had; return quietly if not (the spawn then says 404)."""
        ...

    async def lazy_failure(self, tag: str) -> ForkdError | None:
        """Why ``tag``'s children fail, if it is still arriving and could not (a corrupt chunk, a
        store gone); answered once what the failed import registered is gone again."""
        ...


class Spawner:
    def __init__(self, data: DataDir, table: SandboxTable, store: SnapshotStore,
                 accel: HostAccelerator, networks: Networks, shm: ShmMemory,
                 capacity: HostCapacity | None = None, *, disks: DiskLimits | None = None,
                 missing: MissingSnapshots | None = None, host_id: str | None = None,
                 shared: SharedVolumes | None = None) -> None:
        """``capacity``: the host's ceilings (None: its own, with no limits); ``disks``: who enforces
        every child's disk quota (None: none is); ``missing``: where a spawn of a tag this host lacks
        asks for it first (None: it says 404); ``host_id``: this host's name in a fleet."""
        self._data = data
        # The host's ceilings (controller/capacity.py): a new VM past them is a 503 no_capacity.
        self._capacity = capacity or HostCapacity(live=lambda: len(table.ids()))
        self._table = table
        self._store = store
        self._accel = accel
        self._networks = networks
        self._shm = shm
        self._busy: dict[str, int] = {}  # tag -> spawns of it in progress (pool refills included)
        # Snapshots whose restore-touched chunks were recorded, or tried (store/restore_chunks.py).
        self._touch_tried: set[str] = set()
        self._pool: PoolSource | None = None
        self._missing = missing
        self._disks = disks
        self._shared = shared  # who serves shared volumes (None: a spawn that needs one is refused)
        # Names the host in every sandbox id (sb-<host>-<hex>-<n>), so a fleet gateway can route by id.
        self.host_id = host_id
        # Foreground spawns in progress: pool refills wait until there are none.
        self._foreground = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def draw_from(self, pool: PoolSource) -> None:
        """From now on spawns claim matching children from ``pool`` before restoring (the pool
        keeper says so at its construction: it needs this spawner, so it comes later)."""
        self._pool = pool

    def spawning(self, tag: str) -> bool:
        """Whether children of ``tag`` are being restored right now (not yet registered)."""
        return self._busy.get(tag, 0) > 0

    async def wait_idle(self) -> None:
        """Return once no foreground spawn (or fork) is in progress."""
        while self._foreground:
            await self._idle.wait()

    async def spawn(self, tag: str, n: int = 1, options: SpawnOptions | None = None) -> list[SandboxRecord]:
        """Fork ``n`` children of snapshot ``tag`` in parallel; all or nothing.

        ``options.prewarm``: read the snapshot's memory file into the page cache first
        (host/pagecache.py). (Deadlines and idle pauses are the Runtime's.)
        """
        options = options or SpawnOptions()
        children = child_specs(n, options)
        if options.prewarm:
            snap = self._store.forkable(tag)
            read = await asyncio.to_thread(pagecache.prefetch, snap.dir.mem)
            log.info("prewarm: read %d MiB of %s's memory into the page cache", read >> 20, tag)
        results = await self.spawn_each(tag, children, options)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            # All or nothing: a partial batch would leave the caller with ids it never saw.
            await asyncio.gather(*(self._table.kill(r.id) for r in results
                                   if isinstance(r, SandboxRecord)), return_exceptions=True)
            raise failures[0]
        return [r for r in results if isinstance(r, SandboxRecord)]

    def check_capacity(self, n: int) -> None:
        """NoCapacity (503) if ``n`` more VMs would pass this host's ceilings now (controller/capacity.py)."""
        self._capacity.check(n)

    async def check_request(self, tag: str, memory_limits: list[int | None], *, per_child_netns: bool,
                            egress: EgressPolicy | None = None) -> tuple[Forkable, NetRequest | None]:
        """The request-wide checks of a spawn (400/404/409 before any VM starts): the snapshot,
        and what its children's networks need (None: no network)."""
        self.check_limits(memory_limits)  # a bad body is 400 whether or not the tag exists
        snap = self._store.forkable(tag)
        host = await self._accel.for_snapshot(snap.dir)
        check_compatible(snap.config.accel, host, tag)
        net = await self._networks.prepare(tap=snap.tap, dns=snap.dns, egress=egress or EgressPolicy(),
                                           per_child_netns=per_child_netns, what=f"snapshot {tag!r}")
        return snap, net

    async def check_network(self, *, tap: str | None, dns: tuple[str, ...], egress: EgressPolicy | None,
                            per_child_netns: bool, what: str) -> None:
        """The network checks of ``check_request``, for a fork before its source is paused."""
        await self._networks.prepare(tap=tap, dns=dns, egress=egress or EgressPolicy(),
                                     per_child_netns=per_child_netns, what=what)

    @staticmethod
    def check_limits(memory_limits: list[int | None]) -> None:
        for limit in memory_limits:
            if limit is not None:
                cgroups.validate_limit(limit)
                if cgroups.detect() == "none":
                    raise InvalidRequest(f"{cgroups.NEEDS}; this host has neither")

    async def spawn_each(self, tag: str, children: list[ChildSpec], options: SpawnOptions | None = None
                         ) -> list[SandboxRecord | ForkdError]:
        """Fork one child per spec; each succeeds or fails on its own.

        Request-wide problems (bad tag, bad options, a missing namespace) raise
        before any VM starts. A child that fails leaves nothing behind, and its
        error takes its place in the result. Children a warm pool can serve
        (same snapshot and options) are claimed from it; the rest are restored.
        Of ``options`` the batch-wide ones count here (namespace, ``live_fork``,
        egress); the per-child ones are in ``children``.
        """
        options = options or SpawnOptions()
        per_child_netns, live_fork = options.per_child_netns, options.live_fork
        n = len(children)
        bounds.SPAWN_N.check(n)
        if self._disks is not None:
            children = [dataclasses.replace(c, disk_quota_mib=self._disks.quota_for(c.disk_quota_mib))
                        for c in children]
        self._foreground += 1
        self._idle.clear()
        self._busy[tag] = self._busy.get(tag, 0) + 1
        try:
            if self._missing is not None:
                await self._missing.ensure_local(tag)
            snap, net = await self.check_request(tag, [c.memory_limit_mib for c in children],
                                                 per_child_netns=per_child_netns, egress=options.egress)
            if options.volumes:
                if self._shared is None:
                    raise InvalidRequest("this daemon serves no shared volumes")
                extra = tuple(self._shared.spawn_entries(options.volumes, snap.volumes))
                children = [dataclasses.replace(c, volumes=extra) for c in children]
            claimed: list[SandboxRecord | None] = [None] * n
            if any(c.cpu_limit is not None or c.pids_limit is not None for c in children):
                for name, asked in (("cpu", any(c.cpu_limit is not None for c in children)),
                                    ("pids", any(c.pids_limit is not None for c in children))):
                    if asked and cgroups.detect_controller(name) == "none":  # 400 before any VM starts
                        raise InvalidRequest(f"{cgroups.needs(name)}; this host has neither")
            elif self._pool is not None and not options.volumes and not any(c.sandbox_id for c in children):
                # (A child with an id of its own is a resume: no pool member has that id. Pool members
                # mount only their snapshot's volumes: a spawn's own are restored with each child.)
                # Pool members have no cpu or pids limit: only spawns without one draw from a pool.
                claimed = await self._pool.claim(tag, children, options)
            misses = [i for i, c in enumerate(claimed) if c is None]
            results: list[SandboxRecord | ForkdError] = [c for c in claimed if c is not None]
            if not misses:
                return await self._limit_disks(results)
            try:
                with self._capacity.admit(len(misses)):  # claimed members hold their places already
                    fresh = await self._restore_batch(snap, [children[i] for i in misses], net,
                                                      per_child_netns=per_child_netns, live_fork=live_fork)
            except BaseException:
                # A request-wide refusal after the claims: the claimed children go too.
                await asyncio.gather(*(self._table.kill(c.id) for c in claimed if c is not None),
                                     return_exceptions=True)
                raise
            if self._missing is not None and (why := await self._missing.lazy_failure(tag)) is not None:
                # "QEMU exited" hides it: the memory it was restoring could not be had.
                fresh = [why if isinstance(r, ForkdError) else r for r in fresh]
            merged: list[SandboxRecord | ForkdError] = []
            fresh_iter = iter(fresh)
            for c in claimed:
                merged.append(c if c is not None else next(fresh_iter))
            return await self._limit_disks(merged)
        finally:
            self._busy[tag] -= 1
            if not self._busy[tag]:
                del self._busy[tag]
            self._foreground -= 1
            if not self._foreground:
                self._idle.set()

    async def _limit_disks(self, results: list[SandboxRecord | ForkdError]
                           ) -> list[SandboxRecord | ForkdError]:
        """Arm each child's disk quota before anyone gets it; a child it fails for fails."""
        if self._disks is None:
            return results
        disks = self._disks

        async def one(result: SandboxRecord | ForkdError) -> SandboxRecord | ForkdError:
            if isinstance(result, ForkdError) or not result.disk_quota_mib:
                return result
            try:
                await disks.limit(result)
            except (ForkdError, OSError) as exc:
                with contextlib.suppress(ForkdError, OSError):
                    await self._table.kill(result.id)
                return VMError(f"child {result.id} could not get its disk quota: {exc}")
            return result

        return list(await asyncio.gather(*(one(r) for r in results)))

    async def restore_member(self, key: PoolKey) -> SandboxRecord:
        """Restore one warm-pool member for ``key``: registered hidden (``pooled``), left running."""
        self._busy[key.tag] = self._busy.get(key.tag, 0) + 1
        try:
            snap, net = await self.check_request(key.tag, [key.memory_limit_mib],
                                                 per_child_netns=key.per_child_netns, egress=key.egress)
            member = ChildSpec(memory_limit_mib=key.memory_limit_mib)
            with self._capacity.admit(1):  # a pool member holds a VM like any sandbox
                [result] = await self._restore_batch(snap, [member], net, per_child_netns=key.per_child_netns,
                                                     live_fork=key.live_fork, pooled=True)
        finally:
            self._busy[key.tag] -= 1
            if not self._busy[key.tag]:
                del self._busy[key.tag]
        if isinstance(result, ForkdError):
            raise result
        return result

    async def _restore_batch(self, snap: Forkable, children: list[ChildSpec], net: NetRequest | None, *,
                             per_child_netns: bool, live_fork: bool, pooled: bool = False
                             ) -> list[SandboxRecord | ForkdError]:
        """Claim ``forkd-child-<i>`` names (``per_child_netns``) for ``children`` and restore them."""
        n = len(children)
        netns_names: list[str | None] = [None] * n
        claimed: list[int] = []
        if per_child_netns:
            claimed = self._networks.claim_child_netns(n)  # no await since the check: atomic
            netns_names = [netns_mod.child_netns(i) for i in claimed]
        try:
            results = await self._restore_all(snap, children, net, netns_names, live_fork, pooled)
        finally:
            self._networks.release_child_netns(claimed)
        return [r if isinstance(r, SandboxRecord | ForkdError)
                else VMError(f"fork failed: {type(r).__name__}: {r}") for r in results]

    async def _restore_all(self, snap: Forkable, children: list[ChildSpec], net: NetRequest | None,
                           netns_names: list[str | None], live_fork: bool, pooled: bool
                           ) -> list[SandboxRecord | BaseException]:
        mem = await self._shm.ensure(snap.record.tag, snap.dir.mem) if live_fork else snap.dir.mem
        prefix = self._table.new_batch_prefix(self.host_id)
        gate = asyncio.Semaphore(SPAWN_PARALLELISM)

        async def one(i: int, child: ChildSpec, netns: str | None) -> SandboxRecord:
            async with gate:
                return await self._restore_child(child.sandbox_id or f"{prefix}-{i:04d}", snap, mem, child,
                                                 net, netns=netns, live_fork=live_fork, pooled=pooled)

        return list(await asyncio.gather(
            *(one(i, child, ns) for i, (child, ns) in enumerate(zip(children, netns_names, strict=True))),
            return_exceptions=True))

    async def _restore_child(self, sb_id: str, snap: Forkable, mem: Path, child: ChildSpec,
                             net: NetRequest | None, *, netns: str | None, live_fork: bool,
                             pooled: bool) -> SandboxRecord:
        for attempt in range(1, RESTORE_ATTEMPTS + 1):
            try:
                return await self._restore_once(sb_id, snap, mem, child, net, netns=netns,
                                                live_fork=live_fork, pooled=pooled)
            except BootTimeout as exc:
                if attempt == RESTORE_ATTEMPTS:
                    raise BootTimeout(f"child {sb_id} of {snap.record.tag!r} did not come up after "
                                      f"{attempt} restores: {exc}") from exc
                # The whole message: it carries the guest console's last lines.
                log.warning("child %s stayed silent after its restore (attempt %d), retrying: %s",
                            sb_id, attempt, exc)
        raise AssertionError("unreachable")

    async def _restore_once(self, sb_id: str, snap: Forkable, mem: Path, child: ChildSpec,
                            net: NetRequest | None, *, netns: str | None, live_fork: bool,
                            pooled: bool) -> SandboxRecord:
        memory_limit_mib = child.memory_limit_mib
        run_dir = self._data.sandboxes / sb_id
        run_dir.mkdir(parents=True)
        cgroup: cgroups.CgroupHandle | None = None
        network: ChildNet | None = None
        launcher: list[str] = []
        try:
            if child.cgroup_limits:
                cgroup = cgroups.create(sb_id, memory_limit_mib, cpu=child.cpu_limit, pids=child.pids_limit)
                # Before QEMU exists: a daemon that dies now still finds it on restart.
                (run_dir / "cgroup").write_text("".join(f"{p}\n" for p in cgroup.paths))
                launcher += cgroup.launcher()
            if net is not None:
                network = await self._networks.acquire(sb_id, net, netns)
                launcher += self._networks.launcher(network)
            clone_overlay(snap.dir.disk, run_dir / "disk.qcow2", snap.dir.path / ".child-overlay.qcow2")
            # Its own copy-on-write view of each writable volume, as of the snapshot.
            volumes.child_overlays(snap.volumes, snap.dir, run_dir / "disk.qcow2")
            inputs = child.restore
            if network is not None and (pem := self._networks.names.trust_pem(sb_id)) is not None:
                # Its policy has header rules: its guest trusts its own egress CA (host/egress_tls.py).
                inputs = dataclasses.replace(inputs, trust=pem)
            vm = await VM.restore(run_dir, snap.config, mem_path=mem, state_path=snap.dir.state,
                                  disk=run_dir / "disk.qcow2", tap=snap.tap, launcher=launcher,
                                  inputs=inputs,
                                  volumes=volumes.drives_for(snap.volumes, run_dir / "disk.qcow2",
                                                             volumes.ROOT_NODE, snap.dir))
        except BaseException as exc:
            oom_killed = cgroup is not None and cgroup.oom_kills() > 0
            throttled = cgroup is not None and child.cpu_limit is not None and cgroup.throttled() > 0
            if cgroup is not None:
                cgroup.remove()  # VM.restore killed and reaped QEMU before raising
            if network is not None:
                await self._networks.release(network)
            console.keep_for_debugging(run_dir)
            shutil.rmtree(run_dir, ignore_errors=True)
            if oom_killed and isinstance(exc, Exception):
                # Say why, rather than leave "QEMU exited (code -9)" a mystery; with a limit the
                # request set, it is the request's to raise (400, not the daemon failing).
                raise (VMError if memory_limit_mib is None else InvalidRequest)(
                    f"child {sb_id} was OOM-killed while restoring: its memory limit of {memory_limit_mib} "
                    "MiB (or a limit on forkd's parent cgroup) is below what a restored child needs; "
                    f"raise memory_limit_mib ({exc})") from exc
            if throttled and isinstance(exc, VMError):
                # A QEMU held to a sliver of a CPU misses its start-up deadlines: the request's limit.
                raise InvalidRequest(
                    f"child {sb_id} could not restore in time under its cpu_limit of {child.cpu_limit} "
                    f"CPUs, which held it back; raise cpu_limit ({exc})") from exc
            raise
        started = time.time()  # sub-second: lists sort by it (E2B's startedAt)
        record = SandboxRecord(
            id=sb_id, snapshot_tag=snap.record.tag, dir=str(run_dir), created_at_unix=int(started),
            started_unix=started,
            config=snap.config, disk=DiskChain.fresh(run_dir, snap.record.tag), pid=vm.pid,
            netns=network.netns if network is not None else None, memory_limit_mib=memory_limit_mib,
            live_fork=live_fork,
            cgroup=str(cgroup.path) if cgroup is not None else None, tap=snap.tap, timings=vm.timings,
            metadata=dict(child.metadata), pooled=pooled, cpu_limit=child.cpu_limit,
            pids_limit=child.pids_limit, cgroup_extra=[str(p) for p in cgroup.extra] if cgroup else [],
            network=network, disk_quota_mib=child.disk_quota_mib,
            volumes=[*snap.volumes, *child.volumes],
        )
        self._table.add(record, vm)
        if self._shared is not None and any(is_shared(v) for v in record.volumes):
            # Its shared volumes mounted (a snapshot's already are, in the memory it restored) and served.
            try:
                await self._shared.attach(sb_id, vm, record.volumes)
            except BaseException:
                with contextlib.suppress(Exception):
                    await self._table.kill(sb_id)
                raise
        if snap.record.tag not in self._touch_tried and not restore_chunks.recorded(snap.dir.path):
            self._touch_tried.add(snap.record.tag)  # once per snapshot per daemon, even if it fails
            await self._record_restore_chunks(snap, mem, vm.pid)
        return record

    @staticmethod
    async def _record_restore_chunks(snap: Forkable, mem: Path, pid: int) -> None:
        """The first child of ``snap`` restored here has answered its agent: record which chunks
        of its ``mem`` the restore touched (store/restore_chunks.py). A hint for lazy imports
        elsewhere: a failure of any kind is logged, never the spawn's (its child is registered)."""
        try:
            ram = memdiff.RamMapping.find(pid, mem, snap.config.mem_mib << 20)
            chunks = await asyncio.to_thread(restore_chunks.record, snap.dir.path, ram)
        except Exception as exc:  # a hint: nothing here may fail a registered child
            log.warning("could not record the memory chunks a restore of %s touched: %s",
                        snap.record.tag, exc)
            return
        if chunks is not None:
            log.info("%s: a restore touched %d memory chunk(s), recorded for lazy imports",
                     snap.record.tag, len(chunks))
