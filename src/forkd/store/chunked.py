"""Chunked blobs: how one file travels (a pack archive member, an object-store object).

A file's logical content is cut on a fixed grid of ``GRID`` bytes (4 MiB), and
each chunk into 4 KiB pages. A page of zeros (a hole, or zeros a filesystem
happens to hold) is not data; a chunk's **runs** are its maximal runs of
non-zero pages, and its digest is the sha256 of those runs (each one's offset
and length, then its bytes). A chunk without runs is *absent*. The file's
**digest**, its name in archives and the object store, is the sha256 of the
chunk table (size, grid, and each present chunk's position and digest). So:

* computing a digest reads only the file's data extents (``SEEK_DATA``) and
  hashes only non-zero pages: a hole is never read or hashed (whole-file
  sha256 over GiBs of logical size was where a pull's time went);
* it depends on the content alone, not on where one filesystem keeps holes,
  so the same base image is found by digest on every host;
* each chunk is checked on its own, before a byte of it is written (and a lazy
  reader can check the one chunk it fetched).

The **encoding** of a file: for each present chunk, in order, one zstd frame
holding the bytes of its runs; frames follow each other with nothing between
them. The **index** (JSON, travelling next to the frames) gives the file's
size, the grid and, per present chunk, its position, digest, where its frame
is, and its runs (``extents``). The index is trusted only once its chunk table
hashes to the digest the manifest names; a frame only once it decompresses to
exactly its runs' length and hashes, with those runs, to its chunk's digest
(runs that are not the canonical ones hash differently, so a hostile index
cannot place bytes elsewhere).

Decoding writes each verified chunk straight into the final file with
``os.pwrite`` at its extents (no staging copy, holes left as holes), chunks in
parallel threads: zstd, sha256 and pwrite all release the GIL.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import zstandard

from forkd import bounds, jsondepth
from forkd.errors import InvalidRequest
from forkd.store import sparse

FORMAT = "forkd-chunked"
VERSION = 1
GRID = 4 << 20
MIN_GRID, MAX_GRID = 64 << 10, 16 << 20
ZSTD_LEVEL = 3
MAX_INDEX_BYTES = 32 << 20  # 1 TiB of 4 MiB chunks with a few extents each fits well below
MAX_EXTENTS_PER_CHUNK = 4096
THREADS = 4  # enough to keep 2 cores busy while one thread waits on a read
PAGE = 4096
_ZERO_PAGE = bytes(PAGE)

T = TypeVar("T")
R = TypeVar("R")
Extents = tuple[tuple[int, int], ...]
ReadRange = Callable[[int, int], bytes]  # (offset, length) in the frames -> exactly those bytes


class CorruptBlob(InvalidRequest):
    """A blob (index or chunk) that does not decode or is not what the manifest says it is."""


@dataclass(frozen=True)
class Chunk:
    """One present chunk: grid position, digest, its frame (offset, length), the extents it fills."""

    index: int
    sha256: str
    extents: Extents  # its runs: absolute file offsets, within this chunk, increasing
    zoff: int = 0
    zlen: int = 0

    @property
    def data_bytes(self) -> int:
        return sum(length for _, length in self.extents)

    def describe(self, blob: str, grid: int) -> str:
        start = self.index * grid
        return f"chunk {self.index} (bytes {start}-{start + grid - 1}) of blob {blob[:12]}…"


@dataclass(frozen=True)
class ChunkIndex:
    size: int
    grid: int
    chunks: tuple[Chunk, ...]

    @property
    def data_bytes(self) -> int:
        return sum(c.data_bytes for c in self.chunks)

    @property
    def stored_bytes(self) -> int:
        """Length of the encoding (all frames)."""
        return sum(c.zlen for c in self.chunks)

    def digest(self) -> str:
        """The file's digest: the sha256 of its chunk table (not of the frames or extents, which
        are only how this copy is laid out; each chunk's digest vouches for its content)."""
        h = hashlib.sha256(f"{FORMAT} {VERSION} {self.size} {self.grid}\n".encode())
        for c in self.chunks:
            h.update(f"{c.index} {c.sha256}\n".encode())
        return h.hexdigest()

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "size": self.size, "grid": self.grid,
                "chunks": [[c.index, c.sha256, c.zoff, c.zlen, [list(e) for e in c.extents]]
                           for c in self.chunks]}

    def encode_json(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    def parse(cls, raw: bytes, max_size: int) -> ChunkIndex:
        """Parse an index from an archive or a bucket, trusting nothing (bounds, order, overlap)."""
        if len(raw) > MAX_INDEX_BYTES:
            raise CorruptBlob(f"the chunk index is {len(raw)} bytes (at most {MAX_INDEX_BYTES})")
        try:
            d: Any = jsondepth.loads(raw, bounds.MAX_JSON_DEPTH)
            if d.get("format") != FORMAT or d.get("version") != VERSION:
                raise CorruptBlob(f"not a {FORMAT} version {VERSION} index")
            size, grid = _int(d["size"]), _int(d["grid"])
            chunks = tuple(Chunk(_int(i), str(sha), tuple((_int(o), _int(n)) for o, n in ext),
                                 _int(zoff), _int(zlen))
                           for i, sha, zoff, zlen, ext in d["chunks"])
        except CorruptBlob:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptBlob(f"the chunk index does not parse: {exc}") from None
        if not 0 <= size <= max_size:
            raise CorruptBlob(f"the chunk index claims {size} bytes, more than the {max_size} allowed")
        if grid & (grid - 1) or not MIN_GRID <= grid <= MAX_GRID:
            raise CorruptBlob(f"the chunk index's grid {grid} is not a power of two in range")
        last = -1
        for c in chunks:
            start, end = c.index * grid, min((c.index + 1) * grid, size)
            if c.index <= last or start >= size or len(c.sha256) != 64 or c.zlen <= 0 \
                    or not c.extents or len(c.extents) > MAX_EXTENTS_PER_CHUNK:
                raise CorruptBlob(f"the chunk index's entry for chunk {c.index} is malformed")
            pos = start
            for offset, length in c.extents:
                if offset < pos or length <= 0 or offset + length > end:
                    raise CorruptBlob(f"the chunk index's extents of chunk {c.index} overlap or leave it")
                pos = offset + length
            last = c.index
        return cls(size, grid, chunks)


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{v!r} is not a non-negative integer")
    return v


def _layout(size: int, extents: Iterable[tuple[int, int]], grid: int) -> list[tuple[int, Extents]]:
    """The data extents cut on the grid: (chunk position, its extents), chunks with data only."""
    out: dict[int, list[tuple[int, int]]] = {}
    for offset, length in extents:
        end = min(offset + length, size)
        while offset < end:
            i = offset // grid
            step = min(end, (i + 1) * grid) - offset
            out.setdefault(i, []).append((offset, step))
            offset += step
    return [(i, tuple(e)) for i, e in sorted(out.items())]


def _hash(data: memoryview | bytes, runs: Extents) -> str:
    """A chunk's digest: each run's offset and length, then its bytes (``data``: the runs' bytes,
    in order)."""
    h = hashlib.sha256()
    view = memoryview(data)
    at = 0
    for offset, length in runs:
        h.update(b"%d %d\n" % (offset, length))
        h.update(view[at: at + length])
        at += length
    return h.hexdigest()


def _runs(data: bytes, extents: Extents) -> tuple[Extents, bytes]:
    """The maximal runs of non-zero pages of a chunk whose data extents hold ``data``, and their
    bytes. Pages are 4 KiB of the file (absolute offsets); a partial one at an extent's edge
    counts as the part of it that is there."""
    runs: list[list[int]] = []
    keep: list[tuple[int, int]] = []  # slices of data
    at = 0
    for offset, length in extents:
        pos, end = offset, offset + length
        if offset % PAGE == 0 and length % PAGE == 0 and data.find(_ZERO_PAGE, at, at + length) < 0:
            pos = end  # whole pages, none of them zeros (no 4 KiB of zeros anywhere): one run, no loop
            if runs and runs[-1][0] + runs[-1][1] == offset:
                runs[-1][1] += length
                keep[-1] = (keep[-1][0], at + length)
            else:
                runs.append([offset, length])
                keep.append((at, at + length))
        while pos < end:
            step = min(end, (pos // PAGE + 1) * PAGE) - pos
            lo = at + pos - offset
            if data[lo: lo + step] != _ZERO_PAGE[:step]:
                if runs and runs[-1][0] + runs[-1][1] == pos:
                    runs[-1][1] += step
                    keep[-1] = (keep[-1][0], lo + step)
                else:
                    runs.append([pos, step])
                    keep.append((lo, lo + step))
            pos += step
        at += length
    if len(keep) == 1 and keep[0] == (0, len(data)):
        return ((runs[0][0], runs[0][1]),), data  # all of it: no copy
    return tuple((o, n) for o, n in runs), b"".join(data[a:b] for a, b in keep)


def _read_chunk(fd: int, extents: Extents) -> bytes:
    parts = []
    for offset, length in extents:
        piece = os.pread(fd, length, offset)
        if len(piece) != length:
            raise OSError(f"a file shrank while being read (at {offset})")
        parts.append(piece)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def ordered_map(fn: Callable[[T], R], items: Iterable[T], threads: int = THREADS) -> Generator[R, None, None]:
    """``map`` over a thread pool, results in order, at most ``2 * threads`` items in flight
    (memory stays bounded however large the file)."""
    with ThreadPoolExecutor(threads) as pool:
        window: list[Future[R]] = []
        try:
            for item in items:
                window.append(pool.submit(fn, item))
                if len(window) >= 2 * threads:
                    yield window.pop(0).result()
            while window:
                yield window.pop(0).result()
        finally:
            for f in window:
                f.cancel()


def digest(path: Path, grid: int = GRID) -> tuple[str, ChunkIndex]:
    """The file's digest and chunk table (no frames), reading only its data extents."""
    index = _scan(path, grid, None)
    return index.digest(), index


def encode(path: Path, emit: Callable[[bytes], object], *, expect: str | None = None,
           grid: int = GRID) -> ChunkIndex:
    """Write ``path``'s frames through ``emit`` (in order) and return their index.

    With ``expect``: the content must still have that digest (files that travel are not
    written to, but a changed one must never go out under its old name).
    """
    index = _scan(path, grid, emit)
    if expect is not None and index.digest() != expect:
        raise CorruptBlob(f"{path} changed while it was being packed (digest {index.digest()[:12]}…, "
                          f"expected {expect[:12]}…)")
    return index


_local = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    c: zstandard.ZstdCompressor | None = getattr(_local, "cctx", None)
    if c is None:  # one per thread: a compressor is not safe to share between threads
        c = _local.cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    return c


def _scan(path: Path, grid: int, emit: Callable[[bytes], object] | None) -> ChunkIndex:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        layout = _layout(size, sparse.data_extents(fd, size), grid)

        def one(item: tuple[int, Extents]) -> tuple[int, Extents, str, bytes | None]:
            i, extents = item
            runs, data = _runs(_read_chunk(fd, extents), extents)
            if not runs:
                return i, runs, "", None
            return i, runs, _hash(data, runs), _compressor().compress(data) if emit is not None else b""

        chunks: list[Chunk] = []
        zoff = 0
        # Closed before fd is: no thread may still read it (or a file that reuses its number).
        with contextlib.closing(ordered_map(one, layout)) as results:
            for i, extents, sha, frame in results:
                if frame is None:  # all zeros: absent, like a hole
                    continue
                if emit is not None:
                    emit(frame)
                chunks.append(Chunk(i, sha, extents, zoff, len(frame)))
                zoff += len(frame)
    finally:
        os.close(fd)
    return ChunkIndex(size, grid, tuple(chunks))


def _batches(chunks: tuple[Chunk, ...], limit: int) -> list[list[Chunk]]:
    """Chunks whose frames are adjacent, grouped into reads of about ``limit`` bytes."""
    out: list[list[Chunk]] = []
    for c in sorted(chunks, key=lambda c: c.zoff):
        last = out[-1] if out else None
        if last and last[-1].zoff + last[-1].zlen == c.zoff and \
                c.zoff + c.zlen - last[0].zoff <= limit:
            last.append(c)
        else:
            out.append([c])
    return out


def verified(c: Chunk, frame: memoryview | bytes, blob: str, grid: int,
             dctx: zstandard.ZstdDecompressor | None = None) -> bytes:
    """The bytes of chunk ``c``'s runs from its ``frame``, once they hash to its digest;
    :class:`CorruptBlob` naming the chunk otherwise (never a byte of an unverified chunk)."""
    what = c.describe(blob, grid)
    try:
        data = (dctx or zstandard.ZstdDecompressor()).decompress(frame, max_output_size=c.data_bytes)
    except zstandard.ZstdError as exc:
        raise CorruptBlob(f"{what} does not decompress ({exc}): corrupt or tampered") from None
    if len(data) != c.data_bytes or _hash(data, c.extents) != c.sha256:
        raise CorruptBlob(f"{what}: its sha256 is not the manifest's {c.sha256[:12]}… "
                          "(corrupt or tampered)")
    return data


def decode(index: ChunkIndex, expect: str, read: ReadRange, dest: Path, *, read_bytes: int = 8 << 20,
           threads: int = THREADS, progress: Callable[[int], None] | None = None) -> None:
    """Write the file ``index`` describes into the new file ``dest``, every chunk verified first.

    ``read(offset, length)`` returns frame bytes (a pread of an archive member, a range GET);
    adjacent frames are read together up to ``read_bytes``, reads run in ``threads`` threads.
    A corrupt index or chunk raises :class:`CorruptBlob` naming it, and ``dest`` is removed.
    """
    if index.digest() != expect:
        raise CorruptBlob(f"the chunk index of blob {expect[:12]}… does not match its digest "
                          f"({index.digest()[:12]}…): corrupt or tampered")
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    lock = threading.Lock()
    done = [0]

    def one(batch: list[Chunk]) -> None:
        base = batch[0].zoff
        length = batch[-1].zoff + batch[-1].zlen - base
        raw = read(base, length)
        if len(raw) != length:
            raise CorruptBlob(f"{batch[0].describe(expect, index.grid)}: {len(raw)} of {length} bytes "
                              "came back (truncated)")
        view = memoryview(raw)
        dctx = zstandard.ZstdDecompressor()
        for c in batch:
            data = verified(c, view[c.zoff - base: c.zoff - base + c.zlen], expect, index.grid, dctx)
            at = 0
            for offset, n in c.extents:
                os.pwrite(fd, data[at: at + n], offset)
                at += n
            if progress:
                with lock:
                    done[0] += c.data_bytes
                    progress(done[0])

    try:
        os.ftruncate(fd, index.size)  # the holes: nothing else is written there
        with ThreadPoolExecutor(threads) as pool:
            futures = [pool.submit(one, b) for b in _batches(index.chunks, read_bytes)]
            try:
                for f in as_completed(futures):  # the first failure, as soon as it happens
                    f.result()
            finally:
                for f in futures:
                    f.cancel()
    except BaseException:
        os.close(fd)
        dest.unlink(missing_ok=True)
        raise
    os.close(fd)


__all__ = ["GRID", "Chunk", "ChunkIndex", "CorruptBlob", "decode", "digest", "encode", "ordered_map",
           "verified"]
