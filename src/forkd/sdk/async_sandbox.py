"""Object-style SDK: :class:`AsyncSandbox` (one child VM) and :class:`AsyncSnapshot` (a tag).

::

    from forkd import AsyncSandbox

    async with AsyncSandbox(tag="pyagent") as sb:  # spawns one child on entry, kills it on exit
        await sb.commands.run("apt install -y something-risky")
        branch = await sb.branch()  # POST /v1/sandboxes/{sb.id}/branch
        grandchildren = await branch.fork(n=5)  # waits until ready, then spawns 5
        for g in grandchildren:
            result = await g.commands.run(["python3", "-c", "print(2 + 2)"])
            print(result.stdout)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from forkd.sdk._defaults import default_async_controller
from forkd.sdk._http import DEFAULT_WAIT_SECS, snapshot_is_ready
from forkd.sdk._twins import sync_property
from forkd.sdk.async_client import AsyncController
from forkd.sdk.errors import NotFoundError
from forkd.sdk.types import (
    CommandResult,
    EvalResult,
    JSONDict,
    SandboxInfo,
    SnapshotInfo,
    SnapshotView,
)


class AsyncSnapshot(SnapshotView):
    """A registered snapshot tag, as returned by :meth:`AsyncSandbox.branch`.

    Behaves as its SnapshotInfo dict (``snap["tag"]``) and adds
    :meth:`wait_ready`, :meth:`fork` and :meth:`delete`.
    """

    def __init__(self, info: SnapshotInfo, *, controller: AsyncController | None = None) -> None:
        super().__init__(info)
        self.controller = controller or default_async_controller()

    @classmethod
    async def from_tag(cls, tag: str, *, controller: AsyncController | None = None) -> AsyncSnapshot:
        """Look up an existing snapshot by tag."""
        controller = controller or default_async_controller()
        return cls(await controller.get_snapshot(tag), controller=controller)

    @classmethod
    async def create(
        cls, tag: str, *, controller: AsyncController | None = None, **kwargs: Any
    ) -> AsyncSnapshot:
        """Build a new snapshot; ``kwargs`` as for :meth:`AsyncController.create_snapshot`."""
        controller = controller or default_async_controller()
        return cls(await controller.create_snapshot(tag, **kwargs), controller=controller)

    async def refresh(self) -> AsyncSnapshot:
        """Re-read the SnapshotInfo from the daemon."""
        self._info = await self.controller.get_snapshot(self.tag)
        return self

    async def wait_ready(
        self, timeout: float | None = DEFAULT_WAIT_SECS, interval: float = 0.2
    ) -> AsyncSnapshot:
        """Wait until the snapshot can be forked (a live ``wait=False`` branch is
        still ``"writing"`` for a while). Returns immediately if it already is.

        Raises :class:`~forkd.sdk.errors.SnapshotFailedError` or
        :class:`~forkd.sdk.errors.ForkdTimeoutError`.
        """
        if not snapshot_is_ready(self._info):
            self._info = await self.controller.wait_snapshot_ready(self.tag, timeout, interval)
        return self

    async def fork(
        self,
        n: int = 1,
        *,
        per_child_netns: bool = False,
        memory_limit_mib: int | None = None,
        live_fork: bool = False,
        wait_timeout: float | None = DEFAULT_WAIT_SECS,
    ) -> list[AsyncSandbox]:
        """Spawn ``n`` sandboxes from this snapshot (after :meth:`wait_ready`).

        The sandboxes are owned by the caller: each is killed when used as a
        context manager and left, or explicitly via :meth:`AsyncSandbox.kill`.
        """
        await self.wait_ready(wait_timeout)
        infos = await self.controller.spawn_sandboxes(
            self.tag,
            n=n,
            per_child_netns=per_child_netns,
            memory_limit_mib=memory_limit_mib,
            live_fork=live_fork,
        )
        return [AsyncSandbox.from_info(info, self.controller) for info in infos]

    async def delete(self, cascade: bool = False, force: bool = False) -> None:
        """Unregister the tag and remove its files."""
        await self.controller.delete_snapshot(self.tag, cascade=cascade, force=force)


class AsyncCommands:
    """``sb.commands``: subprocesses inside the sandbox."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def run(
        self,
        cmd: str | Sequence[str],
        timeout: float = 30,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
    ) -> CommandResult:
        """Run ``cmd`` and wait for it. A string runs via ``/bin/sh -c``; a list is argv.

        ``timeout`` is enforced in the guest (the process group is killed and
        ``timed_out`` set). A non-zero exit is reported, not raised.
        """
        body = await self._sandbox.controller.exec(
            self._sandbox.id, cmd, timeout_secs=timeout, env=env, cwd=cwd, stdin=stdin
        )
        return CommandResult.from_json(body)


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
        per_child_netns, memory_limit_mib, live_fork: spawn options, see
            :meth:`AsyncController.spawn_sandboxes`.
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
    ) -> None:
        if (tag is None) == (sandbox_id is None):
            raise ValueError("pass exactly one of tag= (spawn a sandbox) or sandbox_id= (attach)")
        self._controller = controller
        self._tag = tag
        self._spawn_opts: dict[str, Any] = {
            "per_child_netns": per_child_netns,
            "memory_limit_mib": memory_limit_mib,
            "live_fork": live_fork,
        }
        self._id = sandbox_id
        self._info: SandboxInfo | None = None
        self._killed = False
        self.owned = False
        self.commands = AsyncCommands(self)

    @classmethod
    async def create(
        cls,
        tag: str,
        *,
        controller: AsyncController | None = None,
        per_child_netns: bool = False,
        memory_limit_mib: int | None = None,
        live_fork: bool = False,
    ) -> AsyncSandbox:
        """Spawn a sandbox from snapshot ``tag`` and return it (owned: killed by :meth:`close`)."""
        sb = cls(
            tag,
            controller=controller,
            per_child_netns=per_child_netns,
            memory_limit_mib=memory_limit_mib,
            live_fork=live_fork,
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

    async def refresh(self) -> SandboxInfo:
        """Re-read the SandboxInfo from the daemon."""
        self._info = await self.controller.get_sandbox(self.id)
        return self._info

    async def ping(self) -> JSONDict:
        """Round trip to the guest agent: ``{"pong": true, "pid": 1, ...}``."""
        return await self.controller.ping(self.id)

    async def eval(self, code: str, timeout: float | None = None) -> EvalResult:
        """Evaluate Python ``code`` in the warm PID 1 interpreter (state persists)."""
        return EvalResult.from_json(await self.controller.eval(self.id, code, timeout=timeout))

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
    "AsyncCommands",
    "AsyncSandbox",
    "AsyncSnapshot",
    "SnapshotView",
    "default_async_controller",
]
