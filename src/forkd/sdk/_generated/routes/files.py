# GENERATED from src/forkd/sdk/async_routes/files.py by scripts/unasync_sdk.py — do not edit.
# Edit the async source, then run: python scripts/unasync_sdk.py
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

from .transport import Transport


class FileRoutes(Transport):
    """``/v1/sandboxes/{id}/files``."""

    # -------------------------------------------------------------------- files

    # Each file method takes ``user``: the guest user it acts as (permissions checked as theirs,
    # what it creates is theirs); None: root.

    def file_stat(self, sandbox_id: str, path: str, user: str | None = None) -> FileInfo:
        """``GET /v1/sandboxes/{id}/files/stat`` → ``{"path", "name", "type", "size", "mode", "mtime",
        "owner", "group"}``."""
        return cast(FileInfo, self._send(_guest_calls.file_stat(sandbox_id, path, user=user)))

    def file_list(self, sandbox_id: str, path: str, user: str | None = None) -> FileList:
        """``GET /v1/sandboxes/{id}/files/list`` → ``{"path", "entries": [FileInfo...], "truncated"}``."""
        return cast(FileList, self._send(_guest_calls.file_list(sandbox_id, path, user=user)))

    def file_mkdir(
        self, sandbox_id: str, path: str, parents: bool = False, user: str | None = None
    ) -> MkdirResponse:
        """``POST /v1/sandboxes/{id}/files/mkdir`` → ``{"path", "created"}``."""
        call = _guest_calls.file_mkdir(sandbox_id, path, parents=parents, user=user)
        return cast(MkdirResponse, self._send(call))

    def file_remove(
        self, sandbox_id: str, path: str, recursive: bool = False, user: str | None = None
    ) -> None:
        """``DELETE /v1/sandboxes/{id}/files``: a file, or a directory (``recursive`` if not empty)."""
        self._send(_guest_calls.file_remove(sandbox_id, path, recursive=recursive, user=user))

    def file_exists(self, sandbox_id: str, path: str, user: str | None = None) -> bool:
        """Whether ``path`` exists in the sandbox (for ``user``: whether they can see it)."""
        try:
            self.file_stat(sandbox_id, path, user=user)
        except NotFoundError:
            return False
        return True

    def write_file(
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
        content: bytes | collections.abc.Iterator[bytes]
        if isinstance(data, str):
            content = data.encode()
        elif isinstance(data, bytes | bytearray | memoryview):
            content = bytes(data)
        else:
            content = self._pieces(data, progress)
        try:
            response = self._client.request(
                call.method, call.path, params=call.params, content=content,
                headers={"Content-Type": "application/octet-stream"},
                timeout=timeout_for(call, self.timeout),
            )
        except httpx.HTTPError as exc:
            raise translate(exc, self.url, call) from exc
        return cast(FileInfo, parse_response(call, response))

    def read_file_into(
        self, sandbox_id: str, path: str, sink: IO[bytes], progress: Progress | None = None,
        user: str | None = None,
    ) -> int:
        """``GET /v1/sandboxes/{id}/files``: stream ``path`` into ``sink``; returns the bytes written.

        An interrupted download raises (the body is chunked, so a cut is seen).
        """
        call = _guest_calls.file_read(sandbox_id, path, user=user)
        done = 0
        try:
            with self._client.stream(
                call.method, call.path, params=call.params, timeout=timeout_for(call, self.timeout)
            ) as response:
                if not response.is_success:
                    response.read()
                    parse_response(call, response)  # raises the mapped error
                for chunk in response.iter_bytes():
                    sink.write(chunk)
                    done += len(chunk)
                    if progress is not None:
                        progress(done)
        except httpx.HTTPError as exc:
            raise translate(exc, self.url, call) from exc
        return done
