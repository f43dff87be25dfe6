"""Object-style SDK: :class:`AsyncSnapshot`, a registered snapshot tag that sandboxes fork from.

::

    from forkd import AsyncSnapshot

    snap = await AsyncSnapshot.from_tag("pyagent")
    kids = await snap.fork(n=5)  # waits until it is ready, then spawns 5
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Unpack

from forkd.sdk._defaults import default_async_controller
from forkd.sdk._http import DEFAULT_WAIT_SECS, snapshot_is_ready
from forkd.sdk.async_client import AsyncController
from forkd.sdk.models import NetworkPolicy, SpawnExtra
from forkd.sdk.types import SnapshotInfo, SnapshotView

if TYPE_CHECKING:
    from forkd.sdk.async_sandbox import AsyncSandbox


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
        env: Mapping[str, str] | None = None,
        child_env: Sequence[Mapping[str, str]] | None = None,
        metadata: Mapping[str, str] | None = None,
        timeout_secs: float | None = None,
        allow_internet_access: bool = False,
        network: NetworkPolicy | None = None,
        **options: Unpack[SpawnExtra],
    ) -> list[AsyncSandbox]:
        """Spawn ``n`` sandboxes from this snapshot (after :meth:`wait_ready`).

        The sandboxes are owned by the caller: each is killed when used as a
        context manager and left, or explicitly via :meth:`AsyncSandbox.kill`.
        ``env``, ``child_env`` (one per sandbox), ``metadata``,
        ``timeout_secs``, ``allow_internet_access``, ``network`` and ``**options``
        (the request's other fields) as for :meth:`AsyncController.spawn_sandboxes`.
        """
        await self.wait_ready(wait_timeout)
        infos = await self.controller.spawn_sandboxes(
            self.tag,
            n=n,
            per_child_netns=per_child_netns,
            memory_limit_mib=memory_limit_mib,
            live_fork=live_fork,
            env=env,
            child_env=child_env,
            metadata=metadata,
            timeout_secs=timeout_secs,
            allow_internet_access=allow_internet_access,
            network=network,
            **options,
        )
        # Imported here: a sandbox makes snapshots (branch) and a snapshot makes sandboxes (fork).
        from forkd.sdk.async_sandbox import AsyncSandbox

        return [AsyncSandbox.from_info(info, self.controller) for info in infos]

    async def delete(self, cascade: bool = False, force: bool = False) -> None:
        """Unregister the tag and remove its files."""
        await self.controller.delete_snapshot(self.tag, cascade=cascade, force=force)


__all__ = ["AsyncSnapshot"]
