"""Status and snapshot routes: health, version, metrics; snapshots listed, created, deleted,
waited for, compacted, pushed and pulled."""

from __future__ import annotations

import asyncio
import collections.abc
import time
from collections.abc import Sequence
from typing import IO, Any, Unpack, cast

import httpx

from forkd.sdk import _calls
from forkd.sdk._http import (
    DEFAULT_WAIT_SECS,
    Progress,
    parse_response,
    snapshot_is_ready,
    timeout_for,
    translate,
)
from forkd.sdk.errors import ForkdTimeoutError
from forkd.sdk.models import (
    BuildContextInfo,
    CreateSnapshotExtra,
    Health,
    NetworkPolicy,
    PullResult,
    PushResult,
    SnapshotDetail,
    TemplateBuildExtra,
    Version,
)
from forkd.sdk.types import (
    JSONDict,
    SnapshotInfo,
)

from .transport import AsyncTransport


class AsyncSnapshotRoutes(AsyncTransport):
    """``/healthz``, ``/version``, ``/metrics`` and ``/v1/snapshots``."""

    # ------------------------------------------------------------------- status

    async def healthz(self) -> Health:
        """``GET /healthz`` → ``{"ok": true}``. Needs no token."""
        return cast(Health, await self._send(_calls.healthz()))

    async def version(self) -> Version:
        """``GET /version`` → ``{"version": "0.1.0", "api": "v1"}``."""
        return cast(Version, await self._send(_calls.version()))

    async def metrics(self) -> str:
        """``GET /metrics``: Prometheus text exposition."""
        return cast(str, await self._send(_calls.metrics()))

    # ---------------------------------------------------------------- snapshots

    async def list_snapshots(self) -> list[SnapshotInfo]:
        """``GET /v1/snapshots``: every registered snapshot."""
        return cast(list[SnapshotInfo], await self._send(_calls.list_snapshots()))

    async def get_snapshot(self, tag: str) -> SnapshotDetail:
        """``GET /v1/snapshots/{tag}``: one snapshot, including its lineage."""
        return cast(SnapshotDetail, await self._send(_calls.get_snapshot(tag)))

    async def create_snapshot(
        self,
        tag: str,
        *,
        kernel: str | None = None,
        rootfs: str | None = None,
        boot_wait_secs: float | None = None,
        image: str | None = None,
        mem_mib: int | None = None,
        vcpus: int | None = None,
        warm_imports: Sequence[str] | None = None,
        setup: Sequence[str | Sequence[str]] | None = None,
        nic: bool = False,
        allow_internet_access: bool = False,
        network: NetworkPolicy | None = None,
        **extra: Unpack[CreateSnapshotExtra],
    ) -> SnapshotInfo:
        """``POST /v1/snapshots``: boot a template VM, warm it up, snapshot it as ``tag``.

        Returns once the snapshot is ready (tens of seconds under TCG). Only the
        arguments you set are sent; the daemon picks defaults for the rest.

        Args:
            image: guest image name (``forkd image build --name``).
            warm_imports: Python modules PID 1 imports before the snapshot,
                e.g. ``["numpy", "json"]``.
            setup: commands run in the guest, in order, before the snapshot: a
                string runs via ``/bin/sh -c`` (``"pip install requests"``), a
                list is an argv.
            nic: give the template, and so every child, a network device (eth0
                with an address, a route and DNS); children are then reachable
                from the host at their SandboxInfo ``ip``.
            allow_internet_access, network: the template's own egress while it
                boots and runs ``setup`` (as for :meth:`spawn_sandboxes`).
            **extra: the request's other optional fields (:class:`~forkd.sdk.models.CreateSnapshotExtra`,
                generated from the daemon's ``CreateSnapshotRequest``), sent as given.
        """
        call = _calls.create_snapshot(
            tag,
            kernel=kernel,
            rootfs=rootfs,
            boot_wait_secs=boot_wait_secs,
            image=image,
            mem_mib=mem_mib,
            vcpus=vcpus,
            warm_imports=warm_imports,
            setup=setup,
            extra=extra,
            nic=nic,
            allow_internet_access=allow_internet_access,
            network=network,
        )
        return cast(SnapshotInfo, await self._send(call))

    async def list_images(self) -> list[dict[str, Any]]:
        """``GET /v1/images``: the guest images the daemon boots from (built or pulled)."""
        return cast(list[dict[str, Any]], await self._send(_calls.list_images()))

    async def delete_image(self, name: str) -> None:
        """``DELETE /v1/images/{name}``: 409 (ConflictError) while snapshots stand on it."""
        await self._send(_calls.delete_image(name))

    async def delete_snapshot(self, tag: str, cascade: bool = False, force: bool = False) -> None:
        """``DELETE /v1/snapshots/{tag}``.

        Args:
            cascade: also delete snapshots branched from this one.
            force: delete even if live sandboxes were forked from it.
        """
        await self._send(_calls.delete_snapshot(tag, cascade=cascade, force=force))

    async def wait_snapshot_ready(
        self, tag: str, timeout: float | None = DEFAULT_WAIT_SECS, interval: float = 0.2
    ) -> SnapshotInfo:
        """Poll ``GET /v1/snapshots/{tag}`` until its ``status`` is ``"ready"``.

        Returns the final SnapshotInfo. Raises
        :class:`~forkd.sdk.errors.SnapshotFailedError` if the background write
        failed and :class:`~forkd.sdk.errors.ForkdTimeoutError` after ``timeout``
        seconds (``None`` waits forever).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            info = await self.get_snapshot(tag)
            if snapshot_is_ready(info):
                return info
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ForkdTimeoutError(
                        f"snapshot {tag!r} is still {info.get('status')!r} after {timeout}s"
                    )
                await asyncio.sleep(min(interval, remaining))
            else:
                await asyncio.sleep(interval)

    async def push_snapshot(self, tag: str, *, force: bool = False) -> PushResult:
        """``POST /v1/snapshots/{tag}/push``: publish it (and the chain its disk needs) to the object store.

        Content-addressed: only blobs the store lacks are sent. ``force`` replaces a
        different snapshot of the same tag there. Returns ``{"lineage", "blobs_uploaded", ...}``.
        """
        return cast(PushResult, await self._send(_calls.push_snapshot(tag, force=force)))

    async def pull_snapshot(self, tag: str) -> PullResult:
        """``POST /v1/snapshots/{tag}/pull``: fetch it from the object store onto the daemon's host.

        Ancestors the host already holds are reused. Returns ``{"created", "reused",
        "bytes_downloaded"}``. (A spawn of a tag the host lacks pulls it by itself.)
        """
        return cast(PullResult, await self._send(_calls.pull_snapshot(tag)))

    async def compact_snapshot(self, tag: str, to: str) -> SnapshotInfo:
        """``POST /v1/snapshots/{tag}/compact``: copy ``tag`` into ``to``, a standalone snapshot.

        Its disk chain is flattened and it has no parent, so ``tag``'s ancestors can
        then be deleted without losing ``to``.
        """
        return cast(SnapshotInfo, await self._send(_calls.compact_snapshot(tag, to)))

    # ---------------------------------------------------------------- templates

    async def put_build_context(
        self, tar: bytes | IO[bytes], progress: Progress | None = None
    ) -> BuildContextInfo:
        """``PUT /v1/templates/contexts``: upload a build context (a tar of the files COPY may
        name; a file object is streamed a piece at a time) → ``{"context": sha256, "bytes"}``."""
        call = _calls.put_build_context()
        content: bytes | collections.abc.AsyncIterator[bytes]
        if isinstance(tar, bytes | bytearray | memoryview):
            content = bytes(tar)
        else:
            content = self._pieces(tar, progress)
        try:
            response = await self._client.request(
                call.method, call.path, content=content, headers={"Content-Type": "application/x-tar"},
                timeout=timeout_for(call, self.timeout))
        except httpx.HTTPError as exc:
            raise translate(exc, self.url, call) from exc
        return cast(BuildContextInfo, parse_response(call, response))

    def build_template(
        self, tag: str, dockerfile: str, context: str | None = None, **extra: Unpack[TemplateBuildExtra]
    ) -> collections.abc.AsyncGenerator[JSONDict, None]:
        """``POST /v1/templates``: build ``dockerfile`` into the snapshot ``tag``, its progress
        streamed: ``plan``, a ``step`` per instruction (``cached``: not run), ``log`` lines as a
        step runs, last ``done`` (``snapshot``, ``cache_hits``, ``steps_run``, ``layers``). A
        failed build raises :class:`~forkd.sdk.errors.ServerError` with its message.

        Args:
            context: the digest :meth:`put_build_context` answered (needed by COPY).
            **extra: the request's other optional fields
                (:class:`~forkd.sdk.models.TemplateBuildExtra`: build_args, mem_mib, nic, replace, …).
        """
        return self._stream(_calls.build_template(tag, dockerfile, context=context, extra=extra))
