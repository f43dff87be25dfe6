"""The pack archive: one zstd-compressed tar holding a manifest and the blobs it names.

Layout, in this order::

    manifest.json          the Manifest (store/manifest.py)
    blobs/<sha256>         one sparse stream (store/sparse.py) per distinct file content

The zstd frame carries a checksum, so a flipped bit anywhere fails the
decompression; each blob is checked against its sha256 while it is written
out; the manifest comes first, so a host that cannot restore the snapshot
refuses before anything is extracted.

Reading trusts nothing: a member that is not ``manifest.json`` or
``blobs/<64 hex>`` (an absolute path, ``..``, anything else) is an unsafe path;
symlinks, hard links, devices, FIFOs and directories are refused; every blob
must be one the manifest names, at most once. Nothing from the archive is used
as a path: blobs land in a staging directory under their verified digest.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO

import zstandard

from forkd.errors import InvalidRequest
from forkd.store import sparse
from forkd.store.manifest import Manifest

MANIFEST = "manifest.json"
BLOB_RE = re.compile(r"^blobs/([0-9a-f]{64})$")
MAX_MANIFEST_BYTES = 16 << 20
OMITTED = "FORKD.omitted"
ZSTD_LEVEL = 3

Progress = Callable[[int], None]  # bytes of file data done so far


class ArchiveError(InvalidRequest):
    """An archive forkd refuses; ``kind`` says which: corrupt, unsafe or unsupported."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind} archive: {message}")
        self.kind = kind


def write(out: Path, manifest: Manifest, blobs: dict[str, Path], progress: Progress | None = None,
          omit: set[str] | None = None) -> int:
    """Write the archive to ``out`` (a new file, 0600: it holds guest memory); returns its size.
    ``blobs``: sha256 -> file.

    ``omit``: blobs left out on purpose (the base image, for a host known to have
    it); the manifest member's ``FORKD.omitted`` header names them.
    """
    omit = omit or set()
    missing = set(manifest.blobs()) - set(blobs) - omit
    if missing:
        raise ValueError(f"no file for blobs {sorted(missing)[:3]}")
    cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True, threads=-1)
    done = 0
    with open(out, "xb", opener=sparse.private_opener) as raw, cctx.stream_writer(raw, closefd=False) as z, \
            tarfile.open(fileobj=z, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        body = json.dumps(manifest.to_json(), indent=1).encode()
        _add(tar, MANIFEST, len(body), io.BytesIO(body), {OMITTED: ",".join(sorted(omit))} if omit else None)
        for sha in sorted(set(manifest.blobs()) - omit):
            with sparse.StreamReader(blobs[sha]) as reader:
                _add(tar, f"blobs/{sha}", reader.info.stream_bytes, reader)
                done += reader.info.data_bytes
            if progress:
                progress(done)
    return out.stat().st_size


def _add(tar: tarfile.TarFile, name: str, size: int, fileobj: IO[bytes] | sparse.StreamReader,
         pax: dict[str, str] | None = None) -> None:
    info = tarfile.TarInfo(name)
    if pax:
        info.pax_headers = pax
    info.size = size
    info.mode = 0o600
    info.mtime = int(time.time())
    tar.addfile(info, fileobj)


def read(path: Path, staging: Path, want: Callable[[Manifest, set[str]], Iterable[str]],
         progress: Progress | None = None) -> tuple[Manifest, dict[str, Path]]:
    """Verify the whole archive; extract the blobs ``want(manifest)`` names into ``staging``.

    ``want(manifest, omitted)`` runs once the manifest is read (``omitted``: the
    blobs the archive was packed without) and may raise to refuse the archive
    (e.g. a host that cannot restore it) before anything is extracted. Blobs
    not wanted are still decompressed and hashed: every byte is verified.
    Returns the manifest and sha256 -> extracted file.
    """
    try:
        return _read(path, staging, want, progress)
    except zstandard.ZstdError as exc:
        raise ArchiveError("corrupt", f"{path}: zstd: {exc}") from None
    except tarfile.TarError as exc:
        raise ArchiveError("corrupt", f"{path}: tar: {exc}") from None
    except sparse.CorruptStream as exc:
        raise ArchiveError("corrupt", f"{path}: {exc}") from None
    except EOFError as exc:
        raise ArchiveError("corrupt", f"{path}: truncated ({exc})") from None


def _read(path: Path, staging: Path, want: Callable[[Manifest, set[str]], Iterable[str]],
          progress: Progress | None) -> tuple[Manifest, dict[str, Path]]:
    dctx = zstandard.ZstdDecompressor()
    manifest: Manifest | None = None
    wanted: set[str] = set()
    omitted: set[str] = set()
    seen: dict[str, Path | None] = {}
    done = 0
    with open(path, "rb") as raw, dctx.stream_reader(raw, read_across_frames=True) as z, \
            tarfile.open(fileobj=z, mode="r|") as tar:
        for member in tar:
            _check_member(member)
            if manifest is None:
                if member.name != MANIFEST:
                    raise ArchiveError("corrupt", f"the first member is {member.name!r}, not {MANIFEST}")
                manifest = _read_manifest(tar, member)
                omitted = _omitted(member, manifest)
                wanted = set(want(manifest, omitted))
                if wanted & omitted:
                    raise ArchiveError("corrupt", "the archive was packed without blobs this host needs")
                continue
            m = BLOB_RE.match(member.name)
            if m is None:
                raise ArchiveError("unsafe", f"member {member.name!r} is not blobs/<sha256> (unsafe path)")
            sha = m.group(1)
            sizes = manifest.blobs()
            if sha not in sizes:
                raise ArchiveError("corrupt", f"blob {sha[:12]}… is not named by the manifest")
            if sha in seen:
                raise ArchiveError("corrupt", f"blob {sha[:12]}… appears twice")
            src = tar.extractfile(member)
            assert src is not None  # a regular file (checked above)
            dest = staging / sha if sha in wanted else None
            info = _verify_blob(src, dest, sha, sizes[sha])
            seen[sha] = dest
            done += info.data_bytes
            if progress:
                progress(done)
    if manifest is None:
        raise ArchiveError("corrupt", f"{path} holds no {MANIFEST}")
    absent = sorted(set(manifest.blobs()) - set(seen) - omitted)
    if absent:
        raise ArchiveError("corrupt", f"{len(absent)} blob(s) the manifest names are missing, "
                                      f"e.g. {absent[0][:12]}… (truncated archive?)")
    return manifest, {sha: p for sha, p in seen.items() if p is not None}


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
        data = json.loads(f.read())
    except ValueError as exc:
        raise ArchiveError("corrupt", f"{MANIFEST} is not JSON: {exc}") from None
    try:
        return Manifest.from_json(data)
    except InvalidRequest as exc:
        raise ArchiveError("unsupported" if "version" in str(exc) else "corrupt", str(exc)) from None


def _verify_blob(src: IO[bytes], dest: Path | None, sha: str, size: int) -> sparse.SparseInfo:
    try:
        return sparse.write(src, dest, expect_sha256=sha, max_size=size)
    except sparse.CorruptStream as exc:
        raise ArchiveError("corrupt", f"blob {sha[:12]}…: {exc}") from None


__all__ = ["ArchiveError", "read", "write"]
