"""The asyncio REST client: :class:`AsyncController` (same methods as coroutines)."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, cast

import httpx

from forkd.sdk import _calls
from forkd.sdk._http import (
    DEFAULT_TIMEOUT,
    DEFAULT_WAIT_SECS,
    Call,
    headers,
    parse_response,
    resolve_token,
    resolve_url,
    resolve_verify,
    snapshot_is_ready,
    timeout_for,
    translate,
)
from forkd.sdk.errors import ForkdTimeoutError
from forkd.sdk.types import JSONDict, SandboxInfo, SnapshotInfo


class AsyncController:
    """Asyncio twin of :class:`~forkd.sdk.client.Controller`.

    Same constructor arguments, same methods, each a coroutine; see
    ``Controller`` for their documentation. Use ``async with`` or
    :meth:`aclose` to release connections.

    Example::

        async with AsyncController() as c:
            kids = await c.spawn_sandboxes("pyagent", n=10)
            results = await asyncio.gather(*(c.eval(k["id"], "1 + 1") for k in kids))
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        *,
        verify: bool | str | ssl.SSLContext | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = resolve_url(url)
        self.timeout = timeout
        self._client = httpx.AsyncClient(
            base_url=self.url,
            headers=headers(resolve_token(token)),
            timeout=timeout,
            verify=resolve_verify(verify),
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"AsyncController(url={self.url!r})"

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> AsyncController:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _send(self, call: Call) -> Any:
        try:
            response = await self._client.request(
                call.method,
                call.path,
                json=call.json,
                params=call.params or None,
                timeout=timeout_for(call, self.timeout),
            )
        except httpx.HTTPError as exc:
            raise translate(exc, self.url, call) from exc
        return parse_response(call, response)

    async def healthz(self) -> JSONDict:
        return cast(JSONDict, await self._send(_calls.healthz()))

    async def version(self) -> JSONDict:
        return cast(JSONDict, await self._send(_calls.version()))

    async def metrics(self) -> str:
        return cast(str, await self._send(_calls.metrics()))

    async def list_snapshots(self) -> list[SnapshotInfo]:
        return cast(list[SnapshotInfo], await self._send(_calls.list_snapshots()))

    async def get_snapshot(self, tag: str) -> SnapshotInfo:
        return cast(SnapshotInfo, await self._send(_calls.get_snapshot(tag)))

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
        **extra: Any,
    ) -> SnapshotInfo:
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
        )
        return cast(SnapshotInfo, await self._send(call))

    async def delete_snapshot(self, tag: str, cascade: bool = False, force: bool = False) -> None:
        await self._send(_calls.delete_snapshot(tag, cascade=cascade, force=force))

    async def wait_snapshot_ready(
        self, tag: str, timeout: float | None = DEFAULT_WAIT_SECS, interval: float = 0.2
    ) -> SnapshotInfo:
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

    async def spawn_sandboxes(
        self,
        tag: str,
        n: int = 1,
        per_child_netns: bool = False,
        memory_limit_mib: int | None = None,
        live_fork: bool = False,
    ) -> list[SandboxInfo]:
        call = _calls.spawn_sandboxes(
            tag,
            n=n,
            per_child_netns=per_child_netns,
            memory_limit_mib=memory_limit_mib,
            live_fork=live_fork,
        )
        return cast(list[SandboxInfo], await self._send(call))

    async def list_sandboxes(self) -> list[SandboxInfo]:
        return cast(list[SandboxInfo], await self._send(_calls.list_sandboxes()))

    async def get_sandbox(self, sandbox_id: str) -> SandboxInfo:
        return cast(SandboxInfo, await self._send(_calls.get_sandbox(sandbox_id)))

    async def kill_sandbox(self, sandbox_id: str) -> None:
        await self._send(_calls.kill_sandbox(sandbox_id))

    async def ping(self, sandbox_id: str) -> JSONDict:
        return cast(JSONDict, await self._send(_calls.ping(sandbox_id)))

    async def exec(
        self,
        sandbox_id: str,
        args: str | Sequence[str],
        timeout_secs: float = 30,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
    ) -> JSONDict:
        call = _calls.exec_(
            sandbox_id, args, timeout_secs=timeout_secs, env=env, cwd=cwd, stdin=stdin
        )
        return cast(JSONDict, await self._send(call))

    async def eval(self, sandbox_id: str, code: str, timeout: float | None = None) -> JSONDict:
        return cast(JSONDict, await self._send(_calls.eval_(sandbox_id, code, timeout=timeout)))

    async def branch_sandbox(
        self,
        sandbox_id: str,
        tag: str | None = None,
        mode: str | None = None,
        wait: bool = True,
        diff: bool | None = None,
    ) -> SnapshotInfo:
        call = _calls.branch_sandbox(sandbox_id, tag=tag, mode=mode, wait=wait, diff=diff)
        return cast(SnapshotInfo, await self._send(call))


__all__ = ["DEFAULT_WAIT_SECS", "AsyncController"]
