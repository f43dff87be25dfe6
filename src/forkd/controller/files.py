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
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any, cast

from forkd import bounds
from forkd.controller.agent_gateway import AgentGateway
from forkd.controller.results import DirListing, FileEntry, MkdirResult
from forkd.errors import Conflict, GuestError, InvalidRequest, TooLarge
from forkd.guest import protocol

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


def _piece(result: dict[str, Any], asked: int) -> tuple[bytes, bool]:
    """A read piece from the guest, refused unless it is base64 of at most ``asked`` bytes."""
    encoded = result.get("data")
    eof = result.get("eof")
    if not isinstance(encoded, str) or not isinstance(eof, bool) or len(encoded) > 4 * (asked // 3 + 1):
        raise GuestError("guest agent sent a malformed file piece")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise GuestError("guest agent sent a file piece that is not base64") from None
    if len(data) > asked:
        raise GuestError("guest agent sent a longer file piece than asked for")
    return data, eof


def checked_info(result: dict[str, Any]) -> FileEntry:
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

    async def _call(self, sandbox_id: str, action: str, *, user: str | None = None,
                    **args: object) -> dict[str, Any]:
        """One agent call; ``user``: the guest user it acts as (None: root, the agent itself)."""
        if bounds.check_guest_user(user) is not None:
            await self._agents.require_user_support(sandbox_id, user)
            args["user"] = user
        return await self._agents.call(sandbox_id, action, PIECE_TIMEOUT_SECS, **args)

    # --------------------------------------------------------------- metadata

    async def stat(self, sandbox_id: str, path: str, *, user: str | None = None) -> FileEntry:
        result = await self._call(sandbox_id, protocol.FILE_STAT, path=check_path(path), user=user)
        return checked_info(result)

    async def list(self, sandbox_id: str, path: str, *, user: str | None = None) -> DirListing:
        result = await self._call(sandbox_id, protocol.FILE_LIST, path=check_path(path), user=user)
        entries = result.get("entries")
        if not isinstance(entries, list) or len(entries) > protocol.FILE_LIST_MAX:
            raise GuestError("guest agent sent a malformed or overlong listing")
        return {"path": path, "entries": [checked_info(e if isinstance(e, dict) else {}) for e in entries],
                "truncated": bool(result.get("truncated"))}

    async def mkdir(self, sandbox_id: str, path: str, *, parents: bool = False,
                    user: str | None = None) -> MkdirResult:
        result = await self._call(sandbox_id, protocol.FILE_MKDIR, path=check_path(path), parents=parents,
                                  user=user)
        return {"path": path, "created": bool(result.get("created"))}

    async def remove(self, sandbox_id: str, path: str, *, recursive: bool = False,
                     user: str | None = None) -> None:
        await self._call(sandbox_id, protocol.FILE_REMOVE, path=check_path(path), recursive=recursive,
                         user=user)

    async def move(self, sandbox_id: str, source: str, destination: str, *,
                   user: str | None = None) -> FileEntry:
        """Rename ``source`` to ``destination`` (parents made); returns the destination's FileInfo."""
        return checked_info(await self._call(sandbox_id, protocol.FILE_MOVE, source=check_path(source),
                                             destination=check_path(destination), user=user))

    # ----------------------------------------------------------------- writes

    async def write(self, sandbox_id: str, path: str, chunks: AsyncIterable[bytes], *,
                    max_bytes: int, mode: int | None = None, user: str | None = None,
                    metadata: dict[str, str] | None = None) -> FileEntry:
        """Write ``chunks`` to ``path`` (replaced atomically at the end); 413 past ``max_bytes``.
        As ``user``, the file is theirs (the pieces and the close act as the open did). The file
        lands with exactly ``metadata`` (none: none, whatever the file it replaces had)."""
        check_path(path)
        extra: dict[str, object] = {"mode": mode} if mode is not None else {}
        if metadata := check_metadata(metadata):
            # An older agent would drop it and answer as if it were stored.
            await self._agents.require_agent(sandbox_id, protocol.CAP_METADATA)
            extra["metadata"] = metadata
        opened = await self._call(sandbox_id, protocol.FILE_WRITE_OPEN, path=path, user=user, **extra)
        handle = opened.get("handle")
        if not isinstance(handle, str) or len(handle) > 64:
            raise GuestError("guest agent sent a malformed upload handle")
        in_flight: set[asyncio.Task[dict[str, Any]]] = set()
        try:
            offset = 0
            async for piece in rechunk(chunks, protocol.FILE_CHUNK):
                if offset + len(piece) > max_bytes:
                    raise TooLarge(f"file exceeds the daemon's {max_bytes}-byte limit")
                while len(in_flight) >= WINDOW:
                    done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        task.result()  # the first failure ends the upload
                data = base64.b64encode(piece).decode("ascii")
                in_flight.add(asyncio.create_task(self._call(
                    sandbox_id, protocol.FILE_WRITE, handle=handle, offset=offset, data=data)))
                offset += len(piece)
            await asyncio.gather(*in_flight)  # a failure cancels the rest below
            in_flight.clear()
            closed = await self._call(sandbox_id, protocol.FILE_WRITE_CLOSE, handle=handle, commit=True)
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
                     in_flight: set[asyncio.Task[dict[str, Any]]]) -> None:
        await asyncio.gather(*in_flight, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._call(sandbox_id, protocol.FILE_WRITE_CLOSE, handle=handle, commit=False)

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
        ahead: list[asyncio.Task[dict[str, Any]]] = []
        next_offset = 0
        try:
            while True:
                while len(ahead) < WINDOW:
                    ahead.append(asyncio.create_task(self._call(
                        sandbox_id, protocol.FILE_READ, path=path, offset=next_offset, length=size,
                        user=user)))
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

