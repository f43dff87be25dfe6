"""Snapshots that travel: describe one with its disk chain, and bring one in from elsewhere.

``SnapshotTravel`` owns moving snapshots between hosts, by pack archive
(store/archive.py) or object store (store/objectstore.py):

* **export** (``travel_export.SnapshotExporter``) describes the snapshot with
  every ancestor its disk needs (whole: they arrive forkable, and the lineage
  with them), disk layers in a canonical form that hashes the same on every host.
* **import** checks the host can restore it (accelerator and CPU model, QEMU
  version), reuses ancestors this host already holds (same content), finds the
  base image locally by digest or brings it along, writes each new snapshot
  into a staging directory, points its layers at this host's paths, publishes
  it and registers it, oldest first. A failure unregisters and removes what
  this import added and nothing else.
* **ensure_local** is the spawner's hook: a spawn of a tag this host lacks but
  the store holds brings it here first, once per host (a lock per tag), however
  many spawns ask at the same time. Where this host can serve files through
  FUSE it does so **lazily** (``LazyImports``, travel_lazy.py: the child starts
  before its memory has arrived). Without FUSE, or with ``lazy`` off, it pulls
  eagerly.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forkd.config import DataDir
from forkd.controller.host_accel import HostAccelerator
from forkd.controller.results import PullReport, PushReport
from forkd.controller.snapshots import SnapshotStore
from forkd.controller.tags import TagReservations
from forkd.controller.travel_export import Export, SnapshotExporter
from forkd.controller.travel_lazy import LazyImports
from forkd.errors import Conflict, ForkdError, IncompatibleSnapshot, NotFound, VMError
from forkd.host import fusefile
from forkd.host.accel import check_compatible
from forkd.image.builder import list_images
from forkd.store import archive, layout, snapshot_meta, sparse
from forkd.store.digests import DigestCache
from forkd.store.layout import SnapshotDir, check_tag
from forkd.store.manifest import BaseEntry, Manifest, SnapshotEntry
from forkd.store.objectstore import ObjectStore
from forkd.store.records import SnapshotRecord, now_unix
from forkd.vmm import disk as disk_mod
from forkd.vmm import probe

log = logging.getLogger("forkd.travel")

UPLOAD_THREADS = 4
BLOB_THREADS = 3  # blobs fetched at once (each with its own concurrent range GETs)
_QEMU_VERSION_RE = re.compile(r"version (\d+)\.(\d+)")

# Puts one blob (sha256, logical size) into a new file.
Fetch = Callable[[str, int, Path], None]


def qemu_release(version: str) -> str:
    """``"QEMU emulator version 7.2.19 (Debian …)"`` -> ``"7.2"``: the part migration state depends on."""
    m = _QEMU_VERSION_RE.search(version)
    return f"{m.group(1)}.{m.group(2)}" if m else version


@dataclass
class ImportPlan:
    manifest: Manifest
    reuse: list[str] = field(default_factory=list)  # tags already here with the same content
    new: list[SnapshotEntry] = field(default_factory=list)  # oldest first
    base_path: Path | None = None  # the base image, when this host has it

    @property
    def needs_base(self) -> bool:
        return self.base_path is None and any(
            f.backing is not None and f.backing.tag is None for s in self.new for f in s.files)

    def blobs(self) -> set[str]:
        """What must be fetched: the new snapshots' files, and the base if this host lacks it."""
        out = {f.sha256 for s in self.new for f in s.files}
        if self.needs_base:
            out.add(self.manifest.base.sha256)
        return out


class SnapshotTravel:
    def __init__(self, data: DataDir, snapshots: SnapshotStore, tags: TagReservations,
                 accel: HostAccelerator, store: ObjectStore | None = None) -> None:
        self._data = data
        self._snapshots = snapshots  # registered through the owner; read through its records
        self._tags = tags
        self._accel = accel
        self.store = store
        # chunked digests (format 2); digests.json held format 1's whole-file sha256s
        self._digests = DigestCache(data.travel / "chunk-digests.json")
        # Guest images' digests live with the images: every data dir that shares them (and a
        # first pull into a fresh one) finds a base by digest without reading it again.
        self._image_digests = DigestCache(data.images / ".chunk-digests.json")
        self._exporter = SnapshotExporter(data, snapshots, self._digests, self._image_digests, self.bases,
                                          self.workdir)
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # tag -> (its pull lock, users)
        self.pulls = 0  # imports from the store (a spawn's fetch or an explicit pull)
        # A spawn of a store-only tag starts it lazily (memory served by FUSE as it arrives)
        # where this host can; False: always pull it whole first.
        self.lazy = True
        self.lazily = LazyImports(self, snapshots)

    @property
    def travel_dir(self) -> Path:
        return self._data.travel

    @property
    def bases(self) -> Path:
        return self._data.travel / "bases"

    def private_travel(self) -> Path:
        """The travel directory, 0700 whatever the umask (and if an older forkd made it 0755):
        its staging holds guest memory and disks on their way in and out."""
        travel = self._data.travel
        travel.mkdir(mode=0o700, parents=True, exist_ok=True)
        travel.chmod(0o700)
        return travel

    def workdir(self, what: str) -> Path:
        path = self.private_travel() / f".{what}-{secrets.token_hex(4)}"
        path.mkdir(mode=0o700)
        return path

    def _require_store(self) -> ObjectStore:
        if self.store is None:
            raise Conflict("no object store is configured: start the daemon with --store "
                                 "s3://bucket/prefix (or FORKD_STORE), with AWS_ENDPOINT_URL and "
                                 "credentials for non-AWS stores")
        return self.store

    # ================================================================ export

    def export(self, tag: str) -> Export:
        """Describe ``tag`` and its disk chain for travel (blocking: digests, disk copies)."""
        return self._exporter.export(tag)

    # ================================================================ import

    async def plan(self, manifest: Manifest) -> ImportPlan:
        """What importing ``manifest`` takes here; raises if this host cannot restore it."""
        host = await self._accel.current()
        check_compatible(manifest.accel, host, manifest.tag)
        ours = probe.qemu_version()
        if qemu_release(manifest.qemu_version) != qemu_release(ours):
            raise IncompatibleSnapshot(
                f"snapshot {manifest.tag!r} was made with {manifest.qemu_version} but this host runs "
                f"{ours}; device state does not move between QEMU releases: install QEMU "
                f"{qemu_release(manifest.qemu_version)} here, or re-create the snapshot on this host")
        return await asyncio.to_thread(self._plan, manifest)

    def _plan(self, manifest: Manifest) -> ImportPlan:
        plan = ImportPlan(manifest)
        for entry in manifest.snapshots:
            if self._snapshots.records.has(entry.tag) or (self._data.snapshots / entry.tag).exists():
                self._check_same(entry, manifest)
                plan.reuse.append(entry.tag)
            else:
                plan.new.append(entry)
        if any(f.backing is not None and f.backing.tag is None for s in plan.new for f in s.files):
            plan.base_path = self._find_base(manifest.base)
        return plan

    def _check_same(self, entry: SnapshotEntry, manifest: Manifest) -> None:
        """``entry.tag`` exists here: fine if it is the very same snapshot, 409 otherwise."""
        try:
            local = self.export(entry.tag)
        except ForkdError as exc:
            raise Conflict(f"snapshot {entry.tag!r} (in the chain of {manifest.tag!r}) already exists "
                           f"here and cannot be compared ({exc}); delete it first (forkd rmi {entry.tag})"
                           ) from None
        try:
            mine = {f.name: f.sha256 for f in local.manifest.snapshot(entry.tag).files}
            theirs = {f.name: f.sha256 for f in entry.files}
            same_base = local.manifest.base.sha256 == manifest.base.sha256
        finally:
            local.cleanup()
        if mine != theirs or not same_base:
            raise Conflict(f"this host already has a different snapshot tagged {entry.tag!r} (in the chain "
                           f"of {manifest.tag!r}); delete it first (forkd rmi {entry.tag} --cascade) or "
                           "import on another host")

    def _find_base(self, base: BaseEntry) -> Path | None:
        """This host's copy of the base image, found by digest (a guest image, or one that travelled)."""
        travelled = self.bases / f"{base.sha256}.{base.format}"
        if travelled.exists():
            return travelled
        if base.format != "raw":
            return None
        images = sorted(list_images(self._data), key=lambda i: i.key != base.image.get("key"))
        for image in images:
            if image.rootfs.exists() and image.rootfs.stat().st_size == base.size and \
                    self._exporter.digest(image.rootfs) == base.sha256:
                return image.base  # the build's own name, which a rebuild keeps (image/builder.py)
        return None

    def apply(self, plan: ImportPlan, fetch: Fetch, origin: str) -> list[SnapshotRecord]:
        """Bring the plan's new snapshots in (blocking); the caller has reserved their tags."""
        created: list[SnapshotRecord] = []
        staging: SnapshotDir | None = None
        try:
            base_path = plan.base_path
            if plan.needs_base:
                base_path = self._install_base(plan.manifest.base, fetch)
            for entry in plan.new:
                staging = layout.staging_dir(self._data.snapshots, entry.tag)
                for f in entry.files:
                    fetch(f.sha256, f.size, staging.path / f.name)
                    if f.backing is not None:
                        target = (str(base_path) if f.backing.tag is None
                                  else str(self._data.snapshots / f.backing.tag / f.backing.file))
                        disk_mod.set_backing(staging.path / f.name, target, f.backing.format)
                # The paths of the host that wrote it mean nothing here (and must reach nothing):
                # its rootfs is the base this host has, its template's kernel this host's image's.
                meta = snapshot_meta.for_import(entry.meta, f"snapshot {entry.tag!r} meta")
                if "rootfs" in entry.meta and base_path is not None:
                    meta["rootfs"] = str(base_path)
                meta["imported"] = {"from": origin, "at_unix": now_unix(), "chain_of": plan.manifest.tag}
                staging.write_meta(meta)
                final = layout.publish(staging, self._data.snapshots, entry.tag)
                staging = None
                record = SnapshotRecord(
                    tag=entry.tag, dir=str(final.path), created_at_unix=entry.created_at_unix,
                    parent_tag=entry.parent_tag, branched_from=entry.record.get("branched_from"),
                    pause_ms=entry.record.get("pause_ms"), mode=entry.record.get("mode"))
                try:
                    self._snapshots.register(record)
                except BaseException:
                    shutil.rmtree(final.path, ignore_errors=True)
                    raise
                created.append(record)
            return created
        except BaseException as exc:
            if staging is not None:
                shutil.rmtree(staging.path, ignore_errors=True)
            for record in reversed(created):
                self._snapshots.unregister(record.tag)
                layout.discard(Path(record.dir))
            if isinstance(exc, OSError):
                space = " (free some disk space)" if exc.errno == errno.ENOSPC else ""
                raise VMError(f"importing {plan.manifest.tag!r} failed: {exc}{space}; nothing was "
                              "registered") from exc
            raise

    def _install_base(self, base: BaseEntry, fetch: Fetch) -> Path:
        self.private_travel()
        self.bases.mkdir(mode=0o700, exist_ok=True)
        final = self.bases / f"{base.sha256}.{base.format}"
        tmp = self.bases / f".{base.sha256}.tmp-{secrets.token_hex(4)}"
        try:
            fetch(base.sha256, base.size, tmp)
            (self.bases / f"{base.sha256}.json").write_text(json.dumps(base.image))
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        return final

    @contextlib.contextmanager
    def reserved(self, plan: ImportPlan) -> Iterator[None]:
        """Reserve every tag the import creates (409 if one is being written meanwhile)."""
        done: list[str] = []
        try:
            for entry in plan.new:
                self._tags.reserve(entry.tag)
                done.append(entry.tag)
            yield
        finally:
            for tag in done:
                self._tags.release(tag)

    # ================================================================ archives

    async def pack(self, tag: str, out: Path, *, include_base: bool = True,
                   progress: archive.Progress | None = None) -> dict[str, Any]:
        if out.exists():
            raise Conflict(f"{out} already exists; pick another file or remove it")
        exp = await asyncio.to_thread(self.export, tag)
        try:
            omit = set() if include_base else {exp.manifest.base.sha256}
            size = await asyncio.to_thread(archive.write, out, exp.manifest, exp.blobs, progress, omit)
        except BaseException:
            out.unlink(missing_ok=True)
            raise
        finally:
            exp.cleanup()
        return {"tag": tag, "archive": str(out), "bytes": size, "lineage": exp.manifest.lineage,
                "base_included": include_base, "base_sha256": exp.manifest.base.sha256}

    async def unpack(self, path: Path, progress: archive.Progress | None = None) -> dict[str, Any]:
        if not path.is_file():
            raise NotFound(f"archive {path} does not exist")
        workdir = self.workdir("unpack")
        loop = asyncio.get_running_loop()
        plans: list[ImportPlan] = []

        def want(manifest: Manifest, omitted: set[str]) -> set[str]:
            plan = asyncio.run_coroutine_threadsafe(self.plan(manifest), loop).result()
            if plan.needs_base and manifest.base.sha256 in omitted:
                image = manifest.base.image
                raise IncompatibleSnapshot(
                    f"snapshot {manifest.tag!r} sits on base image {manifest.base.sha256[:12]}… "
                    f"({image.get('name')!r}, key {image.get('key')}), which this host lacks and the "
                    "archive was packed without (--no-base): pack it again with its base")
            plans.append(plan)
            return plan.blobs()

        try:
            manifest, extracted = await asyncio.to_thread(archive.read, path, workdir, want, progress)
            plan = plans[0]
            with self.reserved(plan):
                created = await asyncio.to_thread(self.apply, plan, placer(plan, extracted),
                                                  f"archive {path.name}")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return {"tag": manifest.tag, "lineage": manifest.lineage, "created": [r.tag for r in created],
                "reused": plan.reuse, "base": "installed" if plan.needs_base else "found on this host"}

    # ================================================================ object store

    async def push(self, tag: str, *, force: bool = False) -> PushReport:
        store = self._require_store()
        exp = await asyncio.to_thread(self.export, tag)
        try:
            return await asyncio.to_thread(self._push, store, exp, force)
        finally:
            exp.cleanup()

    def _push(self, store: ObjectStore, exp: Export, force: bool) -> PushReport:
        manifest = exp.manifest
        if not force:
            for t in manifest.lineage:
                held = store.get_manifest(t)
                if held is not None and _files(held, t) != _files(manifest, t):
                    raise Conflict(f"store {store.url} already holds a different snapshot tagged {t!r}; "
                                   "push with force to replace it, or push under another tag")
        missing = [sha for sha in sorted(exp.blobs) if not store.has_blob(sha)]
        with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
            sent = list(pool.map(lambda sha: store.put_blob(sha, exp.blobs[sha]), missing))
        for t in manifest.lineage:  # after every blob: a manifest never names a missing one
            store.put_manifest(manifest.upto(t))
        return {"tag": manifest.tag, "store": str(store.url), "lineage": manifest.lineage,
                "blobs": len(exp.blobs), "blobs_uploaded": len(missing), "bytes_uploaded": sum(sent)}

    async def pull(self, tag: str) -> PullReport:
        """Fetch ``tag`` (and the ancestors it needs) from the store; a no-op if it is here already."""
        store = self._require_store()
        check_tag(tag)
        async with self._lock(tag):
            if self._snapshots.records.has(tag):
                return {"tag": tag, "created": [], "reused": [tag], "bytes_downloaded": 0}
            manifest = await asyncio.to_thread(store.get_manifest, tag)
            if manifest is None:
                raise NotFound(f"snapshot {tag!r} is neither on this host nor in store {store.url}")
            return await self._import_from_store(store, manifest)

    async def ensure_local(self, tag: str) -> None:
        """The spawner's hook: bring ``tag`` here if this host lacks it and the store holds it
        (lazily where it can); raises if ``tag`` arrived lazily and its memory cannot be had."""
        if self._snapshots.records.has(tag):
            # Only while its snapshot is still here: a failed lazy import removes it, and a later
            # spawn (the store back) fetches it anew rather than repeat the old failure for ever.
            await self.lazily.raise_failure(tag)
        if self.store is None or self._snapshots.records.has(tag):
            return
        if not (self.lazy and fusefile.available()):
            with contextlib.suppress(NotFound):
                await self.pull(tag)
            return
        store = self.store
        check_tag(tag)
        async with self._lock(tag):
            if self._snapshots.records.has(tag):
                await self.lazily.raise_failure(tag)
                return
            manifest = await asyncio.to_thread(store.get_manifest, tag)
            if manifest is None:
                return  # the spawn says 404
            await self.lazily.start(store, manifest)

    async def lazy_failure(self, tag: str) -> ForkdError | None:
        """The spawner's question: why children of a lazily arrived ``tag`` cannot be restored."""
        return await self.lazily.failure_settled(tag)

    async def close(self) -> None:
        """Daemon stop (after its sandboxes are gone): lazy imports end (travel_lazy.py)."""
        await self.lazily.close()

    def recover(self) -> None:
        """At start: what a previous daemon left mid-way through a lazy import."""
        self.lazily.recover()

    async def _import_from_store(self, store: ObjectStore, manifest: Manifest) -> PullReport:
        started = time.monotonic()
        before = store.stats.snapshot()["bytes_downloaded"]
        plan = await self.plan(manifest)
        workdir = self.workdir(f"pull-{manifest.tag}")
        planned = time.monotonic()
        try:
            with self.reserved(plan):
                fetched = await asyncio.to_thread(self.fetch_all, store, plan, workdir)
                downloaded = time.monotonic()
                created = await asyncio.to_thread(self.apply, plan, placer(plan, fetched),
                                                  f"store {store.url}")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        self.pulls += 1
        got = store.stats.snapshot()["bytes_downloaded"] - before
        done = time.monotonic()
        log.info("pulled %s from %s: %d snapshot(s), %d bytes in %.2fs (plan %.2fs, download %.2fs, "
                 "place and register %.2fs)", manifest.tag, store.url, len(created), got, done - started,
                 planned - started, downloaded - planned, done - downloaded)
        return {"tag": manifest.tag, "created": [r.tag for r in created], "reused": plan.reuse,
                "bytes_downloaded": got}

    @staticmethod
    def fetch_all(store: ObjectStore, plan: ImportPlan, workdir: Path,
                   only: set[str] | None = None) -> dict[str, Path]:
        """Every blob the plan needs (of ``only``), into ``workdir``, several at a time (largest
        first): a small blob's few requests then overlap a large one's range GETs instead of
        waiting behind them."""
        sizes = plan.manifest.blobs()
        shas = sorted(plan.blobs() if only is None else only, key=lambda sha: -sizes[sha])
        out = {sha: workdir / sha for sha in shas}
        with ThreadPoolExecutor(BLOB_THREADS) as pool:
            for _ in pool.map(lambda sha: store.get_blob(sha, out[sha], sizes[sha]), shas):
                pass  # map raises the first failure; leaving the pool waits for the others
        return out

    @contextlib.asynccontextmanager
    async def _lock(self, tag: str) -> AsyncIterator[None]:
        """One pull of ``tag`` at a time on this host; the lock goes once nobody holds or awaits it."""
        lock, users = self._locks.get(tag, (asyncio.Lock(), 0))
        self._locks[tag] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[tag]
            if users == 1:
                del self._locks[tag]
            else:
                self._locks[tag] = (lock, users - 1)

    def stats(self) -> dict[str, int]:
        out = {"pulls": self.pulls}
        if self.store is not None:
            out.update(self.store.stats.snapshot())
        return out


def placer(plan: ImportPlan, fetched: dict[str, Path]) -> Fetch:
    """``apply``'s fetch from blobs already here (extracted or downloaded): moved into place, or
    copied while another file of the plan still needs the same bytes."""
    uses: dict[str, int] = {}
    for s in plan.new:
        for f in s.files:
            uses[f.sha256] = uses.get(f.sha256, 0) + 1

    def place(sha: str, _size: int, dest: Path) -> None:
        uses[sha] = uses.get(sha, 1) - 1
        if uses[sha] > 0:
            sparse.copy(fetched[sha], dest)
        else:
            os.rename(fetched[sha], dest)

    return place


def _files(manifest: Manifest, tag: str) -> dict[str, str]:
    return {f.name: f.sha256 for f in manifest.snapshot(tag).files}


__all__ = ["Export", "ImportPlan", "SnapshotTravel", "qemu_release"]
