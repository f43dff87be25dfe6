"""`SandboxFiles`: files in a sandbox, moved through the agent in bounded pieces.

The daemon never holds a whole file: an upload is cut into ``FILE_CHUNK``
pieces as it arrives and at most ``WINDOW`` pieces are in flight to the guest;
a download reads ahead at most ``WINDOW`` pieces. Each piece is one agent
request, so exec and eval calls to the same sandbox interleave with a transfer.

The guest is not trusted: every piece it sends back is checked against the
length asked for before it is decoded, and listings are capped by count.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import Any, cast

from forkd import bounds
from forkd.controller.agent_gateway import AgentGateway
from forkd.controller.results import DirListing, FileEntry, MkdirResult
from forkd.errors import Conflict, GuestError, InvalidRequest, TooLarge
from forkd.guest import capabilities, messages, protocol

# Pieces in flight per transfer: enough to keep the port busy while one is
# being encoded on either side, small enough to bound memory (~4 MiB each).
WINDOW = 4
PIECE_TIMEOUT_SECS = 60.0


def check_path(path: str) -> str:
    """``protocol.check_path`` with the daemon's error type (400)."""
    try:
        return protocol.check_path(path)
    except protocol.RequestError as exc:
        raise InvalidRequest(str(exc)) from None


def _piece(result: messages.FileReadReply, asked: int) -> tuple[bytes, bool]:
    """A read piece from the guest (its types checked), refused unless it is base64 of at most
    ``asked`` bytes."""
    encoded, eof = result["data"], result["eof"]
    if len(encoded) > 4 * (asked // 3 + 1):
        raise GuestError("guest agent sent an overlong file piece")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise GuestError("guest agent sent a file piece that is not base64") from None
    if len(data) > asked:
        raise GuestError("guest agent sent a longer file piece than asked for")
    return data, eof


def checked_info(result: Mapping[str, Any]) -> FileEntry:
    """A FileInfo from the guest, with only the documented keys of the documented types."""
    out: dict[str, Any] = {}
    for key, kinds in (("path", str), ("name", str), ("type", str), ("size", int), ("mode", int),
                       ("mtime", (int, float))):
        value = result.get(key)
        if not isinstance(value, kinds) or isinstance(value, bool):
            raise GuestError(f"guest agent sent a malformed file entry ({key!r})")
        if isinstance(value, str) and len(value) > protocol.FILE_PATH_MAX + protocol.FILE_NAME_MAX:
            raise GuestError(f"guest agent sent an overlong {key!r}")
        out[key] = value
    # Optional: the owner's and group's names, and where a symbolic link resolves to.
    for key, limit in (("owner", protocol.FILE_NAME_MAX), ("group", protocol.FILE_NAME_MAX),
                       ("target", protocol.FILE_PATH_MAX)):
        value = result.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or len(value) > limit:
            raise GuestError(f"guest agent sent a malformed file entry ({key!r})")
        out[key] = value
    # Optional: the file's metadata (its user.e2b.* extended attributes), within E2B's bounds.
    if "metadata" in result:
        try:
            out["metadata"] = protocol.check_metadata(result["metadata"])
        except protocol.RequestError:
            raise GuestError("guest agent sent malformed file metadata") from None
    return cast(FileEntry, out)  # each key checked above


def check_metadata(metadata: dict[str, str] | None) -> dict[str, str]:
    """``protocol.check_metadata`` with the daemon's error type (400)."""
    try:
        return protocol.check_metadata(metadata)
    except protocol.RequestError as exc:
        raise InvalidRequest(str(exc)) from None


async def rechunk(chunks: AsyncIterable[bytes], size: int) -> AsyncIterator[bytes]:
    """Pieces of exactly ``size`` bytes (the last may be shorter) from any stream of bytes."""
    buf = bytearray()
    async for chunk in chunks:
        buf += chunk
        while len(buf) >= size:
            yield bytes(buf[:size])
            del buf[:size]
    if buf:
        yield bytes(buf)


class SandboxFiles:
    def __init__(self, agents: AgentGateway) -> None:
        self._agents = agents
        self._aborts: set[asyncio.Task[None]] = set()

    async def _user(self, sandbox_id: str, user: str | None) -> str | None:
        """The guest user a request acts as, checked (None: root, the agent itself); 409 first
        on an agent too old to know "user" (it would act as root)."""
        if bounds.check_guest_user(user) is not None:
            await self._agents.require_user_support(sandbox_id, user)
        return user

    async def _write(self, sandbox_id: str, req: messages.FileWriteRequest) -> messages.FileWriteReply:
        return await self._agents.call(sandbox_id, lambda agent: agent.file_write(req, PIECE_TIMEOUT_SECS))

    async def _read(self, sandbox_id: str, req: messages.FileReadRequest) -> messages.FileReadReply:
        return await self._agents.call(sandbox_id, lambda agent: agent.file_read(req, PIECE_TIMEOUT_SECS))

    # --------------------------------------------------------------- metadata

    async def stat(self, sandbox_id: str, path: str, *, user: str | None = None) -> FileEntry:
        req: messages.FileStatRequest = {"path": check_path(path)}
        if (as_user := await self._user(sandbox_id, user)) is not None:
            req["user"] = as_user
        return checked_info(await self._agents.call(sandbox_id, lambda agent: agent.file_stat(
            req, PIECE_TIMEOUT_SECS)))

    async def list(self, sandbox_id: str, path: str, *, user: str | None = None) -> DirListing:
        req: messages.FileListRequest = {"path": check_path(path)}
        if (as_user := await self._user(sandbox_id, user)) is not None:
            req["user"] = as_user
        result = await self._agents.call(sandbox_id, lambda agent: agent.file_list(req, PIECE_TIMEOUT_SECS))
        if len(result["entries"]) > protocol.FILE_LIST_MAX:
            raise GuestError("guest agent sent an overlong listing")
        return {"path": path, "entries": [checked_info(e) for e in result["entries"]],
                "truncated": result["truncated"]}

    async def mkdir(self, sandbox_id: str, path: str, *, parents: bool = False,
                    user: str | None = None) -> MkdirResult:
        req: messages.FileMkdirRequest = {"path": check_path(path), "parents": parents}
        if (as_user := await self._user(sandbox_id, user)) is not None:
            req["user"] = as_user
        result = await self._agents.call(sandbox_id, lambda agent: agent.file_mkdir(req, PIECE_TIMEOUT_SECS))
        return {"path": path, "created": result["created"]}

    async def remove(self, sandbox_id: str, path: str, *, recursive: bool = False,
                     user: str | None = None) -> None:
        req: messages.FileRemoveRequest = {"path": check_path(path), "recursive": recursive}
        if (as_user := await self._user(sandbox_id, user)) is not None:
            req["user"] = as_user
        await self._agents.call(sandbox_id, lambda agent: agent.file_remove(req, PIECE_TIMEOUT_SECS))

    async def move(self, sandbox_id: str, source: str, destination: str, *,
                   user: str | None = None) -> FileEntry:
        """Rename ``source`` to ``destination`` (parents made); returns the destination's FileInfo."""
        req: messages.FileMoveRequest = {"source": check_path(source), "destination": check_path(destination)}
        if (as_user := await self._user(sandbox_id, user)) is not None:
            req["user"] = as_user
        return checked_info(await self._agents.call(sandbox_id, lambda agent: agent.file_move(
            req, PIECE_TIMEOUT_SECS)))

    # ----------------------------------------------------------------- writes

    async def write(self, sandbox_id: str, path: str, chunks: AsyncIterable[bytes], *,
                    max_bytes: int, mode: int | None = None, user: str | None = None,
                    metadata: dict[str, str] | None = None) -> FileEntry:
        """Write ``chunks`` to ``path`` (replaced atomically at the end); 413 past ``max_bytes``.
        As ``user``, the file is theirs (the pieces and the close act as the open did). The file
        lands with exactly ``metadata`` (none: none, whatever the file it replaces had)."""
        opening: messages.FileWriteOpenRequest = {"path": check_path(path)}
        if mode is not None:
            opening["mode"] = mode
        if metadata := check_metadata(metadata):
            # An older agent would drop it and answer as if it were stored.
            await self._agents.require_agent(sandbox_id, capabilities.CAP_METADATA)
            opening["metadata"] = metadata
        if (as_user := await self._user(sandbox_id, user)) is not None:
            opening["user"] = as_user
        opened = await self._agents.call(sandbox_id, lambda agent: agent.file_write_open(
            opening, PIECE_TIMEOUT_SECS))
        handle = opened["handle"]
        if len(handle) > 64:
            raise GuestError("guest agent sent an overlong upload handle")
        in_flight: set[asyncio.Task[messages.FileWriteReply]] = set()
        try:
            offset = 0
            async for piece in rechunk(chunks, protocol.FILE_CHUNK):
                if offset + len(piece) > max_bytes:
                    raise TooLarge(f"file exceeds the daemon's {max_bytes}-byte limit")
                while len(in_flight) >= WINDOW:
                    done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        task.result()  # the first failure ends the upload
                req: messages.FileWriteRequest = {"handle": handle, "offset": offset,
                                                  "data": base64.b64encode(piece).decode("ascii")}
                in_flight.add(asyncio.create_task(self._write(sandbox_id, req)))
                offset += len(piece)
            await asyncio.gather(*in_flight)  # a failure cancels the rest below
            in_flight.clear()
            closed = await self._agents.call(sandbox_id, lambda agent: agent.file_write_close(
                {"handle": handle, "commit": True}, PIECE_TIMEOUT_SECS))
            return checked_info(closed)
        except BaseException:
            for task in in_flight:
                task.cancel()
            # In the background: this may be a cancellation, which must not wait on the guest.
            abort = asyncio.ensure_future(self._abort(sandbox_id, handle, in_flight))
            self._aborts.add(abort)
            abort.add_done_callback(self._aborts.discard)
            raise

    async def _abort(self, sandbox_id: str, handle: str,
                     in_flight: set[asyncio.Task[messages.FileWriteReply]]) -> None:
        await asyncio.gather(*in_flight, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._agents.call(sandbox_id, lambda agent: agent.file_write_close(
                {"handle": handle, "commit": False}, PIECE_TIMEOUT_SECS))

    # ------------------------------------------------------------------ reads

    async def open_read(self, sandbox_id: str, path: str, *,
                        user: str | None = None) -> tuple[FileEntry, AsyncIterator[bytes]]:
        """The file's FileInfo and its bytes, read ahead at most ``WINDOW`` pieces.

        The stat comes first so that a missing file (404) or a directory (409)
        is refused before any response has started. The bytes are read until
        the guest says end of file, so a file that grows meanwhile is read on.
        """
        info = await self.stat(sandbox_id, path, user=user)
        if info["type"] != "file":
            what = "a directory" if info["type"] == "dir" else f"not a regular file ({info['type']})"
            raise Conflict(f"{path}: {what}")
        return info, self._pieces(sandbox_id, path, user)

    async def _pieces(self, sandbox_id: str, path: str, user: str | None) -> AsyncIterator[bytes]:
        size = protocol.FILE_CHUNK
        ahead: list[asyncio.Task[messages.FileReadReply]] = []
        next_offset = 0
        as_user = await self._user(sandbox_id, user)
        try:
            while True:
                while len(ahead) < WINDOW:
                    req: messages.FileReadRequest = {"path": path, "offset": next_offset, "length": size}
                    if as_user is not None:
                        req["user"] = as_user
                    ahead.append(asyncio.create_task(self._read(sandbox_id, req)))
                    next_offset += size
                data, eof = _piece(await ahead.pop(0), size)
                if data:
                    yield data
                if eof:
                    return
        finally:
            for task in ahead:
                task.cancel()
            await asyncio.gather(*ahead, return_exceptions=True)

