"""``POST /files`` bodies as streams of (path, pieces): octet-stream (optionally gzip) or multipart.

The SDK uploads one file as ``application/octet-stream`` (envd >= 0.5.7, the
default for file-like data) or any number as ``multipart/form-data`` (field
``file``, the part's filename is the file's path). Either way nothing is held
whole: multipart is parsed as it arrives (``python-multipart``'s streaming
parser) and each part's bytes are handed on piece by piece, with backpressure;
gzip is inflated piece by piece, and its output counted, so a small bomb cannot
grow past the size limit. (``X-Metadata-*`` headers, the files' metadata, are read by
``file_routes.metadata_headers``, shared with forkd's own upload.)
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from python_multipart.multipart import MultipartParser, parse_options_header

from forkd.errors import InvalidRequest, TooLarge

MAX_PARTS = 256  # files in one multipart upload

Write = Callable[[str, AsyncIterator[bytes]], Awaitable[dict[str, Any]]]


async def inflate(chunks: AsyncIterator[bytes], max_bytes: int) -> AsyncIterator[bytes]:
    """Gunzip a stream, refusing output past ``max_bytes``."""
    decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
    produced = 0
    async for chunk in chunks:
        try:
            out = decoder.decompress(chunk, max_bytes + 1 - produced)
        except zlib.error as exc:
            raise InvalidRequest(f"the body is not valid gzip ({exc})") from None
        produced += len(out)
        if produced > max_bytes or decoder.unconsumed_tail:
            raise TooLarge(f"file exceeds the daemon's {max_bytes}-byte limit")
        if out:
            yield out
    tail = decoder.flush()
    if produced + len(tail) > max_bytes:
        raise TooLarge(f"file exceeds the daemon's {max_bytes}-byte limit")
    if tail:
        yield tail


async def multipart(body: AsyncIterator[bytes], content_type: str, default_path: str | None,
                    write: Write) -> list[dict[str, Any]]:
    """Write every ``file`` part of a multipart body with ``write(path, pieces)``; their FileInfos.

    A part's path is its filename, or ``default_path`` (the ``path`` query
    parameter) when it has none. Parts are written one after another, each as
    its bytes arrive.
    """
    _, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if not boundary:
        raise InvalidRequest("multipart/form-data body without a boundary")
    events: list[tuple[str, Any]] = []
    header: dict[str, bytearray] = {"field": bytearray(), "value": bytearray()}
    headers: dict[bytes, bytes] = {}

    def on_header_field(data: bytes, start: int, end: int) -> None:
        header["field"] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        header["value"] += data[start:end]

    def on_header_end() -> None:
        headers[bytes(header["field"]).lower()] = bytes(header["value"])
        header["field"].clear()
        header["value"].clear()

    def on_headers_finished() -> None:
        events.append(("begin", dict(headers)))
        headers.clear()

    def on_part_data(data: bytes, start: int, end: int) -> None:
        events.append(("data", bytes(data[start:end])))

    def on_part_end() -> None:
        events.append(("end", None))

    parser = MultipartParser(boundary, {
        "on_header_field": on_header_field, "on_header_value": on_header_value,
        "on_header_end": on_header_end, "on_headers_finished": on_headers_finished,
        "on_part_data": on_part_data, "on_part_end": on_part_end,
    })
    written: list[dict[str, Any]] = []
    part: _Part | None = None
    try:
        async for chunk in body:
            try:
                parser.write(chunk)
            except Exception as exc:  # python-multipart's parse errors
                raise InvalidRequest(f"malformed multipart body: {exc}") from None
            for kind, value in events:
                if kind == "begin":
                    if len(written) >= MAX_PARTS:
                        raise InvalidRequest(f"at most {MAX_PARTS} files per upload")
                    part = _Part(_part_path(value, default_path), write)
                elif kind == "data" and part is not None:
                    await part.feed(value)
                elif kind == "end" and part is not None:
                    written.append(await part.finish())
                    part = None
            events.clear()
        parser.finalize()
        if part is not None:
            raise InvalidRequest("the multipart body ended inside a part")
    except BaseException:
        if part is not None:
            part.abort()
        raise
    if not written:
        raise InvalidRequest("the multipart body has no file part")
    return written


def _part_path(headers: dict[bytes, bytes], default_path: str | None) -> str:
    _, options = parse_options_header(headers.get(b"content-disposition", b""))
    filename = options.get(b"filename")
    path = filename.decode("utf-8", "replace") if filename else default_path
    if not path:
        raise InvalidRequest("a file part needs a filename (its path) or the path query parameter")
    return path


class _Part:
    """One file part being written: its pieces go to ``write`` through a bounded queue."""

    def __init__(self, path: str, write: Write) -> None:
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=8)
        self._task = asyncio.ensure_future(write(path, self._pieces()))

    async def _pieces(self) -> AsyncIterator[bytes]:
        while (piece := await self._queue.get()) is not None:
            yield piece

    async def _put(self, item: bytes | None) -> None:
        put = asyncio.ensure_future(self._queue.put(item))
        done, _ = await asyncio.wait({put, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if put not in done:  # the write ended (failed) before taking all its data
            put.cancel()
            self._task.result()
            raise InvalidRequest("the upload ended before the file's data did")

    async def feed(self, data: bytes) -> None:
        await self._put(data)

    async def finish(self) -> dict[str, Any]:
        await self._put(None)
        return await self._task

    def abort(self) -> None:
        """The body failed midway: the write is cancelled, which discards its temp file."""
        self._task.cancel()
