"""Describing a snapshot for travel: its manifest, and where each of its blobs' bytes are.

Export follows the snapshot's disk chain (``qemu-img info --backing-chain``) down
to the base image, so the snapshot travels with every ancestor its disk needs.
Disk layers travel in a canonical form (backing names relative, not this host's
absolute paths) so that the same disk hashes the same on every host and is
stored once. Its own module because it only reads: the import side
(``travel.SnapshotTravel``) is the one that registers snapshots.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forkd.config import VERSION, DataDir
from forkd.controller import volumes
from forkd.controller.snapshots import SnapshotStore
from forkd.errors import VMError
from forkd.host.accel import Accel
from forkd.image.builder import list_images
from forkd.store import chunked, restore_chunks, sparse
from forkd.store.digests import DigestCache
from forkd.store.layout import SnapshotDir, check_tag
from forkd.store.manifest import FILE_RE, Backing, BaseEntry, FileEntry, Manifest, SnapshotEntry
from forkd.store.records import now_unix
from forkd.vmm import disk as disk_mod
from forkd.vmm import probe


@dataclass
class Export:
    """A snapshot described for travel: its manifest and where each blob's bytes are."""

    manifest: Manifest
    blobs: dict[str, Path]
    workdir: Path  # canonical copies of disk layers live here until cleanup()

    def cleanup(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


class SnapshotExporter:
    def __init__(self, data: DataDir, snapshots: SnapshotStore, digests: DigestCache,
                 image_digests: DigestCache, bases: Path, workdir: Callable[[str], Path]) -> None:
        self._data = data
        self._snapshots = snapshots  # read only: its records
        self._digests = digests
        self._image_digests = image_digests  # guest images' digests live with the images
        self.bases = bases  # where travelled base images are kept (their image.json beside them)
        self._workdir = workdir  # a private scratch directory (0700) under the travel directory

    def export(self, tag: str) -> Export:
        """Describe ``tag`` and its disk chain for travel (blocking: digests, disk copies)."""
        check_tag(tag)
        snap = self._snapshots.records.get(tag)
        snap.check_forkable()
        volumes.require_none(snap, "pack/push")  # its volume layers do not travel (yet)
        workdir = self._workdir(f"export-{tag}")
        try:
            return self._export(tag, workdir)
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise

    def _export(self, tag: str, workdir: Path) -> Export:
        chain = disk_mod.backing_chain(SnapshotDir(self._data.snapshots / tag).disk)
        links = [self._classify(path, fmt, last=i == len(chain) - 1) for i, (path, fmt) in enumerate(chain)]
        base_path, base_fmt = chain[-1]
        base_sha = self.digest(base_path)
        base = BaseEntry(base_sha, base_path.stat().st_size, base_fmt, self._image_info(base_path, base_sha))
        lineage: list[str] = []
        for owner, _ in links[:-1]:
            if owner not in lineage:
                lineage.append(owner)
        if not lineage or lineage[0] != tag:
            raise VMError(f"cannot pack {tag!r}: its disk is not its own ({chain[0][0]})")
        lineage.reverse()
        blobs: dict[str, Path] = {base_sha: base_path}
        entries = []
        for t in lineage:
            record = self._snapshots.records.get(t)
            record.check_forkable()
            sdir = SnapshotDir(self._data.snapshots / t)
            files = [self._plain_file(sdir.mem, blobs), self._plain_file(sdir.state, blobs)]
            for i, (owner, _) in enumerate(links[:-1]):
                if owner == t:
                    below, fmt = links[i + 1], chain[i + 1][1]
                    bottom = i + 1 == len(links) - 1
                    backing = Backing(None, "", fmt) if bottom else Backing(below[0], below[1], fmt)
                    files.append(self._canonical_layer(chain[i][0], workdir / t, backing, base_sha, blobs))
            meta = sdir.read_meta()
            accel = Accel(meta["config"]["accel"], meta["config"]["cpu"])
            entries.append(SnapshotEntry(
                t, record.parent_tag, record.created_at_unix, tuple(files), meta,
                {"branched_from": record.branched_from, "pause_ms": record.pause_ms, "mode": record.mode},
                restore_chunks.read(sdir.path, files[0].size)))
        accels = {(Accel(e.meta["config"]["accel"], e.meta["config"]["cpu"])) for e in entries}
        if len(accels) != 1:
            raise VMError(f"cannot pack {tag!r}: its chain mixes accelerators {sorted(map(str, accels))}")
        manifest = Manifest(tag, now_unix(), VERSION, probe.qemu_version(), accel, base, tuple(entries))
        return Export(manifest, blobs, workdir)

    def digest(self, path: Path) -> str:
        images = self._data.images.resolve()
        cache = self._image_digests if path.resolve().is_relative_to(images) else self._digests
        return cache.sha256(path)

    def _classify(self, path: Path, fmt: str, *, last: bool) -> tuple[str, str]:
        """(tag, file) for a layer in a snapshot directory; ("", "") for the base at the bottom."""
        resolved = path.resolve()
        if resolved.parent.parent == self._data.snapshots.resolve() and not last:
            tag, name = resolved.parent.name, resolved.name
            if not FILE_RE.match(name) or fmt != "qcow2" or not self._snapshots.records.has(tag):
                raise VMError(f"cannot pack: disk layer {resolved} is not a registered snapshot's layer")
            return tag, name
        if not last:
            raise VMError(f"cannot pack: the disk chain runs through {resolved}, which is neither a "
                          "snapshot's layer nor a base image")
        return "", ""

    def _plain_file(self, path: Path, blobs: dict[str, Path]) -> FileEntry:
        sha = self._digests.sha256(path)
        blobs.setdefault(sha, path)
        return FileEntry(path.name, sha, path.stat().st_size)

    def _canonical_layer(self, path: Path, into: Path, backing: Backing, base_sha: str,
                         blobs: dict[str, Path]) -> FileEntry:
        """A copy of a layer whose backing name does not depend on this host's paths."""
        into.mkdir(mode=0o700, parents=True, exist_ok=True)
        copy = into / path.name
        sparse.copy(path, copy)
        name = (f"../../bases/{base_sha}.{backing.format}" if backing.tag is None
                else f"../{backing.tag}/{backing.file}")
        disk_mod.set_backing(copy, name, backing.format)
        sha, _ = chunked.digest(copy)
        blobs.setdefault(sha, copy)
        return FileEntry(path.name, sha, copy.stat().st_size, backing)

    def _image_info(self, base_path: Path, sha: str) -> dict[str, Any]:
        """What is known of the image a base came from (image.json, or the travelled base's record)."""
        sidecar = self.bases / f"{sha}.json"
        if sidecar.exists():
            with contextlib.suppress(OSError, ValueError):
                info: dict[str, Any] = json.loads(sidecar.read_text())
                return info
        for image in list_images(self._data):
            if base_path.resolve() in (image.rootfs.resolve(), image.base.resolve()):
                info = {"name": image.name, "key": image.key,
                        "kernel_version": image.meta.get("kernel_version"),
                        "recipe": image.meta.get("recipe")}
                pulled = image.meta.get("oci") or {}
                if pulled.get("digest"):  # an image pulled from a registry: which one, by digest
                    info["oci_digest"], info["oci_ref"] = pulled["digest"], pulled.get("ref")
                return info
        return {}
