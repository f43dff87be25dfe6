"""The forkd runtime: the one Python API the daemon, benchmarks and tests use.

A thin façade over the controller's owners, each of which holds one piece of
state and is the only code that changes it:

* ``TagReservations`` (tags.py): snapshot tags being written right now;
* ``SnapshotStore`` (snapshots.py): registered snapshots, lineage, deletion;
* ``SandboxEvents`` (sandbox_events.py): made first and given to each owner, which subscribes
  itself to the events it must hear (a teardown, a turn of work, a kill, activity, a wake);
* ``SandboxTable`` (sandboxes.py): live VMs, one lock per sandbox, teardown;
* ``AgentGateway`` (agent_gateway.py): every request to a guest agent, with its bookkeeping
  (busy, wake, activity, errors explained by the sandbox's death or kill);
* ``SandboxFiles`` (files.py), ``SandboxProcesses`` (processes.py): files and
  processes in a sandbox, through its agent, in bounded pieces and streams;
* ``Networks`` (network.py): sandbox namespaces, addresses, links and egress rules;
* ``HostAccelerator`` (host_accel.py): the host's accelerator;
* ``TemplateBuilder`` (templates.py): creating snapshots from a booted template;
* ``Spawner`` (spawner.py): forking children; ``Brancher`` (branch.py): BRANCH;
* ``Forker`` (forks.py): fork / fork-tree / promote of a running sandbox, and
  dropping fork snapshots nobody needs; ``Checkpointer`` (checkpoints.py):
  auto-checkpoint policies;
* ``PoolKeeper`` (pools.py): warm pools of paused children that spawns claim first;
* ``ConsoleWarden`` (console_warden.py): keeps every guest console log capped;
* ``DeadlineKeeper`` (lifetimes.py): sandbox deadlines (``timeout_secs``), kills the expired;
* ``IdlePauser`` (idle.py): pauses sandboxes idle for their ``idle_pause_secs``, resumes on use.
* ``Hibernator`` (hibernation.py): sandboxes to disk (on request, idle, or at their deadline) and
  back on their next request; a sub-API (``runtime.hibernation``) the routes call directly.
* ``Suspender`` (suspend.py): paused sandboxes (E2B's pause/resume, workspace suspend);
  ``Workspaces`` (workspaces.py): named sandboxes; ``Compactor`` (compaction.py): standalone
  copies of branch chains.
* ``SnapshotTravel`` (travel.py): pack/unpack, push/pull to an object store, and
  fetching a tag this host lacks before a spawn of it.

Tags and ids are validated before any path is built from them, nothing
half-made is ever registered, and no QEMU process outlives a failure.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, cast

from forkd import bounds
from forkd.bounds import DEFAULT_DISK_QUOTA_MIB
from forkd.config import DataDir, HostLimits
from forkd.controller.agent_gateway import AgentGateway
from forkd.controller.branch import Brancher
from forkd.controller.capacity import HostCapacity
from forkd.controller.changes import SandboxChanges
from forkd.controller.checkpoints import Checkpointer
from forkd.controller.code_contexts import CodeRunner
from forkd.controller.compaction import Compactor
from forkd.controller.console_warden import ConsoleWarden
from forkd.controller.costs import SandboxCosts
from forkd.controller.disk_quota import DiskQuotas
from forkd.controller.files import SandboxFiles
from forkd.controller.forks import Forker, ForkReport
from forkd.controller.hibernated_branch import HibernatedBrancher
from forkd.controller.hibernation import Hibernator
from forkd.controller.host_accel import HostAccelerator
from forkd.controller.idle import IdlePauser
from forkd.controller.images import OciImages, PullRequest
from forkd.controller.kernel_cells import KernelCells
from forkd.controller.lifetimes import DeadlineKeeper
from forkd.controller.network import Networks
from forkd.controller.options import ForkOptions, SpawnOptions
from forkd.controller.pools import PoolKeeper
from forkd.controller.processes import ProcessEvent, ProcessEvents, SandboxProcesses
from forkd.controller.recovery import recover
from forkd.controller.results import (
    CancelResult,
    EvalResult,
    ExecResult,
    PingResult,
    PromoteResult,
    RecordJson,
    SandboxCounts,
    SandboxView,
)
from forkd.controller.sandbox_events import SandboxEvents
from forkd.controller.sandboxes import SandboxTable
from forkd.controller.secrets import Secrets
from forkd.controller.shared_volumes import SharedVolumes
from forkd.controller.snapshot_deletion import SnapshotDeletion
from forkd.controller.snapshots import SnapshotStore
from forkd.controller.spawner import Spawner
from forkd.controller.suspend import Suspender
from forkd.controller.suspend import view as suspend_view
from forkd.controller.tags import TagReservations
from forkd.controller.template_build import BuildRequest, TemplateBuilds
from forkd.controller.templates import Progress, SnapshotSpec, TemplateBuilder, no_progress
from forkd.controller.travel import SnapshotTravel
from forkd.controller.travel_offline import offline_travel
from forkd.controller.volumes import Volumes
from forkd.controller.watches import DirWatches, WatchBatch, WatchEvent
from forkd.controller.workspaces import Workspaces
from forkd.errors import Conflict, InvalidRequest, NotFound
from forkd.guest import capabilities, messages, protocol
from forkd.guest.protocol import RestoreInputs
from forkd.host import cgroups
from forkd.host.egress import EgressPolicy
from forkd.host.fdlimit import raise_fd_limit
from forkd.host.shm import ShmMemory
from forkd.image import oci
from forkd.store.datalock import DataDirLock
from forkd.store.layout import check_host_id, check_sandbox_id
from forkd.store.objectstore import ObjectStore
from forkd.store.registry import (
    PausedRecord,
    Registry,
    SandboxRecord,
    SnapshotRecord,
)
from forkd.store.secret_box import SecretBox

__all__ = [
    "BuildRequest", "ForkOptions", "ForkReport", "ProcessEvent", "ProcessEvents", "PullRequest", "Runtime",
    "SnapshotSpec",
    "SpawnOptions",
    "WatchBatch", "WatchEvent", "offline_travel",
]

log = logging.getLogger("forkd.runtime")
# A running guest's answer to being given its egress CA (PUT network adding header rules).
TRUST_TIMEOUT_SECS = 30.0


class Runtime:
    def __init__(self, data: DataDir, registry: Registry, *, store: ObjectStore | None = None,
                 host_id: str | None = None, disk_quota_mib: int | None = None,
                 limits: HostLimits | None = None, registries: oci.Registries | None = None) -> None:
        """``store``, ``host_id``, ``disk_quota_mib``, ``limits``: as ``open`` takes them (checked there)."""
        self.data = data
        # The database: each owner below gets only its own table, and a read-only view
        # (or a one-column writer) of the tables it only reads (docs/ARCHITECTURE.md).
        self.registry = registry
        self._closed = False
        # What close() was asked to do with the sandboxes; a start that fails half-way
        # leaves the re-adopted ones running for the next daemon.
        self._keep_sandboxes = True
        # The stops of what open() started, in reverse order (an empty stack until then).
        self._lifecycle = contextlib.AsyncExitStack()
        self.shm = ShmMemory(data.root)
        # Owners are made in order, each given what it needs; an owner that must hear of
        # teardowns, turns of work, kills or activity subscribes itself to ``events`` in its own
        # constructor. Two cycles close inside the later owner's constructor (PoolKeeper: the
        # spawner draws from it; Hibernator: the idle pauser hibernates through it).
        self.events = SandboxEvents()
        rows = registry.sandboxes  # owned by the SandboxTable; the others read it, or set one column
        self.sandboxes = SandboxTable(rows, registry.aliases, registry.prefixes, data.sandboxes, self.events)
        self.agents = AgentGateway(self.sandboxes, self.events)  # every request to a guest agent
        self.files = SandboxFiles(self.agents)
        self.costs = SandboxCosts(self.sandboxes)  # what each sandbox costs the host (RAM, disk)
        self.kernels = KernelCells(self.agents, self.events)  # sub-APIs: routes call these five directly
        self.code = CodeRunner(self.agents, self.kernels, self.events)
        self.processes = SandboxProcesses(self.agents, self.events)
        self.watches = DirWatches(self.agents)
        # Reservations ask the store, made next, whether a tag is taken: late-bound through the lambda.
        self.tags = TagReservations(lambda tag: self.snapshots.exists(tag))
        self.snapshots = SnapshotStore(registry.snapshots, registry.snapshot_names, data.snapshots, self.tags,
                                       self.shm)
        # A sandbox's file changes, from its disk layers: diff, patch, tar, apply onto another.
        self.diffs = SandboxChanges(self.sandboxes, self.snapshots, self.agents, self.files, data.tmp)
        self.accel = HostAccelerator(data)
        # Secrets (values sealed at rest) reach only the egress of sandboxes with header rules.
        self.secrets = Secrets(registry.secrets, SecretBox(data.secrets_key))
        self.networks = Networks(data.root, rows, events=self.events, resolve_secret=self.secrets.resolve)
        self.volumes = Volumes(registry.volumes, data, registry.snapshots, rows)
        # Shared (hostdir) volumes: each mounting guest's FUSE ops answered from the volume's files.
        self.shared_volumes = SharedVolumes(self.volumes, self.sandboxes.vm, self.events)
        self.templates = TemplateBuilder(data, self.snapshots, self.tags, self.accel, self.networks,
                                         self.volumes, self.shared_volumes)
        self.travel = SnapshotTravel(data, self.snapshots, self.tags, self.accel, store)
        self.disk_quotas = DiskQuotas(rows, self.sandboxes, self.events,
                                      DEFAULT_DISK_QUOTA_MIB if disk_quota_mib is None else disk_quota_mib)
        # The host's ceilings (--max-sandboxes, --memory-reserve-mib): every new VM is admitted by it.
        self.capacity = HostCapacity(live=lambda: len(self.sandboxes.ids()), limits=limits)
        self.spawner = Spawner(data, self.sandboxes, self.snapshots, self.accel, self.networks, self.shm,
                               self.capacity, disks=self.disk_quotas, missing=self.travel, host_id=host_id,
                               shared=self.shared_volumes)
        self.brancher = Brancher(rows, data.snapshots, self.sandboxes, self.events, self.snapshots, self.tags,
                                 after_disk_cut=self.disk_quotas.after_disk_cut)
        asleep = HibernatedBrancher(self.brancher, data.snapshots, self.sandboxes, self.snapshots, self.tags)
        self.forker = Forker(rows, registry.aliases, self.sandboxes, self.events, self.brancher, self.spawner,
                             self.snapshots, self.tags, asleep)
        self.checkpoints = Checkpointer(rows, self.sandboxes, self.events, self.brancher, self.snapshots,
                                        self.forker)
        self.pools = PoolKeeper(registry.pools, rows, self.sandboxes, self.events, self.spawner,
                                self.snapshots)
        self.console_warden = ConsoleWarden(data)
        self.idle = IdlePauser(rows, self.sandboxes, self.events)
        self.hibernation = Hibernator(self.sandboxes, self.agents, self.events, self.snapshots, self.networks,
                                      self.idle, self.disk_quotas, self.templates, self.shared_volumes)
        self.reaper = DeadlineKeeper(rows, self.sandboxes, self.events, hibernate=self.hibernation.hibernate)
        self.suspender = Suspender(registry.paused, rows, self.sandboxes, self.brancher, self.spawner,
                                   self.snapshots, self.idle)
        self.workspaces = Workspaces(registry.workspaces, registry.paused, self.sandboxes, self.spawner,
                                     self.suspender, self.forker.collect, self.hibernation.wake)
        self.compactor = Compactor(data.snapshots, self.snapshots, self.tags)
        self.deletion = SnapshotDeletion(self.snapshots, self.sandboxes, self.suspender, self.pools,
                                         self.brancher, self.forker)
        # Dockerfile builds (controller/template_build.py): a sub-API the template routes call. Its
        # build host is this facade (spawn, exec, branch, kill of its build sandboxes).
        # Images pulled from registries (controller/images.py): POST /v1/images and a build's FROM REF.
        self.images = OciImages(data, self.snapshots.on_image, registries)
        self.builds = TemplateBuilds(data, self.templates, self, self.images)

    # ---------------------------------------------------------------- open/close

    @classmethod
    async def open(cls, data: DataDir | None = None, *, store: str | None = None,
                   host_id: str | None = None, disk_quota_mib: int | None = None,
                   limits: HostLimits | None = None, registries: oci.Registries | None = None) -> Runtime:
        """``store``: an object store URL (``s3://bucket/prefix``) to push to, pull from, and fetch
        missing tags from; ``host_id``: this host's name in a fleet, put in every sandbox id;
        ``disk_quota_mib``: the quota of a spawn that gives none (0: none; None: the default,
        controller/disk_quota.py); ``limits``: the host's ceilings on sandboxes and free memory
        (controller/capacity.py; None: none); ``registries``: the mirrors and auth file image pulls
        use (controller/images.py)."""
        raise_fd_limit()  # ~3 descriptors per live sandbox: 1024 would cap a host at ~300
        data = (data or DataDir.from_env()).ensure()
        object_store = ObjectStore(store) if store else None
        if host_id is not None:
            check_host_id(host_id)
        if disk_quota_mib is not None:
            bounds.DISK_QUOTA_MIB.check(disk_quota_mib)
        async with contextlib.AsyncExitStack() as stack:
            # Refused during an offline pack/unpack of this dir; released last. Opened alone, the
            # scratch files a crashed daemon left behind go first.
            stack.callback(DataDirLock.shared(data, when_alone=data.clear_tmp).release)
            rt = cls(data, Registry(data.registry), store=object_store, host_id=host_id,
                     disk_quota_mib=disk_quota_mib, limits=limits, registries=registries)
            stack.callback(rt.registry.close)
            await rt._start(stack)
            rt._lifecycle = stack.pop_all()  # open: close() unwinds it
        return rt

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        """Recover, then start the background owners in order; each one's stop goes on
        ``stack`` as it starts, so ``close`` (or a failed start) stops them in reverse:
        the pool keeper first (no refill may start a VM once the rest are stopping),
        the sandboxes' teardown last."""
        with self.registry.sandboxes.reads_kept():  # every owner below reads every row
            await self._start_owners(stack)

    async def _start_owners(self, stack: contextlib.AsyncExitStack) -> None:
        self.travel.recover()  # mounts and half-arrived snapshots of a lazy import
        await recover(self.data, self.snapshots, self.sandboxes, self.shm)
        await self.brancher.recover()  # sources a dead daemon left mid-branch
        stack.push_async_callback(self.travel.close)  # after the sandboxes: nothing maps them then
        stack.push_async_callback(self._teardown_sandboxes)
        for sb in self.sandboxes.records.all():  # re-adopted guests' shared volumes served again
            self.shared_volumes.resume(sb)
        stack.push_async_callback(self.shared_volumes.close)
        # Networks of sandboxes that did not survive (and of interrupted templates) go.
        await self.networks.reap(alive={sb.id for sb in self.sandboxes.records.all()})
        await self.forker.collect()  # fork snapshots whose children died while no daemon ran
        self.console_warden.start()
        stack.push_async_callback(self.console_warden.stop)
        self.checkpoints.start()  # policies kept in the registry count calls again
        stack.push_async_callback(self.checkpoints.wait_background)
        stack.push_async_callback(self.brancher.wait_background)  # live branches finish first
        await self.disk_quotas.start()  # quotas of re-adopted sandboxes armed again
        stack.push_async_callback(self.disk_quotas.stop)
        await self.idle.start()  # idle policies back, and which re-adopted sandboxes are paused
        stack.push_async_callback(self.idle.stop)
        await self.hibernation.start()  # hibernations a dead daemon left unfinished are undone
        stack.push_async_callback(self.hibernation.stop)
        await self.reaper.start()  # sandboxes that expired while no daemon ran go now
        stack.push_async_callback(self.reaper.stop)
        await self.pools.start()  # re-adopted pool members go back in, the rest are discarded
        stack.push_async_callback(self.pools.stop)

    async def _teardown_sandboxes(self) -> None:
        """Stop every sandbox, or leave them for the next daemon (``close(keep_sandboxes=True)``)."""
        if self._keep_sandboxes:
            await self.sandboxes.detach_all()
            return
        await self.sandboxes.kill_all()
        if not any(sb.cgroup for sb in self.sandboxes.records.all()):  # every hierarchy's parent
            cgroups.remove_parent_if_empty()
        # No sandbox left to need them: give the RAM back.
        self.shm.prune(keep=set())
        await self.networks.close()

    async def close(self, *, keep_sandboxes: bool = False) -> None:
        """Stop every sandbox (or, with ``keep_sandboxes``, leave them for the next daemon)."""
        if self._closed:
            return
        self._closed = True
        self._keep_sandboxes = keep_sandboxes
        await self._lifecycle.aclose()

    async def __aenter__(self) -> Runtime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---------------------------------------------------------------- snapshots

    def list_snapshots(self) -> list[SnapshotRecord]:
        return self.snapshots.all()

    def get_snapshot(self, tag: str) -> SnapshotRecord:
        return self.snapshots.get(tag)

    def name_snapshot(self, name: str, tag: str) -> None:
        """``name`` stands for the snapshot ``tag`` (E2B's template tags); see ``resolve_snapshot``."""
        self.snapshots.name(name, tag)

    def unname_snapshot(self, name: str) -> bool:
        return self.snapshots.unname(name)

    def snapshot_names(self, tag: str) -> list[tuple[str, float]]:
        return self.snapshots.names(tag)

    def resolve_snapshot(self, name: str) -> str:
        """The tag ``name`` is: a snapshot's own, or the one a name given by ``name_snapshot`` stands for."""
        return self.snapshots.resolve(name)

    async def create_snapshot(self, spec: SnapshotSpec, progress: Progress = no_progress) -> SnapshotRecord:
        return await self.templates.create(spec, progress)

    def snapshot_lineage(self, tag: str) -> RecordJson:
        return self.deletion.lineage(tag)

    async def delete_snapshot(self, tag: str, *, cascade: bool = False, force: bool = False) -> None:
        await self.deletion.delete(tag, cascade=cascade, force=force)

    # ---------------------------------------------------------------- sandboxes

    def list_sandboxes(self, *, after: str | None = None, limit: int | None = None,
                       where: Callable[[SandboxRecord], bool] | None = None) -> list[SandboxRecord]:
        """The alive sandboxes, oldest first: those ``where`` keeps, from the one after ``after``
        (404 if it is not alive), at most ``limit`` of them (read from the registry as taken)."""
        alive = (self._with_state(sb) for sb in self.sandboxes.records.scan(after) if not sb.pooled)
        return list(itertools.islice((sb for sb in alive if where is None or where(sb)), limit))

    def count_sandboxes(self) -> SandboxCounts:
        """How many sandboxes a list shows, and how many of those are idle-paused (both read
        without parsing a row: /metrics asks on every scrape)."""
        return {"listed": self.sandboxes.records.count_listed(), "paused": self.idle.counts()["paused"]}

    def get_sandbox(self, sandbox_id: str) -> SandboxRecord:
        return self._with_state(
            self.sandboxes.records.get(self.sandboxes.resolve(check_sandbox_id(sandbox_id))))

    def relaying(self, sandbox_id: str) -> AbstractAsyncContextManager[SandboxRecord]:
        """Around traffic the daemon relays to one of its ports (api/port_proxy.py): woken or
        resumed first, then busy and in use until the relay ends."""
        return self.agents.relaying(check_sandbox_id(sandbox_id))

    def _with_state(self, record: SandboxRecord) -> SandboxRecord:
        record.paused = self.idle.paused(record.id)
        return record

    async def spawn(self, tag: str, n: int = 1, options: SpawnOptions | None = None) -> list[SandboxRecord]:
        """Fork ``n`` children of snapshot ``tag`` in parallel; all or nothing (see SpawnOptions).

        Egress needs a snapshot with a NIC; a claimed warm-pool member's deadline
        starts at its claim.
        """
        options = options or SpawnOptions()
        records = await self.spawner.spawn(tag, n, options)
        self._apply_lifetimes(records, options)
        return records

    def _apply_lifetimes(self, records: list[SandboxRecord], options: SpawnOptions) -> None:
        """The deadlines and idle pauses ``options`` ask for, from now (a spawn's, a fork's children's)."""
        self.reaper.apply(records, options.timeout_secs, hibernate=options.hibernate_on_timeout,
                          memory=options.hibernate_on_timeout_memory, auto_resume=options.auto_resume)
        self.idle.apply(records, options.idle_pause_secs)
        self.idle.apply_hibernate(records, options.idle_hibernate_secs)

    async def fork(self, sandbox_id: str, count: int = 1, options: ForkOptions | None = None, *,
                   tree: bool = False) -> ForkReport:
        """Branch a sandbox once and fork ``count`` children of it (see controller/forks.py and
        ForkOptions); the children's lifetimes are their own (the source keeps its deadline). A
        hibernated source is forked from its saved state and stays hibernated (one hibernated
        without its memory is woken first)."""
        options = options or ForkOptions()
        source = self.sandboxes.resolve(check_sandbox_id(sandbox_id))
        if not self.hibernation.asleep_with_memory(source):  # such a one is forked as it sleeps
            await self.hibernation.wake(source)
        result = await self.forker.fork(sandbox_id, count, options, tree=tree)
        self._apply_lifetimes(result.children, options.spawn)
        return result

    async def promote(self, sandbox_id: str, *, tree_id: str | None = None, cleanup_siblings: bool = True,
                      replace_parent: bool = False) -> PromoteResult:
        return await self.forker.promote(sandbox_id, tree_id=tree_id, cleanup_siblings=cleanup_siblings,
                                         replace_parent=replace_parent)

    async def kill(self, sandbox_id: str) -> None:
        """Stop a sandbox; a paused one is forgotten, and its state snapshot dropped."""
        check_sandbox_id(sandbox_id)
        if self.sandboxes.resolve(sandbox_id) not in self.sandboxes and self.suspender.has(sandbox_id):
            self.suspender.discard(sandbox_id)
            await self.forker.collect()
            return
        await self.sandboxes.kill(sandbox_id)

    def network_log(self, sandbox_id: str) -> list[dict[str, Any]]:
        """The latest names the sandbox's guest asked its resolver for, each allowed or refused and
        why (host/dnsguard.py; empty without names in its policy)."""
        return self.networks.names.decisions(self.get_sandbox(sandbox_id).id)

    def set_timeout(self, sandbox_id: str, timeout_secs: float) -> SandboxRecord:
        """The sandbox is killed ``timeout_secs`` from now (E2B's ``set_timeout``: sooner or later)."""
        check_sandbox_id(sandbox_id)
        self.reaper.set_timeout(sandbox_id, timeout_secs)
        return self.get_sandbox(sandbox_id)

    async def update_network(self, sandbox_id: str, egress: EgressPolicy) -> SandboxRecord:
        """Replace a running or hibernated sandbox's egress policy (controller/network.py
        ``Networks.update``; a hibernated one's applies at its wake). 409 for a paused one."""
        check_sandbox_id(sandbox_id)
        resolved = self.sandboxes.resolve(sandbox_id)
        if resolved not in self.sandboxes and not self.hibernation.hibernated(resolved) \
                and self.suspender.has(sandbox_id):
            raise Conflict(f"sandbox {sandbox_id!r} is paused: resume it (E2B: connect), then update "
                           "its network")
        if self.sandboxes.hidden(resolved):
            raise NotFound(f"sandbox {sandbox_id!r} is not alive")
        async with self.sandboxes.lock(resolved):
            record = self.sandboxes.records.get(resolved)  # 404: killed meanwhile
            trusted = self.networks.names.trust_pem(resolved)
            await self.networks.update(record, egress)
            vm = self.sandboxes.vm(resolved)
            pem = self.networks.names.trust_pem(resolved)
            if vm is not None and pem is not None and pem != trusted:
                # Header rules now, and none before: the running guest trusts its egress CA from
                # here on (the restore's idempotent call; a spawn's child got it with its restore).
                await vm.post_restore(TRUST_TIMEOUT_SECS, RestoreInputs(trust=pem))
        return self.sandboxes.records.get(resolved)

    async def ping(self, sandbox_id: str) -> PingResult:
        return cast(PingResult, await self.agents.call(sandbox_id, lambda agent: agent.ping(30)))

    async def exec(
        self, sandbox_id: str, args: list[str], timeout_secs: float = 30, env: dict[str, str] | None = None,
        cwd: str | None = None, stdin: str | None = None, max_output_bytes: int | None = None,
        user: str | None = None,
    ) -> ExecResult:
        """Run ``args`` to its end (as ``user``, a guest user's name; None: root, the agent itself)."""
        if not args or not all(isinstance(a, str) for a in args):
            raise InvalidRequest("args must be a non-empty list of strings")
        bounds.EXEC_TIMEOUT_SECS.check(timeout_secs)
        given = {"env": env, "cwd": cwd, "stdin": stdin, "max_output_bytes": max_output_bytes,
                 "user": bounds.check_guest_user(user)}
        req = cast(messages.ExecRequest, {"args": args, "timeout_secs": timeout_secs,
                                          **{k: v for k, v in given.items() if v is not None}})
        await self.agents.require_user_support(sandbox_id, user)
        # The agent enforces the timeout; ours only catches a wedged guest.
        result = await self.agents.call(sandbox_id, lambda agent: agent.exec(req, timeout_secs + 30))
        await self.events.turn_done(sandbox_id)
        return cast(ExecResult, result)  # checked against ExecResponse on the way out

    async def eval(self, sandbox_id: str, code: str,
                   timeout_secs: float = bounds.EVAL_TIMEOUT_SECS) -> EvalResult:
        if not isinstance(code, str):
            raise InvalidRequest("code must be a string")
        bounds.EVAL_TIMEOUT.check(timeout_secs)
        await self.agents.require_agent(sandbox_id, capabilities.CAP_PYTHON)  # 400 on an image without Python
        # The agent enforces the limit and answers (a TimeoutError reply, exit_code 1);
        # the grace only catches a wedged guest.
        result = await self.agents.call(sandbox_id, lambda agent: agent.eval(
            {"code": code, "timeout_secs": timeout_secs}, timeout_secs + protocol.REPLY_GRACE_SECS))
        await self.events.turn_done(sandbox_id)
        return result  # checked against its type as it came, and against EvalResponse on the way out

    async def cancel_eval(self, sandbox_id: str) -> CancelResult:
        """Interrupt the sandbox's running eval (it answers ``CancelledError``); ``{"cancelled": bool}``."""
        result = await self.agents.call(sandbox_id, lambda agent: agent.eval_cancel(30))
        return {"cancelled": result["cancelled"]}

    # Processes, files, code contexts and kernel cells are sub-APIs the routes call directly:
    # ``processes`` (controller/processes.py), ``files`` (files.py), ``code`` (code_contexts.py),
    # ``kernels`` (kernel_cells.py) and ``watches`` (watches.py). Each owner checks its input and
    # reports a turn of work (``SandboxEvents.turn_done``) for auto-checkpoints.

    async def branch(self, sandbox_id: str, tag: str | None = None, mode: str = "full",
                     wait: bool = True, *, measure_diff: bool = False,
                     parent_tag: str | None = None) -> SnapshotRecord:
        """Snapshot a running sandbox into ``tag`` and let it carry on (see controller/branch.py)."""
        await self.hibernation.wake(self.sandboxes.resolve(check_sandbox_id(sandbox_id)))
        return await self.brancher.branch(self.sandboxes.resolve(sandbox_id), tag, mode, wait,
                                          measure_diff=measure_diff, parent_tag=parent_tag)

    async def compact_snapshot(self, tag: str, to: str) -> SnapshotRecord:
        """A standalone copy of snapshot ``tag`` (its disk chain flattened) as ``to``."""
        return await self.compactor.compact(tag, to)

    # ---------------------------------------------------------------- pause / resume

    async def pause(self, sandbox_id: str, *, mode: str = "full") -> PausedRecord:
        """Branch the sandbox's state, then stop it (controller/suspend.py)."""
        await self.hibernation.wake(self.sandboxes.resolve(check_sandbox_id(sandbox_id)))
        return await self.suspender.pause(sandbox_id, mode=mode)

    async def resume(self, sandbox_id: str, *, timeout_secs: float | None = None) -> SandboxRecord:
        """Start a paused sandbox again under its id; killed ``timeout_secs`` later, if given."""
        if timeout_secs is not None:
            bounds.SANDBOX_TIMEOUT_SECS.check(timeout_secs)
        if await self.hibernation.wake(self.sandboxes.resolve(check_sandbox_id(sandbox_id))):
            record = self.sandboxes.records.get(self.sandboxes.resolve(sandbox_id))  # E2B's connect
        else:
            record = await self.suspender.resume(sandbox_id)
        self.reaper.apply([record], timeout_secs, hibernate=record.hibernate_on_timeout,
                          memory=record.hibernate_on_timeout_memory)
        return record

    def describe_sandbox(self, sandbox_id: str) -> SandboxView:
        """A running or paused sandbox as the E2B layer shows it (``controller.suspend.view``):
        id, template (the snapshot it was first forked from), state, started, ends, vcpus,
        mem_mib, disk_mb, metadata, egress. 404 if it is neither."""
        check_sandbox_id(sandbox_id)
        resolved = self.sandboxes.resolve(sandbox_id)
        if (resolved in self.sandboxes and not self.sandboxes.hidden(resolved)) \
                or self.hibernation.hibernated(resolved):
            record = self.sandboxes.records.get(resolved)
            return suspend_view(record, self.suspender.template_of(record))
        paused = self.suspender.get(sandbox_id)
        return suspend_view(paused, paused.template)

    def describe_sandboxes(self) -> list[SandboxView]:
        """Every running and every paused sandbox (``describe_sandbox``), oldest first (started in
        the same second: running ones in their order of creation, then paused ones)."""
        out = [suspend_view(sb, self.suspender.template_of(sb)) for sb in self.list_sandboxes()]
        out += [suspend_view(p, p.template) for p in self.suspender.all()]
        return sorted(out, key=lambda v: v["started"])  # stable: keeps the registry's order in a tie

    # ------------------------------------ travel (controller/travel.py: the sub-API ``travel``)

    @property
    def host_id(self) -> str | None:
        return self.spawner.host_id
