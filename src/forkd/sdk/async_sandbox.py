"""Asyncio twins of :class:`~forkd.sdk.sandbox.Sandbox` and ``Snapshot``.

As with the sync class, ``AsyncSandbox(tag=...)`` spawns on ``async with``
entry (or use ``await AsyncSandbox.create(tag)``)::

    async with AsyncSandbox(tag="pyagent") as sb:
        result = await sb.commands.run("echo hi")
        branch = await sb.branch(mode="diff")
        kids = await branch.fork(n=3)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from forkd.sdk._defaults import default_async_controller
from forkd.sdk._http import DEFAULT_WAIT_SECS, snapshot_is_ready
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
    """Async :class:`~forkd.sdk.sandbox.Snapshot`: a Mapping over SnapshotInfo."""

    def __init__(self, info: SnapshotInfo, *, controller: AsyncController | None = None) -> None:
        super().__init__(info)
        self.controller = controller or default_async_controller()

    @classmethod
    async def from_tag(cls, tag: str, *, controller: AsyncController | None = None) -> AsyncSnapshot:
        controller = controller or default_async_controller()
        return cls(await controller.get_snapshot(tag), controller=controller)

    @classmethod
    async def create(
        cls, tag: str, *, controller: AsyncController | None = None, **kwargs: Any
    ) -> AsyncSnapshot:
        controller = controller or default_async_controller()
        return cls(await controller.create_snapshot(tag, **kwargs), controller=controller)

    async def refresh(self) -> AsyncSnapshot:
        self._info = await self.controller.get_snapshot(self.tag)
        return self

    async def wait_ready(
        self, timeout: float | None = DEFAULT_WAIT_SECS, interval: float = 0.2
    ) -> AsyncSnapshot:
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
        await self.wait_ready(wait_timeout)
        infos = await self.controller.spawn_sandboxes(
            self.tag,
            n=n,
            per_child_netns=per_child_netns,
            memory_limit_mib=memory_limit_mib,
            live_fork=live_fork,
        )
        return [AsyncSandbox._adopt(info, self.controller) for info in infos]

    async def delete(self, cascade: bool = False, force: bool = False) -> None:
        await self.controller.delete_snapshot(self.tag, cascade=cascade, force=force)


class AsyncCommands:
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
        body = await self._sandbox.controller.exec(
            self._sandbox.id, cmd, timeout_secs=timeout, env=env, cwd=cwd, stdin=stdin
        )
        return CommandResult.from_json(body)


class AsyncSandbox:
    """Async :class:`~forkd.sdk.sandbox.Sandbox`. Spawns on ``async with`` entry."""

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
        """Spawn a sandbox from ``tag`` and return it (owned: killed by :meth:`close`)."""
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
    def _adopt(cls, info: SandboxInfo, controller: AsyncController) -> AsyncSandbox:
        sb = cls(sandbox_id=str(info["id"]), controller=controller)
        sb._info = info
        sb.owned = True
        return sb

    def __repr__(self) -> str:
        return f"AsyncSandbox(id={self._id!r}, owned={self.owned})"

    @property
    def controller(self) -> AsyncController:
        # Resolved lazily: the default client needs a running event loop.
        if self._controller is None:
            self._controller = default_async_controller()
        return self._controller

    @property
    def id(self) -> str:
        if self._id is None:
            raise RuntimeError(
                "sandbox not started: use `async with AsyncSandbox(tag=...)`, "
                "await AsyncSandbox.create(tag) or await sb.start()"
            )
        return self._id

    async def start(self) -> AsyncSandbox:
        """Spawn the sandbox if this object was made with ``tag=`` and has not yet."""
        if self._id is None:
            assert self._tag is not None
            spawned = await self.controller.spawn_sandboxes(self._tag, n=1, **self._spawn_opts)
            self._info = spawned[0]
            self._id = str(self._info["id"])
            self.owned = True
        return self

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
        return await self.controller.ping(self.id)

    async def eval(self, code: str, timeout: float | None = None) -> EvalResult:
        return EvalResult.from_json(await self.controller.eval(self.id, code, timeout=timeout))

    async def branch(
        self, tag: str | None = None, mode: str | None = None, wait: bool = True
    ) -> AsyncSnapshot:
        info = await self.controller.branch_sandbox(self.id, tag=tag, mode=mode, wait=wait)
        return AsyncSnapshot(info, controller=self.controller)

    async def kill(self) -> None:
        await self.controller.kill_sandbox(self.id)
        self._killed = True

    async def close(self) -> None:
        """Kill the sandbox if this object created it; a no-op for attached ones."""
        if self.owned and not self._killed:
            try:
                await self.kill()
            except NotFoundError:
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
