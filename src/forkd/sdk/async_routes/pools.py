"""Pool, workspace and volume routes: warm pools per snapshot, named workspaces that suspend and
resume, and named volumes."""

from __future__ import annotations

from typing import Unpack, cast

from forkd.sdk import _calls
from forkd.sdk.models import (
    NetworkPolicy,
    PoolExtra,
    PoolInfo,
    VolumeExport,
    VolumeInfo,
)
from forkd.sdk.types import (
    WorkspaceInfo,
)

from .transport import AsyncTransport


class AsyncPoolRoutes(AsyncTransport):
    """``/v1/pools`` and ``/v1/workspaces``."""

    async def set_pool(
        self,
        tag: str,
        size: int,
        *,
        memory_limit_mib: int | None = None,
        per_child_netns: bool = False,
        live_fork: bool = False,
        allow_internet_access: bool = False,
        network: NetworkPolicy | None = None,
        **options: Unpack[PoolExtra],
    ) -> PoolInfo:
        """``PUT /v1/snapshots/{tag}/pool``: keep ``size`` children restored and paused.

        Spawns of ``tag`` with the same options (``memory_limit_mib``,
        ``per_child_netns``, ``live_fork``, ``allow_internet_access``,
        ``network``) are served from the pool first;
        ``size=0`` drains it. Returns ``{"size", "ready", ...}``. ``**options`` are the
        request's other optional fields (:class:`~forkd.sdk.models.PoolExtra`), sent as given.
        """
        call = _calls.set_pool(
            tag,
            size,
            memory_limit_mib=memory_limit_mib,
            per_child_netns=per_child_netns,
            live_fork=live_fork,
            allow_internet_access=allow_internet_access,
            network=network,
            extra=options,
        )
        return cast(PoolInfo, await self._send(call))

    async def get_pool(self, tag: str) -> PoolInfo:
        """``GET /v1/snapshots/{tag}/pool`` → ``{"size", "ready", "claims", "misses", ...}``."""
        return cast(PoolInfo, await self._send(_calls.get_pool(tag)))

    async def list_pools(self) -> list[PoolInfo]:
        """``GET /v1/pools``: every warm pool of the daemon."""
        return cast(list[PoolInfo], await self._send(_calls.list_pools()))

    # -------------------------------------------------------------- workspaces

    async def create_workspace(
        self,
        name: str,
        snapshot_tag: str,
        *,
        per_child_netns: bool = False,
        memory_limit_mib: int | None = None,
    ) -> WorkspaceInfo:
        """``POST /v1/workspaces``: fork a sandbox of ``snapshot_tag`` under a name that
        lives through suspend and resume (forkd 0.5's workspaces, E2B's pause/resume)."""
        call = _calls.create_workspace(name, snapshot_tag, per_child_netns=per_child_netns,
                                       memory_limit_mib=memory_limit_mib)
        return cast(WorkspaceInfo, await self._send(call))

    async def list_workspaces(self) -> list[WorkspaceInfo]:
        """``GET /v1/workspaces``."""
        return cast(list[WorkspaceInfo], await self._send(_calls.list_workspaces()))

    async def get_workspace(self, name: str) -> WorkspaceInfo:
        """``GET /v1/workspaces/{name}``: ``status`` is running, suspended or stale."""
        return cast(WorkspaceInfo, await self._send(_calls.get_workspace(name)))

    async def delete_workspace(self, name: str) -> None:
        """``DELETE /v1/workspaces/{name}``: kill its sandbox (or drop its saved state)."""
        await self._send(_calls.delete_workspace(name))

    async def suspend_workspace(self, name: str, *, diff: bool = False) -> WorkspaceInfo:
        """``POST /v1/workspaces/{name}/suspend``: branch its sandbox to a state snapshot,
        then stop it. ``diff`` pauses it for less time (state as of the end of the copy)."""
        return cast(WorkspaceInfo, await self._send(_calls.suspend_workspace(name, diff=diff)))

    async def resume_workspace(self, name: str) -> WorkspaceInfo:
        """``POST /v1/workspaces/{name}/resume``: start its sandbox again, under the same id."""
        return cast(WorkspaceInfo, await self._send(_calls.resume_workspace(name)))

    # -------------------------------------------------------------- volumes

    async def create_volume(self, name: str, *, size_mib: int | None = None,
                            source: str | None = None, fs: str | None = None) -> VolumeInfo:
        """``POST /v1/volumes``: a volume of ``size_mib`` (its quota), empty or filled from
        ``source``, a directory or tarball on the daemon's host. ``fs``: ``ext4`` (default: a disk
        each child of a snapshot copies) or ``hostdir`` (files running sandboxes share)."""
        return cast(VolumeInfo, await self._send(_calls.create_volume(name, size_mib=size_mib,
                                                                      source=source, fs=fs)))

    async def list_volumes(self) -> list[VolumeInfo]:
        """``GET /v1/volumes``."""
        return cast(list[VolumeInfo], await self._send(_calls.list_volumes()))

    async def get_volume(self, name: str) -> VolumeInfo:
        """``GET /v1/volumes/{name}``: ``snapshots`` names those that attach it."""
        return cast(VolumeInfo, await self._send(_calls.get_volume(name)))

    async def export_volume(self, name: str, to: str, *, snapshot: str | None = None) -> VolumeExport:
        """``POST /v1/volumes/{name}/export``: copy its files into ``to``, a new directory on the
        daemon's host; with ``snapshot``, as that snapshot holds the volume."""
        return cast(VolumeExport, await self._send(_calls.export_volume(name, to, snapshot=snapshot)))

    async def delete_volume(self, name: str) -> None:
        """``DELETE /v1/volumes/{name}``: 409 while a snapshot attaches it."""
        await self._send(_calls.delete_volume(name))
