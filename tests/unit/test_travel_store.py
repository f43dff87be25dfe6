"""Sparse streams, chunked blobs, manifests and pack archives: the file-level parts of snapshot
travel (no VM)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest
import zstandard

from forkd.host.accel import Accel
from forkd.store import archive, chunked, sparse
from forkd.store.manifest import BadManifest, BaseEntry, FileEntry, Manifest, SnapshotEntry

MIB = 1 << 20


def holey(path: Path, size: int, pieces: dict[int, bytes]) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
        for offset, data in pieces.items():
            f.seek(offset)
            f.write(data)
    return path


def full_sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------ sparse


def test_extents_skip_holes(tmp_path: Path) -> None:
    f = holey(tmp_path / "mem", 64 * MIB, {0: os.urandom(100_000), 40 * MIB: b"x" * 5000})
    info = sparse.inspect(f)
    assert info.size == 64 * MIB
    assert info.data_bytes < 2 * MIB  # filesystem blocks around the two pieces, not 64 MiB


# ------------------------------------------------------------------ chunked blobs


def test_the_digest_is_the_contents_not_where_the_holes_are(tmp_path: Path) -> None:
    pieces = {0: os.urandom(100_000), 40 * MIB: b"x" * 5000, 50 * MIB: bytes(3 * MIB)}
    sparse_file = holey(tmp_path / "sparse", 64 * MIB, pieces)
    dense = tmp_path / "dense"
    dense.write_bytes(sparse_file.read_bytes())  # the same content, no holes at all
    sha, index = chunked.digest(sparse_file)
    assert chunked.digest(dense)[0] == sha
    # Two chunks hold data; the written zeros at 50 MiB are absent like the holes, and only
    # the non-zero pages are data (what is hashed, sent and written).
    assert [c.index for c in index.chunks] == [0, 40 * MIB // chunked.GRID]
    assert index.data_bytes == 25 * 4096 + 2 * 4096  # 100,000 bytes on 25 pages; 5,000 on 2
    other = holey(tmp_path / "other", 64 * MIB, {**pieces, 40 * MIB: b"y" * 5000})
    assert chunked.digest(other)[0] != sha


def encoded(path: Path) -> tuple[str, chunked.ChunkIndex, bytes]:
    out = bytearray()
    index = chunked.encode(path, out.extend)
    return index.digest(), index, bytes(out)


def test_a_chunked_round_trip_restores_content_and_holes(tmp_path: Path) -> None:
    src = holey(tmp_path / "src", 32 * MIB, {MIB: os.urandom(3 * MIB), 20 * MIB: bytes(2 * MIB),
                                            31 * MIB: b"end"})
    sha, index, frames = encoded(src)
    assert sha == chunked.digest(src)[0]
    dest = tmp_path / "dest"
    reads: list[tuple[int, int]] = []

    def read(offset: int, length: int) -> bytes:
        reads.append((offset, length))
        return frames[offset: offset + length]

    again = chunked.ChunkIndex.parse(index.encode_json(), 32 * MIB)
    chunked.decode(again, sha, read, dest, read_bytes=1)  # one read per chunk
    assert dest.read_bytes() == src.read_bytes()
    assert len(reads) == len(index.chunks) == 2
    # The explicit zeros at 20 MiB came back as a hole: only the random 3 MiB are allocated.
    assert sparse.allocated_bytes(dest) <= 3 * MIB + 256 * 1024


def test_a_corrupt_chunk_or_index_fails_naming_it_and_leaves_nothing(tmp_path: Path) -> None:
    src = holey(tmp_path / "src", 16 * MIB, {0: os.urandom(MIB), 9 * MIB: os.urandom(MIB)})
    sha, index, frames = encoded(src)
    second = index.chunks[1]
    bad = bytearray(frames)
    bad[second.zoff + second.zlen // 2] ^= 1
    dest = tmp_path / "out"
    with pytest.raises(chunked.CorruptBlob, match=rf"chunk 2 \(bytes {8 * MIB}-.*of blob {sha[:12]}"):
        chunked.decode(index, sha, lambda o, n: bytes(bad[o: o + n]), dest)
    assert not dest.exists()
    # A chunk swapped for another well-formed one: it decompresses, its hash gives it away.
    first = index.chunks[0]
    swapped = chunked.ChunkIndex(index.size, index.grid, (first, chunked.Chunk(
        second.index, second.sha256, second.extents, first.zoff, first.zlen)))
    with pytest.raises(chunked.CorruptBlob, match=r"chunk 2 .* sha256 is not the manifest's"):
        chunked.decode(swapped, sha, lambda o, n: frames[o: o + n], dest)
    assert not dest.exists()
    # An index whose table is not the one the digest names is refused before any read.
    lying = chunked.ChunkIndex(index.size, index.grid, (first,))
    with pytest.raises(chunked.CorruptBlob, match="does not match its digest"):
        chunked.decode(lying, sha, lambda o, n: pytest.fail("read"), dest)
    with pytest.raises(chunked.CorruptBlob, match="truncated"):
        chunked.decode(index, sha, lambda o, n: frames[o: o + n][:-1], dest)
    assert not dest.exists()


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(size=1 << 50),
    lambda d: d.update(grid=3 * MIB),
    lambda d: d["chunks"][0][4].append([0, 10]),  # overlaps its first extent
    lambda d: d["chunks"][0][4].__setitem__(0, [0, 5 * MIB]),  # leaves its chunk
    lambda d: d["chunks"].append(d["chunks"][0]),  # out of order
    lambda d: d.update(version=2),
])
def test_a_hostile_index_is_refused(tmp_path: Path, mutate: Any) -> None:
    _, index, _ = encoded(holey(tmp_path / "src", 8 * MIB, {0: os.urandom(1000)}))
    d = index.to_json()
    mutate(d)
    with pytest.raises(chunked.CorruptBlob):
        chunked.ChunkIndex.parse(json.dumps(d).encode(), 8 * MIB)


def test_a_stream_round_trip_restores_content_and_holes(tmp_path: Path) -> None:
    src = holey(tmp_path / "src", 32 * MIB, {MIB: os.urandom(3 * MIB), 20 * MIB: bytes(2 * MIB)})
    dest = tmp_path / "dest"
    with sparse.StreamReader(src) as reader:
        info = sparse.write(reader, dest, expect_sha256=full_sha(src), max_size=src.stat().st_size)
    assert dest.read_bytes() == src.read_bytes()
    assert info.size == 32 * MIB
    # The explicit zeros at 20 MiB came back as a hole: only the random 3 MiB are allocated.
    assert sparse.allocated_bytes(dest) <= 3 * MIB + 256 * 1024


def test_a_tampered_or_truncated_stream_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    src = holey(tmp_path / "src", 4 * MIB, {0: os.urandom(MIB)})
    with sparse.StreamReader(src) as reader:
        stream = reader.read()
    bad = bytearray(stream)
    bad[-10] ^= 1
    for data, words in ((bytes(bad), "sha256"), (stream[:-100], "truncated"), (stream + b"x", "after"),
                        (b"NOT A STREAM\n", "magic")):
        dest = tmp_path / "out"
        with pytest.raises(sparse.CorruptStream, match=words):
            sparse.write(io.BytesIO(data), dest, expect_sha256=full_sha(src), max_size=4 * MIB)
        assert not dest.exists()


def test_a_stream_cannot_claim_more_than_allowed_or_overlap(tmp_path: Path) -> None:
    for header in ({"size": 10 * MIB, "extents": []}, {"size": 100, "extents": [[0, 50], [40, 10]]},
                   {"size": 100, "extents": [[90, 20]]}):
        data = sparse.MAGIC + json.dumps(header).encode() + b"\n"
        with pytest.raises(sparse.CorruptStream):
            sparse.write(io.BytesIO(data), tmp_path / "x", expect_sha256=None, max_size=MIB)


# ------------------------------------------------------------------ manifests


def entry(tag: str, shas: dict[str, str], backing: tuple[str | None, str] | None = ("", ""),
          size: int = 10) -> SnapshotEntry:
    from forkd.store.manifest import Backing

    disk_backing = Backing(None, "", "raw") if backing == ("", "") else (
        Backing(backing[0], backing[1], "qcow2") if backing else None)
    return SnapshotEntry(tag, None, 1, (FileEntry("mem", shas["mem"], size),
                                        FileEntry("state", shas["state"], size),
                                        FileEntry("disk.qcow2", shas["disk"], size, disk_backing)))


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def manifest(*snaps: SnapshotEntry) -> Manifest:
    return Manifest(snaps[-1].tag, 1, "0.1.0", "QEMU emulator version 7.2.19", Accel.tcg(),
                    BaseEntry(sha("base"), 100, "raw", {"name": "default"}), snaps)


def test_a_base_pulled_from_a_registry_travels_with_its_digest() -> None:
    m = manifest(entry("a", {"mem": sha("1"), "state": sha("2"), "disk": sha("3")}))
    d = m.to_json()
    d["base"]["image"].update(oci_digest=f"sha256:{sha('layer')}", oci_ref="docker.io/library/busybox:1")
    assert Manifest.from_json(json.loads(json.dumps(d))).base.image["oci_digest"] == f"sha256:{sha('layer')}"


def test_a_manifest_survives_json() -> None:
    m = manifest(entry("a", {"mem": sha("1"), "state": sha("2"), "disk": sha("3")}),
                 entry("b", {"mem": sha("4"), "state": sha("5"), "disk": sha("6")}, ("a", "disk.qcow2")))
    again = Manifest.from_json(json.loads(json.dumps(m.to_json())))
    assert again == m
    assert again.lineage == ["a", "b"] and again.upto("a").lineage == ["a"]
    assert set(again.blobs()) == {sha(str(i)) for i in range(1, 7)} | {sha("base")}


@pytest.mark.parametrize("mutate,words", [
    (lambda d: d["snapshots"][0]["files"].update({"../../etc/passwd": d["snapshots"][0]["files"]["mem"]}),
     "not allowed"),
    (lambda d: d["snapshots"][0]["files"]["disk.qcow2"].update(backing={"tag": "zz", "file": "disk.qcow2",
                                                                        "format": "qcow2"}),
     "not earlier in the chain"),
    (lambda d: d["snapshots"][0]["files"]["disk.qcow2"].update(backing={"tag": "a", "file": "disk.qcow2",
                                                                        "format": "qcow2"}),
     "not an older layer"),
    (lambda d: d["snapshots"][0].update(tag="../x"), "not a valid snapshot tag"),
    (lambda d: d["snapshots"][0]["files"]["mem"].update(sha256="abc"), "sha256"),
    (lambda d: d.update(version=99), "version"),
    (lambda d: d["snapshots"][0]["files"].pop("state"), "lacks state"),
    (lambda d: d.update(tag="other"), "not the last snapshot"),
    (lambda d: d["base"]["image"].update(oci_digest="sha256:../x"), "oci_digest must be sha256"),
    (lambda d: d["base"]["image"].update(oci_ref="r" * 513), "oci_ref must be a string"),
])
def test_a_bad_manifest_is_refused_with_the_reason(mutate: Any, words: str) -> None:
    d = manifest(entry("a", {"mem": sha("1"), "state": sha("2"), "disk": sha("3")})).to_json()
    mutate(d)
    with pytest.raises(BadManifest, match=words):
        Manifest.from_json(d)


# ------------------------------------------------------------------ archives


def packed(tmp_path: Path) -> tuple[Manifest, dict[str, Path]]:
    files = {n: holey(tmp_path / n, 8 * MIB, {0: os.urandom(20_000)})
             for n in ("mem", "state", "disk", "base")}
    shas = {n: chunked.digest(p)[0] for n, p in files.items()}
    m = Manifest("a", 1, "0.1.0", "QEMU emulator version 7.2.19", Accel.tcg(),
                 BaseEntry(shas["base"], 8 * MIB, "raw"), (entry("a", shas, size=8 * MIB),))
    return m, {shas[n]: p for n, p in files.items()}


def test_an_archive_round_trip_extracts_what_is_wanted(tmp_path: Path) -> None:
    m, blobs = packed(tmp_path)
    out = tmp_path / "a.forkd"
    archive.write(out, m, blobs)
    staging = tmp_path / "staging"
    staging.mkdir()
    base = m.base.sha256
    got, extracted = archive.read(out, staging, lambda manifest, omitted: set(manifest.blobs()) - {base})
    assert got == m
    assert set(extracted) == set(m.blobs()) - {base}
    for digest, path in extracted.items():
        assert path.read_bytes() == blobs[digest].read_bytes()


def test_an_archive_without_its_base_says_so(tmp_path: Path) -> None:
    m, blobs = packed(tmp_path)
    out = tmp_path / "a.forkd"
    archive.write(out, m, {k: v for k, v in blobs.items() if k != m.base.sha256}, omit={m.base.sha256})
    seen: list[set[str]] = []
    archive.read(out, tmp_path, lambda manifest, omitted: seen.append(omitted) or set())
    assert seen == [{m.base.sha256}]


def craft(tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    out = tmp_path / "crafted.forkd"
    out.write_bytes(buf.getvalue())
    return out


def member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE,
           link: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    info.linkname = link
    return info, data


@pytest.mark.parametrize("bad,kind,words", [
    (member("../../etc/cron.d/x", b"evil"), "unsafe", "unsafe path"),
    (member("/etc/passwd", b"evil"), "unsafe", "unsafe path"),
    (member("blobs/x", kind=tarfile.SYMTYPE, link="/etc/shadow"), "unsafe", "link"),
    (member("blobs/y", kind=tarfile.LNKTYPE, link="manifest.json"), "unsafe", "link"),
    (member("dev", kind=tarfile.CHRTYPE), "unsafe", "device"),
    (member("fifo", kind=tarfile.FIFOTYPE), "unsafe", "device or FIFO"),
    (member("notes.txt", b"hi"), "unsafe", "not blobs/<sha256>"),
    (member("blobs/" + "0" * 64, b"x"), "corrupt", "not named by the manifest"),
    (member("blobs/" + "0" * 64 + ".idx", b"x"), "unsafe", "not blobs/<sha256>"),
])
def test_unsafe_or_foreign_members_are_refused(tmp_path: Path, bad: tuple[tarfile.TarInfo, bytes], kind: str,
                                               words: str) -> None:
    m, _ = packed(tmp_path)
    body = json.dumps(m.to_json()).encode()
    path = craft(tmp_path, [member("manifest.json", body), bad])
    with pytest.raises(archive.ArchiveError) as err:
        archive.read(path, tmp_path, lambda manifest, omitted: set())
    assert err.value.kind == kind and words in str(err.value)
    assert not list((tmp_path).glob("../../etc/cron.d/x"))


def test_the_manifest_must_come_first_and_every_blob_must_be_there(tmp_path: Path) -> None:
    m, _ = packed(tmp_path)
    body = json.dumps(m.to_json()).encode()
    first = craft(tmp_path, [member("blobs/" + m.base.sha256, b"x"), member("manifest.json", body)])
    with pytest.raises(archive.ArchiveError, match="first member"):
        archive.read(first, tmp_path, lambda manifest, omitted: set())
    only = craft(tmp_path, [member("manifest.json", body)])
    with pytest.raises(archive.ArchiveError, match="missing"):
        archive.read(only, tmp_path, lambda manifest, omitted: set())
    garbage = tmp_path / "garbage.forkd"
    garbage.write_bytes(os.urandom(4096))
    with pytest.raises(archive.ArchiveError) as err:
        archive.read(garbage, tmp_path, lambda manifest, omitted: set())
    assert err.value.kind == "corrupt"


def test_a_refusal_from_want_stops_before_any_blob_is_written(tmp_path: Path) -> None:
    m, blobs = packed(tmp_path)
    out = tmp_path / "a.forkd"
    archive.write(out, m, blobs)
    staging = tmp_path / "staging"
    staging.mkdir()

    def refuse(manifest: Manifest, omitted: set[str]) -> set[str]:
        raise archive.ArchiveError("unsupported", "this host cannot restore it")

    with pytest.raises(archive.ArchiveError, match="cannot restore"):
        archive.read(out, staging, refuse)
    assert list(staging.iterdir()) == []


def test_a_corrupt_chunk_in_an_archive_is_named_and_nothing_is_left(tmp_path: Path) -> None:
    m, blobs = packed(tmp_path)
    out = tmp_path / "a.forkd"
    archive.write(out, m, blobs)
    mem = m.snapshots[0].file("mem").sha256
    with tarfile.open(out) as tar:
        frames = tar.getmember(f"blobs/{mem}")
    data = bytearray(out.read_bytes())
    data[frames.offset_data + frames.size // 2] ^= 0x55
    out.write_bytes(bytes(data))
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(archive.ArchiveError) as err:
        archive.read(out, staging, lambda manifest, omitted: set(manifest.blobs()))
    assert err.value.kind == "corrupt"
    assert f"chunk 0 (bytes 0-{chunked.GRID - 1}) of blob {mem[:12]}" in str(err.value)
    assert list(staging.iterdir()) == []


def test_a_format_1_archive_says_which_forkd_reads_it(tmp_path: Path) -> None:
    old = tmp_path / "old.forkd"
    tar = craft(tmp_path, [member("manifest.json", b"{}")]).read_bytes()
    old.write_bytes(zstandard.ZstdCompressor().compress(tar))
    with pytest.raises(archive.ArchiveError) as err:
        archive.read(old, tmp_path, lambda manifest, omitted: set())
    assert err.value.kind == "unsupported" and "format 1" in str(err.value)
