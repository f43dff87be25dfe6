# GENERATED from src/forkd/sdk/async_sandbox.py by scripts/unasync_sdk.py — do not edit.
# Edit the async source, then run: python scripts/unasync_sdk.py
"""Object-style SDK: :class:`Sandbox`, one child VM (a tag is an :class:`Snapshot`, in
``async_snapshot.py``).

::

    from forkd import Sandbox

    with Sandbox(tag="pyagent") as sb:  # spawns one child on entry, kills it on exit
        sb.commands.run("apt install -y something-risky")
        branch = sb.branch()  # POST /v1/sandboxes/{sb.id}/branch
        grandchildren = branch.fork(n=5)  # waits until ready, then spawns 5
        for g in grandchildren:
            result = g.commands.run(["python3", "-c", "print(2 + 2)"])
            print(result.stdout)

        forked = sb.fork(3, child_env=[{"SEED": str(i)} for i in range(3)])
        for kid in forked.children:  # sb keeps running; the children are the caller's
            kid.close()
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Unpack

from forkd.sdk._defaults import default_controller
from forkd.sdk._generated.client import Controller
from forkd.sdk._generated.explore import explore_tree
from forkd.sdk._generated.guest import CommandHandle, Commands, Files
from forkd.sdk._generated.snapshot import Snapshot
from forkd.sdk.errors import NotFoundError
from forkd.sdk.execution import Callbacks, Execution, OnError, OnResult, OnText
from forkd.sdk.models import ApplyResponse, ForkExtra, NetworkPolicy, PingResponse, SandboxMemory, SpawnExtra
from forkd.sdk.terminal import Terminal
from forkd.sdk.types import (
    CandidateT,
    Checkpoints,
    EvalResult,
    ExploreResult,
    ForkResult,
    PromoteResult,
    SandboxInfo,
    SnapshotInfo,
    SnapshotView,
)


class Sandbox:
    """One child VM.

    ``Sandbox(tag="pyagent")`` records what to spawn; the sandbox is
    spawned on entering its ``with`` block, by :meth:`create` or by
    :meth:`start` (until then :attr:`id` raises ``RuntimeError``). A sandbox
    this object spawned is owned: leaving the block, or :meth:`close`, kills it.
    ``Sandbox(sandbox_id="sb-...")`` attaches to an existing sandbox without
    any request and never kills it on exit.

    Args:
        tag: snapshot to fork the new sandbox from (exclusive with ``sandbox_id``).
        sandbox_id: attach to this live sandbox instead.
        controller: the :class:`Controller` to use; default: one shared client
            configured from ``FORKD_URL`` / ``FORKD_TOKEN``.
        per_child_netns, memory_limit_mib, live_fork, env, metadata, timeout_secs,
        idle_pause_secs: spawn options, see :meth:`Controller.spawn_sandboxes`.
        allow_internet_access, network, **options:
            spawn options, see :meth:`Controller.spawn_sandboxes` (``options``: the
            request's other fields, :class:`~forkd.sdk.models.SpawnExtra`).
    """

    def __init__(
        self,
        tag: str | None = None,
        *,
        sandbox_id: str | None = None,
        controller: Controller | None = None,
        per_child_netns: bool = False,
        memory_limit_mib: int | None = None,
        live_fork: bool = False,
        env: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        timeout_secs: float | None = None,
        idle_pause_secs: float | None = None,
        allow_internet_access: bool = False,
        network: NetworkPolicy | None = None,
        **options: Unpack[SpawnExtra],
    ) -> None:
        if (tag is None) == (sandbox_id is None):
            raise ValueError("pass exactly one of tag= (spawn a sandbox) or sandbox_id= (attach)")
        self._controller = controller
        self._tag = tag
        self._spawn_opts: dict[str, Any] = {
            "per_child_netns": per_child_netns,
            "memory_limit_mib": memory_limit_mib,
            "live_fork": live_fork,
            "env": env,
            "metadata": metadata,
            "timeout_secs": timeout_secs,
            "idle_pause_secs": idle_pause_secs,
            "allow_internet_access": allow_internet_access,
            "network": network,
            **options,
        }
        self._id = sandbox_id
        self._info: SandboxInfo | None = None
        self._killed = False
        self.owned = False
        self.commands = Commands(self)
        self.files = Files(self)

    @classmethod
    def create(
        cls,
        tag: str,
        *,
        controller: Controller | None = None,
        per_child_netns: bool = False,
        memory_limit_mib: int | None = None,
        live_fork: bool = False,
        env: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        timeout_secs: float | None = None,
        idle_pause_secs: float | None = None,
        allow_internet_access: bool = False,
        network: NetworkPolicy | None = None,
        **options: Unpack[SpawnExtra],
    ) -> Sandbox:
        """Spawn a sandbox from snapshot ``tag`` and return it (owned: killed by :meth:`close`)."""
        sb = cls(
            tag,
            controller=controller,
            per_child_netns=per_child_netns,
            memory_limit_mib=memory_limit_mib,
            live_fork=live_fork,
            env=env,
            metadata=metadata,
            timeout_secs=timeout_secs,
            idle_pause_secs=idle_pause_secs,
            allow_internet_access=allow_internet_access,
            network=network,
            **options,
        )
        sb.start()
        return sb

    @classmethod
    def from_info(cls, info: SandboxInfo, controller: Controller) -> Sandbox:
        """Wrap a sandbox that was just spawned on the caller's behalf (owned)."""
        sb = cls(sandbox_id=str(info["id"]), controller=controller)
        sb._info = info
        sb.owned = True
        return sb

    def __repr__(self) -> str:
        return f"Sandbox(id={self._id!r}, owned={self.owned})"

    @property
    def controller(self) -> Controller:
        """The :class:`Controller` in use.

        The one given, else the shared default (resolved on first use).
        """
        if self._controller is None:
            self._controller = default_controller()
        return self._controller

    @property
    def id(self) -> str:
        """The sandbox id; ``RuntimeError`` if a ``tag=`` sandbox was not started yet."""
        if self._id is None:
            raise RuntimeError(
                "sandbox not started: use `with Sandbox(tag=...)`, "
                "Sandbox.create(tag) or sb.start()"
            )
        return self._id

    def start(self) -> Sandbox:
        """Spawn the sandbox if this object was made with ``tag=`` and has not yet.

        Returns ``self``; a no-op for an attached or already started sandbox.
        """
        if self._id is None:
            assert self._tag is not None
            spawned = self.controller.spawn_sandboxes(self._tag, n=1, **self._spawn_opts)
            self._info = spawned[0]
            self._id = str(self._info["id"])
            self.owned = True
        return self

    @property
    def info(self) -> SandboxInfo:
        """The SandboxInfo dict (fetched on first use when attached)."""
        if self._info is None:
            self._info = self.controller.get_sandbox(self.id)
        return self._info

    def terminal(self, cols: int = 80, rows: int = 24, *, user: str | None = None) -> Terminal:
        """A login shell on a ``cols`` x ``rows`` pty in this sandbox, as ``user`` (None: root), over
        the daemon's WebSocket: ``send`` keys, ``recv`` output, ``resize``; closing it kills the shell."""
        return self.controller.open_terminal(self.id, cols=cols, rows=rows, user=user)

    def get_host(self, port: int) -> str:
        """``"<ip>:<port>"``: where the host reaches ``port`` in the guest (E2B's ``get_host``).

        Every port of the sandbox's SandboxInfo ``ip`` is forwarded to the guest;
        it needs a snapshot made with ``nic=True`` (``ValueError`` otherwise).
        """
        info = self._info or self.refresh()
        ip = info.get("ip")
        if not ip:
            raise ValueError(f"sandbox {self.id} has no network address: fork it from a snapshot "
                             "made with nic=True")
        return f"{ip}:{int(port)}"

    def refresh(self) -> SandboxInfo:
        """Re-read the SandboxInfo from the daemon."""
        self._info = self.controller.get_sandbox(self.id)
        return self._info

    def diff(self, against: str = "parent", *, include: list[str] | None = None,
                   exclude: list[str] | None = None, format: str = "json") -> Any:
        """What this sandbox's filesystem changed since its snapshot (or against ``"snapshot:TAG"`` /
        ``"sandbox:ID"``): a :class:`SandboxDiff` (``format="json"``), a unified patch (``"patch"``,
        str) or a tar of the changed files (``"tar"``, bytes)."""
        return self.controller.sandbox_diff(self.id, against, include=include, exclude=exclude,
                                                  format=format)

    def apply(self, source: str, paths: list[str] | None = None) -> ApplyResponse:
        """Write ``source``'s changes since its snapshot (a child's) into this sandbox; a conflict
        raises :class:`~forkd.sdk.errors.Conflict` naming every path, and nothing is written."""
        return self.controller.apply_changes(self.id, source, paths)

    def memory(self) -> SandboxMemory:
        """What this sandbox costs the host: RAM shared with its snapshot and siblings, RAM of its
        own, pages untouched, its own disk layers (bytes; ``GET /v1/sandboxes/{id}/memory``)."""
        return self.controller.sandbox_memory(self.id)

    def ping(self) -> PingResponse:
        """Round trip to the guest agent: ``{"pong": true, "pid": 1, ...}``."""
        return self.controller.ping(self.id)

    def eval(self, code: str, timeout: float | None = None) -> EvalResult:
        """Evaluate Python ``code`` in the warm PID 1 interpreter (state persists).

        ``timeout``: interrupt it after this many seconds (default: the daemon's 60 s)."""
        return EvalResult.from_json(self.controller.eval(self.id, code, timeout=timeout))

    def run_code(
        self,
        code: str,
        *,
        language: str | None = None,
        context: str | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        on_stdout: OnText | None = None,
        on_stderr: OnText | None = None,
        on_result: OnResult | None = None,
        on_error: OnError | None = None,
    ) -> Execution:
        """Run a cell on one of this sandbox's Jupyter kernels (a snapshot of the ``code-interpreter``
        image; else :class:`~forkd.sdk.errors.ConflictError`) → its :class:`Execution`.

        ``language``: ``python``, ``bash``, ``javascript`` (``js``) or ``r``; None: the context's
        (python for a new one). ``context``: the kernel, one per context (None: the language's
        default). ``timeout``: seconds before the kernel is interrupted (None: the daemon's 300).
        ``env``: environment for this cell only. The callbacks are called, in the kernel's order,
        as the events arrive: ``on_stdout``/``on_stderr`` with each piece of text, ``on_result``
        with each :class:`~forkd.sdk.execution.Result`, ``on_error`` with the
        :class:`~forkd.sdk.execution.ExecutionError`. A cell that raises returns normally, with
        ``error`` set.
        """
        execution = Execution()
        callbacks = Callbacks(on_stdout, on_stderr, on_result, on_error)
        events = self.controller.code_stream(self.id, code, language=language, context=context,
                                             timeout=timeout, env=env)
        with contextlib.closing(events):
            for event in events:
                execution.add(event, callbacks)
        return execution

    def cancel_eval(self) -> bool:
        """Interrupt the eval running in this sandbox (it answers ``CancelledError``);
        False if none was running."""
        return bool((self.controller.cancel_eval(self.id))["cancelled"])

    def branch(
        self, tag: str | None = None, mode: str | None = None, wait: bool = True
    ) -> Snapshot:
        """Branch this running sandbox into a new snapshot tag; it pauses briefly and resumes.

        ``mode``: ``"full"`` (default), ``"diff"`` or ``"live"`` (needs
        ``live_fork=True`` at spawn). With ``wait=False`` (live only) the
        snapshot is still writing; :meth:`Snapshot.fork` waits for it.
        """
        info = self.controller.branch_sandbox(self.id, tag=tag, mode=mode, wait=wait)
        return Snapshot(info, controller=self.controller)

    # ---------------------------------------------------------------- forking

    def fork(
        self,
        count: int = 1,
        *,
        env: Mapping[str, str] | None = None,
        child_env: Sequence[Mapping[str, str]] | None = None,
        metadata: Mapping[str, str] | None = None,
        memory_limit_mib: int | None = None,
        child_memory_limit_mib: Sequence[int | None] | None = None,
        per_child_netns: bool = False,
        live_fork: bool = False,
        keep_snapshot: bool = False,
        timeout_secs: float | None = None,
        allow_internet_access: bool = False,
        network: NetworkPolicy | None = None,
        **options: Unpack[ForkExtra],
    ) -> ForkResult[Sandbox]:
        """Fork this running sandbox into ``count`` children; it pauses briefly and keeps running.

        Each child succeeds or fails on its own: the result lists the
        children that came up (owned by the caller: :meth:`close` or
        :meth:`kill` each) and an error per child that did not. The options
        are those of :meth:`Controller.fork_sandbox`, its generated ``**options``
        (:class:`~forkd.sdk.models.ForkExtra`: ``idle_pause_secs``, ...)
        included; ``child_env`` and ``child_memory_limit_mib`` give each child its own
        (length ``count``).

        Example::

            forked = sb.fork(3, child_env=[{"TRY": str(i)} for i in range(3)])
            for failure in forked.errors:
                print(f"child {failure.index} failed: {failure.error}")
        """
        body = self.controller.fork_sandbox(
            self.id,
            count,
            env=env,
            child_env=child_env,
            metadata=metadata,
            memory_limit_mib=memory_limit_mib,
            child_memory_limit_mib=child_memory_limit_mib,
            per_child_netns=per_child_netns,
            live_fork=live_fork,
            keep_snapshot=keep_snapshot,
            timeout_secs=timeout_secs,
            allow_internet_access=allow_internet_access,
            network=network,
            **options,
        )
        return ForkResult.from_json(body, self._child)

    def fork_tree(
        self,
        count: int = 1,
        *,
        env: Mapping[str, str] | None = None,
        child_env: Sequence[Mapping[str, str]] | None = None,
        metadata: Mapping[str, str] | None = None,
        memory_limit_mib: int | None = None,
        child_memory_limit_mib: Sequence[int | None] | None = None,
        per_child_netns: bool = False,
        live_fork: bool = False,
        keep_snapshot: bool = False,
        timeout_secs: float | None = None,
        allow_internet_access: bool = False,
        network: NetworkPolicy | None = None,
        **options: Unpack[ForkExtra],
    ) -> ForkResult[Sandbox]:
        """:meth:`fork` as one fork-tree: the result has a ``tree_id``, and each child
        can :meth:`promote` itself (keep it, kill its siblings).
        """
        body = self.controller.fork_tree(
            self.id,
            count,
            env=env,
            child_env=child_env,
            metadata=metadata,
            memory_limit_mib=memory_limit_mib,
            child_memory_limit_mib=child_memory_limit_mib,
            per_child_netns=per_child_netns,
            live_fork=live_fork,
            keep_snapshot=keep_snapshot,
            timeout_secs=timeout_secs,
            allow_internet_access=allow_internet_access,
            network=network,
            **options,
        )
        return ForkResult.from_json(body, self._child)

    def _child(self, info: SandboxInfo) -> Sandbox:
        """A forked child: owned by the caller, on this sandbox's controller."""
        return Sandbox.from_info(info, self.controller)

    def promote(
        self,
        *,
        tree_id: str | None = None,
        cleanup_siblings: bool = True,
        replace_parent: bool = False,
    ) -> PromoteResult[Sandbox]:
        """Keep this fork-tree child: kill its siblings (``cleanup_siblings``).

        With ``replace_parent`` the tree's source is killed too and its id
        names this sandbox from then on, so killing the source's id (for
        instance leaving the source's own ``with`` block) kills this one.
        ``tree_id`` defaults to this sandbox's own ``fork_tree_id``. The
        result's ``winner`` is ``self``; ``deleted`` says what was killed.
        """
        body = self.controller.promote_sandbox(
            self.id,
            tree_id=tree_id,
            cleanup_siblings=cleanup_siblings,
            replace_parent=replace_parent,
        )
        self._info = body["winner"]
        return PromoteResult.from_json(body, self)

    def explore(
        self,
        candidates: Iterable[CandidateT],
        run: Callable[[Sandbox, CandidateT], Any],
        score: Callable[[Sandbox, CandidateT, Any], Any] | None = None,
        *,
        replace_parent: bool = False,
        concurrency: int | None = None,
        env: Mapping[str, str] | None = None,
        child_env: Sequence[Mapping[str, str]] | None = None,
        metadata: Mapping[str, str] | None = None,
        memory_limit_mib: int | None = None,
        child_memory_limit_mib: Sequence[int | None] | None = None,
        per_child_netns: bool = False,
        live_fork: bool = False,
        keep_snapshot: bool = False,
        apply_winner: bool = False,
    ) -> ExploreResult[Sandbox, CandidateT]:
        """Best of N: try each candidate in a child of its own and keep the best child.

        Forks a tree with one child per candidate (child ``i`` gets
        ``child_env[i]``), calls ``run(child, candidate)`` for all children at
        the same time (a thread each for the blocking
        :class:`forkd.sdk.Sandbox`), then ``score(child, candidate,
        result)`` with what ``run`` returned; higher is better. Without
        ``score`` the result of ``run`` is the score. ``run`` and ``score`` are
        called like this class's methods (awaited where those are).

        The best child (the lowest index among equal scores) is promoted: its
        siblings are killed and it keeps running, owned by the caller
        (``result.winner.close()``). A candidate whose child failed to spawn,
        or whose ``run`` or ``score`` raised or gave no number, is an outcome
        with its ``error``; it never stops the others. If no candidate
        succeeded, every child is killed and :class:`~forkd.sdk.errors.ExploreError`
        (with all the outcomes) is raised.

        Args:
            candidates: what to try, one child each (at least one).
            replace_parent: also kill this sandbox; its id then names the
                winner (this object and ``result.winner`` are one VM).
            apply_winner: write the winner's file changes (its diff against
                the tree's snapshot) into this sandbox before the promote
                (``result.applied``); a conflict raises
                :class:`~forkd.sdk.errors.Conflict` naming the files, nothing
                written, and every child killed.
            concurrency: at most this many ``run``/``score`` calls at once
                (default: all).
            env, child_env, metadata, memory_limit_mib,
                child_memory_limit_mib, per_child_netns, live_fork,
                keep_snapshot: fork options, see :meth:`fork`.

        Example::

            def attempt(child: Sandbox, lr: float) -> CommandResult:
                return child.commands.run(f"python3 train.py --lr {lr}")

            def accuracy(child: Sandbox, lr: float, out: CommandResult) -> float:
                return float(out.stdout.split()[-1])

            best = sb.explore([0.1, 0.01, 0.001], attempt, accuracy)
            print(best.best.candidate, best.best.score, best.winner.id)
        """
        result = explore_tree(
            self, candidates, run, score, replace_parent=replace_parent, concurrency=concurrency,
            env=env, child_env=child_env, metadata=metadata, memory_limit_mib=memory_limit_mib,
            child_memory_limit_mib=child_memory_limit_mib, per_child_netns=per_child_netns,
            live_fork=live_fork, keep_snapshot=keep_snapshot, apply_winner=apply_winner,
        )
        if result.promotion.replaced_parent is not None:
            self._info = None  # this id names the winner now
        return result

    # ------------------------------------------------------------ checkpoints

    def set_checkpoints(
        self, every: int, keep: int | None = None, mode: str | None = None
    ) -> Checkpoints[Snapshot]:
        """Branch this sandbox automatically after every ``every`` exec/eval calls.

        Keeps the newest ``keep`` checkpoints (daemon default 3); ``mode`` is
        ``"diff"`` (default) or ``"live"`` (needs ``live_fork``). Replaces any
        earlier policy. Fork a checkpoint (``.snapshots[-1].fork()``) to go
        back to it.
        """
        body = self.controller.set_checkpoints(self.id, every, keep=keep, mode=mode)
        return Checkpoints.from_json(body, self._snapshot)

    def get_checkpoints(self) -> Checkpoints[Snapshot]:
        """The checkpoint policy (``None`` if unset) and the kept checkpoints, oldest first."""
        return Checkpoints.from_json(self.controller.get_checkpoints(self.id), self._snapshot)

    def delete_checkpoints(self) -> Checkpoints[Snapshot]:
        """Stop checkpointing; the checkpoints already taken stay."""
        body = self.controller.delete_checkpoints(self.id)
        return Checkpoints.from_json(body, self._snapshot)

    def _snapshot(self, info: SnapshotInfo) -> Snapshot:
        return Snapshot(info, controller=self.controller)

    def set_timeout(self, timeout_secs: float) -> SandboxInfo:
        """Kill this sandbox ``timeout_secs`` from now (sooner or later than before)."""
        info = self.controller.set_timeout(self.id, timeout_secs)
        self._info = info
        return info

    def update_network(self, *, allow_internet_access: bool = False,
                             network: Mapping[str, Any] | None = None) -> SandboxInfo:
        """Replace this sandbox's network policy (egress rules and port proxy settings) while it
        runs; what ``network`` omits takes a spawn's default."""
        info = self.controller.update_network(self.id, allow_internet_access=allow_internet_access,
                                                    network=network)
        self._info = info
        return info

    def hibernate(self, *, memory: bool = True) -> SandboxInfo:
        """Put this sandbox to disk, its QEMU released, until its next request wakes it;
        ``memory=False``: its disk alone, and the wake cold-boots it."""
        info = self.controller.hibernate(self.id, memory=memory)
        self._info = info
        return info

    def kill(self) -> None:
        """Stop the VM now (whether or not this object created it)."""
        self.controller.kill_sandbox(self.id)
        self._killed = True

    def close(self) -> None:
        """Kill the sandbox if this object created it; a no-op for attached ones."""
        if self.owned and not self._killed:
            try:
                self.kill()
            except NotFoundError:  # already gone (killed elsewhere, daemon restarted)
                self._killed = True

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


__all__ = [
    "CommandHandle",
    "Commands",
    "Sandbox",
    "Snapshot",
    "SnapshotView",
    "default_controller",
]
