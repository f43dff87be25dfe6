# GENERATED from src/forkd/sdk/async_sandbox.py by scripts/unasync_sdk.py — do not edit.
# Edit the async source, then run: python scripts/unasync_sdk.py
"""Object-style SDK: :class:`Sandbox` (one child VM) and :class:`Snapshot` (a tag).

::

    from forkd import Sandbox

    with Sandbox(tag="pyagent") as sb:  # spawns one child on entry, kills it on exit
        sb.commands.run("apt install -y something-risky")
        branch = sb.branch()  # POST /v1/sandboxes/{sb.id}/branch
        grandchildren = branch.fork(n=5)  # waits until ready, then spawns 5
        for g in grandchildren:
            result = g.commands.run(["python3", "-c", "print(2 + 2)"])
            print(result.stdout)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from forkd.sdk._defaults import default_controller
from forkd.sdk._http import DEFAULT_WAIT_SECS, snapshot_is_ready
from forkd.sdk.client import Controller
from forkd.sdk.errors import NotFoundError
from forkd.sdk.types import (
    CommandResult,
    EvalResult,
    JSONDict,
    SandboxInfo,
    SnapshotInfo,
    SnapshotView,
)


class Snapshot(SnapshotView):
    """A registered snapshot tag, as returned by :meth:`Sandbox.branch`.

    Behaves as its SnapshotInfo dict (``snap["tag"]``) and adds
    :meth:`wait_ready`, :meth:`fork` and :meth:`delete`.
    """

    def __init__(self, info: SnapshotInfo, *, controller: Controller | None = None) -> None:
        super().__init__(info)
        self.controller = controller or default_controller()

    @classmethod
    def from_tag(cls, tag: str, *, controller: Controller | None = None) -> Snapshot:
        """Look up an existing snapshot by tag."""
        controller = controller or default_controller()
        return cls(controller.get_snapshot(tag), controller=controller)

    @classmethod
    def create(
        cls, tag: str, *, controller: Controller | None = None, **kwargs: Any
    ) -> Snapshot:
        """Build a new snapshot; ``kwargs`` as for :meth:`Controller.create_snapshot`."""
        controller = controller or default_controller()
        return cls(controller.create_snapshot(tag, **kwargs), controller=controller)

    def refresh(self) -> Snapshot:
        """Re-read the SnapshotInfo from the daemon."""
        self._info = self.controller.get_snapshot(self.tag)
        return self

    def wait_ready(
        self, timeout: float | None = DEFAULT_WAIT_SECS, interval: float = 0.2
    ) -> Snapshot:
        """Wait until the snapshot can be forked (a live ``wait=False`` branch is
        still ``"writing"`` for a while). Returns immediately if it already is.

        Raises :class:`~forkd.sdk.errors.SnapshotFailedError` or
        :class:`~forkd.sdk.errors.ForkdTimeoutError`.
        """
        if not snapshot_is_ready(self._info):
            self._info = self.controller.wait_snapshot_ready(self.tag, timeout, interval)
        return self

    def fork(
        self,
        n: int = 1,
        *,
        per_child_netns: bool = False,
        memory_limit_mib: int | None = None,
        live_fork: bool = False,
        wait_timeout: float | None = DEFAULT_WAIT_SECS,
    ) -> list[Sandbox]:
        """Spawn ``n`` sandboxes from this snapshot (after :meth:`wait_ready`).

        The sandboxes are owned by the caller: each is killed when used as a
        context manager and left, or explicitly via :meth:`Sandbox.kill`.
        """
        self.wait_ready(wait_timeout)
        infos = self.controller.spawn_sandboxes(
            self.tag,
            n=n,
            per_child_netns=per_child_netns,
            memory_limit_mib=memory_limit_mib,
            live_fork=live_fork,
        )
        return [Sandbox.from_info(info, self.controller) for info in infos]

    def delete(self, cascade: bool = False, force: bool = False) -> None:
        """Unregister the tag and remove its files."""
        self.controller.delete_snapshot(self.tag, cascade=cascade, force=force)


class Commands:
    """``sb.commands``: subprocesses inside the sandbox."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def run(
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
        body = self._sandbox.controller.exec(
            self._sandbox.id, cmd, timeout_secs=timeout, env=env, cwd=cwd, stdin=stdin
        )
        return CommandResult.from_json(body)


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
        per_child_netns, memory_limit_mib, live_fork: spawn options, see
            :meth:`Controller.spawn_sandboxes`.
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
        self.commands = Commands(self)

    @classmethod
    def create(
        cls,
        tag: str,
        *,
        controller: Controller | None = None,
        per_child_netns: bool = False,
        memory_limit_mib: int | None = None,
        live_fork: bool = False,
    ) -> Sandbox:
        """Spawn a sandbox from snapshot ``tag`` and return it (owned: killed by :meth:`close`)."""
        sb = cls(
            tag,
            controller=controller,
            per_child_netns=per_child_netns,
            memory_limit_mib=memory_limit_mib,
            live_fork=live_fork,
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

    def refresh(self) -> SandboxInfo:
        """Re-read the SandboxInfo from the daemon."""
        self._info = self.controller.get_sandbox(self.id)
        return self._info

    def ping(self) -> JSONDict:
        """Round trip to the guest agent: ``{"pong": true, "pid": 1, ...}``."""
        return self.controller.ping(self.id)

    def eval(self, code: str, timeout: float | None = None) -> EvalResult:
        """Evaluate Python ``code`` in the warm PID 1 interpreter (state persists)."""
        return EvalResult.from_json(self.controller.eval(self.id, code, timeout=timeout))

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
    "Commands",
    "Sandbox",
    "Snapshot",
    "SnapshotView",
    "default_controller",
]
