"""The pack archive: a tar holding a manifest and the blobs it names, each a chunked blob.

Layout (format 2), in this order::

    manifest.json              the Manifest (store/manifest.py)
    blobs/<digest>             a chunked blob's frames (store/chunked.py) ...
    blobs/<digest>.index       ... and its chunk index, for every distinct file content

The tar itself is not compressed: each chunk is its own zstd frame, so the
reader finds a blob by its member's offset and decompresses, hashes and writes
its chunks in parallel, straight into the destination file (format 1 was one
zstd stream over the whole tar: one core, every byte in order, a hash over
every hole). Each chunk is checked against its digest before it is written,
and the index against the digest the manifest names; the manifest comes
first, so a host that cannot restore the snapshot refuses before anything is
extracted. Blobs this host does not want (a base image it has, found by
digest) are not read at all.

Reading trusts nothing: a member that is not ``manifest.json``,
``blobs/<64 hex>`` or ``blobs/<64 hex>.index`` (an absolute path, ``..``,
anything else) is an unsafe path; symlinks, hard links, devices, FIFOs and
directories are refused; every blob must be one the manifest names, at most
once. Nothing from the archive is used as a path: blobs land in a staging
directory under their verified digest.
"""

from __future__ import annotations

import json
import os
import re
import tarfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Literal

import zstandard

from forkd import bounds, jsondepth
from forkd.errors import InvalidRequest
from forkd.store import chunked, sparse
from forkd.store.manifest import Manifest, UnsupportedManifest

MANIFEST = "manifest.json"
BLOB_RE = re.compile(r"^blobs/([0-9a-f]{64})(\.index)?$")
MAX_MANIFEST_BYTES = 16 << 20
OMITTED = "FORKD.omitted"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # format 1 archives were one zstd stream

Progress = Callable[[int], None]  # bytes of file data done so far


class ArchiveError(InvalidRequest):
    """An archive forkd refuses; ``kind`` says which: corrupt, unsafe or unsupported."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind} archive: {message}")
        self.kind = kind


def write(out: Path, manifest: Manifest, blobs: dict[str, Path], progress: Progress | None = None,
          omit: set[str] | None = None) -> int:
    """Write the archive to ``out`` (a new file, 0600: it holds guest memory); returns its size.
    ``blobs``: digest -> file.

    ``omit``: blobs left out on purpose (the base image, for a host known to have
    it); the manifest member's ``FORKD.omitted`` header names them.
    """
    omit = omit or set()
    missing = set(manifest.blobs()) - set(blobs) - omit
    if missing:
        raise ValueError(f"no file for blobs {sorted(missing)[:3]}")
    done = 0
    with open(out, "xb", opener=sparse.private_opener) as f:
        body = json.dumps(manifest.to_json(), indent=1).encode()
        _add(f, MANIFEST, body, {OMITTED: ",".join(sorted(omit))} if omit else None)
        for sha in sorted(set(manifest.blobs()) - omit):
            index = _add_frames(f, f"blobs/{sha}", blobs[sha], sha)
            _add(f, f"blobs/{sha}.index", index.encode_json())
            done += index.data_bytes
            if progress:
                progress(done)
        f.write(bytes(2 * tarfile.BLOCKSIZE))  # the end-of-archive marker
        return f.tell()


def _header(name: str, size: int, fmt: Literal[0, 1, 2], pax: dict[str, str] | None = None) -> bytes:
    info = tarfile.TarInfo(name)
    if pax:
        info.pax_headers = pax
    info.size = size
    info.mode = 0o600
    info.mtime = int(time.time())
    return info.tobuf(fmt, "utf-8", "surrogateescape")


def _pad(f: IO[bytes], size: int) -> None:
    f.write(bytes(-size % tarfile.BLOCKSIZE))


def _add(f: IO[bytes], name: str, data: bytes, pax: dict[str, str] | None = None) -> None:
    f.write(_header(name, len(data), tarfile.PAX_FORMAT, pax))
    f.write(data)
    _pad(f, len(data))


def _add_frames(f: IO[bytes], name: str, path: Path, sha: str) -> chunked.ChunkIndex:
    """A member of frames written as they are made: its header (one GNU block, whatever the
    size) goes in once the size is known, so nothing is compressed twice or held in memory."""
    start = f.tell()
    f.write(bytes(tarfile.BLOCKSIZE))
    index = chunked.encode(path, f.write, expect=sha)
    end = f.tell()
    header = _header(name, end - start - tarfile.BLOCKSIZE, tarfile.GNU_FORMAT)
    assert len(header) == tarfile.BLOCKSIZE  # a 70-character name: no long-name block
    f.seek(start)
    f.write(header)
    f.seek(end)
    _pad(f, end - start - tarfile.BLOCKSIZE)
    return index


def read(path: Path, staging: Path, want: Callable[[Manifest, set[str]], Iterable[str]],
         progress: Progress | None = None) -> tuple[Manifest, dict[str, Path]]:
    """Check the archive's structure; extract, verified, the blobs ``want(manifest)`` names into
    ``staging``.

    ``want(manifest, omitted)`` runs once the manifest is read (``omitted``: the
    blobs the archive was packed without) and may raise to refuse the archive
    (e.g. a host that cannot restore it) before anything is extracted. Blobs
    not wanted are not read. Returns the manifest and digest -> extracted file.
    """
    try:
        return _read(path, staging, want, progress)
    except tarfile.TarError as exc:
        raise ArchiveError("corrupt", f"{path}: tar: {exc}") from None
    except chunked.CorruptBlob as exc:
        raise ArchiveError("corrupt", f"{path}: {exc}") from None
    except EOFError as exc:
        raise ArchiveError("corrupt", f"{path}: truncated ({exc})") from None


def _read(path: Path, staging: Path, want: Callable[[Manifest, set[str]], Iterable[str]],
          progress: Progress | None) -> tuple[Manifest, dict[str, Path]]:
    with open(path, "rb") as f:
        if _format_1(f):
            raise ArchiveError("unsupported", f"{path} is a format 1 archive (one zstd stream) from an older "
                                              "forkd; unpack it with that forkd, or pack the snapshot again")
        f.seek(0)
        with tarfile.open(fileobj=f, mode="r:") as tar:
            first = tar.next()
            if first is None:
                raise ArchiveError("corrupt", f"{path} holds no {MANIFEST}")
            _check_member(first)
            if first.name != MANIFEST:
                raise ArchiveError("corrupt", f"the first member is {first.name!r}, not {MANIFEST}")
            manifest = _read_manifest(tar, first)
            omitted = _omitted(first, manifest)
            wanted = set(want(manifest, omitted))
            if wanted & omitted:
                raise ArchiveError("corrupt", "the archive was packed without blobs this host needs")
            frames, indexes = _members(tar, manifest)
            absent = sorted((set(manifest.blobs()) - omitted) - (set(frames) & set(indexes)))
            if absent:
                raise ArchiveError("corrupt", f"{len(absent)} blob(s) the manifest names are missing, "
                                              f"e.g. {absent[0][:12]}… (truncated archive?)")
            sizes = manifest.blobs()
            extracted: dict[str, Path] = {}
            done = 0
            try:
                for sha in sorted(wanted):
                    extracted[sha] = staging / sha
                    done += _extract(f, frames[sha], indexes[sha], sha, sizes[sha], extracted[sha])
                    if progress:
                        progress(done)
            except BaseException:
                for p in extracted.values():
                    p.unlink(missing_ok=True)
                raise
    return manifest, extracted


def _format_1(f: IO[bytes]) -> bool:
    """Whether ``f`` is a format 1 archive: a zstd stream whose first member is the manifest."""
    if f.read(4) != ZSTD_MAGIC:
        return False
    f.seek(0)
    try:
        with zstandard.ZstdDecompressor().stream_reader(f, closefd=False) as z:
            head = z.read(tarfile.BLOCKSIZE)
        return tarfile.TarInfo.frombuf(head, "utf-8", "surrogateescape").name in (MANIFEST, "././@PaxHeader")
    except (zstandard.ZstdError, tarfile.TarError):
        return False


def _members(tar: tarfile.TarFile, manifest: Manifest) -> tuple[dict[str, tarfile.TarInfo],
                                                                 dict[str, tarfile.TarInfo]]:
    """Every member after the manifest (headers only: a seekable tar skips over the data)."""
    frames: dict[str, tarfile.TarInfo] = {}
    indexes: dict[str, tarfile.TarInfo] = {}
    sizes = manifest.blobs()
    while (member := tar.next()) is not None:  # iterating would start again at the manifest
        _check_member(member)
        m = BLOB_RE.match(member.name)
        if m is None:
            raise ArchiveError("unsafe", f"member {member.name!r} is not blobs/<sha256> (unsafe path)")
        sha = m.group(1)
        if sha not in sizes:
            raise ArchiveError("corrupt", f"blob {sha[:12]}… is not named by the manifest")
        into = indexes if m.group(2) else frames
        if sha in into:
            raise ArchiveError("corrupt", f"blob {sha[:12]}… appears twice")
        into[sha] = member
    return frames, indexes


def _extract(f: IO[bytes], frames: tarfile.TarInfo, index_member: tarfile.TarInfo, sha: str, size: int,
             dest: Path) -> int:
    """Decode one blob into ``dest``; returns its bytes of data."""
    if index_member.size > chunked.MAX_INDEX_BYTES:
        raise ArchiveError("corrupt", f"the index of blob {sha[:12]}… is {index_member.size} bytes")
    fd = f.fileno()
    index = chunked.ChunkIndex.parse(os.pread(fd, index_member.size, index_member.offset_data), size)
    if index.stored_bytes > frames.size or any(c.zoff + c.zlen > frames.size for c in index.chunks):
        raise ArchiveError("corrupt", f"the index of blob {sha[:12]}… points past its frames")

    def read(offset: int, length: int) -> bytes:
        return os.pread(fd, length, frames.offset_data + offset)

    chunked.decode(index, sha, read, dest)
    return index.data_bytes


def _check_member(member: tarfile.TarInfo) -> None:
    name = member.name
    if name.startswith("/") or ".." in name.split("/") or "\\" in name:
        raise ArchiveError("unsafe", f"member {name!r} has an unsafe path (absolute or '..')")
    if member.issym() or member.islnk():
        raise ArchiveError("unsafe", f"member {name!r} is a link; archives hold regular files only")
    if member.isdev() or member.isfifo():
        raise ArchiveError("unsafe", f"member {name!r} is a device or FIFO; archives hold regular files only")
    if not member.isfile():
        raise ArchiveError("unsafe", f"member {name!r} is not a regular file")


def _omitted(member: tarfile.TarInfo, manifest: Manifest) -> set[str]:
    raw = member.pax_headers.get(OMITTED, "")
    omitted = {s for s in raw.split(",") if s}
    if not omitted <= set(manifest.blobs()):
        raise ArchiveError("corrupt", f"{OMITTED} names blobs the manifest does not")
    return omitted


def _read_manifest(tar: tarfile.TarFile, member: tarfile.TarInfo) -> Manifest:
    if member.size > MAX_MANIFEST_BYTES:
        raise ArchiveError("corrupt", f"{MANIFEST} is {member.size} bytes (at most {MAX_MANIFEST_BYTES})")
    f = tar.extractfile(member)
    assert f is not None
    try:
        data = jsondepth.loads(f.read(), bounds.MAX_JSON_DEPTH)
    except ValueError as exc:
        raise ArchiveError("corrupt", f"{MANIFEST} is not JSON: {exc}") from None
    try:
        return Manifest.from_json(data)
    except InvalidRequest as exc:
        kind = "unsupported" if isinstance(exc, UnsupportedManifest) else "corrupt"
        raise ArchiveError(kind, str(exc)) from None


__all__ = ["ArchiveError", "read", "write"]
