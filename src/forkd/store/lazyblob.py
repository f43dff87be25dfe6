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
touched first, when known) then in file order, in ``threads`` parallel workers,
sharing the same single-flight with the readers; when it returns the file is
complete and can replace the lazily served one. Its workers take runs of
adjacent frames of up to ``FILL_READ_BYTES`` per range GET: a store's cost is
mostly per request (latency on a network; moto's server even reads the whole
object for each range), so a 100 MiB blob in ~4 MiB chunks comes down in a
dozen GETs instead of ~70. A reader wanting a chunk a worker has claimed waits
for that GET; one that no worker has reached yet is fetched alone, at once.
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
# Background range GETs at once: enough that a restore rarely waits on a chunk the fill has not
# reached, few enough to leave the restoring children CPU on a small host (each GET is a
# decompress + sha256 of its chunks here).
FILL_THREADS = 4
FILL_READ_BYTES = 8 << 20  # frame bytes one background GET takes at most (as eager pulls' 8 MiB+)


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
        self.landed: list[int] = []  # chunk positions in the order they arrived (tests, stats)
        self.fill_first: list[int] = []  # the chunks ``fill`` was asked to fetch first (present ones)
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
            if future is None:
                self._inflight[chunk.index] = Future()
        if future is not None:
            future.result()  # raises the fetcher's failure
            return
        self._fetch([chunk])

    def _claim(self, chunks: list[Chunk]) -> list[Chunk]:
        """Those of ``chunks`` neither here nor being fetched, now marked in flight for the caller,
        who must then ``_fetch`` them (anyone else wanting one waits on its future)."""
        with self._lock:
            if self._failed is not None:
                raise self._failed
            mine = [c for c in chunks if c.index not in self._here and c.index not in self._inflight]
            for c in mine:
                self._inflight[c.index] = Future()
        return mine

    def _fetch(self, claimed: list[Chunk]) -> None:
        """Fetch the ``claimed`` chunks (in frame order) with one range GET per run of adjacent
        frames, then verify and write each chunk, waking its waiters as it lands. A failure fails
        the blob (sticky) and every claimed chunk not yet landed, naming the first of those: no
        claimed chunk may be left in flight, its waiters would wait forever."""
        runs: list[list[Chunk]] = []
        for c in claimed:
            if runs and runs[-1][-1].zoff + runs[-1][-1].zlen == c.zoff:
                runs[-1].append(c)
            else:
                runs.append([c])
        landed = 0
        try:
            for run in runs:
                base = run[0].zoff
                frames = self._read_range(base, run[-1].zoff + run[-1].zlen - base)
                with self._lock:
                    self.gets += 1
                    self.bytes_fetched += len(frames)
                    for c in run:
                        self.fetched_by_chunk[c.index] = self.fetched_by_chunk.get(c.index, 0) + 1
                view = memoryview(frames)
                for c in run:
                    frame = view[c.zoff - base: c.zoff - base + c.zlen]
                    if len(frame) != c.zlen:
                        raise LazyBlobFailed(f"{c.describe(self.sha, self.index.grid)}: {len(frame)} "
                                             f"of {c.zlen} bytes came back (truncated)")
                    try:
                        data = chunked.verified(c, frame, self.sha, self.index.grid)
                    except chunked.CorruptBlob as exc:
                        raise LazyBlobFailed(str(exc)) from None
                    at = 0
                    for offset, n in c.extents:
                        os.pwrite(self._fd, data[at: at + n], offset)
                        at += n
                    with self._lock:
                        self._here.add(c.index)
                        self.landed.append(c.index)
                        future = self._inflight.pop(c.index)
                    future.set_result(None)
                    landed += 1
        except BaseException as exc:
            first = claimed[landed]
            failure = exc if isinstance(exc, LazyBlobFailed) else LazyBlobFailed(
                f"{first.describe(self.sha, self.index.grid)}: {exc}")
            with self._lock:
                self._failed = self._failed or failure
                futures = [self._inflight.pop(c.index) for c in claimed[landed:]]
            for f in futures:
                f.set_exception(failure)
            raise failure from exc

    # ------------------------------------------------------------ background

    def fill(self, order: Iterable[int] = (), *, threads: int = FILL_THREADS,
             stop: threading.Event | None = None) -> None:
        """Fetch every chunk not yet here (``order``'s positions first); raises the first failure.
        ``stop`` set: return early (the file is then incomplete)."""
        first = [self._by_pos[p] for p in dict.fromkeys(order) if p in self._by_pos]
        seen = {c.index for c in first}
        self.fill_first = [c.index for c in first]
        todo = first + [c for c in self.index.chunks if c.index not in seen]
        # Spans of adjacent frames in ``todo``'s order, each one GET (unless readers took part).
        spans: list[list[Chunk]] = []
        for c in todo:
            last = spans[-1] if spans else None
            if last and last[-1].zoff + last[-1].zlen == c.zoff and \
                    c.zoff + c.zlen - last[0].zoff <= FILL_READ_BYTES:
                last.append(c)
            else:
                spans.append([c])

        def one(span: list[Chunk]) -> None:
            if stop is not None and stop.is_set():
                return
            # Claimed when the worker gets to it, not up front: until then a reader that wants
            # one of these chunks fetches it alone rather than waiting behind the queue.
            mine = self._claim(span)
            if mine:
                self._fetch(mine)  # split where a reader had already taken a chunk
            for c in span:  # those readers fetched: here, or wait for them
                self.ensure(c)

        with ThreadPoolExecutor(threads) as pool:
            futures = [pool.submit(one, s) for s in spans]
            try:
                for f in futures:
                    f.result()
            finally:
                for f in futures:
                    f.cancel()
        if stop is None or not stop.is_set():
            os.fsync(self._fd)


__all__ = ["FILL_READ_BYTES", "FILL_THREADS", "LazyBlob", "LazyBlobFailed"]
