"""Snapshots that travel, with real VMs: pack/unpack, and push/pull through a real S3 server.

The session's template is registered in a runtime with an object store (no boot of its own);
a branch chain of depth 3 is built from it once a session (test_travel_lazy.py uses the same),
packed, unpacked into a second data directory, pushed and pulled into others. What the guest
sees (a file's sha256, a value and a blob in PID 1's memory) must be identical wherever the
snapshot lands.
"""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest

from forkd.config import DataDir
from forkd.controller.runtime import Runtime
from forkd.errors import NotFound
from forkd.store import archive, sparse

from .conftest import Loop, images_dir, qemu_processes_of
from .services import S3Server

pytestmark = pytest.mark.vm

TEMPLATE = "tv-py"
CHAIN = ("tv-b1", "tv-b2", "tv-b3")  # branches of branches: depth 3 on top of the template
# What a child computes about itself: a file on its disk and values in PID 1's memory.
FILE_SHA = ["sh", "-c", "sha256sum /root/travel.bin | cut -d' ' -f1"]
MEMORY = "(hashlib.sha256(blob).hexdigest(), counter)"


def scratch() -> DataDir:
    data = DataDir.scratch("fkt-")
    return DataDir(data.root, images_dir())


# The store, the source runtime and its chain are the session's (conftest.py: travel_*), shared
# with test_travel_lazy.py; these names are what both modules' tests ask for.
@pytest.fixture
def s3(travel_s3: S3Server) -> S3Server:
    return travel_s3


@pytest.fixture
def source(travel_source: Runtime) -> Runtime:
    return travel_source


@pytest.fixture
def chain(travel_chain: dict[str, Any]) -> dict[str, Any]:
    return travel_chain


def open_runtime(loop: Loop, s3: S3Server, prefix: str = "tv", data: DataDir | None = None) -> Runtime:
    return loop.run(Runtime.open(data or scratch(), store=s3.url(prefix)))


def close_runtime(loop: Loop, rt: Runtime) -> None:
    root = rt.data.root
    loop.run(rt.close())
    assert not qemu_processes_of(root), "QEMU processes left behind"
    shutil.rmtree(root, ignore_errors=True)


async def what_it_sees(rt: Runtime, sb_id: str) -> tuple[str, str]:
    disk = await rt.exec(sb_id, FILE_SHA)
    assert disk["exit_code"] == 0, disk
    mem = await rt.eval(sb_id, MEMORY)
    assert mem["exit_code"] == 0, mem
    return disk["stdout"].strip(), mem["result"]


async def build_chain(source: Runtime) -> dict[str, Any]:
    """tv-py (the session's template) -> tv-b1 -> tv-b2 -> tv-b3; each step writes to the disk and
    to memory first. What the last child saw is what a child of tv-b3 must see anywhere."""
    tag, seen = TEMPLATE, None
    for i, branch in enumerate(CHAIN):
        [sb] = await source.spawn(tag)
        write = f"head -c 300000 /dev/urandom >> /root/travel.bin && echo {i} >> /root/travel.bin && sync"
        step = await source.exec(sb.id, ["sh", "-c", write])
        assert step["exit_code"] == 0, step
        setup = ("import hashlib, os; blob = globals().get('blob', b'') + os.urandom(1 << 20); "
                 f"counter = {i + 1}")
        assert (await source.eval(sb.id, f"exec({setup!r})"))["exit_code"] == 0
        seen = await what_it_sees(source, sb.id)
        await source.branch(sb.id, branch, mode="diff" if i else "full")
        await source.kill(sb.id)
        tag = branch
    return {"tag": tag, "seen": seen}


def read_bytes_of_this_process() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def test_pack_unpack_restores_a_depth_3_branch_identically(loop: Loop, source: Runtime, chain: dict[str, Any],
                                                          tmp_path: Path, s3: S3Server) -> None:
    out = tmp_path / "b3.forkd"
    mems = [source.snapshots.dir(t).mem for t in (TEMPLATE, *CHAIN)]
    logical = sum(m.stat().st_size for m in mems)
    before = read_bytes_of_this_process()
    packed = loop.run(source.travel.pack(chain["tag"], out))
    read = read_bytes_of_this_process() - before
    print(f"\npack: {packed['bytes'] / 2**20:.1f} MiB archive, {read / 2**20:.0f} MiB read; "
          f"memory files {logical / 2**20:.0f} MiB logical, "
          f"{sum(sparse.inspect(m).data_bytes for m in mems) / 2**20:.0f} MiB data")
    assert packed["lineage"] == [TEMPLATE, *CHAIN]
    # Holes are never read: the whole pack (digests and archive, 4 memory files and a
    # 2 GiB base image included) reads less than the memory files' logical size alone.
    assert read < logical

    dest = open_runtime(loop, s3, "unused")
    try:
        result = loop.run(dest.travel.unpack(out))
        assert result["created"] == [TEMPLATE, *CHAIN]
        # Sparseness restored: the unpacked memory file holds about what the original holds.
        mem = dest.snapshots.dir(chain["tag"]).mem
        original = source.snapshots.dir(chain["tag"]).mem
        assert mem.stat().st_size == original.stat().st_size
        assert sparse.allocated_bytes(mem) <= sparse.allocated_bytes(original) + (1 << 20)
        assert sparse.allocated_bytes(mem) < mem.stat().st_size // 2
        assert dest.snapshot_lineage(chain["tag"])["ancestors"] == [CHAIN[1], CHAIN[0], TEMPLATE]

        async def restore() -> tuple[str, str]:
            [sb] = await dest.spawn(chain["tag"])
            try:
                return await what_it_sees(dest, sb.id)
            finally:
                await dest.kill(sb.id)

        assert loop.run(restore()) == chain["seen"]
    finally:
        close_runtime(loop, dest)


def _tamper(src: Path, dst: Path) -> None:
    """Swap two chunks' frames in the biggest blob's index: every frame still decompresses and the
    index still hashes to the manifest's digest, but each chunk now holds another's bytes."""
    with tarfile.open(src) as tar, tarfile.open(dst, "w", format=tarfile.PAX_FORMAT) as out:
        members = tar.getmembers()
        biggest = max((m for m in members if m.name.startswith("blobs/") and not m.name.endswith(".index")),
                      key=lambda m: m.size)
        for m in members:
            f = tar.extractfile(m)
            assert f is not None
            data = f.read()
            if m.name == f"{biggest.name}.index":
                index = json.loads(data)
                a, b = index["chunks"][0], index["chunks"][1]
                a[2:4], b[2:4] = b[2:4], a[2:4]
                data = json.dumps(index).encode()
                m.size = len(data)
            out.addfile(m, io.BytesIO(data))


def test_a_tampered_or_corrupt_archive_is_refused(loop: Loop, source: Runtime, chain: dict[str, Any],
                                                  tmp_path: Path, s3: S3Server) -> None:
    good = tmp_path / "b1.forkd"
    loop.run(source.travel.pack(CHAIN[0], good, include_base=False))
    tampered = tmp_path / "tampered.forkd"
    _tamper(good, tampered)
    corrupt = tmp_path / "corrupt.forkd"
    data = bytearray(good.read_bytes())
    data[len(data) // 2] ^= 0x55
    corrupt.write_bytes(bytes(data))
    truncated = tmp_path / "truncated.forkd"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])

    dest = open_runtime(loop, s3, "unused")
    try:
        refused = ((tampered, "sha256"), (corrupt, "corrupt archive"), (truncated, "corrupt archive"))
        for path, words in refused:
            with pytest.raises(archive.ArchiveError) as err:
                loop.run(dest.travel.unpack(path))
            assert err.value.kind == "corrupt" and words in str(err.value), str(err.value)
            assert dest.list_snapshots() == [], "a refused archive registered something"
            assert not [p for p in dest.data.snapshots.iterdir()], "a refused archive left files"
        # The untouched one unpacks (its base image is this host's guest image, found by digest).
        assert loop.run(dest.travel.unpack(good))["created"] == [TEMPLATE, CHAIN[0]]
    finally:
        close_runtime(loop, dest)


def test_push_then_pull_on_another_data_dir_then_fork(loop: Loop, source: Runtime, chain: dict[str, Any],
                                                      s3: S3Server) -> None:
    first = loop.run(source.travel.push(CHAIN[0]))
    assert first["lineage"] == [TEMPLATE, CHAIN[0]] and first["blobs_uploaded"] == first["blobs"]
    again = loop.run(source.travel.push(chain["tag"]))
    # Content-addressed: the base, the template and tv-b1 are in the store already.
    assert again["blobs_uploaded"] == again["blobs"] - first["blobs"], again

    dest = open_runtime(loop, s3)
    try:
        pulled = loop.run(dest.travel.pull(chain["tag"]))
        assert pulled["created"] == [TEMPLATE, *CHAIN] and pulled["bytes_downloaded"] > 0

        async def fork_there() -> tuple[str, str]:
            [sb] = await dest.spawn(chain["tag"])
            return await what_it_sees(dest, sb.id)

        assert loop.run(fork_there()) == chain["seen"]
        assert loop.run(dest.travel.pull(chain["tag"]))["created"] == []  # already here
        with pytest.raises(NotFound, match="neither on this host nor in store"):
            loop.run(dest.travel.pull("tv-nowhere"))
    finally:
        close_runtime(loop, dest)


def test_20_concurrent_spawns_of_an_absent_tag_download_it_once(loop: Loop, source: Runtime,
                                                                chain: dict[str, Any], s3: S3Server) -> None:
    loop.run(source.travel.push(CHAIN[1]))
    dest = open_runtime(loop, s3)
    dest.travel.lazy = False  # the eager path (test_travel_lazy.py has the lazy one)
    try:
        async def twenty() -> list[Any]:
            return list(await asyncio.gather(*(dest.spawn(CHAIN[1]) for _ in range(20))))

        batches = loop.run(twenty(), timeout=900)
        stats = dest.travel.stats()
        print(f"\n20 concurrent spawns of an absent tag: {stats}")
        assert len({sb.id for batch in batches for sb in batch}) == 20
        assert stats["pulls"] == 1 and stats["manifests_downloaded"] == 1
        lineage = [TEMPLATE, CHAIN[0], CHAIN[1]]
        blobs = [p for t in lineage for p in dest.snapshots.dir(t).path.iterdir()
                 if p.name in ("mem", "state") or (p.suffix == ".qcow2" and not p.name.startswith("."))]
        # Each file of the chain came down once (the base image is this host's guest image).
        assert stats["blobs_downloaded"] == len(blobs), blobs
        assert loop.run(dest.eval(batches[7][0].id, "counter"))["result"] == "2"
    finally:
        close_runtime(loop, dest)
