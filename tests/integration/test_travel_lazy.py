"""Lazy spawn of a store-only tag, with real VMs against moto's S3 server.

The chain (tv-py -> tv-b1 -> tv-b2 -> tv-b3) is test_travel.py's. A host that
lacks the tag starts its child as soon as the small parts are here; the
memory arrives through a FUSE file as the guest touches it (controller/travel.py).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import boto3
import pytest

from forkd.controller.runtime import Runtime
from forkd.errors import ForkdError
from forkd.host import fusefile
from forkd.store import restore_chunks

from .conftest import Loop, qemu_processes_of
from .services import S3Server
from .test_travel import CHAIN, chain, close_runtime, open_runtime, s3, source, what_it_sees

pytestmark = [pytest.mark.vm, pytest.mark.skipif(not fusefile.available(), reason="needs /dev/fuse")]
__all__ = ["chain", "s3", "source"]  # module fixtures shared with test_travel.py


def no_mounts_left(rt: Runtime) -> None:
    assert fusefile.mounts_under(rt.data.root) == [], "FUSE mounts left behind"


def close_clean(loop: Loop, rt: Runtime) -> None:
    root = rt.data.root
    close_runtime(loop, rt)
    assert fusefile.mounts_under(root) == [], "FUSE mounts left behind"


def copy_prefix(s3: S3Server, src: str, dst: str, corrupt: str | None = None,
                drop: str | None = None) -> None:
    """Copy the store under ``src/`` to ``dst/``; flip a byte in each frame of blob ``corrupt``
    (keeping its index), or leave blob ``drop``'s frames out (its index stays: a store that
    loses the data once the spawn has begun)."""
    client = boto3.client("s3", endpoint_url=s3.endpoint, aws_access_key_id="test",
                          aws_secret_access_key="test", region_name="us-east-1")
    import json
    for obj in client.list_objects_v2(Bucket=s3.bucket, Prefix=f"{src}/").get("Contents", []):
        key = str(obj["Key"])
        rest = key[len(src) + 1:]
        if drop is not None and rest == f"chunked/{drop}":
            continue
        body = client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
        if corrupt is not None and rest == f"chunked/{corrupt}":
            index = json.loads(client.get_object(Bucket=s3.bucket, Key=f"{key}.index")["Body"].read())
            data = bytearray(body)
            for _pos, _sha, zoff, zlen, _ext in index["chunks"]:
                data[zoff + zlen // 2] ^= 0x5A
            body = bytes(data)
        client.put_object(Bucket=s3.bucket, Key=f"{dst}/{rest}", Body=body)


def mem_sha(rt: Runtime, tag: str) -> str:
    assert rt.travel.store is not None
    manifest = rt.travel.store.get_manifest(tag)
    assert manifest is not None
    return next(f.sha256 for f in manifest.snapshot(tag).files if f.name == "mem")


def test_a_lazy_grandchild_of_a_depth_3_chain_sees_what_a_local_one_sees(
        loop: Loop, source: Runtime, chain: dict[str, Any], s3: S3Server) -> None:
    loop.run(source.travel.push(chain["tag"]))
    dest = open_runtime(loop, s3)
    try:
        async def lazily() -> tuple[tuple[str, str], dict[str, Any]]:
            [sb] = await dest.spawn(chain["tag"])
            seen = await what_it_sees(dest, sb.id)
            return seen, dest.travel.lazily.stats()

        seen, stats = loop.run(lazily(), timeout=600)
        print(f"\nlazy spawn of {chain['tag']}: {stats.get(chain['tag'])}")
        assert seen == chain["seen"]
        assert dest.travel.lazily.count == 1
        loop.run(dest.travel.lazily.wait(chain["tag"], timeout=600))
        mem = dest.snapshots.dir(chain["tag"]).mem
        assert mem.is_file() and not mem.is_symlink()  # an ordinary local snapshot now

        async def again() -> tuple[str, str]:
            [sb] = await dest.spawn(chain["tag"])
            return await what_it_sees(dest, sb.id)

        assert loop.run(again(), timeout=600) == chain["seen"]
        lazy = dest.travel.lazily.stats().get(chain["tag"])
        if lazy is not None:  # (gone once the first child's mapping went)
            assert set(lazy["fetched_by_chunk"].values()) == {1}
    finally:
        close_clean(loop, dest)


def test_concurrent_lazy_spawns_make_one_get_per_chunk(loop: Loop, source: Runtime, chain: dict[str, Any],
                                                       s3: S3Server) -> None:
    n = 20
    loop.run(source.travel.push(CHAIN[1]))
    dest = open_runtime(loop, s3)
    try:
        async def many() -> list[Any]:
            return list(await asyncio.gather(*(dest.spawn(CHAIN[1]) for _ in range(n))))

        batches = loop.run(many(), timeout=900)
        stats = dest.travel.lazily.stats()[CHAIN[1]]
        print(f"\n{n} concurrent lazy spawns: {stats['gets']} GETs of {stats['chunks']} chunks, "
              f"{stats['bytes_fetched'] / 2**20:.1f} MiB; {dest.travel.stats()}")
        assert len({sb.id for batch in batches for sb in batch}) == n
        assert dest.travel.lazily.count == 1 and dest.travel.stats()["manifests_downloaded"] == 1
        assert loop.run(dest.eval(batches[7][0].id, "counter"))["result"] == "2"
        loop.run(dest.travel.lazily.wait(CHAIN[1], timeout=600))
        stats = dest.travel.lazily.stats().get(CHAIN[1], stats)
        assert set(stats["fetched_by_chunk"].values()) == {1}, stats  # one GET per chunk
    finally:
        close_clean(loop, dest)


def test_a_corrupt_chunk_fails_the_lazy_spawn_naming_it(loop: Loop, source: Runtime, chain: dict[str, Any],
                                                        s3: S3Server) -> None:
    loop.run(source.travel.push(CHAIN[0]))
    copy_prefix(s3, "tv", "tvbad", corrupt=mem_sha(source, CHAIN[0]))
    dest = open_runtime(loop, s3, "tvbad")
    try:
        with pytest.raises(ForkdError, match=r"chunk \d+ \(bytes \d+-\d+\) of blob") as err:
            loop.run(dest.spawn(CHAIN[0]), timeout=600)
        print(f"\ncorrupt chunk: {err.value}")
        assert not qemu_processes_of(dest.data.root)
        assert not dest.list_sandboxes()
    finally:
        close_clean(loop, dest)


def test_a_store_that_loses_the_memory_fails_the_spawn_cleanly(loop: Loop, source: Runtime,
                                                               chain: dict[str, Any], s3: S3Server) -> None:
    loop.run(source.travel.push(CHAIN[0]))
    copy_prefix(s3, "tv", "tvgone", drop=mem_sha(source, CHAIN[0]))
    dest = open_runtime(loop, s3, "tvgone")
    try:
        with pytest.raises(ForkdError) as err:
            loop.run(dest.spawn(CHAIN[0]), timeout=600)
        print(f"\nstore lost the memory: {err.value}")
        with pytest.raises(ForkdError, match="could not be had"):  # the cleanup runs in the background
            loop.run(dest.travel.lazily.wait(CHAIN[0], timeout=60))
        assert not qemu_processes_of(dest.data.root)
        assert not dest.list_sandboxes()
        assert CHAIN[0] not in [r.tag for r in dest.list_snapshots()]  # removed, not left half-here
        no_mounts_left(dest)
    finally:
        close_clean(loop, dest)


def test_a_pushed_snapshot_carries_the_chunks_a_restore_touched_and_a_lazy_fill_fetches_them_first(
        loop: Loop, source: Runtime, chain: dict[str, Any], s3: S3Server) -> None:
    # The chain fixture restored a child of CHAIN[1] on the source (to branch CHAIN[2] from it):
    # that first restore recorded which chunks of CHAIN[1]'s mem it touched.
    recorded_file = source.snapshots.dir(CHAIN[1]).path / restore_chunks.FILE
    assert recorded_file.is_file()
    loop.run(source.travel.push(CHAIN[1]))
    assert source.travel.store is not None
    manifest = source.travel.store.get_manifest(CHAIN[1])
    assert manifest is not None
    recorded = manifest.snapshot(CHAIN[1]).restore_chunks
    assert recorded and list(recorded) == json.loads(recorded_file.read_text())["chunks"]
    dest = open_runtime(loop, s3)
    try:
        async def lazily() -> dict[str, Any]:
            [sb] = await dest.spawn(CHAIN[1])
            assert (await dest.eval(sb.id, "counter"))["result"] == "2"
            return dict(dest.travel.lazily.stats()[CHAIN[1]])

        stats = loop.run(lazily(), timeout=600)
        loop.run(dest.travel.lazily.wait(CHAIN[1], timeout=600))
        stats = dest.travel.lazily.stats().get(CHAIN[1], stats)
        present = set(stats["fetched_by_chunk"])
        first = [p for p in recorded if p in present or p in stats["fill_first"]]
        # The fill was told to take the recorded chunks (those with data) before the rest...
        assert stats["fill_first"] == first, stats
        # ... and they arrived early: on average before the chunks no restore touched.
        landed = stats["landed"]
        at = {p: i for i, p in enumerate(landed)}
        hot = [at[p] for p in first if p in at]
        cold = [i for p, i in at.items() if p not in set(first)]
        print(f"\nrecorded {len(recorded)} chunk(s); {stats['chunks']} present; landing order: {landed}")
        assert len(hot) == len(first) and set(stats["fetched_by_chunk"].values()) == {1}
        if cold:
            assert sum(hot) / len(hot) < sum(cold) / len(cold), landed
    finally:
        close_clean(loop, dest)
