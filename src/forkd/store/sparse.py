"""Sparse files: read only their data, hash them, move them as a stream, write them back with holes.

A snapshot's ``mem`` file is as large as the guest's RAM but mostly holes (pages
the guest never touched), and a guest image's root filesystem is much the same.
Everything here finds a file's data with ``SEEK_DATA``/``SEEK_HOLE``, so a hole
is never read from disk, and writes zero blocks back as holes.

The **sparse stream** is how one file travels (inside an archive member or an
object-store blob): a header line ``FORKD-SPARSE 1 <json>\\n`` holding the
file's logical size and its data extents ``[[offset, length], ...]``, then the
bytes of those extents in order. Its digest is the sha256 of the file's whole
logical content (holes read as zeros), so it matches ``sha256sum`` of the file
and does not depend on where one filesystem happens to keep holes.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from forkd import bounds, jsondepth
from forkd.errors import InvalidRequest

MAGIC = b"FORKD-SPARSE 1 "
CHUNK = 1 << 20  # read and write in 1 MiB pieces
ZERO_BLOCK = 64 << 10  # a block of zeros this large (and aligned) is written back as a hole
MAX_HEADER = 4 << 20  # a header line longer than this is refused (a hostile stream)
MAX_EXTENTS = 200_000
_ZEROS = bytes(CHUNK)


class CorruptStream(InvalidRequest):
    """A sparse stream that does not decode, or whose content is not what it claims."""


class Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


@dataclass(frozen=True)
class SparseInfo:
    """A file's logical size and where its data is (offset, length), in order."""

    size: int
    extents: tuple[tuple[int, int], ...]

    @property
    def data_bytes(self) -> int:
        return sum(length for _, length in self.extents)

    def header(self) -> bytes:
        body = json.dumps({"size": self.size, "extents": [list(e) for e in self.extents]},
                          separators=(",", ":"))
        return MAGIC + body.encode() + b"\n"

    @property
    def stream_bytes(self) -> int:
        """The length of this file's sparse stream (header + data)."""
        return len(self.header()) + self.data_bytes


def data_extents(fd: int, size: int) -> list[tuple[int, int]]:
    """Where the data of an open file is, by ``SEEK_DATA``/``SEEK_HOLE`` (no data read).

    A filesystem without them (``EINVAL``) reports the whole file as data.
    """
    extents: list[tuple[int, int]] = []
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole is left
                break
            if exc.errno == errno.EINVAL and not extents:
                return [(0, size)] if size else []
            raise
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        if end > start:
            extents.append((start, end - start))
        offset = end
    return extents


def inspect(path: Path) -> SparseInfo:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        return SparseInfo(size, tuple(data_extents(fd, size)))
    finally:
        os.close(fd)


def _feed_zeros(h: hashlib._Hash, n: int) -> None:
    while n > 0:
        step = min(n, CHUNK)
        h.update(_ZEROS[:step])
        n -= step


def _read_extents(f: IO[bytes], extents: tuple[tuple[int, int], ...]) -> Iterator[tuple[int, bytes]]:
    for offset, length in extents:
        f.seek(offset)
        done = 0
        while done < length:
            piece = f.read(min(CHUNK, length - done))
            if not piece:
                raise OSError(f"{getattr(f, 'name', 'file')} shrank while being read")
            yield offset + done, piece
            done += len(piece)


class StreamReader:
    """A file-like reader of a file's sparse stream (for tarfile and upload clients)."""

    def __init__(self, path: Path, info: SparseInfo | None = None) -> None:
        self.info = info or inspect(path)
        self._file = open(path, "rb")  # noqa: SIM115 (closed by close())
        self._parts = self._generate()
        self._buf = b""

    def _generate(self) -> Iterator[bytes]:
        yield self.info.header()
        for _, piece in _read_extents(self._file, self.info.extents):
            yield piece

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._buf) < n:
            try:
                self._buf += next(self._parts)
            except StopIteration:
                break
        if n < 0:
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> StreamReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Buffered:
    """Reads exact amounts and one header line from any ``read(n)`` source."""

    def __init__(self, src: Readable) -> None:
        self._src = src
        self._buf = b""

    def _fill(self) -> bool:
        piece = self._src.read(CHUNK)
        self._buf += piece
        return bool(piece)

    def line(self, limit: int) -> bytes:
        while b"\n" not in self._buf:
            if len(self._buf) > limit:
                raise CorruptStream("the sparse stream's header is too long")
            if not self._fill():
                raise CorruptStream("the sparse stream ends inside its header")
        line, _, self._buf = self._buf.partition(b"\n")
        if len(line) > limit:
            raise CorruptStream("the sparse stream's header is too long")
        return line + b"\n"

    def exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            if not self._fill():
                raise CorruptStream("the sparse stream ends early (truncated)")
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def at_end(self) -> bool:
        return not self._buf and not self._fill()


def _read_header(src: _Buffered, max_size: int) -> SparseInfo:
    line = src.line(MAX_HEADER)
    if not line.startswith(MAGIC):
        raise CorruptStream("not a forkd sparse stream (bad magic)")
    try:
        head: Any = jsondepth.loads(line[len(MAGIC):], bounds.MAX_JSON_DEPTH)
        size = int(head["size"])
        extents = tuple((int(o), int(n)) for o, n in head["extents"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptStream(f"the sparse stream's header does not parse: {exc}") from None
    if not 0 <= size <= max_size:
        raise CorruptStream(f"the sparse stream claims {size} bytes, more than the {max_size} allowed")
    if len(extents) > MAX_EXTENTS:
        raise CorruptStream(f"the sparse stream has {len(extents)} extents (at most {MAX_EXTENTS})")
    end = 0
    for offset, length in extents:
        if offset < end or length <= 0 or offset + length > size:
            raise CorruptStream("the sparse stream's extents overlap, are empty or run past its size")
        end = offset + length
    return SparseInfo(size, extents)


def private_opener(path: str, flags: int) -> int:
    """``open(..., opener=)`` that makes a new file 0600: what travels is guest memory and disks,
    and the umask (022 by default) would leave it readable by every local user."""
    return os.open(path, flags, 0o600)


def write(src: Readable, dest: Path | None, *, expect_sha256: str | None, max_size: int) -> SparseInfo:
    """Decode a sparse stream from ``src`` into a new file ``dest``, holes restored.

    Every byte is hashed on the way; with ``expect_sha256`` a mismatch removes
    ``dest`` and raises :class:`CorruptStream`. Zero blocks inside data extents
    are skipped (they read back as zeros from the hole the file keeps there).
    ``dest`` None only verifies.
    """
    stream = _Buffered(src)
    info = _read_header(stream, max_size)
    h = hashlib.sha256()
    pos = 0
    try:
        with (open(dest, "xb", opener=private_opener) if dest is not None
              else open(os.devnull, "wb")) as out:
            for offset, length in info.extents:
                _feed_zeros(h, offset - pos)
                done = 0
                while done < length:
                    piece = stream.exact(min(CHUNK, length - done))
                    h.update(piece)
                    if dest is not None:
                        _write_sparse(out, offset + done, piece)
                    done += len(piece)
                pos = offset + length
            _feed_zeros(h, info.size - pos)
            if dest is not None:
                out.truncate(info.size)
        if not stream.at_end():
            raise CorruptStream("the sparse stream has bytes after its last extent")
        if expect_sha256 is not None and h.hexdigest() != expect_sha256:
            raise CorruptStream(f"content sha256 is {h.hexdigest()}, expected {expect_sha256} "
                                "(corrupt or tampered)")
    except BaseException:
        if dest is not None:
            dest.unlink(missing_ok=True)
        raise
    return info


def copy(src: Path, dest: Path) -> SparseInfo:
    """Copy a file, reading only its data and keeping its holes."""
    with StreamReader(src) as reader:
        return write(reader, dest, expect_sha256=None, max_size=reader.info.size)


def _write_sparse(out: IO[bytes], offset: int, piece: bytes) -> None:
    """Write ``piece`` at ``offset``, leaving aligned all-zero blocks as holes."""
    start = 0
    while start < len(piece):
        block_end = min(len(piece), start + ZERO_BLOCK - (offset + start) % ZERO_BLOCK)
        block = piece[start:block_end]
        if block.count(0) != len(block):
            out.seek(offset + start)
            out.write(block)
        start = block_end


def allocated_bytes(path: Path) -> int:
    """Bytes the filesystem really holds for ``path`` (st_blocks is in 512-byte units)."""
    return os.stat(path).st_blocks * 512


__all__ = ["CorruptStream", "SparseInfo", "StreamReader", "allocated_bytes", "copy", "inspect", "write"]
