"""The object store against a real S3-compatible server (moto's), and the import's host checks."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from forkd.config import DataDir
from forkd.controller.host_accel import HostAccelerator
from forkd.controller.snapshots import SnapshotStore
from forkd.controller.tags import TagReservations
from forkd.controller.travel import SnapshotTravel, qemu_release
from forkd.errors import IncompatibleSnapshot, InvalidRequest, NotFound
from forkd.host.accel import Accel
from forkd.host.shm import ShmMemory
from forkd.store import chunked, sparse
from forkd.store.manifest import Backing, BaseEntry, FileEntry, Manifest, SnapshotEntry
from forkd.store.objectstore import ObjectStore, StoreError, StoreURL
from forkd.store.registry import Registry
from forkd.vmm import disk as disk_mod
from forkd.vmm import probe
from tests.integration.services import S3Server, s3_server

MIB = 1 << 20


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    for k, v in s3.env.items():
        monkeypatch.setenv(k, v)
    return s3


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def manifest(tag: str = "t", accel: Accel | None = None,
             qemu: str = "QEMU emulator version 7.2.19") -> Manifest:
    files = (FileEntry("mem", sha("m"), 10), FileEntry("state", sha("s"), 10),
             FileEntry("disk.qcow2", sha("d"), 10, Backing(None, "", "raw")))
    return Manifest(tag, 1, "0.1.0", qemu, accel or Accel.tcg(), BaseEntry(sha("b"), 10, "raw"),
                    (SnapshotEntry(tag, None, 1, files),))


def test_store_urls() -> None:
    assert StoreURL.parse("s3://bucket/a/b/") == StoreURL("bucket", "a/b/")
    assert str(StoreURL.parse("s3://bucket")) == "s3://bucket"
    for bad in ("http://bucket/x", "s3:///x", "s3://b/../x"):
        with pytest.raises(InvalidRequest):
            StoreURL.parse(bad)


def test_blobs_go_up_once_and_come_back_sparse_and_verified(s3_env: S3Server, tmp_path: Path) -> None:
    store = ObjectStore(s3_env.url("unit"))
    src = tmp_path / "mem"
    with open(src, "wb") as f:
        f.truncate(64 * MIB)
        f.seek(10 * MIB)
        f.write(os.urandom(MIB))
    digest, index = chunked.digest(src)
    assert not store.has_blob(digest)
    sent = store.put_blob(digest, src)
    assert store.has_blob(digest) and sent < 2 * MIB  # the holes never went over the wire
    dest = tmp_path / "back"
    store.get_blob(digest, dest, index.size)
    assert chunked.digest(dest)[0] == digest and dest.read_bytes() == src.read_bytes()
    assert sparse.allocated_bytes(dest) <= 2 * MIB
    # A blob damaged in the store is caught, names its chunk, and leaves no file behind.
    key = f"unit/chunked/{digest}"
    raw = boto3.client("s3").get_object(Bucket=s3_env.bucket, Key=key)["Body"].read()
    boto3.client("s3").put_object(Bucket=s3_env.bucket, Key=key, Body=raw[:-20] + b"x" * 20)
    with pytest.raises(StoreError, match=rf"blob {digest[:12]}… is corrupt: chunk 2 \(bytes {8 * MIB}-"):
        store.get_blob(digest, tmp_path / "bad", index.size)
    assert not (tmp_path / "bad").exists()
    with pytest.raises(NotFound, match="lacks blob"):
        store.get_blob(sha("nothing"), tmp_path / "none", 10)


def test_a_large_blob_goes_up_in_parts_and_comes_down_in_parallel_ranges(s3_env: S3Server,
                                                                         tmp_path: Path) -> None:
    store = ObjectStore(s3_env.url("unit-big"))
    src = tmp_path / "mem"
    with open(src, "wb") as f:  # incompressible data: 24 MiB of frames, 3 parts of 8 MiB or more
        f.truncate(256 * MIB)
        for at in (0, 100 * MIB, 200 * MIB):
            f.seek(at)
            f.write(os.urandom(8 * MIB))
    digest, index = chunked.digest(src)
    store.put_blob(digest, src)
    assert store.stats.snapshot()["parts_uploaded"] == 3
    dest = tmp_path / "back"
    store.get_blob(digest, dest, index.size)
    assert dest.read_bytes() == src.read_bytes()
    assert store.stats.snapshot()["ranges_downloaded"] >= 3


def test_manifests_by_tag(s3_env: S3Server) -> None:
    store = ObjectStore(s3_env.url("unit-m"))
    assert store.get_manifest("t") is None
    store.put_manifest(manifest("t"))
    assert store.get_manifest("t") == manifest("t")
    assert store.list_tags() == ["t"]
    boto3.client("s3").put_object(Bucket=s3_env.bucket, Key="unit-m/snapshots/u.json", Body=b"{not json")
    with pytest.raises(StoreError, match="not valid"):
        store.get_manifest("u")


def test_a_missing_bucket_says_so(s3_env: S3Server) -> None:
    store = ObjectStore("s3://no-such-bucket/x")
    with pytest.raises(StoreError, match="does not exist"):
        store.put_manifest(manifest())


def test_a_host_that_cannot_restore_refuses_before_fetching_anything(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKD_ACCEL", "tcg")
    data = DataDir(tmp_path / "data", tmp_path / "images").ensure()
    registry = Registry(data.registry)
    tags = TagReservations(registry.snapshots.has)
    store = SnapshotStore(registry.snapshots, registry.snapshot_names,
                          data.snapshots, tags, ShmMemory(data.root))
    travel = SnapshotTravel(data, store, tags, HostAccelerator(data))
    try:
        with pytest.raises(IncompatibleSnapshot, match="taken under kvm"):
            asyncio.run(travel.plan(manifest(accel=Accel.kvm())))
        with pytest.raises(IncompatibleSnapshot, match=r"QEMU 1\.0 here"):
            asyncio.run(travel.plan(manifest(qemu="QEMU emulator version 1.0.1")))
    finally:
        registry.close()
    assert qemu_release("QEMU emulator version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u18)") == "7.2"


def test_a_host_that_has_the_base_by_digest_does_not_fetch_it(s3_env: S3Server, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A pull fetches the snapshot's own files, not the base image this host already holds
    (found by digest), and a second pull fetches nothing."""
    monkeypatch.setenv("FORKD_ACCEL", "tcg")
    files = tmp_path / "src"
    files.mkdir()
    base = files / "base.raw"
    with open(base, "wb") as f:
        f.truncate(32 * MIB)
        f.write(os.urandom(MIB))
    mem = files / "mem"
    with open(mem, "wb") as f:
        f.truncate(64 * MIB)
        f.seek(5 * MIB)
        f.write(os.urandom(2 * MIB))
    (files / "state").write_bytes(os.urandom(50_000))
    disk_mod.create_overlay(base, files / "disk.qcow2", "raw")
    shas = {p.name: chunked.digest(p)[0] for p in files.iterdir()}
    snap = SnapshotEntry("t", None, 1, (
        FileEntry("mem", shas["mem"], 64 * MIB), FileEntry("state", shas["state"], 50_000),
        FileEntry("disk.qcow2", shas["disk.qcow2"], (files / "disk.qcow2").stat().st_size,
                  Backing(None, "", "raw"))))
    m = Manifest("t", 1, "0.1.0", probe.qemu_version(), Accel.tcg(),
                 BaseEntry(shas["base.raw"], 32 * MIB, "raw"), (snap,))
    store = ObjectStore(s3_env.url("unit-base"))
    for p in files.iterdir():
        store.put_blob(shas[p.name], p)
    store.put_manifest(m)

    data = DataDir(tmp_path / "data", tmp_path / "images").ensure()
    registry = Registry(data.registry)
    tags = TagReservations(registry.snapshots.has)
    snapshots = SnapshotStore(registry.snapshots, registry.snapshot_names,
                              data.snapshots, tags, ShmMemory(data.root))
    travel = SnapshotTravel(data, snapshots, tags, HostAccelerator(data), store)
    travel.bases.mkdir(parents=True)
    shutil.copyfile(base, travel.bases / f"{shas['base.raw']}.raw")  # it travelled here before
    try:
        pulled = asyncio.run(travel.pull("t"))
        assert pulled["created"] == ["t"]
        got = store.stats.snapshot()
        assert got["blobs_downloaded"] == 3, got  # mem, state, disk: not the base
        assert (data.snapshots / "t" / "mem").read_bytes() == mem.read_bytes()
        assert asyncio.run(travel.pull("t"))["created"] == []
        assert store.stats.snapshot()["blobs_downloaded"] == 3
    finally:
        registry.close()
