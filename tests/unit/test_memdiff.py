"""host/memdiff.py: which pages a private mapping changed (pagemap), and the diff file, whose
every length is checked before it is trusted. The round trip runs on this process's own
private mapping of a file, the way a child maps its snapshot's memory."""

from __future__ import annotations

import ctypes
import io
import itertools
import mmap
import os
import random
import struct
from pathlib import Path

import pytest
import zstandard

from forkd.host import memdiff
from forkd.host.memdiff import PAGE, DiffError, RamMapping

PRESENT, SWAPPED, FILE = memdiff.PRESENT, memdiff.SWAPPED, memdiff.FILE_OR_SHARED


def entries(*flags: int) -> bytes:
    return struct.pack(f"<{len(flags)}Q", *flags)


def test_changed_pages_are_the_private_present_ones_and_the_swapped() -> None:
    pagemap = entries(0, PRESENT | FILE | 17, PRESENT | 5, PRESENT | 6, SWAPPED | 9, 0, PRESENT | FILE,
                      PRESENT | 1)
    assert memdiff.changed_runs(pagemap) == [(2, 3), (7, 1)]
    assert memdiff.changed_runs(entries(0, 0)) == []
    assert memdiff.changed_runs(entries(PRESENT, PRESENT)) == [(0, 2)]
    with pytest.raises(DiffError, match="whole entries"):
        memdiff.changed_runs(b"\0" * 12)


def test_the_table_driven_scan_agrees_with_the_definition() -> None:
    rng = random.Random(23)
    flags = [0, PRESENT, PRESENT | FILE, SWAPPED, SWAPPED | FILE, FILE, PRESENT | SWAPPED]
    values = [rng.choice(flags) | rng.getrandbits(55) for _ in range(5000)]
    changed = [i for i, v in enumerate(values) if (v & PRESENT and not v & FILE) or v & SWAPPED]
    runs = memdiff.changed_runs(entries(*values))
    assert [p for first, count in runs for p in range(first, first + count)] == changed
    assert all(a[0] + a[1] < b[0] for a, b in itertools.pairwise(runs))  # maximal runs


def test_subtract_leaves_the_pages_of_one_set_not_in_the_other() -> None:
    assert memdiff.subtract([(0, 4), (10, 2)], [(1, 2), (11, 5)]) == [(0, 1), (3, 1), (10, 1)]
    assert memdiff.subtract([(0, 3)], []) == [(0, 3)]
    assert memdiff.subtract([(0, 3)], [(0, 3)]) == []


def _private_map(path: Path, size: int) -> tuple[mmap.mmap, int]:
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    address = ctypes.addressof(ctypes.c_char.from_buffer(m))
    return m, address


@pytest.mark.skipif(not os.access("/proc/self/pagemap", os.R_OK), reason="no pagemap")
def test_a_private_mapping_round_trips_through_the_diff_file(tmp_path: Path) -> None:
    size = 16 * PAGE
    mem = tmp_path / "mem"
    mem.write_bytes(bytes(range(256)) * (size // 256))
    first, start = _private_map(mem, size)
    try:
        first[0:size]  # read every page: read pages stay the file's
        first[2 * PAGE:2 * PAGE + 5] = b"hello"
        first[9 * PAGE:11 * PAGE] = b"\xab" * (2 * PAGE)
        ram = RamMapping(os.getpid(), start, size)
        runs = ram.changed()
        assert runs == [(2, 1), (9, 2)]
        diff = tmp_path / "memory.diff"
        written = memdiff.save(ram, runs, diff)
        assert written == diff.stat().st_size and written < 3 * PAGE  # compressed
        second, start2 = _private_map(mem, size)
        try:
            assert memdiff.load(diff, RamMapping(os.getpid(), start2, size)) == runs
            assert second[:] == first[:]
            # Its own changed pages are now exactly those the diff wrote.
            assert RamMapping(os.getpid(), start2, size).changed() == runs
        finally:
            del start2
            second.close()
    finally:
        first.close()
    assert mem.read_bytes() == bytes(range(256)) * (size // 256)  # the file itself never changed


def diff_file(ram: int = 16 * PAGE, runs: list[tuple[int, int]] | None = None, n_pages: int | None = None,
              payload: bytes | None = None, magic: bytes = memdiff.MAGIC, page: int = PAGE) -> bytes:
    runs = [(1, 2)] if runs is None else runs
    pages = sum(c for _, c in runs) if n_pages is None else n_pages
    head = struct.pack("<8sQIIQ", magic, ram, page, len(runs), pages)
    table = b"".join(struct.pack("<QQ", f, c) for f, c in runs)
    body = zstandard.ZstdCompressor().compress(b"\1" * PAGE * pages if payload is None else payload)
    return head + table + body


@pytest.mark.parametrize(("data", "why"), [
    (b"short", "shorter than its header"),
    (diff_file(magic=b"NOTMAGIC"), "bad magic"),
    (diff_file(ram=32 * PAGE), "not this VM's"),
    (diff_file(page=8192), "not this VM's"),
    (diff_file(runs=[(1, 2), (2, 1)]), "overlap"),
    (diff_file(runs=[(5, 1), (1, 1)]), "out of order"),
    (diff_file(runs=[(15, 2)]), "leave its RAM"),
    (diff_file(runs=[(3, 0)]), "leave its RAM"),
    (diff_file(n_pages=5), "add up"),
    (diff_file(runs=[(0, 1)] * 17), "does not fit"),
])
def test_a_bad_header_is_refused_before_any_page_is_written(data: bytes, why: str) -> None:
    with pytest.raises(DiffError, match=why):
        memdiff.read_header(io.BytesIO(data), 16 * PAGE, len(data))


def test_a_run_table_larger_than_the_file_is_refused_without_reading_it() -> None:
    data = struct.pack("<8sQIIQ", memdiff.MAGIC, 16 * PAGE, PAGE, 16, 16)
    with pytest.raises(DiffError, match="does not fit"):
        memdiff.read_header(io.BytesIO(data), 16 * PAGE, len(data))


@pytest.mark.parametrize(("payload", "why"), [
    (b"\1" * PAGE, "end before"),
    (b"\1" * PAGE * 3, "more pages"),
])
def test_pages_that_do_not_match_the_runs_are_refused(tmp_path: Path, payload: bytes, why: str) -> None:
    size = 16 * PAGE
    mem = tmp_path / "mem"
    mem.write_bytes(b"\0" * size)
    diff = tmp_path / "memory.diff"
    diff.write_bytes(diff_file(payload=payload))
    target, start = _private_map(mem, size)
    try:
        with pytest.raises(DiffError, match=why):
            memdiff.load(diff, RamMapping(os.getpid(), start, size))
    finally:
        del start
        target.close()


def test_the_ram_mapping_is_found_by_file_and_size(tmp_path: Path) -> None:
    mem = tmp_path / "mem"
    mem.write_bytes(b"\0" * 8 * PAGE)
    m, start = _private_map(mem, 8 * PAGE)
    try:
        assert RamMapping.find(os.getpid(), mem, 8 * PAGE).start == start
        with pytest.raises(Exception, match="no mapping"):
            RamMapping.find(os.getpid(), mem, 4 * PAGE)
    finally:
        del start
        m.close()
