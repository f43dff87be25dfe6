# GENERATED from src/forkd/sdk/async_routes/forks.py by scripts/unasync_sdk.py — do not edit.
# Edit the async source, then run: python scripts/unasync_sdk.py
"""Branch and fork routes: BRANCH, fork a running sandbox, fork trees, promote, auto-checkpoints."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Unpack, cast

from forkd.sdk import _calls
from forkd.sdk.models import (
    BranchExtra,
    ForkExtra,
    NetworkPolicy,
)
from forkd.sdk.types import (
    CheckpointInfo,
    ForkInfo,
    PromoteInfo,
    SnapshotInfo,
)

from .transport import Transport


class ForkRoutes(Transport):
    """A sandbox's ``branch``, ``fork``, ``promote`` and ``checkpoints``."""

    def branch_sandbox(
        self,
        sandbox_id: str,
        tag: str | None = None,
        mode: str | None = None,
        wait: bool = True,
        diff: bool | None = None,
        **options: Unpack[BranchExtra],
    ) -> SnapshotInfo:
        """``POST /v1/sandboxes/{id}/branch``: snapshot a running sandbox as a new tag.

        The source pauses briefly and resumes; the new snapshot is independent
        of it. ``mode`` is ``"full"`` (daemon default), ``"diff"`` or ``"live"``
        (source spawned with ``live_fork=True``). ``wait=False`` (live only)
        returns with ``status: "writing"``; use :meth:`wait_snapshot_ready`.
        ``diff=True`` is the legacy spelling of ``mode="diff"``. ``**options`` are the
        request's other optional fields (:class:`~forkd.sdk.models.BranchExtra`, e.g.
        ``measure_diff``), sent as given.
        """
        call = _calls.branch_sandbox(sandbox_id, tag=tag, mode=mode, wait=wait, diff=diff, extra=options)
        return cast(SnapshotInfo, self._send(call))

    # ------------------------------------------------------ forking a running sandbox

    def fork_sandbox(
        self,
        sandbox_id: str,
        count: int = 1,
        *,
        per_child_netns: bool = False,
        memory_limit_mib: int | None = None,
        child_memory_limit_mib: Sequence[int | None] | None = None,
        live_fork: bool = False,
        env: Mapping[str, str] | None = None,
        child_env: Sequence[Mapping[str, str]] | None = None,
        metadata: Mapping[str, str] | None = None,
        keep_snapshot: bool = False,
        timeout_secs: float | None = None,
        allow_internet_access: bool = False,
        network: NetworkPolicy | None = None,
        **options: Unpack[ForkExtra],
    ) -> ForkInfo:
        """``POST /v1/sandboxes/{id}/fork``: fork a running sandbox into ``count`` children.

        The source is branched once (``live`` if it was spawned with
        ``live_fork``, else ``diff``), keeps running, and each child is
        restored from that branch. Children succeed or fail one by one: the
        answer is ``{"parent_id", "snapshot_tag", "children": [SandboxInfo],
        "errors": [{"index", "error"}], "pause_ms"}``, and a failed child leaves
        nothing behind.

        Args:
            count: number of children.
            child_memory_limit_mib: one limit per child (``None`` entries use
                ``memory_limit_mib``).
            env, child_env, metadata, per_child_netns, memory_limit_mib,
                live_fork, allow_internet_access, network: as for
                :meth:`spawn_sandboxes` (the egress is the children's; the
                source keeps its own).
            keep_snapshot: keep the intermediate snapshot; by default it is
                deleted once its last child is gone.
            timeout_secs: each child is killed this many seconds after the
                fork returns (the source keeps its own deadline).
            **options: the request's other optional fields
                (:class:`~forkd.sdk.models.ForkExtra`, generated from the daemon's
                ``ForkRequest``), sent as given.
        """
        return cast(ForkInfo, self._send(_calls.fork_sandbox(
            sandbox_id,
            tree=False,
            count=count,
            per_child_netns=per_child_netns,
            memory_limit_mib=memory_limit_mib,
            child_memory_limit_mib=child_memory_limit_mib,
            live_fork=live_fork,
            env=env,
            child_env=child_env,
            metadata=metadata,
            keep_snapshot=keep_snapshot,
            timeout_secs=timeout_secs,
            allow_internet_access=allow_internet_access,
            network=network,
            extra=options,
        )))

    def fork_tree(
        self,
        sandbox_id: str,
        count: int = 1,
        *,
        per_child_netns: bool = False,
        memory_limit_mib: int | None = None,
        child_memory_limit_mib: Sequence[int | None] | None = None,
        live_fork: bool = False,
        env: Mapping[str, str] | None = None,
        child_env: Sequence[Mapping[str, str]] | None = None,
        metadata: Mapping[str, str] | None = None,
        keep_snapshot: bool = False,
        timeout_secs: float | None = None,
        allow_internet_access: bool = False,
        network: NetworkPolicy | None = None,
        **options: Unpack[ForkExtra],
    ) -> ForkInfo:
        """``POST /v1/sandboxes/{id}/fork-tree``: :meth:`fork_sandbox`, as one fork-tree.

        The answer adds ``"tree_id"``; every child's metadata carries
        ``fork_tree_id``, ``fork_parent_id`` and ``fork_index``, so one of them
        can later be kept with :meth:`promote_sandbox`. ``metadata`` must not
        set those three keys itself.
        """
        return cast(ForkInfo, self._send(_calls.fork_sandbox(
            sandbox_id,
            tree=True,
            count=count,
            per_child_netns=per_child_netns,
            memory_limit_mib=memory_limit_mib,
            child_memory_limit_mib=child_memory_limit_mib,
            live_fork=live_fork,
            env=env,
            child_env=child_env,
            metadata=metadata,
            keep_snapshot=keep_snapshot,
            timeout_secs=timeout_secs,
            allow_internet_access=allow_internet_access,
            network=network,
            extra=options,
        )))

    def promote_sandbox(
        self,
        sandbox_id: str,
        *,
        tree_id: str | None = None,
        cleanup_siblings: bool = True,
        replace_parent: bool = False,
    ) -> PromoteInfo:
        """``POST /v1/sandboxes/{id}/promote``: keep this fork-tree child.

        Returns ``{"winner": SandboxInfo, "tree_id", "deleted": [{"id",
        "deleted", "error"?}], "replaced_parent"}``.

        Args:
            tree_id: the fork-tree; default: the child's own ``fork_tree_id``.
            cleanup_siblings: kill every other live child of the tree.
            replace_parent: also kill the tree's source; its id then names the
                winner in every endpoint (so killing the old id kills the winner).
        """
        call = _calls.promote_sandbox(
            sandbox_id,
            tree_id=tree_id,
            cleanup_siblings=cleanup_siblings,
            replace_parent=replace_parent,
        )
        return cast(PromoteInfo, self._send(call))

    def set_checkpoints(
        self, sandbox_id: str, every: int, keep: int | None = None, mode: str | None = None
    ) -> CheckpointInfo:
        """``POST /v1/sandboxes/{id}/checkpoints``: branch after every ``every`` exec/eval calls.

        Keeps the newest ``keep`` checkpoints (daemon default 3) and deletes
        older ones; ``mode`` is ``"diff"`` (default) or ``"live"`` (sandbox
        spawned with ``live_fork``). Replaces any earlier policy. Returns
        ``{"sandbox_id", "policy", "calls", "checkpoints": [SnapshotInfo],
        "last_error"?}``.
        """
        call = _calls.set_checkpoints(sandbox_id, every=every, keep=keep, mode=mode)
        return cast(CheckpointInfo, self._send(call))

    def get_checkpoints(self, sandbox_id: str) -> CheckpointInfo:
        """``GET /v1/sandboxes/{id}/checkpoints``: the policy and the kept checkpoints, oldest first."""
        return cast(CheckpointInfo, self._send(_calls.get_checkpoints(sandbox_id)))

    def delete_checkpoints(self, sandbox_id: str) -> CheckpointInfo:
        """``DELETE /v1/sandboxes/{id}/checkpoints``: stop the policy; the checkpoints taken stay."""
        return cast(CheckpointInfo, self._send(_calls.delete_checkpoints(sandbox_id)))
