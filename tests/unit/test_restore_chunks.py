"""The chunks a restore touched: recorded (store/restore_chunks.py), carried in the manifest
(store/manifest.py ``restore_chunks``), fetched first by a lazy fill (store/lazyblob.py)."""

from __future__ import annotations

import json
import os
import struct
import threading
from pathlib import Path
from typing import Any

import pytest

from forkd.host import memdiff
from forkd.host.accel import Accel
from forkd.store import chunked, restore_chunks
from forkd.store.lazyblob import LazyBlob
from forkd.store.manifest import BadManifest, BaseEntry, FileEntry, Manifest, SnapshotEntry

MIB = 1 << 20
GRID = chunked.MIN_GRID * 4


def sha(n: int) -> str:
    return f"{n:064x}"


def manifest(chunks: tuple[int, ...] = (), mem_size: int = 10 * chunked.GRID) -> Manifest:
    files = (FileEntry("mem", sha(1), mem_size), FileEntry("state", sha(2), 100),
             FileEntry("disk.qcow2", sha(3), 100, None))
    d = Manifest("a", 1, "0.1.0", "QEMU 7.2", Accel.tcg(), BaseEntry(sha(4), 100, "raw"),
                 (SnapshotEntry("a", None, 1, files, {}, {}, chunks),)).to_json()
    # disk.qcow2 needs a backing to parse: the base.
    d["snapshots"][0]["files"]["disk.qcow2"]["backing"] = {"tag": None, "file": "", "format": "raw"}
    return Manifest.from_json(json.loads(json.dumps(d)))


# ------------------------------------------------------------------ manifest field


def test_restore_chunks_survive_json_and_old_manifests_still_load() -> None:
    m = manifest((3, 0, 9))
    assert m.snapshot("a").restore_chunks == (3, 0, 9)
    assert Manifest.from_json(json.loads(json.dumps(m.to_json()))) == m
    old = manifest().to_json()
    assert "restore_chunks" not in old["snapshots"][0]  # none recorded: the field is left out
    assert Manifest.from_json(old).snapshot("a").restore_chunks == ()


@pytest.mark.parametrize("value,words", [
    (list(range(11)), "at most 10"),  # more positions than the file has chunks
    ([10], "below 10"),  # past the end (10 chunks: 0..9)
    ([-1], "below 10"),
    ([1, 1], "twice"),
    (["1"], "not a chunk position"),
    ([True], "not a chunk position"),
    ([1.0], "not a chunk position"),
    ({"0": 1}, "must be a list"),
    ("0,1", "must be a list"),
])
def test_bad_restore_chunks_are_refused_with_the_reason(value: Any, words: str) -> None:
    d = manifest().to_json()
    d["snapshots"][0]["restore_chunks"] = value
    with pytest.raises(BadManifest, match=words):
        Manifest.from_json(d)


def test_a_partial_last_chunk_counts() -> None:
    assert manifest((10,), mem_size=10 * chunked.GRID + 1).snapshot("a").restore_chunks == (10,)


# ------------------------------------------------------------------ recording


def entry(present: bool = False, swapped: bool = False, file: bool = False) -> bytes:
    return struct.pack("<Q", (memdiff.PRESENT if present else 0) | (memdiff.SWAPPED if swapped else 0)
                       | (memdiff.FILE_OR_SHARED if file else 0))


def test_touched_pages_are_the_read_ones_too() -> None:
    pagemap = (entry() + entry(present=True, file=True) + entry(present=True) + entry()
               + entry(swapped=True) + entry(file=True))
    assert memdiff.touched_runs(pagemap) == [(1, 2), (4, 1)]
    assert memdiff.changed_runs(pagemap) == [(2, 1), (4, 1)]  # written only


def test_touched_pages_become_sorted_chunk_positions() -> None:
    per = chunked.GRID // memdiff.PAGE
    assert restore_chunks.chunks_of([]) == []
    assert restore_chunks.chunks_of([(5 * per, 1), (0, 1), (per - 1, 2)]) == [0, 1, 5]


def fake_proc(tmp_path: Path, pid: int, mem: Path, pagemap: bytes, start: int) -> Path:
    proc = tmp_path / "proc"
    (proc / str(pid)).mkdir(parents=True)
    ram = len(pagemap) // 8 * memdiff.PAGE
    (proc / str(pid) / "maps").write_text(f"{start:x}-{start + ram:x} rw-p 00000000 00:00 1 {mem}\n")
    holey = bytearray((start // memdiff.PAGE) * 8) + pagemap
    (proc / str(pid) / "pagemap").write_bytes(bytes(holey))
    return proc


def test_recorded_once_atomically_and_read_back(tmp_path: Path) -> None:
    per = chunked.GRID // memdiff.PAGE
    pages = 4 * per
    pagemap = bytearray(entry() * pages)
    for p in (per + 3, 3 * per):
        pagemap[p * 8: p * 8 + 8] = entry(present=True, file=True)
    mem = tmp_path / "mem"
    mem.touch()
    proc = fake_proc(tmp_path, 42, mem, bytes(pagemap), 1 << 20)
    ram = memdiff.RamMapping.find(42, mem, pages * memdiff.PAGE, proc)
    snap = tmp_path / "snap"
    snap.mkdir()
    assert not restore_chunks.recorded(snap)
    assert restore_chunks.record(snap, ram, proc) == [1, 3]
    assert restore_chunks.record(snap, ram, proc) is None  # written once
    assert sorted(os.listdir(snap)) == [restore_chunks.FILE]  # no temporary left
    assert restore_chunks.read(snap, pages * memdiff.PAGE) == (1, 3)
    # Checked against the file it is read for: a smaller mem makes it unusable, not an error.
    assert restore_chunks.read(snap, 2 * chunked.GRID) == ()
    (snap / restore_chunks.FILE).write_text("{not json")
    assert restore_chunks.read(snap, pages * memdiff.PAGE) == ()
    assert restore_chunks.read(tmp_path / "none", pages * memdiff.PAGE) == ()


# ------------------------------------------------------------------ fill order


class RecordingStore:
    """A blob's frames, read by range like a store, recording each GET's range in order."""

    def __init__(self, src: Path) -> None:
        buf = bytearray()
        self.index = chunked.encode(src, buf.extend, grid=GRID)
        self.sha = self.index.digest()
        self.frames = bytes(buf)
        self.gets: list[tuple[int, int]] = []
        self.lock = threading.Lock()

    def read(self, offset: int, length: int) -> bytes:
        with self.lock:
            self.gets.append((offset, length))
        return self.frames[offset: offset + length]

    def chunks_in(self, get: tuple[int, int]) -> list[int]:
        return [c.index for c in self.index.chunks if get[0] <= c.zoff < get[0] + get[1]]


def test_fill_fetches_the_recorded_chunks_first_then_the_rest_in_file_order(tmp_path: Path) -> None:
    src = tmp_path / "src"
    data = os.urandom(12 * GRID)
    src.write_bytes(data)
    store = RecordingStore(src)
    blob = LazyBlob(store.sha, store.index, store.read, tmp_path / "fill")
    # Recorded: 9, 10 (adjacent: one GET) and 4; 99 is no chunk of this blob and is ignored.
    blob.fill([9, 10, 4, 99, 9], threads=1)
    order = [store.chunks_in(g) for g in store.gets]
    assert order[:2] == [[9, 10], [4]]
    rest = [c for run in order[2:] for c in run]
    assert rest == [0, 1, 2, 3, 5, 6, 7, 8, 11]  # then file order, runs per GET
    assert all(n == 1 for n in blob.fetched_by_chunk.values()) and len(blob.fetched_by_chunk) == 12
    assert (tmp_path / "fill").read_bytes() == data  # every chunk verified and written
    blob.close()


def test_fill_without_an_order_is_file_order(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(os.urandom(6 * GRID))
    store = RecordingStore(src)
    blob = LazyBlob(store.sha, store.index, store.read, tmp_path / "fill")
    blob.fill(threads=1)
    assert [c for g in store.gets for c in store.chunks_in(g)] == list(range(6))
    blob.close()
