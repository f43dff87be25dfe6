"""Warm pools: per snapshot, children already restored, reseeded and paused.

Under TCG most of a fork's time is the restored guest's first answer (the
post-restore call, docs/FIELD-NOTES.md §9), and a child that is only *paused* (QMP
``stop``) costs no CPU. So a pool keeps ``size`` children of one snapshot
restored, post-restored and then stopped; a spawn with the same snapshot and
options (``PoolKey``: memory limit, per-child namespace, ``live_fork``, egress policy)
claims them instead of restoring: ``cont``, then the post-restore call again
(it is idempotent: fresh entropy reseeds the kernel CRNG, Python's and
numpy's RNGs, the clock is stepped to the host's, the child's ``RestoreInputs`` are
given, the very value a restore gives it),
so siblings of one pool never share random streams and the clock is now.
A member that fails its claim is torn down and that child is restored fresh.

``PoolKeeper`` is the one owner of pool targets (rows in the registry's
``pools`` table, so a restart keeps them) and of which members are ready.
Members are ordinary sandboxes registered with ``pooled`` set: the
``SandboxTable`` hides them from every lookup by id until a claim reveals
them, tears them down like any sandbox, and recovery re-adopts them after a
restart; ``start`` then puts the re-adopted members that are still paused
back into their pool and discards the rest.

Refill runs in one background task, one member at a time, only while no
foreground spawn is in progress (``Spawner.wait_idle``), with a pause between
members and an exponential back-off after failures, so it never starves
requests. One pool per snapshot tag.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from forkd import bounds
from forkd.controller.background import cancel_and_wait
from forkd.controller.child_specs import ChildSpec
from forkd.controller.options import SpawnOptions
from forkd.controller.results import PoolReport
from forkd.controller.sandbox_events import SandboxEvents
from forkd.controller.sandboxes import SandboxTable
from forkd.controller.snapshots import SnapshotStore
from forkd.controller.spawner import Spawner
from forkd.errors import ForkdError, NotFound, VMError
from forkd.host.egress import EgressPolicy
from forkd.store.layout import check_tag
from forkd.store.records import PoolConfig, PoolKey, SandboxRecord
from forkd.store.rows.pools import PoolRows
from forkd.store.rows.sandboxes import SandboxReader
from forkd.vmm.machine import VM

log = logging.getLogger("forkd.pools")

# Between two refills: bounds the refill rate (at most ~5 members a second).
REFILL_GAP_SECS = 0.2
# After a failed refill, wait this long, doubling up to the maximum.
BACKOFF_MIN_SECS = 1.0
BACKOFF_MAX_SECS = 60.0
# A pool whose snapshot does not exist (yet) or is not ready is looked at again after this.
PENDING_RECHECK_SECS = 5.0
# A claimed member answers its post-restore call in milliseconds; this only catches a wedged one.
CLAIM_TIMEOUT_SECS = 30.0
# The warm-up calls of a fresh member (see warm_request_paths); a wedged guest fails its refill.
WARM_CALL_TIMEOUT_SECS = 30.0
# Refill durations kept for the metrics scrape that has not happened yet.
MAX_PENDING_REFILL_TIMES = 10_000


@dataclass
class _Pool:
    config: PoolConfig
    ready: deque[str] = field(default_factory=deque)  # paused members, oldest first
    claims: int = 0
    misses: int = 0
    failures: int = 0  # consecutive failed refills
    retry_at: float = 0.0  # monotonic time before which no refill is tried
    last_error: str | None = None

    def info(self) -> PoolReport:
        key = self.config.key
        out: PoolReport = {
            "tag": key.tag, "size": self.config.size, "ready": len(self.ready),
            "memory_limit_mib": key.memory_limit_mib, "per_child_netns": key.per_child_netns,
            "live_fork": key.live_fork, "claims": self.claims, "misses": self.misses,
            "allow_internet_access": key.egress.allow_internet_access,
            "network": {k: key.egress.info()[k] for k in ("allow_out", "deny_out")},
        }
        if self.last_error:
            out["last_error"] = self.last_error
        return out


def empty_pool_info(tag: str) -> PoolReport:
    """What GET says for a snapshot that has no pool."""
    return _Pool(PoolConfig(PoolKey(tag), 0)).info()


async def warm_request_paths(vm: VM) -> None:
    """Run a ping and an empty eval in a member before it is paused.

    Under TCG each QEMU process translates guest code the first time it runs it,
    so a claimed child's first ping or eval would pay ~20 ms of CPU each; paid
    here, in the background refill, the claim and the user's first calls run
    code already translated. Neither leaves a trace a fresh child would not have
    (the eval of ``None`` binds no name). Under KVM it costs next to nothing.
    """
    await vm.call(lambda agent: agent.ping(WARM_CALL_TIMEOUT_SECS))
    await vm.call(lambda agent: agent.eval({"code": "None", "timeout_secs": 10}, WARM_CALL_TIMEOUT_SECS))


class PoolKeeper:
    def __init__(self, pools: PoolRows, sandboxes: SandboxReader, table: SandboxTable, events: SandboxEvents,
                 spawner: Spawner, store: SnapshotStore) -> None:
        self._rows = pools  # the pools table (targets): only this owner writes it
        self._sandboxes = sandboxes
        self._table = table
        self._spawner = spawner
        self._store = store
        self._pools: dict[str, _Pool] = {}
        # Held while one member is being restored, and by resizes and drains, so a
        # drain never races a refill of the same pool into an orphan.
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._refill_times: deque[tuple[str, float]] = deque(maxlen=MAX_PENDING_REFILL_TIMES)
        events.on_removed(self.after_removed)
        # A cycle, closed here rather than by the Runtime: the spawner restores this keeper's
        # members, and its spawns claim from this keeper first.
        spawner.draw_from(self)

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Load the targets, take back re-adopted members that are still paused, start refilling."""
        for config in self._rows.all():
            self._pools[config.tag] = _Pool(config)
        for sb in self._sandboxes.all():
            if sb.pooled and not await self._readopt(sb):
                log.info("discarding pool member %s of %s after the restart", sb.id, sb.snapshot_tag)
                with contextlib.suppress(ForkdError, OSError):
                    await self._table.discard(sb.id)
        self._task = asyncio.create_task(self._run(), name="forkd-pool-refill")

    async def _readopt(self, sb: SandboxRecord) -> bool:
        pool = self._pools.get(sb.snapshot_tag)
        vm = self._table.vm(sb.id)
        if (pool is None or vm is None or sb.pool_key != pool.config.key
                or len(pool.ready) >= pool.config.size):
            return False
        try:
            # A running member was being refilled or claimed when the daemon died: a claim may
            # already have given it a caller's env, so it must not be handed out again.
            if not await vm.is_paused():
                return False
        except ForkdError:
            return False
        pool.ready.append(sb.id)
        log.info("pool member %s of %s re-adopted", sb.id, sb.snapshot_tag)
        return True

    async def stop(self) -> None:
        """Stop refilling (the members stay: the runtime kills or detaches them with the rest)."""
        await cancel_and_wait(self._task)
        self._task = None

    # ---------------------------------------------------------------- targets

    def info(self, tag: str) -> PoolReport:
        pool = self._pools.get(tag)
        return pool.info() if pool is not None else empty_pool_info(tag)

    def has(self, tag: str) -> bool:
        return tag in self._pools

    def all(self) -> list[PoolReport]:
        """Every pool this daemon knows, drained ones (size 0) included for their counters."""
        return [self._pools[t].info() for t in sorted(self._pools)]

    def get(self, tag: str) -> PoolReport:
        """One pool's PoolInfo (404 unless its snapshot exists or a target is kept for it)."""
        check_tag(tag)
        if not self.has(tag):
            self._store.get(tag)  # 404 unless the snapshot exists
        return self.info(tag)

    async def configure(self, tag: str, size: int, *, memory_limit_mib: int | None = None,
                        per_child_netns: bool = False, live_fork: bool = False,
                        allow_internet_access: bool | None = None,
                        network: dict[str, Any] | None = None) -> PoolReport:
        """Keep ``size`` paused children of ``tag`` ready for spawns with these options (0 drains)."""
        bounds.POOL_SIZE.check(size)
        # Only the rules shape a member; the inbound settings are the claimer's (claim()).
        egress = EgressPolicy.from_request(allow_internet_access, network).outbound()
        if size or not self.has(tag):
            self._store.get(tag)  # 404 (a start-up target of a missing tag may still be drained)
        if size:
            # The checks a spawn of that many children would meet (409 not ready, 400 options),
            # now rather than at every refill.
            await self._spawner.check_request(tag, [memory_limit_mib], per_child_netns=per_child_netns,
                                              egress=egress)
        return await self.set(PoolConfig(PoolKey(tag, memory_limit_mib, per_child_netns, live_fork, egress),
                                         size))

    async def preset(self, sizes: dict[str, int]) -> None:
        """The daemon's ``--pool TAG=N``: set at start-up, options kept from an earlier PUT.

        A tag that has no snapshot yet keeps its target, with a warning: its pool
        fills once a snapshot of that tag is ready.
        """
        for tag, size in sizes.items():
            current = self.info(tag)
            egress = EgressPolicy.from_request(current["allow_internet_access"], current["network"])
            key = PoolKey(tag, current["memory_limit_mib"], current["per_child_netns"], current["live_fork"],
                          egress)
            try:
                await self.configure(tag, size, memory_limit_mib=key.memory_limit_mib,
                                     per_child_netns=key.per_child_netns, live_fork=key.live_fork,
                                     allow_internet_access=egress.allow_internet_access,
                                     network=current["network"])
            except NotFound:
                log.warning("pool %s=%d: no snapshot %r yet; the pool fills once it exists", tag, size, tag)
                await self.set(PoolConfig(key, size))
            except ForkdError as exc:
                log.warning("pool %s=%d not set: %s", tag, size, exc)

    def take_refill_times(self) -> list[tuple[str, float]]:
        """(tag, seconds) of every refill since the last call (the metrics scrape drains them)."""
        out = list(self._refill_times)
        self._refill_times.clear()
        return out

    async def set(self, config: PoolConfig) -> PoolReport:
        """Set a pool's target; members beyond it (or restored with other options) are killed."""
        bounds.POOL_SIZE.check(config.size)
        async with self._lock:
            pool = self._pools.get(config.tag)
            if pool is None:
                pool = self._pools[config.tag] = _Pool(config)
            doomed: list[str] = []
            if pool.config.key != config.key:
                doomed, pool.ready = list(pool.ready), deque()
            while len(pool.ready) > config.size:
                doomed.append(pool.ready.pop())  # the newest go first
            pool.config = config
            pool.failures, pool.retry_at, pool.last_error = 0, 0.0, None
            if config.size:
                self._rows.set(config)
            else:
                self._rows.delete(config.tag)
            await self._discard(doomed)
        self._wake.set()
        log.info("pool %s: target %d (%s)", config.tag, config.size, config.key)
        return pool.info()

    async def drop(self, tag: str) -> None:
        """Forget ``tag``'s pool and kill its members (its snapshot is being deleted)."""
        async with self._lock:
            pool = self._pools.pop(tag, None)
            self._rows.delete(tag)
            # Members of the tag a claim has not revealed yet go too (nothing else may hold them).
            doomed = {sb.id for sb in self._sandboxes.all() if sb.pooled and sb.snapshot_tag == tag}
            if pool is not None:
                doomed.update(pool.ready)
            await self._discard(sorted(doomed))

    async def _discard(self, ids: list[str]) -> None:
        results = await asyncio.gather(*(self._table.discard(i) for i in ids), return_exceptions=True)
        for sb_id, result in zip(ids, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("could not tear down pool member %s: %s", sb_id, result)

    async def after_removed(self, record: SandboxRecord) -> None:
        """``SandboxEvents.removed`` hook: a member torn down by anyone leaves its pool's ready list."""
        pool = self._pools.get(record.snapshot_tag)
        if pool is not None and record.id in pool.ready:
            pool.ready.remove(record.id)
            self._wake.set()

    # ---------------------------------------------------------------- claims

    async def claim(self, tag: str, children: list[ChildSpec], options: SpawnOptions
                    ) -> list[SandboxRecord | None]:
        """Serve what the pool of ``tag`` can: a resumed, reseeded child per matching spec.

        A disk quota does not shape a child at restore time: it is armed once claimed
        (the Spawner's), so children with any quota draw from the same pool.
        """
        out: list[SandboxRecord | None] = [None] * len(children)
        pool = self._pools.get(tag)
        if pool is None:
            return out
        taken: list[tuple[int, str]] = []
        for i, child in enumerate(children):
            key = PoolKey(tag, child.memory_limit_mib, options.per_child_netns, options.live_fork,
                          options.egress.outbound())
            if key == pool.config.key.outbound() and pool.ready:
                taken.append((i, pool.ready.popleft()))  # no await since the check: nobody else gets it
            else:
                pool.misses += 1
        if taken:
            self._wake.set()  # refill what was taken, once the foreground is idle
        resumed = await asyncio.gather(*(self._resume(pool, sb_id, children[i], options.egress)
                                         for i, sb_id in taken))
        for (i, _), record in zip(taken, resumed, strict=True):
            out[i] = record
        return out

    async def _resume(self, pool: _Pool, sb_id: str, child: ChildSpec, egress: EgressPolicy
                      ) -> SandboxRecord | None:
        started = time.monotonic()
        try:
            vm = self._table.vm(sb_id)
            if vm is None:
                raise VMError("it is gone")
            record = self._sandboxes.get(sb_id)
            # The same idempotent call as after a restore: the member's own RNG streams (its
            # siblings were restored from the same snapshot), the clock of now, the child's
            # RestoreInputs (the same value VM.restore would have given it).
            # Sent before "cont" (the paused guest reads it once it runs): one round trip less.
            call = asyncio.ensure_future(vm.post_restore(CLAIM_TIMEOUT_SECS, child.restore))
            try:
                await vm.resume()
            except BaseException:
                call.cancel()
                with contextlib.suppress(BaseException):
                    await call
                raise
            resumed = time.monotonic() - started
            await vm.await_or_exit(call, CLAIM_TIMEOUT_SECS + 5, "the pooled child's post-restore call")
        except (ForkdError, OSError) as exc:
            log.warning("pool member %s of %s failed its claim, restoring a fresh child instead: %s",
                        sb_id, pool.config.tag, exc)
            pool.misses += 1
            with contextlib.suppress(ForkdError, OSError):
                await self._table.discard(sb_id)
            return None
        record.started_unix = time.time()  # its start is its claim (lists sort by it)
        record.created_at_unix = int(record.started_unix)
        record.metadata = dict(child.metadata)
        record.disk_quota_mib = child.disk_quota_mib
        if record.network is not None:  # the same rules (the key matched); the claimer's port settings
            record.network = dataclasses.replace(record.network, egress=egress)
        record.timings = {"claimed_s": resumed, "ready_s": time.monotonic() - started}
        self._table.reveal(record)
        pool.claims += 1
        return record

    # ---------------------------------------------------------------- refill

    def _next(self) -> tuple[PoolKey | None, float]:
        """The pool to refill now, or how long to sleep before looking again."""
        now = time.monotonic()
        wait = 3600.0
        best: _Pool | None = None
        for tag in sorted(self._pools):
            pool = self._pools[tag]
            if len(pool.ready) >= pool.config.size:
                continue
            if pool.retry_at > now:
                wait = min(wait, pool.retry_at - now)
                continue
            try:
                self._store.get(tag).check_forkable()
            except ForkdError:  # not there (a start-up target) or not ready yet
                wait = min(wait, PENDING_RECHECK_SECS)
                continue
            if best is None or len(pool.ready) < len(best.ready):
                best = pool
        return (best.config.key if best else None), wait

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            key, wait = self._next()
            if key is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
                continue
            await self._spawner.wait_idle()  # foreground spawns first
            try:
                await self._refill_one(key)
            except Exception:  # the loop must outlive any one failure
                log.exception("pool refill of %s", key.tag)
            await asyncio.sleep(REFILL_GAP_SECS)

    async def _refill_one(self, key: PoolKey) -> None:
        async with self._lock:
            pool = self._pools.get(key.tag)
            if pool is None or pool.config.key != key or len(pool.ready) >= pool.config.size:
                return  # resized or dropped meanwhile
            started = time.monotonic()
            record: SandboxRecord | None = None
            try:
                record = await self._spawner.restore_member(key)
                vm = self._table.vm(record.id)
                if vm is None:
                    raise VMError(f"pool member {record.id} vanished")
                await warm_request_paths(vm)
                # Paused, its vCPUs cost no CPU until a spawn claims it.
                await vm.pause()
            except (ForkdError, OSError) as exc:
                if record is not None:
                    await self._discard([record.id])
                pool.failures += 1
                delay = min(BACKOFF_MAX_SECS, BACKOFF_MIN_SECS * 2 ** (pool.failures - 1))
                pool.retry_at = time.monotonic() + delay
                pool.last_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                log.warning("pool %s: refill failed (retrying in %.0f s): %s", key.tag, delay, exc)
                return
            pool.ready.append(record.id)
            pool.failures, pool.last_error = 0, None
            self._refill_times.append((key.tag, time.monotonic() - started))


__all__ = ["PoolKeeper", "empty_pool_info"]
