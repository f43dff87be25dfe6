"""Lazily arriving blobs (store/lazyblob.py) and the FUSE file that serves one (host/fusefile.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from forkd.host import fusefile
from forkd.store import chunked
from forkd.store.lazyblob import LazyBlob, LazyBlobFailed

MIB = 1 << 20
GRID = chunked.MIN_GRID * 4  # 256 KiB chunks: small files, many chunks


def make_file(path: Path) -> bytes:
    """16 chunks: data, zeros (absent chunks), a hole, a chunk with zero pages inside."""
    size = 16 * GRID
    data = bytearray(size)
    for i in (0, 1, 3, 7, 8, 15):
        data[i * GRID: (i + 1) * GRID] = os.urandom(GRID)
    data[7 * GRID + 8192: 7 * GRID + 16384] = bytes(8192)  # zero pages inside a present chunk
    path.write_bytes(bytes(data))
    return bytes(data)


class Frames:
    """A blob's frames and index, read by range like a store; counts and can slow or corrupt reads."""

    def __init__(self, src: Path, delay: float = 0.0) -> None:
        buf = bytearray()
        self.index = chunked.encode(src, buf.extend, grid=GRID)
        self.sha = self.index.digest()
        self.frames = bytes(buf)
        self.delay = delay
        self.reads: Counter[int] = Counter()
        self.lock = threading.Lock()
        self.fail = False

    def read(self, offset: int, length: int) -> bytes:
        with self.lock:
            self.reads[offset] += 1
        if self.fail:
            raise OSError("store unreachable")
        time.sleep(self.delay)
        return self.frames[offset: offset + length]


@pytest.fixture
def original(tmp_path: Path) -> tuple[Path, bytes]:
    src = tmp_path / "src"
    return src, make_file(src)


def test_reads_match_and_fetch_only_what_they_cover(tmp_path: Path, original: tuple[Path, bytes]) -> None:
    src, data = original
    frames = Frames(src)
    blob = LazyBlob(frames.sha, frames.index, frames.read, tmp_path / "fill")
    assert blob.read(2 * GRID + 5, 100) == data[2 * GRID + 5: 2 * GRID + 105]  # absent chunk: zeros
    assert blob.gets == 0  # zero chunks are never fetched
    assert blob.read(7 * GRID, GRID) == data[7 * GRID: 8 * GRID]
    assert blob.gets == 1
    assert blob.read(GRID - 10, 20) == data[GRID - 10: GRID + 10]  # two chunks
    assert blob.gets == 3
    assert blob.read(16 * GRID - 3, 100) == data[-3:]  # past the end: what is there
    blob.fill()
    assert blob.complete
    assert (tmp_path / "fill").read_bytes() == data
    assert set(frames.reads.values()) == {1}  # every chunk fetched exactly once
    assert sum(blob.fetched_by_chunk.values()) == len(frames.index.chunks) == 6
    assert blob.gets <= 6  # the fill takes adjacent frames together


def test_concurrent_readers_share_one_fetch_per_chunk(tmp_path: Path, original: tuple[Path, bytes]) -> None:
    src, data = original
    frames = Frames(src, delay=0.05)
    blob = LazyBlob(frames.sha, frames.index, frames.read, tmp_path / "fill")

    def reader(i: int) -> bytes:
        off = (i * 7919) % (16 * GRID - 4096)
        return blob.read(off, 3 * GRID)

    with ThreadPoolExecutor(20) as pool:
        got = list(pool.map(reader, range(40)))
        filler = pool.submit(blob.fill)
        filler.result()
    for i, part in enumerate(got):
        off = (i * 7919) % (16 * GRID - 4096)
        assert part == data[off: off + 3 * GRID]
    assert set(frames.reads.values()) == {1}
    assert sum(blob.fetched_by_chunk.values()) == 6 and set(blob.fetched_by_chunk.values()) == {1}
    assert blob.gets <= 6


def test_a_corrupt_chunk_fails_its_readers_naming_it(tmp_path: Path, original: tuple[Path, bytes]) -> None:
    src, data = original
    frames = Frames(src)
    bad = next(c for c in frames.index.chunks if c.index == 8)
    raw = bytearray(frames.frames)
    raw[bad.zoff + bad.zlen // 2] ^= 0xFF
    frames.frames = bytes(raw)
    blob = LazyBlob(frames.sha, frames.index, frames.read, tmp_path / "fill")
    assert blob.read(0, 10) == data[:10]
    with pytest.raises(LazyBlobFailed, match=r"chunk 8 \(bytes 2097152-2359295\)"):
        blob.read(8 * GRID, 10)
    with pytest.raises(LazyBlobFailed, match="chunk 8"):  # sticky: no second fetch, same message
        blob.read(15 * GRID, 10)
    assert blob.read(0, 10) == data[:10]  # what was verified before stays readable
    with pytest.raises(LazyBlobFailed):
        blob.fill()
    assert frames.reads[bad.zoff] == 1


def test_fill_takes_adjacent_frames_together_and_leaves_readers_theirs(
        tmp_path: Path, original: tuple[Path, bytes]) -> None:
    src, data = original
    frames = Frames(src)
    blob = LazyBlob(frames.sha, frames.index, frames.read, tmp_path / "fill")
    assert blob.read(GRID, 10) == data[GRID: GRID + 10]  # a reader took chunk 1 first
    blob.fill()
    assert (tmp_path / "fill").read_bytes() == data
    assert set(blob.fetched_by_chunk.values()) == {1} and len(blob.fetched_by_chunk) == 6
    # chunk 1 alone, then chunk 0 and the run 3, 7, 8, 15 (their frames are adjacent): 3 GETs
    assert blob.gets == 3 < len(frames.index.chunks)


def test_a_corrupt_chunk_in_a_fill_run_fails_its_waiters_too(
        tmp_path: Path, original: tuple[Path, bytes]) -> None:
    src, data = original
    frames = Frames(src, delay=0.2)
    bad = next(c for c in frames.index.chunks if c.index == 3)
    raw = bytearray(frames.frames)
    raw[bad.zoff + bad.zlen // 2] ^= 0xFF
    frames.frames = bytes(raw)
    blob = LazyBlob(frames.sha, frames.index, frames.read, tmp_path / "fill")
    with ThreadPoolExecutor(2) as pool:
        filler = pool.submit(blob.fill, threads=1)
        time.sleep(0.05)  # the fill's one GET of every frame is under way
        late = pool.submit(blob.read, 15 * GRID, 10)  # waits on it, not a GET of its own
        with pytest.raises(LazyBlobFailed, match="chunk 3"):
            filler.result(timeout=10)
        with pytest.raises(LazyBlobFailed, match="chunk 3"):
            late.result(timeout=10)  # woken with the failure, not left waiting
    assert blob.read(0, 10) == data[:10]  # landed before the bad one: verified, readable
    assert blob.gets == 1


def test_an_unreachable_store_fails_reads(tmp_path: Path, original: tuple[Path, bytes]) -> None:
    src, _ = original
    frames = Frames(src)
    frames.fail = True
    blob = LazyBlob(frames.sha, frames.index, frames.read, tmp_path / "fill")
    with pytest.raises(LazyBlobFailed, match="store unreachable"):
        blob.read(0, 10)


def test_an_index_that_is_not_the_manifests_is_refused(tmp_path: Path, original: tuple[Path, bytes]) -> None:
    src, _ = original
    frames = Frames(src)
    with pytest.raises(chunked.CorruptBlob, match="does not match its digest"):
        LazyBlob("0" * 64, frames.index, frames.read, tmp_path / "fill")


CLIENT = r"""
import mmap, os, sys, hashlib
fd = os.open(sys.argv[1], os.O_RDWR)  # as QEMU opens mem-path
size = os.fstat(fd).st_size
m = mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
os.close(fd)
m[0] = m[0] ^ 0xFF  # copy-on-write: never reaches the file
m[0] = m[0] ^ 0xFF
print(hashlib.sha256(m[:]).hexdigest(), flush=True)
sys.stdin.readline()  # stays mapped until told
print(hashlib.sha256(m[:]).hexdigest(), flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0 or not fusefile.available(), reason="needs root and /dev/fuse")
def test_fuse_file_serves_a_private_mapping_until_the_last_user(tmp_path: Path,
                                                                original: tuple[Path, bytes]) -> None:
    import hashlib

    src, data = original
    frames = Frames(src)
    blob = LazyBlob(frames.sha, frames.index, frames.read, tmp_path / "fill")
    point = tmp_path / "mem"
    point.touch()
    served = fusefile.FuseFile(point, blob.size, blob.read, on_end=blob.close)
    served.start()
    try:
        assert point.stat().st_size == len(data)
        client = subprocess.Popen([sys.executable, "-c", CLIENT, str(point)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert client.stdout is not None
        assert client.stdout.readline().strip() == hashlib.sha256(data).hexdigest()
        blob.fill()
        served.detach()  # gone from the path, still served to the mapping
        assert fusefile.mounts_under(tmp_path) == [] and point.stat().st_size == 0  # the empty file under it
        assert not served.wait_ended(0.3)
        out, _ = client.communicate("\n", timeout=30)
        assert out.strip() == hashlib.sha256(data).hexdigest()
        assert served.wait_ended(10)  # the last user went: the connection ended, the blob closed
        assert blob.failed is not None
    finally:
        served.abort()
        fusefile.umount(point)
    assert fusefile.mounts_under(tmp_path) == []
    assert set(frames.reads.values()) == {1}
