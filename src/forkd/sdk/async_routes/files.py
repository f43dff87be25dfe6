"""File routes: stat, list, mkdir, remove, and streamed upload and download."""

from __future__ import annotations

import collections.abc
from typing import IO, cast

import httpx

from forkd.sdk import _guest_calls
from forkd.sdk._http import (
    Progress,
    parse_response,
    timeout_for,
    translate,
)
from forkd.sdk.errors import NotFoundError
from forkd.sdk.models import (
    FileInfo,
    FileList,
    MkdirResponse,
)

from .transport import AsyncTransport


class AsyncFileRoutes(AsyncTransport):
    """``/v1/sandboxes/{id}/files``."""

    # -------------------------------------------------------------------- files

    # Each file method takes ``user``: the guest user it acts as (permissions checked as theirs,
    # what it creates is theirs); None: root.

    async def file_stat(self, sandbox_id: str, path: str, user: str | None = None) -> FileInfo:
        """``GET /v1/sandboxes/{id}/files/stat`` → ``{"path", "name", "type", "size", "mode", "mtime",
        "owner", "group"}``."""
        return cast(FileInfo, await self._send(_guest_calls.file_stat(sandbox_id, path, user=user)))

    async def file_list(self, sandbox_id: str, path: str, user: str | None = None) -> FileList:
        """``GET /v1/sandboxes/{id}/files/list`` → ``{"path", "entries": [FileInfo...], "truncated"}``."""
        return cast(FileList, await self._send(_guest_calls.file_list(sandbox_id, path, user=user)))

    async def file_mkdir(
        self, sandbox_id: str, path: str, parents: bool = False, user: str | None = None
    ) -> MkdirResponse:
        """``POST /v1/sandboxes/{id}/files/mkdir`` → ``{"path", "created"}``."""
        call = _guest_calls.file_mkdir(sandbox_id, path, parents=parents, user=user)
        return cast(MkdirResponse, await self._send(call))

    async def file_remove(
        self, sandbox_id: str, path: str, recursive: bool = False, user: str | None = None
    ) -> None:
        """``DELETE /v1/sandboxes/{id}/files``: a file, or a directory (``recursive`` if not empty)."""
        await self._send(_guest_calls.file_remove(sandbox_id, path, recursive=recursive, user=user))

    async def file_exists(self, sandbox_id: str, path: str, user: str | None = None) -> bool:
        """Whether ``path`` exists in the sandbox (for ``user``: whether they can see it)."""
        try:
            await self.file_stat(sandbox_id, path, user=user)
        except NotFoundError:
            return False
        return True

    async def write_file(
        self,
        sandbox_id: str,
        path: str,
        data: bytes | str | IO[bytes],
        mode: int | None = None,
        progress: Progress | None = None,
        user: str | None = None,
    ) -> FileInfo:
        """``PUT /v1/sandboxes/{id}/files``: write ``data`` to ``path``, replacing it atomically.

        ``data`` is bytes, text (UTF-8) or a binary file object, which is
        streamed a piece at a time, never read whole. Returns the FileInfo.
        """
        call = _guest_calls.file_write(sandbox_id, path, mode=mode, user=user)
        content: bytes | collections.abc.AsyncIterator[bytes]
        if isinstance(data, str):
            content = data.encode()
        elif isinstance(data, bytes | bytearray | memoryview):
            content = bytes(data)
        else:
            content = self._pieces(data, progress)
        try:
            response = await self._client.request(
                call.method, call.path, params=call.params, content=content,
                headers={"Content-Type": "application/octet-stream"},
                timeout=timeout_for(call, self.timeout),
            )
        except httpx.HTTPError as exc:
            raise translate(exc, self.url, call) from exc
        return cast(FileInfo, parse_response(call, response))

    async def read_file_into(
        self, sandbox_id: str, path: str, sink: IO[bytes], progress: Progress | None = None,
        user: str | None = None,
    ) -> int:
        """``GET /v1/sandboxes/{id}/files``: stream ``path`` into ``sink``; returns the bytes written.

        An interrupted download raises (the body is chunked, so a cut is seen).
        """
        call = _guest_calls.file_read(sandbox_id, path, user=user)
        done = 0
        try:
            async with self._client.stream(
                call.method, call.path, params=call.params, timeout=timeout_for(call, self.timeout)
            ) as response:
                if not response.is_success:
                    await response.aread()
                    parse_response(call, response)  # raises the mapped error
                async for chunk in response.aiter_bytes():
                    sink.write(chunk)
                    done += len(chunk)
                    if progress is not None:
                        progress(done)
        except httpx.HTTPError as exc:
            raise translate(exc, self.url, call) from exc
        return done
