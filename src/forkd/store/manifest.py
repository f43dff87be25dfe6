"""The manifest of a travelling snapshot: what a pack archive and the object store carry.

A manifest names a snapshot (``tag``), the chain of snapshots its disk needs
(``snapshots``, oldest first: its lineage), every file of each by digest
(store/chunked.py; the field keeps its name ``sha256``) and size, how the disk
layers stack (``backing``), the base image at the bottom of the chain, and
what the host that made it ran (QEMU version, accelerator and CPU model).
Files are referred to by content, so a blob shared by several snapshots (a
base image, a parent's disk) travels and is stored once.

:func:`Manifest.from_json` trusts nothing: an archive or a bucket may be
hostile. Names come from a fixed allow-list (never used as paths as given),
tags and digests are pattern-checked, sizes bounded, and every backing
reference must point down the chain.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from forkd import bounds
from forkd.errors import InvalidRequest
from forkd.host.accel import KNOWN_CPUS, Accel
from forkd.store import snapshot_meta
from forkd.store.chunked import GRID

FORMAT = "forkd-snapshot"
# 2: files are named by their chunked digest (store/chunked.py), no longer by the sha256 of
# their whole logical content (which meant hashing every hole).
VERSION = 2
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
# The files of a snapshot that travel (snapshot.json travels as ``meta``).
FILE_RE = re.compile(r"^(mem|state|disk\.qcow2|layer-[0-9]{1,4}\.qcow2)$")
REQUIRED_FILES = ("mem", "state", "disk.qcow2")
DISK_FORMATS = ("raw", "qcow2")
MAX_SNAPSHOTS = 256
MAX_FILES_PER_SNAPSHOT = 64
MAX_FILE_BYTES = 1 << 40  # 1 TiB: above any RAM (bounds.MEM_MIB) or image size forkd makes


class BadManifest(InvalidRequest):
    """A manifest that does not parse or does not hold together; the message says where."""


class UnsupportedManifest(BadManifest):
    """A manifest of another format version: another forkd's, not a damaged one."""


@dataclass(frozen=True)
class Backing:
    """What a disk layer sits on: a file of a snapshot in the chain, or (``tag`` None) the base."""

    tag: str | None
    file: str
    format: str

    def to_json(self) -> dict[str, Any]:
        return {"tag": self.tag, "file": self.file, "format": self.format}


@dataclass(frozen=True)
class FileEntry:
    name: str
    sha256: str
    size: int
    backing: Backing | None = None

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "size": self.size,
                "backing": self.backing.to_json() if self.backing else None}


@dataclass(frozen=True)
class SnapshotEntry:
    tag: str
    parent_tag: str | None
    created_at_unix: int
    files: tuple[FileEntry, ...]
    meta: dict[str, Any] = field(default_factory=dict)  # its snapshot.json
    record: dict[str, Any] = field(default_factory=dict)  # branched_from, pause_ms, mode
    # The GRID chunks of ``mem`` a restore touched on the host that made it (fetched first by a
    # lazy import); empty when none was recorded.
    restore_chunks: tuple[int, ...] = ()

    def file(self, name: str) -> FileEntry:
        for f in self.files:
            if f.name == name:
                return f
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {"tag": self.tag, "parent_tag": self.parent_tag, "created_at_unix": self.created_at_unix,
                "files": {f.name: f.to_json() for f in self.files}, "meta": self.meta,
                "record": self.record,
                **({"restore_chunks": list(self.restore_chunks)} if self.restore_chunks else {})}


@dataclass(frozen=True)
class BaseEntry:
    """The image the bottom disk layer sits on (a guest image's root filesystem)."""

    sha256: str
    size: int
    format: str
    image: dict[str, Any] = field(default_factory=dict)  # name, key, kernel_version, recipe

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "size": self.size, "format": self.format, "image": self.image}


@dataclass(frozen=True)
class Manifest:
    tag: str
    created_at_unix: int
    forkd_version: str
    qemu_version: str
    accel: Accel
    base: BaseEntry
    snapshots: tuple[SnapshotEntry, ...]

    @property
    def lineage(self) -> list[str]:
        return [s.tag for s in self.snapshots]

    def snapshot(self, tag: str) -> SnapshotEntry:
        for s in self.snapshots:
            if s.tag == tag:
                return s
        raise KeyError(tag)

    def blobs(self) -> dict[str, int]:
        """Every blob the chain needs, sha256 -> logical size (the base included)."""
        out = {self.base.sha256: self.base.size}
        for s in self.snapshots:
            for f in s.files:
                out[f.sha256] = f.size
        return out

    def upto(self, tag: str) -> Manifest:
        """The manifest of ``tag``, an ancestor in this chain: the chain cut after it."""
        i = self.lineage.index(tag)
        return Manifest(tag, self.created_at_unix, self.forkd_version, self.qemu_version, self.accel,
                        self.base, self.snapshots[: i + 1])

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "tag": self.tag,
                "created_at_unix": self.created_at_unix, "forkd_version": self.forkd_version,
                "qemu_version": self.qemu_version,
                "accel": {"name": self.accel.name, "cpu": self.accel.cpu},
                "base": self.base.to_json(), "lineage": self.lineage,
                "snapshots": [s.to_json() for s in self.snapshots]}

    @classmethod
    def from_json(cls, d: Any) -> Manifest:
        try:
            return _parse(d)
        except BadManifest:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BadManifest(f"manifest is malformed ({type(exc).__name__}: {exc})") from None


def _str(d: dict[str, Any], key: str, limit: int = 1024) -> str:
    v = d[key]
    if not isinstance(v, str) or len(v) > limit:
        raise BadManifest(f"manifest field {key!r} must be a string of at most {limit} characters")
    return v


def _int(v: Any, what: str, high: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= high:
        raise BadManifest(f"manifest {what} must be an integer between 0 and {high}")
    return v


def _tag(v: Any, what: str) -> str:
    if not isinstance(v, str) or not bounds.TAG_RE.match(v):
        raise BadManifest(f"manifest {what} {v!r} is not a valid snapshot tag")
    return v


def _sha(v: Any, what: str) -> str:
    if not isinstance(v, str) or not SHA256_RE.match(v):
        raise BadManifest(f"manifest {what} is not a sha256 hex digest")
    return v


def _parse(d: Any) -> Manifest:
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise BadManifest(f"not a forkd snapshot manifest (format must be {FORMAT!r})")
    if d.get("version") != VERSION:
        raise UnsupportedManifest(f"manifest version {d.get('version')!r} is not supported (this forkd reads "
                          f"version {VERSION}); unpack it with the forkd that packed it")
    accel = d["accel"]
    base_d = d["base"]
    fmt = base_d["format"]
    if fmt not in DISK_FORMATS:
        raise BadManifest(f"manifest base format {fmt!r} is not one of {DISK_FORMATS}")
    image = base_d.get("image") or {}
    # What the base was built from (name, key, kernel version, recipe): informational, but its name
    # and key are compared with this host's images, so they are short strings.
    if not isinstance(image, dict) or len(image) > 16 or \
            not all(isinstance(image.get(k), (str, type(None))) and len(image.get(k) or "") <= 128
                    for k in ("name", "key", "kernel_version")):
        raise BadManifest("manifest base image must be an object whose name, key and kernel_version are "
                          "strings of at most 128 characters")
    # A base converted from a registry's image names it by digest (and reference).
    digest, ref = image.get("oci_digest"), image.get("oci_ref")
    if digest is not None and not (isinstance(digest, str) and re.fullmatch(r"sha256:[0-9a-f]{64}", digest)):
        raise BadManifest("manifest base image's oci_digest must be sha256:<64 hex digits>")
    if ref is not None and not (isinstance(ref, str) and len(ref) <= 512):
        raise BadManifest("manifest base image's oci_ref must be a string of at most 512 characters")
    base = BaseEntry(_sha(base_d["sha256"], "base sha256"), _int(base_d["size"], "base size", MAX_FILE_BYTES),
                     fmt, image)
    raw_snaps = d["snapshots"]
    if not isinstance(raw_snaps, list) or not 1 <= len(raw_snaps) <= MAX_SNAPSHOTS:
        raise BadManifest(f"manifest must list 1 to {MAX_SNAPSHOTS} snapshots")
    snaps: list[SnapshotEntry] = []
    for raw in raw_snaps:
        snaps.append(_parse_snapshot(raw, snaps))
    tag = _tag(d["tag"], "tag")
    if snaps[-1].tag != tag:
        raise BadManifest(f"manifest tag {tag!r} is not the last snapshot of its chain")
    if d.get("lineage") not in (None, [s.tag for s in snaps]):
        raise BadManifest("manifest lineage does not match its snapshots")
    accel_name, accel_cpu = _str(accel, "name", 16), _str(accel, "cpu", 256)
    if KNOWN_CPUS.get(accel_name) != accel_cpu:
        raise BadManifest(f"manifest accel {accel_name!r} (cpu {accel_cpu!r}) is not one forkd runs "
                          "guests with")
    return Manifest(tag, _int(d["created_at_unix"], "created_at_unix", 1 << 40),
                    _str(d, "forkd_version", 64), _str(d, "qemu_version", 256),
                    Accel(accel_name, accel_cpu), base, tuple(snaps))


def _parse_snapshot(raw: Any, earlier: list[SnapshotEntry]) -> SnapshotEntry:
    tag = _tag(raw["tag"], "snapshot tag")
    if any(s.tag == tag for s in earlier):
        raise BadManifest(f"manifest lists snapshot {tag!r} twice")
    parent = raw.get("parent_tag")
    if parent is not None:
        _tag(parent, f"parent of {tag!r}")
    files_d = raw["files"]
    if not isinstance(files_d, dict) or len(files_d) > MAX_FILES_PER_SNAPSHOT:
        raise BadManifest(f"snapshot {tag!r}: files must be an object of at most {MAX_FILES_PER_SNAPSHOT}")
    files = []
    for name, f in files_d.items():
        if not isinstance(name, str) or not FILE_RE.match(name):
            raise BadManifest(f"snapshot {tag!r}: file name {name!r} is not allowed (unsafe path?)")
        backing = _parse_backing(f.get("backing"), tag, name, earlier, set(files_d))
        files.append(FileEntry(name, _sha(f["sha256"], f"{tag}/{name} sha256"),
                               _int(f["size"], f"{tag}/{name} size", MAX_FILE_BYTES), backing))
    missing = [n for n in REQUIRED_FILES if n not in files_d]
    if missing:
        raise BadManifest(f"snapshot {tag!r} lacks {', '.join(missing)}")
    # Its snapshot.json and record are checked field by field like any (store/snapshot_meta.py).
    try:
        meta = snapshot_meta.check(raw.get("meta"), f"snapshot {tag!r} meta")
        record = snapshot_meta.check_record(raw.get("record") or {}, f"snapshot {tag!r} record")
    except snapshot_meta.BadMeta as exc:
        raise BadManifest(str(exc)) from None
    mem_size = next(f.size for f in files if f.name == "mem")
    chunks = parse_restore_chunks(raw.get("restore_chunks"), mem_size, f"snapshot {tag!r}")
    return SnapshotEntry(tag, parent, _int(raw["created_at_unix"], f"{tag} created_at_unix", 1 << 40),
                         tuple(files), meta, record, chunks)


def parse_restore_chunks(v: Any, mem_size: int, what: str) -> tuple[int, ...]:
    """A list of distinct chunk positions of a ``mem`` of ``mem_size`` bytes (None: none), checked:
    at most as many as the file has chunks, each below that count."""
    if v is None:
        return ()
    count = -(-mem_size // GRID)
    if not isinstance(v, list) or len(v) > count:
        raise BadManifest(f"{what}: restore_chunks must be a list of at most {count} chunk positions")
    for i in v:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < count:
            raise BadManifest(f"{what}: restore_chunks entry {i!r} is not a chunk position below {count}")
    if len(set(v)) != len(v):
        raise BadManifest(f"{what}: restore_chunks lists a chunk twice")
    return tuple(v)


def _layer_rank(name: str) -> int:
    """disk.qcow2 is the newest layer of a snapshot; layer-<i> are older, lower i older still."""
    return 1 << 20 if name == "disk.qcow2" else int(name.removeprefix("layer-").removesuffix(".qcow2"))


def _parse_backing(b: Any, tag: str, name: str, earlier: list[SnapshotEntry],
                   own: set[str]) -> Backing | None:
    if b is None:
        if name.endswith(".qcow2"):
            raise BadManifest(f"snapshot {tag!r}: disk layer {name} has no backing")
        return None
    if not name.endswith(".qcow2"):
        raise BadManifest(f"snapshot {tag!r}: {name} is not a disk and cannot have a backing")
    fmt = b["format"]
    if fmt not in DISK_FORMATS:
        raise BadManifest(f"snapshot {tag!r}: backing format {fmt!r} is not one of {DISK_FORMATS}")
    target, file = b.get("tag"), b.get("file")
    if target is None:
        return Backing(None, "", fmt)
    if not isinstance(file, str) or not FILE_RE.match(file) or not file.endswith(".qcow2"):
        raise BadManifest(f"snapshot {tag!r}: {name} is backed by {file!r}, which is not a disk layer")
    if target == tag:
        # Within a snapshot layers stack downwards: disk.qcow2 on layer-N, layer-N on layer-M<N.
        if file not in own or _layer_rank(file) >= _layer_rank(name):
            raise BadManifest(f"snapshot {tag!r}: {name} is backed by {file}, which is missing or not "
                              "an older layer")
    elif not any(s.tag == target and any(f.name == file for f in s.files) for s in earlier):
        raise BadManifest(f"snapshot {tag!r}: {name} is backed by {target}/{file}, "
                          "which is not earlier in the chain")
    return Backing(target, file, fmt)


__all__ = ["Backing", "BadManifest", "BaseEntry", "FileEntry", "Manifest", "SnapshotEntry",
           "UnsupportedManifest", "parse_restore_chunks"]
