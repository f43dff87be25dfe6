"""Object-style SDK: :class:`AsyncSandbox`, one child VM (a tag is an :class:`AsyncSnapshot`, in
``async_snapshot.py``).

::

    from forkd import AsyncSandbox

    async with AsyncSandbox(tag="pyagent") as sb:  # spawns one child on entry, kills it on exit
        await sb.commands.run("apt install -y something-risky")
        branch = await sb.branch()  # POST /v1/sandboxes/{sb.id}/branch
        grandchildren = await branch.fork(n=5)  # waits until ready, then spawns 5
        for g in grandchildren:
            result = await g.commands.run(["python3", "-c", "print(2 + 2)"])
            print(result.stdout)

        forked = await sb.fork(3, child_env=[{"SEED": str(i)} for i in range(3)])
        for kid in forked.children:  # sb keeps running; the children are the caller's
            await kid.close()
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Unpack

from forkd.sdk._defaults import default_async_controller
from forkd.sdk._twins import sync_property
from forkd.sdk.async_client import AsyncController
from forkd.sdk.async_explore import explore_tree
from forkd.sdk.async_guest import AsyncCommandHandle, AsyncCommands, AsyncFiles
from forkd.sdk.async_snapshot import AsyncSnapshot
from forkd.sdk.errors import NotFoundError
from forkd.sdk.execution import Callbacks, Execution, OnError, OnResult, OnText
from forkd.sdk.models import ApplyResponse, ForkExtra, NetworkPolicy, PingResponse, SandboxMemory, SpawnExtra
from forkd.sdk.terminal import AsyncTerminal
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


class AsyncSandbox:
    """One child VM.

    ``AsyncSandbox(tag="pyagent")`` records what to spawn; the sandbox is
    spawned on entering its ``async with`` block, by :meth:`create` or by
    :meth:`start` (until then :attr:`id` raises ``RuntimeError``). A sandbox
    this object spawned is owned: leaving the block, or :meth:`close`, kills it.
    ``AsyncSandbox(sandbox_id="sb-...")`` attaches to an existing sandbox without
    any request and never kills it on exit.

    Args:
        tag: snapshot to fork the new sandbox from (exclusive with ``sandbox_id``).
        sandbox_id: attach to this live sandbox instead.
        controller: the :class:`AsyncController` to use; default: one shared client
            configured from ``FORKD_URL`` / ``FORKD_TOKEN``.
        per_child_netns, memory_limit_mib, live_fork, env, metadata, timeout_secs,
        idle_pause_secs: spawn options, see :meth:`AsyncController.spawn_sandboxes`.
        allow_internet_access, network, **options:
            spawn options, see :meth:`AsyncController.spawn_sandboxes` (``options``: the
            request's other fields, :class:`~forkd.sdk.models.SpawnExtra`).
    """

    def __init__(
        self,
        tag: str | None = None,
        *,
        sandbox_id: str | None = None,
        controller: AsyncController | None = None,
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
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)

    @classmethod
    async def create(
        cls,
        tag: str,
        *,
        controller: AsyncController | None = None,
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
    ) -> AsyncSandbox:
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
        await sb.start()
        return sb

    @classmethod
    def from_info(cls, info: SandboxInfo, controller: AsyncController) -> AsyncSandbox:
        """Wrap a sandbox that was just spawned on the caller's behalf (owned)."""
        sb = cls(sandbox_id=str(info["id"]), controller=controller)
        sb._info = info
        sb.owned = True
        return sb

    def __repr__(self) -> str:
        return f"AsyncSandbox(id={self._id!r}, owned={self.owned})"

    @property
    def controller(self) -> AsyncController:
        """The :class:`AsyncController` in use.

        The one given, else the shared default (resolved on first use).
        """
        if self._controller is None:
            self._controller = default_async_controller()
        return self._controller

    @property
    def id(self) -> str:
        """The sandbox id; ``RuntimeError`` if a ``tag=`` sandbox was not started yet."""
        if self._id is None:
            raise RuntimeError(
                "sandbox not started: use `async with AsyncSandbox(tag=...)`, "
                "await AsyncSandbox.create(tag) or await sb.start()"
            )
        return self._id

    async def start(self) -> AsyncSandbox:
        """Spawn the sandbox if this object was made with ``tag=`` and has not yet.

        Returns ``self``; a no-op for an attached or already started sandbox.
        """
        if self._id is None:
            assert self._tag is not None
            spawned = await self.controller.spawn_sandboxes(self._tag, n=1, **self._spawn_opts)
            self._info = spawned[0]
            self._id = str(self._info["id"])
            self.owned = True
        return self

    @sync_property
    async def info(self) -> SandboxInfo:
        """The SandboxInfo dict (fetched on first use when attached)."""
        if self._info is None:
            self._info = await self.controller.get_sandbox(self.id)
        return self._info

    async def terminal(self, cols: int = 80, rows: int = 24, *, user: str | None = None) -> AsyncTerminal:
        """A login shell on a ``cols`` x ``rows`` pty in this sandbox, as ``user`` (None: root), over
        the daemon's WebSocket: ``send`` keys, ``recv`` output, ``resize``; closing it kills the shell."""
        return await self.controller.open_terminal(self.id, cols=cols, rows=rows, user=user)

    async def get_host(self, port: int) -> str:
        """``"<ip>:<port>"``: where the host reaches ``port`` in the guest (E2B's ``get_host``).

        Every port of the sandbox's SandboxInfo ``ip`` is forwarded to the guest;
        it needs a snapshot made with ``nic=True`` (``ValueError`` otherwise).
        """
        info = self._info or await self.refresh()
        ip = info.get("ip")
        if not ip:
            raise ValueError(f"sandbox {self.id} has no network address: fork it from a snapshot "
                             "made with nic=True")
        return f"{ip}:{int(port)}"

    async def refresh(self) -> SandboxInfo:
        """Re-read the SandboxInfo from the daemon."""
        self._info = await self.controller.get_sandbox(self.id)
        return self._info

    async def diff(self, against: str = "parent", *, include: list[str] | None = None,
                   exclude: list[str] | None = None, format: str = "json") -> Any:
        """What this sandbox's filesystem changed since its snapshot (or against ``"snapshot:TAG"`` /
        ``"sandbox:ID"``): a :class:`SandboxDiff` (``format="json"``), a unified patch (``"patch"``,
        str) or a tar of the changed files (``"tar"``, bytes)."""
        return await self.controller.sandbox_diff(self.id, against, include=include, exclude=exclude,
                                                  format=format)

    async def apply(self, source: str, paths: list[str] | None = None) -> ApplyResponse:
        """Write ``source``'s changes since its snapshot (a child's) into this sandbox; a conflict
        raises :class:`~forkd.sdk.errors.Conflict` naming every path, and nothing is written."""
        return await self.controller.apply_changes(self.id, source, paths)

    async def memory(self) -> SandboxMemory:
        """What this sandbox costs the host: RAM shared with its snapshot and siblings, RAM of its
        own, pages untouched, its own disk layers (bytes; ``GET /v1/sandboxes/{id}/memory``)."""
        return await self.controller.sandbox_memory(self.id)

    async def ping(self) -> PingResponse:
        """Round trip to the guest agent: ``{"pong": true, "pid": 1, ...}``."""
        return await self.controller.ping(self.id)

    async def eval(self, code: str, timeout: float | None = None) -> EvalResult:
        """Evaluate Python ``code`` in the warm PID 1 interpreter (state persists).

        ``timeout``: interrupt it after this many seconds (default: the daemon's 60 s)."""
        return EvalResult.from_json(await self.controller.eval(self.id, code, timeout=timeout))

    async def run_code(
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
        async with contextlib.aclosing(events):
            async for event in events:
                execution.add(event, callbacks)
        return execution

    async def cancel_eval(self) -> bool:
        """Interrupt the eval running in this sandbox (it answers ``CancelledError``);
        False if none was running."""
        return bool((await self.controller.cancel_eval(self.id))["cancelled"])

    async def branch(
        self, tag: str | None = None, mode: str | None = None, wait: bool = True
    ) -> AsyncSnapshot:
        """Branch this running sandbox into a new snapshot tag; it pauses briefly and resumes.

        ``mode``: ``"full"`` (default), ``"diff"`` or ``"live"`` (needs
        ``live_fork=True`` at spawn). With ``wait=False`` (live only) the
        snapshot is still writing; :meth:`AsyncSnapshot.fork` waits for it.
        """
        info = await self.controller.branch_sandbox(self.id, tag=tag, mode=mode, wait=wait)
        return AsyncSnapshot(info, controller=self.controller)

    # ---------------------------------------------------------------- forking

    async def fork(
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
    ) -> ForkResult[AsyncSandbox]:
        """Fork this running sandbox into ``count`` children; it pauses briefly and keeps running.

        Each child succeeds or fails on its own: the result lists the
        children that came up (owned by the caller: :meth:`close` or
        :meth:`kill` each) and an error per child that did not. The options
        are those of :meth:`AsyncController.fork_sandbox`, its generated ``**options``
        (:class:`~forkd.sdk.models.ForkExtra`: ``idle_pause_secs``, ...)
        included; ``child_env`` and ``child_memory_limit_mib`` give each child its own
        (length ``count``).

        Example::

            forked = await sb.fork(3, child_env=[{"TRY": str(i)} for i in range(3)])
            for failure in forked.errors:
                print(f"child {failure.index} failed: {failure.error}")
        """
        body = await self.controller.fork_sandbox(
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

    async def fork_tree(
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
    ) -> ForkResult[AsyncSandbox]:
        """:meth:`fork` as one fork-tree: the result has a ``tree_id``, and each child
        can :meth:`promote` itself (keep it, kill its siblings).
        """
        body = await self.controller.fork_tree(
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

    def _child(self, info: SandboxInfo) -> AsyncSandbox:
        """A forked child: owned by the caller, on this sandbox's controller."""
        return AsyncSandbox.from_info(info, self.controller)

    async def promote(
        self,
        *,
        tree_id: str | None = None,
        cleanup_siblings: bool = True,
        replace_parent: bool = False,
    ) -> PromoteResult[AsyncSandbox]:
        """Keep this fork-tree child: kill its siblings (``cleanup_siblings``).

        With ``replace_parent`` the tree's source is killed too and its id
        names this sandbox from then on, so killing the source's id (for
        instance leaving the source's own ``with`` block) kills this one.
        ``tree_id`` defaults to this sandbox's own ``fork_tree_id``. The
        result's ``winner`` is ``self``; ``deleted`` says what was killed.
        """
        body = await self.controller.promote_sandbox(
            self.id,
            tree_id=tree_id,
            cleanup_siblings=cleanup_siblings,
            replace_parent=replace_parent,
        )
        self._info = body["winner"]
        return PromoteResult.from_json(body, self)

    async def explore(
        self,
        candidates: Iterable[CandidateT],
        run: Callable[[AsyncSandbox, CandidateT], Any],
        score: Callable[[AsyncSandbox, CandidateT, Any], Any] | None = None,
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
    ) -> ExploreResult[AsyncSandbox, CandidateT]:
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

            async def attempt(child: AsyncSandbox, lr: float) -> CommandResult:
                return await child.commands.run(f"python3 train.py --lr {lr}")

            async def accuracy(child: AsyncSandbox, lr: float, out: CommandResult) -> float:
                return float(out.stdout.split()[-1])

            best = await sb.explore([0.1, 0.01, 0.001], attempt, accuracy)
            print(best.best.candidate, best.best.score, best.winner.id)
        """
        result = await explore_tree(
            self, candidates, run, score, replace_parent=replace_parent, concurrency=concurrency,
            env=env, child_env=child_env, metadata=metadata, memory_limit_mib=memory_limit_mib,
            child_memory_limit_mib=child_memory_limit_mib, per_child_netns=per_child_netns,
            live_fork=live_fork, keep_snapshot=keep_snapshot, apply_winner=apply_winner,
        )
        if result.promotion.replaced_parent is not None:
            self._info = None  # this id names the winner now
        return result

    # ------------------------------------------------------------ checkpoints

    async def set_checkpoints(
        self, every: int, keep: int | None = None, mode: str | None = None
    ) -> Checkpoints[AsyncSnapshot]:
        """Branch this sandbox automatically after every ``every`` exec/eval calls.

        Keeps the newest ``keep`` checkpoints (daemon default 3); ``mode`` is
        ``"diff"`` (default) or ``"live"`` (needs ``live_fork``). Replaces any
        earlier policy. Fork a checkpoint (``.snapshots[-1].fork()``) to go
        back to it.
        """
        body = await self.controller.set_checkpoints(self.id, every, keep=keep, mode=mode)
        return Checkpoints.from_json(body, self._snapshot)

    async def get_checkpoints(self) -> Checkpoints[AsyncSnapshot]:
        """The checkpoint policy (``None`` if unset) and the kept checkpoints, oldest first."""
        return Checkpoints.from_json(await self.controller.get_checkpoints(self.id), self._snapshot)

    async def delete_checkpoints(self) -> Checkpoints[AsyncSnapshot]:
        """Stop checkpointing; the checkpoints already taken stay."""
        body = await self.controller.delete_checkpoints(self.id)
        return Checkpoints.from_json(body, self._snapshot)

    def _snapshot(self, info: SnapshotInfo) -> AsyncSnapshot:
        return AsyncSnapshot(info, controller=self.controller)

    async def set_timeout(self, timeout_secs: float) -> SandboxInfo:
        """Kill this sandbox ``timeout_secs`` from now (sooner or later than before)."""
        info = await self.controller.set_timeout(self.id, timeout_secs)
        self._info = info
        return info

    async def update_network(self, *, allow_internet_access: bool = False,
                             network: Mapping[str, Any] | None = None) -> SandboxInfo:
        """Replace this sandbox's network policy (egress rules and port proxy settings) while it
        runs; what ``network`` omits takes a spawn's default."""
        info = await self.controller.update_network(self.id, allow_internet_access=allow_internet_access,
                                                    network=network)
        self._info = info
        return info

    async def hibernate(self, *, memory: bool = True) -> SandboxInfo:
        """Put this sandbox to disk, its QEMU released, until its next request wakes it;
        ``memory=False``: its disk alone, and the wake cold-boots it."""
        info = await self.controller.hibernate(self.id, memory=memory)
        self._info = info
        return info

    async def kill(self) -> None:
        """Stop the VM now (whether or not this object created it)."""
        await self.controller.kill_sandbox(self.id)
        self._killed = True

    async def close(self) -> None:
        """Kill the sandbox if this object created it; a no-op for attached ones."""
        if self.owned and not self._killed:
            try:
                await self.kill()
            except NotFoundError:  # already gone (killed elsewhere, daemon restarted)
                self._killed = True

    async def __aenter__(self) -> AsyncSandbox:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


__all__ = [
    "AsyncCommandHandle",
    "AsyncCommands",
    "AsyncSandbox",
    "AsyncSnapshot",
    "SnapshotView",
    "default_async_controller",
]
