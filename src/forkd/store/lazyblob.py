"""A blob that arrives chunk by chunk while it is already being read.

``LazyBlob`` fills a local sparse file (``dest``) from a chunked blob
(store/chunked.py) on demand: ``read(offset, length)`` first makes sure every
present chunk the range covers is here, fetching each with one range GET of
its frame, verifying it against the index (whose digest the manifest names)
and writing it at its extents, then answers from the file. So:

* a byte is never answered from a chunk that was not verified; a chunk that
  fails (corrupt, or the store unreachable) fails the read with
  :class:`LazyBlobFailed` naming it, and every later read that needs it too
  (sticky: a snapshot whose memory cannot be had is broken, retrying would
  only make 20 children each wait for their own timeout);
* a chunk is fetched **once**, however many readers want it at the same time:
  the first one fetches, the others wait on its future (20 children faulting
  the same pages make one GET per chunk);
* a range with no present chunk (zero pages, known from the index) is zeros
  from the file's holes, never fetched.

``fill`` fetches every chunk not yet here, in ``order`` (the chunks a restore
touched first, when known) then in file order, a few at a time, sharing the
same single-flight with the readers; when it returns the file is complete and
can replace the lazily served one.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from forkd.store import chunked
from forkd.store.chunked import Chunk, ChunkIndex

ReadRange = Callable[[int, int], bytes]  # (offset, length) in the blob's frames -> those bytes
FILL_THREADS = 2  # background fetches at once: leaves CPU for the restoring children on 2 cores


class LazyBlobFailed(OSError):
    """A chunk of a lazily arriving blob could not be had or did not verify."""


class LazyBlob:
    def __init__(self, sha: str, index: ChunkIndex, read_range: ReadRange, dest: Path) -> None:
        if index.digest() != sha:
            raise chunked.CorruptBlob(f"the chunk index of blob {sha[:12]}… does not match its digest "
                                      f"({index.digest()[:12]}…): corrupt or tampered")
        self.sha = sha
        self.index = index
        self.size = index.size
        self.dest = dest
        self._read_range = read_range
        self._by_pos = {c.index: c for c in index.chunks}
        self._lock = threading.Lock()
        self._here: set[int] = set()
        self._inflight: dict[int, Future[None]] = {}
        self._failed: LazyBlobFailed | None = None
        self._closed = False
        self.gets = 0  # range GETs made (one per chunk fetched)
        self.bytes_fetched = 0  # frame bytes those GETs brought
        self.fetched_by_chunk: dict[int, int] = {}  # chunk position -> GETs of it (tests)
        self._fd = os.open(dest, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(self._fd, index.size)  # holes: the absent chunks, zeros without a fetch
        except BaseException:
            os.close(self._fd)
            dest.unlink(missing_ok=True)
            raise

    # ------------------------------------------------------------ state

    @property
    def complete(self) -> bool:
        with self._lock:
            return len(self._here) == len(self._by_pos)

    @property
    def failed(self) -> LazyBlobFailed | None:
        return self._failed

    def close(self) -> None:
        """No more reads: later ones fail (the file itself is the caller's)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._failed = self._failed or LazyBlobFailed(f"blob {self.sha[:12]}… is no longer served")
        with contextlib.suppress(OSError):
            os.close(self._fd)

    # ------------------------------------------------------------ reading

    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (fewer past the end), every covering chunk verified first."""
        if offset < 0 or length < 0:
            raise ValueError("negative offset or length")
        end = min(offset + length, self.size)
        if offset >= end:
            return b""
        grid = self.index.grid
        for pos in range(offset // grid, (end - 1) // grid + 1):
            chunk = self._by_pos.get(pos)
            if chunk is not None:
                self.ensure(chunk)
        return os.pread(self._fd, end - offset, offset)

    def ensure(self, chunk: Chunk) -> None:
        """``chunk`` is here and verified when this returns; fetched by this call or one already
        under way (single flight)."""
        with self._lock:
            if chunk.index in self._here:
                return  # verified earlier: still good whatever failed since
            if self._failed is not None:
                raise self._failed
            future = self._inflight.get(chunk.index)
            mine = future is None
            if future is None:
                future = self._inflight[chunk.index] = Future()
        if not mine:
            future.result()  # raises the fetcher's failure
            return
        try:
            self._fetch(chunk)
        except BaseException as exc:
            failure = exc if isinstance(exc, LazyBlobFailed) else LazyBlobFailed(
                f"{chunk.describe(self.sha, self.index.grid)}: {exc}")
            with self._lock:
                self._failed = self._failed or failure
                del self._inflight[chunk.index]
            future.set_exception(failure)
            raise failure from exc
        with self._lock:
            self._here.add(chunk.index)
            del self._inflight[chunk.index]
        future.set_result(None)

    def _fetch(self, chunk: Chunk) -> None:
        frame = self._read_range(chunk.zoff, chunk.zlen)
        with self._lock:
            self.gets += 1
            self.bytes_fetched += len(frame)
            self.fetched_by_chunk[chunk.index] = self.fetched_by_chunk.get(chunk.index, 0) + 1
        if len(frame) != chunk.zlen:
            raise LazyBlobFailed(f"{chunk.describe(self.sha, self.index.grid)}: {len(frame)} of "
                                 f"{chunk.zlen} bytes came back (truncated)")
        try:
            data = chunked.verified(chunk, frame, self.sha, self.index.grid)
        except chunked.CorruptBlob as exc:
            raise LazyBlobFailed(str(exc)) from None
        at = 0
        for offset, n in chunk.extents:
            os.pwrite(self._fd, data[at: at + n], offset)
            at += n

    # ------------------------------------------------------------ background

    def fill(self, order: Iterable[int] = (), *, threads: int = FILL_THREADS,
             stop: threading.Event | None = None) -> None:
        """Fetch every chunk not yet here (``order``'s positions first); raises the first failure.
        ``stop`` set: return early (the file is then incomplete)."""
        first = [self._by_pos[p] for p in dict.fromkeys(order) if p in self._by_pos]
        seen = {c.index for c in first}
        todo = first + [c for c in self.index.chunks if c.index not in seen]

        def one(c: Chunk) -> None:
            if stop is None or not stop.is_set():
                self.ensure(c)

        with ThreadPoolExecutor(threads) as pool:
            futures = [pool.submit(one, c) for c in todo]
            try:
                for f in futures:
                    f.result()
            finally:
                for f in futures:
                    f.cancel()
        if stop is None or not stop.is_set():
            os.fsync(self._fd)


__all__ = ["FILL_THREADS", "LazyBlob", "LazyBlobFailed"]
