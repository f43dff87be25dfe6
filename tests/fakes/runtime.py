"""``FakeRuntime``: the controller's ``Runtime`` in memory, for tests of the REST layer.

The daemon's routes (``forkd.api.routes``) call ``Runtime`` through the
``RuntimeLike`` protocol (``forkd.api.deps``); this fake has every one of its
methods with the same signatures (a unit test compares them), keeps the same
records (``forkd.store.registry``'s ``SnapshotRecord``, ``SandboxRecord`` and
``PausedRecord``, so ``info()`` is the real one), and
raises the same errors for the same mistakes, without booting anything.

What it models: the snapshot and sandbox tables, lineage (a branch's parent is
the snapshot its source was forked from, then the source's previous branch),
409 for taken tags and for deleting what others depend on, live branches that
need ``live_fork`` and, with ``wait=False``, stay ``writing`` for a few polls;
E2B's pause (a branch to ``paused-<id>-<n>``, then the sandbox stops) and resume
under the same id, and ``describe_sandbox(es)``, the E2B layer's view of both.
What it does not: VMs, host prerequisites, timeouts, guest output (``exec``
echoes its argv; ``eval`` knows arithmetic and the answers in
``eval_answers``). Its processes (``FakeProcess``) play a few commands:
``echo`` (prints its words and exits 0), ``cat`` (echoes stdin until it is
closed), ``err`` (prints its words on stderr, exits 1), ``sleep`` (runs until
signalled), ``bytes`` (prints ``\xff\xfe`` and a split "é"); anything else prints
its argv and exits 0.

Knobs for tests: ``calls`` records every call as (name, args, kwargs);
``branch_release`` makes ``branch`` wait for an event; ``raise_on_ping``;
``permissive`` makes any well-formed id alive and any tag a ready snapshot (so
that fuzzed requests get past the lookups into the handlers).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import dataclasses
import hashlib
import operator
import posixpath
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple, cast

from forkd import bounds
from forkd.controller.diffs import check_filters
from forkd.controller.disk_quota import DEFAULT_DISK_QUOTA_MIB
from forkd.controller.files import check_metadata, check_path
from forkd.controller.forks import ForkReport
from forkd.controller.options import ForkOptions, SpawnOptions
from forkd.controller.processes import ProcessEvent, check_pty_size, signal_number
from forkd.controller.results import (
    ApplyResult,
    CancelResult,
    CheckpointReport,
    ContextReport,
    Deletion,
    DirListing,
    EvalResult,
    ExecResult,
    FileEntry,
    FsDiff,
    MkdirResult,
    PingResult,
    PoolReport,
    ProcessEntry,
    PromoteResult,
    PullReport,
    PushReport,
    RecordJson,
    SandboxCost,
    SandboxCounts,
    SandboxView,
    SignalResult,
    StdinResult,
    VolumeExportReport,
    VolumeReport,
    WorkspaceReport,
)
from forkd.controller.spawner import ChildSpec, child_specs
from forkd.controller.suspend import STATE_PREFIX
from forkd.controller.suspend import view as suspend_view
from forkd.controller.watches import WatchBatch, WatchEvent
from forkd.errors import Conflict, InvalidRequest, NotFound, TooLarge
from forkd.host.accel import Accel, VMConfig
from forkd.host.egress import EgressPolicy
from forkd.store.layout import check_sandbox_id, check_tag
from forkd.store.records import Hibernation
from forkd.store.registry import AutoCheckpoint, DiskChain, PausedRecord, SandboxRecord, SnapshotRecord


def _egress_kwargs(allow_internet_access: bool | None, network: dict[str, Any] | None) -> dict[str, Any]:
    """The egress arguments of a call, checked by the real rule; recorded only when given."""
    EgressPolicy.from_request(allow_internet_access, network)
    out: dict[str, Any] = {}
    if allow_internet_access:
        out["allow_internet_access"] = True
    if network is not None:
        out["network"] = network
    return out

CREATED = 1717000000
MODES = ("full", "diff", "live")
FAKE_MIN_CHILD_MIB = 128  # a fork child with a smaller limit "fails at restore"


class Call(NamedTuple):
    """One call to the fake, as the caller made it."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def _no_progress(_step: str, _fraction: float) -> None:
    pass


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def _arithmetic(node: ast.AST) -> Any:
    """The value of an expression made of number literals and + - * / // %; else ValueError."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(
            node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_arithmetic(node.left), _arithmetic(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_arithmetic(node.operand))
    raise ValueError(f"the fake runtime cannot evaluate {ast.dump(node)[:60]}")


class FakeProcess:
    """A scripted process: its events so far, and queues of the streams that watch it."""

    def __init__(self, pid: int, args: list[str], env: dict[str, str] | None, cwd: str | None,
                 tag: str | None, stdin: bytes | None, stdin_open: bool) -> None:
        self.pid, self.args, self.env, self.cwd, self.tag = pid, args, env or {}, cwd, tag
        self.stdin_open = stdin_open
        self.pty: dict[str, int] | None = None  # its terminal's size, for one started on a pty
        self.events: list[ProcessEvent] = [ProcessEvent("start", pid)]
        self.watchers: list[asyncio.Queue[ProcessEvent]] = []
        self.exit: ProcessEvent | None = None
        cmd, words = args[0], " ".join(args[1:])
        if cmd == "echo":
            self.emit("stdout", f"{words}\n".encode())
            self.finish(0)
        elif cmd == "err":
            self.emit("stderr", f"{words}\n".encode())
            self.finish(1)
        elif cmd == "bytes":
            self.emit("stdout", b"\xff\xfe caf\xc3")
            self.emit("stdout", b"\xa9\n")
            self.finish(0)
        elif cmd == "cat":
            if stdin:
                self.emit("stdout", stdin)
            if not self.stdin_open:
                self.finish(0)
        elif cmd != "sleep":
            self.emit("stdout", " ".join(args).encode())
            self.finish(0)

    def emit(self, kind: str, data: bytes) -> None:
        self.publish(ProcessEvent(kind, self.pid, data=data))  # type: ignore[arg-type]

    def publish(self, event: ProcessEvent) -> None:
        self.events.append(event)
        for queue in self.watchers:
            queue.put_nowait(event)

    def finish(self, exit_code: int, signal: int | None = None) -> None:
        self.exit = ProcessEvent("exit", self.pid, exit_code=exit_code, signal=signal)
        self.stdin_open = False
        self.publish(self.exit)

    def info(self) -> ProcessEntry:
        return {"pid": self.pid, "tag": self.tag, "args": self.args, "env": self.env, "cwd": self.cwd,
                "user": None, "running": self.exit is None,
                "exit_code": self.exit.exit_code if self.exit else None,
                "signal": self.exit.signal if self.exit else None, "timed_out": False,
                "stdin_open": self.stdin_open, "started_at": float(CREATED), "ended_at": None,
                "pty": self.pty}


class FakeCell:
    """A cell's events, as ``CellEvents`` gives them."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = list(events)
        self.closed = False

    def __aiter__(self) -> FakeCell:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if not self.events:
            raise StopAsyncIteration
        return self.events.pop(0)

    async def aclose(self) -> None:
        self.closed = True


class FakeEvents:
    """A fake process stream (``ProcessEvents``' interface)."""

    def __init__(self, proc: FakeProcess, from_start: bool, on_close: Callable[[FakeProcess], None]) -> None:
        self.pid = proc.pid
        self._proc = proc
        self._queue: asyncio.Queue[ProcessEvent] = asyncio.Queue()
        for event in proc.events if from_start else [proc.events[0]]:
            self._queue.put_nowait(event)
        proc.watchers.append(self._queue)
        self._on_close = on_close
        self._done = False

    def __aiter__(self) -> FakeEvents:
        return self

    async def __anext__(self) -> ProcessEvent:
        if self._done:
            raise StopAsyncIteration
        event = await self._queue.get()
        if event.type == "exit":
            self._done = True
        return event

    async def aclose(self) -> None:
        if not self._done:
            self._done = True
            self._on_close(self._proc)
        if self._queue in self._proc.watchers:
            self._proc.watchers.remove(self._queue)


class FakeDirWatches:
    """``Runtime.watches`` over the fake's files: watchers of directories that exist; what they
    report is what a test puts in ``pending`` (nothing in the fake writes events by itself)."""

    def __init__(self, runtime: FakeRuntime) -> None:
        self._runtime = runtime
        self.pending: dict[tuple[str, str], list[WatchEvent]] = {}  # (sandbox, watcher) -> events
        # Watchers made with include_entry: their directory (events get its files' entries).
        self.with_entries: dict[tuple[str, str], str] = {}

    async def create(self, sandbox_id: str, path: str, *, recursive: bool = False,
                     include_entry: bool = False) -> str:
        self._runtime._call("watch_create", sandbox_id, path, recursive=recursive,
                            **({"include_entry": True} if include_entry else {}))
        fs, norm = self._runtime._fs(sandbox_id, path)
        if norm not in fs:
            raise NotFound(f"{path} does not exist")
        if fs[norm] is not None:
            raise InvalidRequest(f"{path} is not a directory")
        watcher = f"w{len(self.pending) + 1}"
        self.pending[(sandbox_id, watcher)] = []
        if include_entry:
            self.with_entries[(sandbox_id, watcher)] = norm
        return watcher

    async def events(self, sandbox_id: str, watcher: str, *, wait_ms: int = 0) -> WatchBatch:
        if (sandbox_id, watcher) not in self.pending:
            raise NotFound(f"no directory watcher {watcher!r}")
        found, self.pending[(sandbox_id, watcher)] = self.pending[(sandbox_id, watcher)], []
        root = self.with_entries.get((sandbox_id, watcher))
        if root is not None:  # as the agent: what each event names, now, unless it is gone
            fs, _ = self._runtime._fs(sandbox_id, root)
            found = [WatchEvent(ev.name, ev.type, await self._runtime.files.stat(
                         sandbox_id, posixpath.join(root, ev.name)))
                     if ev.type not in ("remove", "rename") and posixpath.join(root, ev.name) in fs
                     else ev for ev in found]
        return WatchBatch(found, overflowed=False)

    async def remove(self, sandbox_id: str, watcher: str) -> None:
        if self.pending.pop((sandbox_id, watcher), None) is None:
            raise NotFound(f"no directory watcher {watcher!r}")


@dataclass
class FakeRuntime:
    """Answers like ``forkd.controller.runtime.Runtime`` without any VM."""

    snapshots: dict[str, SnapshotRecord] = field(default_factory=dict)
    sandboxes: dict[str, SandboxRecord] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    branch_release: asyncio.Event | None = None  # when set, branch() waits for it
    raise_on_ping: BaseException | None = None
    permissive: bool = False
    # A live wait=False branch reads "writing" this many times, then "ready".
    polls_while_writing: int = 1
    eval_answers: dict[str, str] = field(default_factory=lambda: {"numpy.zeros(5).sum()": "0.0"})
    closed_with: dict[str, Any] | None = None
    aliases: dict[str, str] = field(default_factory=dict)  # promote(replace_parent): source id -> winner
    snapshot_name_rows: dict[str, tuple[str, float]] = field(default_factory=dict)  # name -> (tag, when)
    pool_rows: dict[str, dict[str, Any]] = field(default_factory=dict)  # tag -> PoolInfo
    network_decisions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # id -> resolver log
    refill_times: list[tuple[str, float]] = field(default_factory=list)  # for the metrics scrape
    # Every sandbox's files: path -> contents (bytes) or None for a directory.
    guest_files: dict[str, dict[str, bytes | None]] = field(default_factory=dict)
    # Sizes of the body pieces file_write received, to show that uploads stream.
    upload_pieces: list[int] = field(default_factory=list)
    download_piece: int = 1 << 20  # file_read yields pieces of this size
    workspace_rows: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> its row
    suspended: dict[str, SnapshotRecord] = field(default_factory=dict)  # sandbox id -> its state
    paused: dict[str, PausedRecord] = field(default_factory=dict)  # E2B's pause: sandbox id -> its row
    # sandbox -> pid -> process
    guest_processes: dict[str, dict[int, FakeProcess]] = field(default_factory=dict)
    cancelled_evals: int = 0
    _next_pid: int = field(default=100, init=False)
    store_url: str | None = None  # the object store push/pull use (None: not configured)
    host_id: str | None = None  # a fleet host's id: children are sb-<host>-abcdef-<n>
    stored: dict[str, list[str]] = field(default_factory=dict)  # tag in the store -> its lineage
    _spawned: int = field(default=0, init=False)
    _writing: dict[str, int] = field(default_factory=dict, init=False)  # tag -> polls left while writing
    _branch_seq: dict[str, int] = field(default_factory=dict, init=False)
    _disk_parent: dict[str, str] = field(default_factory=dict, init=False)  # source id -> its newest branch
    _in_flight: set[str] = field(default_factory=set, init=False)  # tags of branches not yet returned
    # The sub-APIs, as ``Runtime`` has them.
    watches: FakeDirWatches = field(init=False)
    files: FakeFiles = field(init=False)
    processes: FakeProcesses = field(init=False)
    kernels: FakeKernels = field(init=False)
    checkpoints: FakeCheckpoints = field(init=False)
    travel: FakeTravel = field(init=False)
    workspaces: FakeWorkspaces = field(init=False)
    volumes: FakeVolumes = field(init=False)
    pools: FakePools = field(init=False)
    hibernation: FakeHibernation = field(init=False)
    builds: FakeBuilds = field(init=False)
    images: FakeImages = field(init=False)
    tags: FakeTags = field(init=False)
    suspender: FakePaused = field(init=False)

    def __post_init__(self) -> None:
        self.watches = FakeDirWatches(self)
        self.files = FakeFiles(self)
        self.costs = FakeCosts(self)
        self.diffs = FakeDiffs(self)
        self.processes = FakeProcesses(self)
        self.kernels = FakeKernels(self)
        self.checkpoints = FakeCheckpoints(self)
        self.travel = FakeTravel(self)
        self.workspaces = FakeWorkspaces(self)
        self.volumes = FakeVolumes(self)
        self.pools = FakePools(self)
        self.hibernation = FakeHibernation(self)
        self.builds = FakeBuilds(self)
        self.images = FakeImages(self)
        self.tags = FakeTags(self)
        self.suspender = FakePaused(self)

    # ---------------------------------------------------------------- set-up

    def add_snapshot(self, tag: str, *, parent_tag: str | None = None, **fields: Any) -> SnapshotRecord:
        """Register ``tag`` (ready unless ``status`` says otherwise), as if built or branched."""
        record = SnapshotRecord(tag=tag, dir=f"/data/snapshots/{tag}", created_at_unix=CREATED,
                                parent_tag=parent_tag, **fields)
        self.snapshots[tag] = record
        return record

    def add_sandbox(self, sandbox_id: str, tag: str = "py", *, live_fork: bool = False,
                    memory_limit_mib: int | None = None, netns: str | None = None) -> SandboxRecord:
        record = SandboxRecord(
            id=sandbox_id, snapshot_tag=tag, dir=f"/data/sandboxes/{sandbox_id}",
            created_at_unix=CREATED + 123, config=VMConfig(512, 1, Accel.tcg()),
            disk=DiskChain.fresh(Path(f"/data/sandboxes/{sandbox_id}"), tag), pid=4242, netns=netns,
            memory_limit_mib=memory_limit_mib, live_fork=live_fork,
        )
        self.sandboxes[sandbox_id] = record
        return record

    def names(self) -> list[str]:
        """The names of the calls so far, in order."""
        return [c.name for c in self.calls]

    # ------------------------------------------------------------- internals

    def _call(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append(Call(name, args, kwargs))

    def _snapshot(self, tag: str) -> SnapshotRecord:
        if tag not in self.snapshots and self.permissive:
            self.add_snapshot(tag)
        if tag not in self.snapshots:
            raise NotFound(f"snapshot {tag!r} is not registered")
        return self.snapshots[tag]

    def _sandbox(self, sandbox_id: str) -> SandboxRecord:
        sandbox_id = self._resolve(sandbox_id)  # after promote(replace_parent), as the real table does
        if sandbox_id not in self.sandboxes and self.permissive:
            self.add_sandbox(sandbox_id, live_fork=True)
        if sandbox_id not in self.sandboxes:
            raise NotFound(f"sandbox {sandbox_id!r} is not alive")
        return self.sandboxes[sandbox_id]

    def _dependents(self, tag: str) -> list[str]:
        out: list[str] = []
        todo = [tag]
        while todo:
            parent = todo.pop(0)
            children = [s.tag for s in self.snapshots.values() if s.parent_tag == parent]
            out += children
            todo += children
        return out

    # --------------------------------------------------------------- runtime

    async def close(self, *, keep_sandboxes: bool = False) -> None:
        self.closed_with = {"keep_sandboxes": keep_sandboxes}

    async def create_snapshot(self, spec: Any, progress: Callable[[str, float], None] = _no_progress
                              ) -> SnapshotRecord:
        self._call("create_snapshot", spec)
        if spec.tag in self.snapshots:
            raise Conflict(f"snapshot {spec.tag!r} already exists; delete it first (forkd rmi {spec.tag})")
        progress("ready", 1.0)
        return self.add_snapshot(spec.tag)

    def list_snapshots(self) -> list[SnapshotRecord]:
        return list(self.snapshots.values())

    def name_snapshot(self, name: str, tag: str) -> None:
        self._call("name_snapshot", name, tag)
        check_tag(name)
        self._snapshot(tag)
        if name != tag and name in self.snapshots:
            raise Conflict(f"{name!r} is a snapshot's own tag; a name cannot stand for another")
        self.snapshot_name_rows[name] = (tag, time.time())

    def unname_snapshot(self, name: str) -> bool:
        return self.snapshot_name_rows.pop(name, None) is not None

    def snapshot_names(self, tag: str) -> list[tuple[str, float]]:
        return sorted(((n, when) for n, (t, when) in self.snapshot_name_rows.items() if t == tag),
                      key=lambda item: (item[1], item[0]))

    def resolve_snapshot(self, name: str) -> str:
        if name in self.snapshots:
            return name
        return self.snapshot_name_rows.get(name, (name, 0.0))[0]

    def get_snapshot(self, tag: str) -> SnapshotRecord:
        self._call("get_snapshot", tag)
        record = self._snapshot(tag)
        if record.status == "writing" and tag in self._writing:
            self._writing[tag] -= 1
            if self._writing[tag] < 0:
                del self._writing[tag]
                record.status = "ready"
        return record

    def snapshot_lineage(self, tag: str) -> RecordJson:
        snap = self._snapshot(tag)
        ancestors: list[str] = []
        parent = snap.parent_tag
        while parent and parent in self.snapshots:
            ancestors.append(parent)
            parent = self.snapshots[parent].parent_tag
        return {**snap.info(), "parent_tag": snap.parent_tag, "ancestors": ancestors,
                "dependents": self._dependents(tag),
                "sandboxes": sorted(s.id for s in self.sandboxes.values() if s.snapshot_tag == tag)}

    async def delete_snapshot(self, tag: str, *, cascade: bool = False, force: bool = False) -> None:
        self._call("delete_snapshot", tag, cascade=cascade, force=force)
        if tag not in self.snapshots:
            raise NotFound(f"snapshot {tag!r} is not registered")
        dependents = self._dependents(tag)
        if dependents and not cascade:
            raise Conflict(f"snapshot {tag!r} has dependent snapshots {dependents}: delete them first, "
                           "or pass cascade=true to delete the subtree")
        doomed = [*reversed(dependents), tag] if cascade else [tag]
        users = [s.id for s in self.sandboxes.values() if s.snapshot_tag in doomed]
        if users and not force:
            raise Conflict(f"sandboxes {users} are running from {tag!r}; kill them first or pass force=true")
        for sandbox_id in users:
            del self.sandboxes[sandbox_id]
        for t in doomed:
            del self.snapshots[t]

    async def spawn(self, tag: str, n: int = 1, options: SpawnOptions | None = None) -> list[SandboxRecord]:
        options = options or SpawnOptions()
        given = options.given()  # recorded as the request set them, the egress as its two fields
        egress = given.pop("egress", None)
        if egress is not None:
            info = egress.info()
            given.update({"allow_internet_access": True} if egress.allow_internet_access else {})
            network = {k: info[k] for k in ("allow_out", "deny_out") if info[k]}
            given.update({"network": network} if network else {})
        self._call("spawn", tag, n, **given)
        self._child_specs(n, options)  # the real per-child checks
        self._snapshot(tag).check_forkable()  # the real rule and its 409 messages
        quota = DEFAULT_DISK_QUOTA_MIB if options.disk_quota_mib is None else options.disk_quota_mib
        out = []
        for i in range(n):
            out.append(self._new_child(tag, i, live_fork=options.live_fork,
                                       memory_limit_mib=options.memory_limit_mib,
                                       per_child_netns=options.per_child_netns,
                                       metadata=options.metadata or {}, timeout_secs=options.timeout_secs))
            out[-1].cpu_limit, out[-1].pids_limit = options.cpu_limit, options.pids_limit
            out[-1].idle_pause_secs = options.idle_pause_secs  # the fake never pauses: it has no clock
            out[-1].disk_quota_mib = quota or None  # the fake's disks never grow
            out[-1].hibernate_on_timeout = options.hibernate_on_timeout
            out[-1].auto_resume = options.auto_resume
        return out

    def _new_child(self, tag: str, i: int, *, live_fork: bool, memory_limit_mib: int | None,
                   per_child_netns: bool, metadata: dict[str, str],
                   timeout_secs: float | None = None) -> SandboxRecord:
        prefix = f"sb-{self.host_id}-abcdef" if self.host_id else "sb-abcdef"
        sandbox_id = f"{prefix}-{self._spawned:04d}"
        self._spawned += 1
        record = self.add_sandbox(sandbox_id, tag, live_fork=live_fork, memory_limit_mib=memory_limit_mib,
                                  netns=f"forkd-child-{i}" if per_child_netns else None)
        record.metadata = dict(metadata)
        if timeout_secs is not None:  # the fake never kills it: it has no clock of its own
            record.expires_at_unix = CREATED + timeout_secs
        return record

    async def fork(self, sandbox_id: str, count: int = 1, options: ForkOptions | None = None, *,
                   tree: bool = False) -> ForkReport:
        """Branch (diff, or live for a live_fork source) and spawn; a child whose limit is below
        ``FAKE_MIN_CHILD_MIB`` fails on its own, as a real child OOM-killed at restore would."""
        o = options or ForkOptions()
        spawn = o.spawn
        given: dict[str, Any] = {k: v for k, v in (("timeout_secs", spawn.timeout_secs),
                                                   ("idle_pause_secs", spawn.idle_pause_secs),
                                                   ("idle_hibernate_secs", spawn.idle_hibernate_secs))
                                 if v is not None}
        if spawn.egress != EgressPolicy():  # recorded as the request's two fields, as the spawn's are
            info = spawn.egress.info()
            given.update({"allow_internet_access": True} if spawn.egress.allow_internet_access else {})
            network = {k: info[k] for k in ("allow_out", "deny_out") if info[k]}
            given.update({"network": network} if network else {})
        self._call("fork", sandbox_id, count, tree=tree, keep_snapshot=o.keep_snapshot, **given)
        keep_snapshot, live_fork = o.keep_snapshot, spawn.live_fork
        per_child_netns, timeout_secs = spawn.per_child_netns, spawn.timeout_secs
        source_id = self._resolve(sandbox_id)
        source = self._sandbox(source_id)
        specs = self._child_specs(count, spawn, o.child_memory_limit_mib)
        snap = await self.branch(source_id, None, "live" if source.live_fork else "diff")
        snap.auto_delete = not keep_snapshot
        tree_id = "ft-00000000000" + str(len(self.calls) % 10) if tree else None
        result = ForkReport(parent_id=source_id, snapshot_tag=snap.tag, tree_id=tree_id,
                            pause_ms=snap.pause_ms)
        for i, spec in enumerate(specs):
            if spec.memory_limit_mib is not None and spec.memory_limit_mib < FAKE_MIN_CHILD_MIB:
                result.errors.append({"index": i, "error": f"child {i} was OOM-killed at restore"})
                continue
            labels = dict(spec.metadata)
            if tree_id:
                labels.update(fork_tree_id=tree_id, fork_parent_id=source_id, fork_index=str(i))
            result.children.append(self._new_child(
                snap.tag, i, live_fork=live_fork, memory_limit_mib=spec.memory_limit_mib,
                per_child_netns=per_child_netns, metadata=labels, timeout_secs=timeout_secs))
        return result

    async def promote(self, sandbox_id: str, *, tree_id: str | None = None, cleanup_siblings: bool = True,
                      replace_parent: bool = False) -> PromoteResult:
        self._call("promote", sandbox_id, tree_id=tree_id, cleanup_siblings=cleanup_siblings,
                   replace_parent=replace_parent)
        winner = self._sandbox(self._resolve(sandbox_id))
        tree = tree_id or winner.metadata.get("fork_tree_id")
        if tree is None or winner.metadata.get("fork_tree_id") != tree:
            raise Conflict(f"sandbox {winner.id} is not a child of fork-tree {tree!r}")
        deleted: list[Deletion] = []
        if cleanup_siblings:
            for sb in [s for s in self.sandboxes.values()
                       if s.metadata.get("fork_tree_id") == tree and s.id != winner.id]:
                del self.sandboxes[sb.id]
                deleted.append({"id": sb.id, "deleted": True})
        parent = winner.metadata.get("fork_parent_id") if replace_parent else None
        if parent:
            if parent in self.sandboxes:
                del self.sandboxes[parent]
                deleted.append({"id": parent, "deleted": True})
            self.aliases[parent] = winner.id
        return {"winner": winner.info(), "tree_id": tree, "deleted": deleted, "replaced_parent": parent}

    def _child_specs(self, n: int, options: SpawnOptions,
                     child_memory_limit_mib: list[int | None] | None = None) -> list[ChildSpec]:
        """The real per-child checks and their 400 messages. ``permissive`` (the fuzzer) drops the
        one rule JSON Schema cannot state, one ``child_*`` entry per child, by trimming/padding."""
        if self.permissive:
            if options.child_env is not None:
                options = dataclasses.replace(options, child_env=(options.child_env + [{}] * n)[:n])
            if child_memory_limit_mib is not None:
                child_memory_limit_mib = (child_memory_limit_mib + [None] * n)[:n]
        return child_specs(n, options, child_memory_limit_mib)

    def _resolve(self, sandbox_id: str) -> str:
        while sandbox_id in self.aliases:
            sandbox_id = self.aliases[sandbox_id]
        return sandbox_id

    def list_sandboxes(self, *, after: str | None = None, limit: int | None = None,
                       where: Callable[[SandboxRecord], bool] | None = None) -> list[SandboxRecord]:
        records = list(self.sandboxes.values())
        if after is not None:
            ids = [r.id for r in records]
            if after not in ids:
                raise NotFound(f"sandbox {after!r} to list after is not alive: list again from the start")
            records = records[ids.index(after) + 1:]
        return [r for r in records if where is None or where(r)][:limit]

    def count_sandboxes(self) -> SandboxCounts:
        return {"listed": len(self.sandboxes), "paused": sum(bool(r.paused) for r in self.sandboxes.values())}

    def get_sandbox(self, sandbox_id: str) -> SandboxRecord:
        self._call("get_sandbox", sandbox_id)
        return self._sandbox(self._resolve(sandbox_id))

    async def kill(self, sandbox_id: str) -> None:
        self._call("kill", sandbox_id)
        del self.sandboxes[self._sandbox(sandbox_id).id]

    def set_timeout(self, sandbox_id: str, timeout_secs: float) -> SandboxRecord:
        self._call("set_timeout", sandbox_id, timeout_secs)
        if timeout_secs != 0:  # 0: now, as the DeadlineKeeper takes it
            bounds.SANDBOX_TIMEOUT_SECS.check(timeout_secs)
        record = self._sandbox(self._resolve(sandbox_id))
        record.expires_at_unix = CREATED + timeout_secs
        return record

    @contextlib.asynccontextmanager
    async def relaying(self, sandbox_id: str) -> AsyncIterator[SandboxRecord]:
        """The port proxy's relay: the sandbox, as the real one hands it over once awake."""
        self._call("relaying", sandbox_id)
        yield self._sandbox(self._resolve(sandbox_id))

    def network_log(self, sandbox_id: str) -> list[dict[str, Any]]:
        self._call("network_log", sandbox_id)
        self._sandbox(self._resolve(sandbox_id))  # 404 like the real one
        return list(self.network_decisions.get(sandbox_id, []))

    async def update_network(self, sandbox_id: str, egress: EgressPolicy) -> SandboxRecord:
        self._call("update_network", sandbox_id, egress.info())
        record = self._sandbox(self._resolve(sandbox_id))
        if record.network is None or record.network.tap is None:
            if self.permissive:  # the fuzzer's sandboxes have no NIC; the 400 is the real one's
                return record
            raise InvalidRequest(f"sandbox {record.id} has no network device")
        record.network = dataclasses.replace(record.network, egress=egress)
        return record

    async def ping(self, sandbox_id: str) -> PingResult:
        self._call("ping", sandbox_id)
        self._sandbox(sandbox_id)
        if self.raise_on_ping is not None:
            raise self.raise_on_ping
        return {"pong": True, "numpy_version": "1.24.2", "pid": 1}

    async def exec(self, sandbox_id: str, args: list[str], timeout_secs: float = 30,
                   env: dict[str, str] | None = None, cwd: str | None = None, stdin: str | None = None,
                   max_output_bytes: int | None = None, user: str | None = None) -> ExecResult:
        """Echoes its argv on stdout (joined by spaces), like ``echo``."""
        self._call("exec", sandbox_id, args, timeout_secs=timeout_secs, env=env, cwd=cwd, stdin=stdin,
                   user=user)
        self._sandbox(sandbox_id)
        return {"stdout": " ".join(args), "stderr": "", "exit_code": 0, "error": None, "timed_out": False}

    # ------------------------------------------------------------------ files

    def _fs(self, sandbox_id: str, path: str) -> tuple[dict[str, bytes | None], str]:
        self._sandbox(sandbox_id)
        check_path(path)
        fs = self.guest_files.setdefault(self._resolve(sandbox_id), {"/": None})
        return fs, posixpath.normpath(path).replace("//", "/")

    @staticmethod
    def _info(path: str, data: bytes | None) -> FileEntry:
        return {"path": path, "name": posixpath.basename(path) or "/",
                "type": "dir" if data is None else "file",
                "size": 0 if data is None else len(data), "mode": 0o755 if data is None else 0o644,
                "mtime": time.time()}

    def _parent_dir(self, fs: dict[str, bytes | None], path: str) -> None:
        parent = posixpath.dirname(path)
        if parent not in fs:
            raise NotFound(f"{parent}: No such file or directory")
        if fs[parent] is not None:
            raise Conflict(f"{parent}: Not a directory")

    # -------------------------------------------------------------- processes

    def _procs(self, sandbox_id: str) -> dict[int, FakeProcess]:
        self._sandbox(self._resolve(sandbox_id))
        return self.guest_processes.setdefault(self._resolve(sandbox_id), {})

    def _proc(self, sandbox_id: str, pid: int) -> FakeProcess:
        proc = self._procs(sandbox_id).get(pid)
        if proc is None:
            raise NotFound(f"no process {pid} (it may have ended long ago)")
        return proc

    def _new_process(self, sandbox_id: str, args: list[str], env: dict[str, str] | None, cwd: str | None,
                     stdin: bytes | None, stdin_open: bool, tag: str | None) -> FakeProcess:
        procs = self._procs(sandbox_id)
        if args[0] == "missing":
            raise InvalidRequest(f"executable not found: {args[0]}")
        self._next_pid += 1
        proc = FakeProcess(self._next_pid, args, env, cwd, tag, stdin, stdin_open)
        procs[proc.pid] = proc
        return proc

    def _kill_on_close(self, proc: FakeProcess) -> None:
        if proc.exit is None:
            proc.finish(-9, 9)

    async def cancel_eval(self, sandbox_id: str) -> CancelResult:
        self._call("cancel_eval", sandbox_id)
        self._sandbox(self._resolve(sandbox_id))
        self.cancelled_evals += 1
        return {"cancelled": False}

    async def eval(self, sandbox_id: str, code: str, timeout_secs: float = 60) -> EvalResult:
        """Arithmetic and ``eval_answers``; anything else fails the way the guest agent reports it."""
        self._call("eval", sandbox_id, code)
        self._sandbox(sandbox_id)
        if code in self.eval_answers:
            return {"result": self.eval_answers[code], "error": None, "exit_code": 0}
        try:
            value = _arithmetic(ast.parse(code, mode="eval").body)
        except (SyntaxError, ValueError, ArithmeticError) as exc:
            return {"result": None, "error": f"{type(exc).__name__}: {exc}", "exit_code": 1}
        return {"result": repr(value), "error": None, "exit_code": 0}

    async def branch(self, sandbox_id: str, tag: str | None = None, mode: str = "full",
                     wait: bool = True, *, measure_diff: bool = False,
                     parent_tag: str | None = None) -> SnapshotRecord:
        extra = {k: v for k, v in (("measure_diff", measure_diff), ("parent_tag", parent_tag)) if v}
        self._call("branch", sandbox_id, tag=tag, mode=mode, wait=wait, **extra)
        if mode not in MODES:
            raise InvalidRequest(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if not wait and mode != "live":
            raise InvalidRequest("wait: false is only meaningful with mode: \"live\"")
        if measure_diff and mode != "full":
            raise InvalidRequest(f"measure_diff measures a full branch, not mode {mode!r}")
        source = self._sandbox(sandbox_id)
        if parent_tag is not None and parent_tag not in (
                source.snapshot_tag, self._disk_parent.get(sandbox_id, source.snapshot_tag)):
            raise Conflict(f"parent_tag {parent_tag!r} is not the parent of a branch of {sandbox_id}")
        if mode == "live" and not source.live_fork:
            raise Conflict(f"sandbox {sandbox_id} was not spawned with live_fork: true, which mode "
                           "\"live\" needs")
        self._branch_seq[sandbox_id] = seq = self._branch_seq.get(sandbox_id, 0) + 1
        tag = tag or f"branch-{sandbox_id}-{seq}"
        if tag in self.snapshots:
            raise Conflict(f"snapshot {tag!r} already exists; delete it first (forkd rmi {tag})")
        if self.branch_release is not None:
            self._in_flight.add(tag)
            try:
                await self.branch_release.wait()
            finally:
                self._in_flight.discard(tag)
        parent = self._disk_parent.get(sandbox_id, source.snapshot_tag)
        record = self.add_snapshot(tag, parent_tag=parent if parent in self.snapshots else None,
                                   branched_from=sandbox_id, pause_ms=48,
                                   status="ready" if wait else "writing")
        if not wait:
            self._writing[tag] = self.polls_while_writing
        if measure_diff:  # as if a quarter of its RAM had been written since the restore
            ram = source.config.mem_mib << 20
            record.diff_measure = {"diff_physical_bytes": ram // 4, "diff_logical_bytes": ram,
                                   "diff_ms": 12.0}
        self._disk_parent[sandbox_id] = tag
        return record

    async def compact_snapshot(self, tag: str, to: str) -> SnapshotRecord:
        self._call("compact_snapshot", tag, to)
        self._snapshot(tag).check_forkable()
        if to in self.snapshots:
            raise Conflict(f"snapshot {to!r} already exists; delete it first (forkd rmi {to})")
        return self.add_snapshot(to, compacted_from=tag)

    # --------------------------------------------------------- pause / resume
    # E2B's pause: the sandbox's state is branched, then it stops (``paused``); resume
    # starts it again under its id from that state.

    def _template_of(self, record: SandboxRecord) -> str:
        """The snapshot it was first forked from: up through auto-deleted (fork, state) snapshots."""
        tag = record.snapshot_tag
        while tag in self.snapshots and self.snapshots[tag].auto_delete and self.snapshots[tag].parent_tag:
            tag = str(self.snapshots[tag].parent_tag)
        return tag

    async def pause(self, sandbox_id: str, *, mode: str = "full") -> PausedRecord:
        self._call("pause", sandbox_id, mode=mode)
        check_sandbox_id(sandbox_id)
        if sandbox_id in self.paused:
            raise Conflict(f"sandbox {sandbox_id} is already paused")
        record = self._sandbox(sandbox_id)
        n = 1
        while f"{STATE_PREFIX}{record.id}-{n}" in self.snapshots:
            n += 1
        state = await self.branch(record.id, f"{STATE_PREFIX}{record.id}-{n}", mode)
        state.auto_delete = True
        paused = PausedRecord(
            id=record.id, state_tag=state.tag, template=self._template_of(record),
            created_at_unix=record.created_at_unix, paused_at_unix=CREATED + 1000,
            metadata=dict(record.metadata), memory_limit_mib=record.memory_limit_mib,
            cpu_limit=record.cpu_limit, pids_limit=record.pids_limit,
            per_child_netns=record.netns is not None, live_fork=record.live_fork,
            vcpus=record.config.vcpus, mem_mib=record.config.mem_mib, egress=record.egress.info(),
            idle_pause_secs=record.idle_pause_secs)
        self.paused[record.id] = paused
        del self.sandboxes[record.id]
        return paused

    async def resume(self, sandbox_id: str, *, timeout_secs: float | None = None) -> SandboxRecord:
        self._call("resume", sandbox_id, timeout_secs=timeout_secs)
        if timeout_secs is not None:
            bounds.SANDBOX_TIMEOUT_SECS.check(timeout_secs)
        check_sandbox_id(sandbox_id)
        hibernated = self.sandboxes.get(sandbox_id)
        if hibernated is not None and hibernated.hibernation is not None:  # woken, as Runtime.resume
            hibernated.hibernation = None
            if timeout_secs is not None:
                hibernated.expires_at_unix = CREATED + timeout_secs
            return hibernated
        if sandbox_id not in self.paused:
            raise NotFound(f"no paused sandbox {sandbox_id!r}")
        paused = self.paused.pop(sandbox_id)
        record = self.add_sandbox(sandbox_id, paused.state_tag, live_fork=paused.live_fork,
                                  memory_limit_mib=paused.memory_limit_mib)
        record.metadata = dict(paused.metadata)
        record.idle_pause_secs = paused.idle_pause_secs
        if timeout_secs is not None:
            record.expires_at_unix = CREATED + timeout_secs
        return record

    def describe_sandbox(self, sandbox_id: str) -> SandboxView:
        """A running or paused sandbox as the E2B layer shows it (``controller.suspend.view``)."""
        self._call("describe_sandbox", sandbox_id)
        check_sandbox_id(sandbox_id)
        if sandbox_id in self.paused:
            paused = self.paused[sandbox_id]
            return suspend_view(paused, paused.template)
        record = self._sandbox(self._resolve(sandbox_id))
        return suspend_view(record, self._template_of(record))

    def describe_sandboxes(self) -> list[SandboxView]:
        out = [suspend_view(sb, self._template_of(sb)) for sb in self.sandboxes.values()]
        out += [suspend_view(p, p.template) for p in self.paused.values()]
        return sorted(out, key=lambda v: (v["started"], v["id"]))

    # ---------------------------------------------------------------- travel

    def _lineage(self, tag: str) -> list[str]:
        chain = [tag]
        while (parent := self._snapshot(chain[-1]).parent_tag) is not None and parent in self.snapshots:
            chain.append(parent)
        return list(reversed(chain))

    def _need_store(self) -> str:
        if self.store_url is None:
            raise Conflict("no object store is configured: start the daemon with --store "
                                 "s3://bucket/prefix (or FORKD_STORE)")
        return self.store_url


class FakeDiffs:
    """``Runtime.diffs``: no disk layers here, so nothing changed (the routes' shapes and refusals
    are what is tested here; real diffs and applies run in tests/integration/test_diff.py)."""

    def __init__(self, runtime: FakeRuntime) -> None:
        self._rt = runtime

    async def diff(self, sandbox_id: str, against: str = "parent", *, include: list[str] | None = None,
                   exclude: list[str] | None = None) -> FsDiff:
        check_filters(include, "include")  # the real filters' checks (400s), before any sandbox
        check_filters(exclude, "exclude")
        record = self._rt._sandbox(sandbox_id)
        return {"sandbox_id": record.id, "against": f"snapshot:{record.snapshot_tag}", "method": "layers",
                "added": [], "modified": [], "deleted": [], "skipped": 0, "elapsed_ms": 0.0}

    async def render(self, sandbox_id: str, against: str, fmt: str, *, include: list[str] | None = None,
                     exclude: list[str] | None = None) -> bytes:
        check_filters(include, "include")
        check_filters(exclude, "exclude")
        self._rt._sandbox(sandbox_id)
        return b""

    async def apply(self, target: str, source: str, paths: list[str] | None = None) -> ApplyResult:
        record, src = self._rt._sandbox(target), self._rt._sandbox(source)
        return {"sandbox_id": record.id, "source": src.id, "against": f"snapshot:{src.snapshot_tag}",
                "written": [], "deleted": [], "unchanged": []}


class FakeCosts:
    """``Runtime.costs``: no VM, so no RAM or disk is held (the route's shape is what is tested here;
    the figures are read from real QEMUs in tests/integration/test_costs.py)."""

    def __init__(self, runtime: FakeRuntime) -> None:
        self._rt = runtime

    async def of(self, sandbox_id: str) -> SandboxCost:
        record = self._rt._sandbox(sandbox_id)
        ram = record.config.mem_mib << 20
        return SandboxCost(sandbox_id=record.id, ram_bytes=ram, shared_bytes=0, private_bytes=0,
                           untouched_bytes=ram, disk_bytes=0)

    def totals(self) -> dict[str, int]:
        return {"shared": 0, "private": 0, "disk": 0}


class FakeFiles:
    """``Runtime.files`` over the fake's in-memory trees (``FakeRuntime.guest_files``)."""

    def __init__(self, runtime: FakeRuntime) -> None:
        self._rt = runtime
        # Each file's metadata (the guest's user.e2b.* xattrs), by (sandbox, path).
        self.metadata: dict[tuple[str, str], dict[str, str]] = {}

    def _info(self, sandbox_id: str, norm: str, data: bytes | None) -> FileEntry:
        info = self._rt._info(norm, data)
        if found := self.metadata.get((sandbox_id, norm)):
            info["metadata"] = dict(found)
        return info

    async def stat(self, sandbox_id: str, path: str, *, user: str | None = None) -> FileEntry:
        self._rt._call("file_stat", sandbox_id, path, user=user)
        fs, norm = self._rt._fs(sandbox_id, path)
        if norm not in fs:
            raise NotFound(f"{path}: No such file or directory")
        return self._info(sandbox_id, norm, fs[norm])

    async def list(self, sandbox_id: str, path: str, *, user: str | None = None) -> DirListing:
        self._rt._call("file_list", sandbox_id, path, user=user)
        fs, norm = self._rt._fs(sandbox_id, path)
        if norm not in fs:
            raise NotFound(f"{path}: No such file or directory")
        if fs[norm] is not None:
            raise Conflict(f"{path}: Not a directory")
        entries = [self._info(sandbox_id, p, d) for p, d in sorted(fs.items())
                   if p != norm and posixpath.dirname(p) == norm]
        return {"path": path, "entries": entries, "truncated": False}

    async def mkdir(self, sandbox_id: str, path: str, *, parents: bool = False,
                    user: str | None = None) -> MkdirResult:
        self._rt._call("file_mkdir", sandbox_id, path, parents=parents, user=user)
        fs, norm = self._rt._fs(sandbox_id, path)
        if norm in fs:
            if parents and fs[norm] is None:
                return {"path": path, "created": False}
            raise Conflict(f"{path}: File exists")
        if parents:
            parts = norm.strip("/").split("/")
            for i in range(1, len(parts)):
                fs.setdefault("/" + "/".join(parts[:i]), None)
        self._rt._parent_dir(fs, norm)
        fs[norm] = None
        return {"path": path, "created": True}

    async def remove(self, sandbox_id: str, path: str, *, recursive: bool = False,
                     user: str | None = None) -> None:
        self._rt._call("file_remove", sandbox_id, path, recursive=recursive, user=user)
        fs, norm = self._rt._fs(sandbox_id, path)
        if norm == "/":
            raise Conflict("refusing to remove /")
        if norm not in fs:
            raise NotFound(f"{path}: No such file or directory")
        inside = [p for p in fs if p.startswith(norm + "/")]
        if inside and not recursive:
            raise Conflict(f"{path}: directory not empty (use recursive)")
        for p in [*inside, norm]:
            del fs[p]

    async def move(self, sandbox_id: str, source: str, destination: str, *,
                   user: str | None = None) -> FileEntry:
        """Renames ``source`` (a file or a directory with what is inside) to ``destination``,
        making its parents, as the agent does; answers the destination's FileInfo."""
        self._rt._call("file_move", sandbox_id, source, destination, user=user)
        fs, src = self._rt._fs(sandbox_id, source)
        _, dst = self._rt._fs(sandbox_id, destination)
        if src not in fs:
            raise NotFound(f"{source}: No such file or directory")
        if src == "/" or dst == src or dst.startswith(src + "/"):
            raise Conflict(f"cannot move {source} into itself")
        if dst in fs:
            raise Conflict(f"{destination}: File exists")
        parts = dst.strip("/").split("/")
        for i in range(1, len(parts)):
            fs.setdefault("/" + "/".join(parts[:i]), None)
        self._rt._parent_dir(fs, dst)
        for path in sorted(p for p in list(fs) if p == src or p.startswith(src + "/")):
            fs[dst + path[len(src):]] = fs.pop(path)
            if (sandbox_id, path) in self.metadata:
                self.metadata[(sandbox_id, dst + path[len(src):])] = self.metadata.pop((sandbox_id, path))
        return self._info(sandbox_id, dst, fs[dst])

    async def write(self, sandbox_id: str, path: str, chunks: AsyncIterable[bytes], *,
                    max_bytes: int, mode: int | None = None, user: str | None = None,
                    metadata: dict[str, str] | None = None) -> FileEntry:
        self._rt._call("file_write", sandbox_id, path, max_bytes=max_bytes, mode=mode, user=user,
                       **({"metadata": metadata} if metadata else {}))
        metadata = check_metadata(metadata)
        fs, norm = self._rt._fs(sandbox_id, path)
        if fs.get(norm, b"") is None:
            raise Conflict(f"{path}: is a directory")
        self._rt._parent_dir(fs, norm)
        data = bytearray()
        async for chunk in chunks:
            self._rt.upload_pieces.append(len(chunk))
            data += chunk
            if len(data) > max_bytes:
                raise TooLarge(f"file exceeds the daemon's {max_bytes}-byte limit")
        fs[norm] = bytes(data)
        self.metadata.pop((sandbox_id, norm), None)  # a new file: only this upload's metadata
        if metadata:
            self.metadata[(sandbox_id, norm)] = dict(metadata)
        return self._info(sandbox_id, norm, fs[norm])

    async def open_read(self, sandbox_id: str, path: str, *,
                        user: str | None = None) -> tuple[FileEntry, AsyncIterator[bytes]]:
        self._rt._call("file_read", sandbox_id, path, user=user)
        info = await self.stat(sandbox_id, path, user=user)
        if info["type"] != "file":
            raise Conflict(f"{path}: a directory")
        fs, norm = self._rt._fs(sandbox_id, path)
        data = fs[norm] or b""

        async def pieces() -> AsyncIterator[bytes]:
            for i in range(0, len(data), self._rt.download_piece):
                yield data[i:i + self._rt.download_piece]

        return info, pieces()


class FakeProcesses:
    """``Runtime.processes`` over the fake's processes (``FakeRuntime.guest_processes``)."""

    def __init__(self, runtime: FakeRuntime) -> None:
        self._rt = runtime

    async def run(
        self, sandbox_id: str, args: list[str], *, env: dict[str, str] | None = None,
        cwd: str | None = None, stdin: bytes | None = None, stdin_open: bool = False,
        tag: str | None = None, timeout_secs: float | None = None, kill_on_close: bool = True,
        user: str | None = None, pty: tuple[int, int] | None = None,
    ) -> FakeEvents:
        self._rt._call("exec_stream", sandbox_id, args, timeout_secs=timeout_secs, env=env, cwd=cwd,
                       stdin=stdin, stdin_open=stdin_open, tag=tag, user=user, pty=pty)
        proc = self._rt._new_process(sandbox_id, args, env, cwd, stdin, stdin_open, tag)
        if pty is not None:
            cols, rows = check_pty_size(*pty)
            proc.pty = {"cols": cols, "rows": rows}
        return FakeEvents(proc, True, self._rt._kill_on_close if kill_on_close else lambda _p: None)

    async def start(
        self, sandbox_id: str, args: list[str], *, env: dict[str, str] | None = None,
        cwd: str | None = None, stdin: bytes | None = None, stdin_open: bool = False,
        tag: str | None = None, timeout_secs: float | None = None, user: str | None = None,
    ) -> ProcessEntry:
        self._rt._call("process_start", sandbox_id, args, env=env, cwd=cwd, stdin=stdin,
                   stdin_open=stdin_open, tag=tag, timeout_secs=timeout_secs, user=user)
        return self._rt._new_process(sandbox_id, args, env, cwd, stdin, stdin_open, tag).info()

    async def attach(self, sandbox_id: str, pid: int, *, from_start: bool = True) -> FakeEvents:
        self._rt._call("process_stream", sandbox_id, pid, from_start=from_start)
        return FakeEvents(self._rt._proc(sandbox_id, pid), from_start, lambda _p: None)

    async def list(self, sandbox_id: str) -> list[ProcessEntry]:
        self._rt._call("process_list", sandbox_id)
        return [p.info() for p in self._rt._procs(sandbox_id).values() if p.exit is None]

    async def get(self, sandbox_id: str, pid: int) -> ProcessEntry:
        self._rt._call("process_get", sandbox_id, pid)
        return self._rt._proc(sandbox_id, pid).info()

    async def write_stdin(self, sandbox_id: str, pid: int, data: bytes, *,
                          eof: bool = False) -> StdinResult:
        self._rt._call("process_write_stdin", sandbox_id, pid, data, eof=eof)
        proc = self._rt._proc(sandbox_id, pid)
        if not proc.stdin_open:
            raise Conflict(f"process {pid} has no open stdin (start it with stdin open)")
        if data and proc.args[0] == "cat":
            proc.emit("stdout", data)
        if eof:
            proc.stdin_open = False
            if proc.args[0] == "cat":
                proc.finish(0)
        return {"pid": pid, "written": len(data), "stdin_open": not eof}

    async def signal(self, sandbox_id: str, pid: int, sig: int | str, *,
                     group: bool = True) -> SignalResult:
        self._rt._call("process_signal", sandbox_id, pid, sig, group=group)
        number = signal_number(sig)
        proc = self._rt._proc(sandbox_id, pid)
        if proc.exit is not None:
            raise NotFound(f"process {pid} is not running")
        if number in (2, 9, 15):  # what ends a fake process
            proc.finish(-number, number)
        return {"pid": pid, "signal": number, "signalled": True}

    async def kill(self, sandbox_id: str, pid: int) -> None:
        await self.signal(sandbox_id, pid, 9)

    async def resize(self, sandbox_id: str, pid: int, cols: int, rows: int) -> None:
        self._rt._call("process_resize", sandbox_id, pid, cols, rows)
        cols, rows = check_pty_size(cols, rows)
        proc = self._rt._proc(sandbox_id, pid)
        if proc.pty is None:
            raise Conflict(f"process {pid} was not started on a terminal (pty)")
        if proc.exit is not None:
            raise NotFound(f"process {pid} is not running")
        proc.pty = {"cols": cols, "rows": rows}


class FakeKernels:
    """``Runtime.kernels``: a kernel that only echoes, enough for the routes' shapes."""

    def __init__(self, runtime: FakeRuntime) -> None:
        self._rt = runtime

    async def run(
        self, sandbox_id: str, code: str, *, context: str | None = None, timeout_secs: float = 300.0,
        env: dict[str, str] | None = None, cwd: str | None = None, language: str | None = None,
    ) -> FakeCell:
        """A kernel that prints the cell's code and ends: enough for the route's shape."""
        self._rt._call("run_cell", sandbox_id, code, context=context, timeout_secs=timeout_secs, env=env,
                       cwd=cwd, language=language)
        return FakeCell([{"type": "stdout", "text": code},
                         {"type": "end", "execution_count": 1, "timed_out": False, "restarted": False}])



class FakeCheckpoints:
    """``Runtime.checkpoints``: a policy on the sandbox's record; the fake never captures one."""

    def __init__(self, runtime: FakeRuntime) -> None:
        self._rt = runtime

    def set(self, sandbox_id: str, every: int, keep: int, mode: str = "diff") -> CheckpointReport:
        self._rt._call("set_checkpoints", sandbox_id, every=every, keep=keep, mode=mode)
        record = self._rt._sandbox(self._rt._resolve(sandbox_id))
        record.checkpoints = AutoCheckpoint(every=every, keep=keep, mode=mode)
        return self.get(sandbox_id)

    def get(self, sandbox_id: str) -> CheckpointReport:
        record = self._rt._sandbox(self._rt._resolve(sandbox_id))
        kept = [s.info() for s in self._rt.snapshots.values() if s.checkpoint_of == record.id]
        return {"sandbox_id": record.id, "policy": record.checkpoints.info() if record.checkpoints else None,
                "calls": 0, "checkpoints": kept}

    def delete(self, sandbox_id: str) -> CheckpointReport:
        record = self._rt._sandbox(self._rt._resolve(sandbox_id))
        record.checkpoints = None
        return self.get(sandbox_id)


class FakeImages:
    """``Runtime.images``: the one built image, and pulls that convert nothing (no registry here)."""

    def __init__(self, runtime: FakeRuntime) -> None:
        self._rt = runtime
        self.pulled: list[str] = []

    def list(self) -> list[dict[str, Any]]:
        return [{"name": "default", "key": "fake"}, *({"name": ref, "key": "fake"} for ref in self.pulled)]

    async def pull(self, req: Any, emit: Callable[[dict[str, Any]], None] = lambda _e: None) -> Any:
        from forkd.image.oci import ImageRef

        self._rt._call("pull_image", req.ref)
        if not self._rt.permissive:  # the real check and its 400; the fuzzer sends any text
            ImageRef.parse(req.ref)
        self.pulled.append(req.ref)
        emit({"type": "done", "image": {"name": req.name or req.ref, "key": "fake"}})
        return None


class FakeBuilds:
    """``Runtime.builds``: contexts by digest; a build parses for real, then registers its tag
    (every step counted as run once, then cached: the real cache's report, without VMs)."""

    def __init__(self, runtime: FakeRuntime) -> None:
        self._rt = runtime
        self.contexts: dict[str, int] = {}
        self.built: set[str] = set()  # canonical steps already "run"

    async def put_context(self, chunks: AsyncIterable[bytes]) -> ContextReport:
        sha, size = hashlib.sha256(), 0
        async for chunk in chunks:
            sha.update(chunk)
            size += len(chunk)
        self.contexts[sha.hexdigest()] = size
        return {"context": sha.hexdigest(), "bytes": size}

    async def build(self, req: Any, emit: Callable[[dict[str, Any]], None] = lambda _e: None) -> Any:
        from forkd.controller.dockerfile import parse, step_canonical

        self._rt._call("build_template", req.tag)
        # The real parse and its 400s; the fuzzer (``permissive``) sends any text, as for spawn's checks.
        plan = parse("FROM default" if self._rt.permissive else req.dockerfile, req.build_args)
        if req.tag in self._rt.snapshots and not req.replace:
            raise Conflict(f"snapshot {req.tag!r} already exists (pass replace to rebuild it)")
        if req.context is not None and req.context not in self.contexts:
            raise NotFound(f"no build context {req.context[:12]}…")
        emit({"type": "plan", "base": plan.base, "steps": len(plan.steps), "warnings": plan.warnings})
        hits = 0
        for i, step in enumerate(plan.steps, 1):
            key = step_canonical(step)
            cached = key in self.built
            hits += cached
            self.built.add(key)
            emit({"type": "step", "index": i, "of": len(plan.steps), "text": step.text, "cached": cached})
        self._rt.snapshots.pop(req.tag, None)
        record = self._rt.add_snapshot(req.tag)
        info = {"snapshot": record.info(), "cache_hits": hits, "steps_run": len(plan.steps) - hits,
                "layers": [], "env": plan.env, "workdir": plan.workdir, "user": plan.user or "root"}
        emit({"type": "done", **info})
        return SimpleNamespace(info=lambda: info)


class FakeTravel:
    """``Runtime.travel``: an object store that is a dict of tag -> lineage (``FakeRuntime.stored``)."""

    def __init__(self, runtime: FakeRuntime) -> None:
        self._rt = runtime

    async def push(self, tag: str, *, force: bool = False) -> PushReport:
        self._rt._call("push_snapshot", tag, force=force)
        url = self._rt._need_store()
        self._rt._snapshot(tag).check_forkable()
        lineage = self._rt._lineage(tag)
        fresh = [t for t in lineage if t not in self._rt.stored]
        for i, t in enumerate(lineage):
            self._rt.stored[t] = lineage[: i + 1]
        return {"tag": tag, "store": url, "lineage": lineage, "blobs": 3 * len(lineage) + 1,
                "blobs_uploaded": 3 * len(fresh), "bytes_uploaded": 1000 * len(fresh)}

    async def pull(self, tag: str) -> PullReport:
        self._rt._call("pull_snapshot", tag)
        url = self._rt._need_store()
        if tag in self._rt.snapshots:
            return {"tag": tag, "created": [], "reused": [tag], "bytes_downloaded": 0}
        if tag not in self._rt.stored:
            raise NotFound(f"snapshot {tag!r} is neither on this host nor in store {url}")
        created, reused, parent = [], [], None
        for t in self._rt.stored[tag]:
            if t in self._rt.snapshots:
                reused.append(t)
            else:
                self._rt.add_snapshot(t, parent_tag=parent)
                created.append(t)
            parent = t
        return {"tag": tag, "created": created, "reused": reused, "bytes_downloaded": 1000 * len(created)}



class FakeVolumes:
    """``Runtime.volumes``: a volume is a row; the snapshots that attach one are
    ``FakeRuntime.volume_users`` (name -> tags)."""

    def __init__(self, runtime: FakeRuntime) -> None:
        self._rt = runtime
        self.rows: dict[str, dict[str, Any]] = {}
        self.users: dict[str, list[str]] = {}

    def info(self, vol: dict[str, Any]) -> VolumeReport:
        return cast(VolumeReport, {**vol, "snapshots": sorted(self.users.get(vol["name"], []))})

    def get(self, name: str) -> dict[str, Any]:
        if name not in self.rows:
            raise NotFound(f"volume {name!r} does not exist")
        return self.rows[name]

    def all(self) -> list[dict[str, Any]]:
        return list(self.rows.values())

    async def create(self, name: str, *, size_mib: int = 1024, fs: str = "ext4",
                     source: str | None = None) -> dict[str, Any]:
        self._rt._call("create_volume", name, size_mib=size_mib, fs=fs, source=source)
        if name in self.rows:
            raise Conflict(f"volume {name!r} already exists; delete it first")
        self.rows[name] = {"name": name, "size_mib": size_mib, "fs": fs, "created_at_unix": CREATED,
                           "used_mib": 0.0}
        return self.rows[name]

    def delete(self, name: str) -> None:
        self.get(name)
        if self.users.get(name):
            raise Conflict(f"volume {name!r} is in use by snapshot(s) {', '.join(self.users[name])}: "
                           "delete them first")
        del self.rows[name]

    async def export(self, name: str, to: str, snapshot: str | None = None) -> VolumeExportReport:
        self._rt._call("export_volume", name, to, snapshot=snapshot)
        self.get(name)
        out: VolumeExportReport = {"name": name, "to": to}
        if snapshot is not None:
            out["snapshot"] = snapshot
        return out


class FakeWorkspaces:
    """``Runtime.workspaces``: a workspace is a name for a sandbox id (``FakeRuntime.workspace_rows``);
    suspended ones keep their state in ``FakeRuntime.suspended``."""

    def __init__(self, runtime: FakeRuntime) -> None:
        self._rt = runtime

    def info(self, ws: dict[str, Any]) -> WorkspaceReport:
        sandbox = ws["sandbox_id"]
        info = {k: v for k, v in ws.items() if k != "sandbox_id"}
        if sandbox in self._rt.sandboxes:
            info |= {"status": "running", "live_sandbox_id": sandbox}
        elif sandbox in self._rt.suspended:
            info |= {"status": "suspended", "current_state_tag": self._rt.suspended[sandbox].tag}
        else:
            info["status"] = "stale"
        return cast(WorkspaceReport, info)

    def get(self, name: str) -> dict[str, Any]:
        if name not in self._rt.workspace_rows:
            raise NotFound(f"workspace {name!r} does not exist")
        return self._rt.workspace_rows[name]

    def all(self) -> list[dict[str, Any]]:
        return list(self._rt.workspace_rows.values())

    async def create(self, name: str, snapshot_tag: str, *, per_child_netns: bool = False,
                     memory_limit_mib: int | None = None) -> dict[str, Any]:
        self._rt._call("create_workspace", name, snapshot_tag, per_child_netns=per_child_netns,
                       memory_limit_mib=memory_limit_mib)
        if name in self._rt.workspace_rows:
            raise Conflict(f"workspace {name!r} already exists; delete it first")
        [child] = await self._rt.spawn(snapshot_tag, 1, SpawnOptions(per_child_netns=per_child_netns,
                                                                     memory_limit_mib=memory_limit_mib))
        self._rt.workspace_rows[name] = {"id": f"ws-{name}", "name": name, "sandbox_id": child.id,
                                         "source_snapshot_tag": snapshot_tag, "created_at_unix": CREATED,
                                         "last_active_unix": CREATED}
        return self.get(name)

    async def suspend(self, name: str, *, mode: str = "full") -> dict[str, Any]:
        self._rt._call("suspend_workspace", name, mode=mode)
        status = self.info(self.get(name))["status"]
        if status != "running":
            raise Conflict(f"workspace {name!r} is {status}, not running")
        sandbox = self.get(name)["sandbox_id"]
        self._rt.suspended[sandbox] = await self._rt.branch(sandbox, f"paused-{sandbox}-1", mode)
        del self._rt.sandboxes[sandbox]
        return self.get(name)

    async def resume(self, name: str) -> dict[str, Any]:
        self._rt._call("resume_workspace", name)
        ws = self.get(name)
        if self.info(ws)["status"] == "running":
            raise Conflict(f"workspace {name!r} is already running")
        state = self._rt.suspended.pop(ws["sandbox_id"], None)
        self._rt.add_sandbox(ws["sandbox_id"], state.tag if state else ws["source_snapshot_tag"])
        return ws

    async def delete(self, name: str) -> None:
        self._rt._call("delete_workspace", name)
        sandbox = self.get(name)["sandbox_id"]
        del self._rt.workspace_rows[name]
        self._rt.sandboxes.pop(sandbox, None)
        self._rt.suspended.pop(sandbox, None)



class FakePools:
    """``Runtime.pools``: pools fill at once (no VMs); spawns do not draw from them here."""

    def __init__(self, runtime: FakeRuntime) -> None:
        self._rt = runtime

    async def configure(self, tag: str, size: int, *, memory_limit_mib: int | None = None,
                        per_child_netns: bool = False, live_fork: bool = False,
                        allow_internet_access: bool | None = None,
                        network: dict[str, Any] | None = None) -> PoolReport:
        self._rt._call("set_pool", tag, size, memory_limit_mib=memory_limit_mib,
                       per_child_netns=per_child_netns, live_fork=live_fork,
                       **_egress_kwargs(allow_internet_access, network))
        bounds.POOL_SIZE.check(size)
        if size:
            self._rt._snapshot(tag).check_forkable()  # 404, then the real 409 messages
        elif tag not in self._rt.pool_rows:
            self._rt._snapshot(tag)
        self._rt.pool_rows[tag] = {"tag": tag, "size": size, "ready": size,
                                   "memory_limit_mib": memory_limit_mib, "per_child_netns": per_child_netns,
                                   "live_fork": live_fork, "claims": 0, "misses": 0}
        return cast(PoolReport, dict(self._rt.pool_rows[tag]))

    def get(self, tag: str) -> PoolReport:
        if tag not in self._rt.pool_rows:
            self._rt._snapshot(tag)
        empty = {"tag": tag, "size": 0, "ready": 0, "memory_limit_mib": None, "per_child_netns": False,
                 "live_fork": False, "claims": 0, "misses": 0}
        return cast(PoolReport, dict(self._rt.pool_rows.get(tag) or empty))

    def all(self) -> list[PoolReport]:
        return [cast(PoolReport, dict(self._rt.pool_rows[t])) for t in sorted(self._rt.pool_rows)]

    def take_refill_times(self) -> list[tuple[str, float]]:
        out, self._rt.refill_times = self._rt.refill_times, []
        return out



class FakeHibernation:
    """``Runtime.hibernation``: a hibernation is a record on the sandbox; nothing goes to disk."""

    def __init__(self, runtime: FakeRuntime) -> None:
        self._rt = runtime

    async def hibernate(self, sandbox_id: str, *, idle: bool = False, memory: bool = True) -> SandboxRecord:
        self._rt._call("hibernate", sandbox_id, memory=memory)
        record = self._rt._sandbox(sandbox_id)
        if record.hibernation is not None:
            raise Conflict(f"sandbox {sandbox_id!r} is hibernated already")
        if memory:
            record.hibernation = Hibernation(at_unix=float(CREATED), pages=300, memory_bytes=1 << 20,
                                             devices_bytes=16384, pause_ms=40.0)
        else:
            record.hibernation = Hibernation(at_unix=float(CREATED), pages=0, memory_bytes=0,
                                             devices_bytes=0, pause_ms=12.0, memory=False)
        return record


__all__ = [
    "Call",
    "FakeCheckpoints",
    "FakeFiles", "FakeHibernation",
    "FakeKernels",
    "FakePools",
    "FakeProcesses",
    "FakeRuntime",
    "FakeTravel",
    "FakeWorkspaces",
]


class FakeTags:
    """``Runtime.tags``: a branch to a tag is in flight until the fake's branch returns."""

    def __init__(self, runtime: FakeRuntime) -> None:
        self._rt = runtime

    def in_flight(self, tag: str) -> bool:
        return tag in self._rt._in_flight


class FakePaused:
    """``Runtime.suspender``, as E2B's snapshot routes read it: the paused sandboxes."""

    def __init__(self, runtime: FakeRuntime) -> None:
        self._rt = runtime

    def all(self) -> list[PausedRecord]:
        return list(self._rt.paused.values())
