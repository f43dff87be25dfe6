"""Lazy imports: a store-only snapshot whose memory arrives while its children already run.

``SnapshotTravel.ensure_local`` hands a spawn's missing tag here where this host can serve
files through FUSE: every small part (manifest, device state, config, disk layers; the base
only if missing) is fetched, but each new snapshot's ``mem`` is a FUSE file
(host/fusefile.py) whose reads fetch and verify the covering chunk (store/lazyblob.py), so
the child starts at once and its page faults bring the memory it touches. A background
thread fetches the rest with parallel range GETs (LazyBlob.fill) from the moment the blobs
are opened, while the small parts are still arriving; once a ``mem`` is complete it replaces
the served file and the mount is detached (children that map it keep being served until the
last one exits). A failure removes the import's snapshots, and the spawner reports it
(``failure``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forkd.controller.snapshots import SnapshotStore
from forkd.errors import ForkdError
from forkd.host import fusefile
from forkd.store import layout
from forkd.store.lazyblob import LazyBlob
from forkd.store.manifest import Manifest
from forkd.store.objectstore import ObjectStore, StoreError
from forkd.store.records import SnapshotRecord

if TYPE_CHECKING:
    from forkd.controller.travel import ImportPlan, SnapshotTravel


log = logging.getLogger("forkd.travel")

# How long a spawn that failed on a lazy import's memory waits for the import to clean up: its
# fill thread stops at its next chunk (each GET is bounded by the store's own timeouts).
SETTLE_SECS = 30.0


@dataclass
class _LazyMem:
    """One snapshot's ``mem`` while it arrives: the blob filling a local file, and the FUSE file
    that serves it (the snapshot's ``mem`` is a symlink to it until the blob is complete)."""

    tag: str
    blob: LazyBlob
    fuse: fusefile.FuseFile
    snap_mem: Path  # <snapshot>/mem
    done: bool = False

    @property
    def failure(self) -> BaseException | None:
        return self.blob.failed if not self.done else None


@dataclass
class _LazyImport:
    """The snapshots one lazy import registered, and their memory still arriving."""

    manifest: Manifest
    workdir: Path  # <travel>/lazy/<token>: fill files and mount points
    mems: list[_LazyMem] = field(default_factory=list)
    created: list[SnapshotRecord] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    failure: BaseException | None = None
    thread: threading.Thread | None = None
    started: float = field(default_factory=time.monotonic)
    settled: threading.Event = field(default_factory=threading.Event)  # every mem here, or failed
    # Set once start() registered the snapshots (snap_mem known) or gave up (then stop is set too):
    # the fill, which starts before, waits for it to swap files in or to clean up.
    registered: threading.Event = field(default_factory=threading.Event)


class LazyImports:
    """The lazy imports under way, by the tags they registered (one import may register a chain)."""

    def __init__(self, travel: SnapshotTravel, snapshots: SnapshotStore) -> None:
        self._travel = travel  # plans, reserves, fetches and applies, as for an eager pull
        self._snapshots = snapshots
        self._imports: dict[str, _LazyImport] = {}  # tag -> the lazy import that registered it
        self.count = 0  # lazy imports started

    def failure(self, tag: str) -> ForkdError | None:
        """Why children of ``tag`` cannot be restored, if it arrived lazily and a chunk of its
        memory could not be had (the spawner reports this instead of "QEMU exited")."""
        imp = self._imports.get(tag)
        if imp is None:
            return None
        failure = imp.failure or next((m.failure for m in imp.mems if m.tag == tag and m.failure), None)
        if failure is None:
            return None
        where = f"store {self._travel.store.url}" if self._travel.store is not None else "the store"
        return StoreError(f"snapshot {tag!r} arrived lazily from {where} and its memory could not be "
                          f"had: {failure}")

    async def failure_settled(self, tag: str, timeout: float = SETTLE_SECS) -> ForkdError | None:
        """``failure``, answered once the failed import has removed what it registered: the fill
        thread does that after the failure is known (a child's read can fail first), and a spawn
        that answers "the store could not be had" must leave no snapshot of it listed after."""
        failure = self.failure(tag)
        imp = self._imports.get(tag)
        if failure is not None and imp is not None and not await asyncio.to_thread(imp.settled.wait, timeout):
            log.warning("the failed lazy import of %s was still cleaning up after %.0f s", tag, timeout)
        return failure

    async def raise_failure(self, tag: str) -> None:
        """Raise ``failure_settled``'s answer: a spawn that fails on a lazy import's failure answers
        only once the import's snapshots are gone, never while they are still listed."""
        failure = await self.failure_settled(tag)
        if failure is not None:
            raise failure

    def stats(self) -> dict[str, Any]:
        """Per lazily arriving tag: GETs and bytes its memory took so far, and whether it is complete."""
        out: dict[str, Any] = {}
        for tag, imp in self._imports.items():
            for m in imp.mems:
                if m.tag == tag:
                    out[tag] = {"gets": m.blob.gets, "bytes_fetched": m.blob.bytes_fetched,
                                "chunks": len(m.blob.index.chunks), "complete": m.done,
                                "fetched_by_chunk": dict(m.blob.fetched_by_chunk),
                                "fill_first": list(m.blob.fill_first), "landed": list(m.blob.landed)}
        return out

    async def wait(self, tag: str, timeout: float | None = None) -> None:
        """Until ``tag``'s lazy import has all its memory here (or failed: raises)."""
        imp = self._imports.get(tag)
        if imp is None:
            return
        if not await asyncio.to_thread(imp.settled.wait, timeout):
            raise TimeoutError(f"the memory of {tag!r} did not all arrive within {timeout} s")
        await self.raise_failure(tag)

    async def start(self, store: ObjectStore, manifest: Manifest) -> None:
        started = time.monotonic()
        plan = await self._travel.plan(manifest)
        mem_of = {f.sha256: s.tag for s in plan.new for f in s.files if f.name == "mem"}
        eager = plan.blobs() - set(mem_of)
        lazydir = self._travel.private_travel() / "lazy"
        lazydir.mkdir(mode=0o700, exist_ok=True)
        imp = _LazyImport(manifest, lazydir / secrets.token_hex(6))
        imp.workdir.mkdir(mode=0o700)
        workdir = self._travel.workdir(f"lazy-{manifest.tag}")
        try:
            with self._travel.reserved(plan):
                # Both to the end, even when one fails: no mount may start after the cleanup.
                got = await asyncio.gather(
                    asyncio.to_thread(self._travel.fetch_all, store, plan, workdir, eager),
                    asyncio.to_thread(self._serve_mems, store, plan, mem_of, imp), return_exceptions=True)
                for result in got:
                    if isinstance(result, BaseException):
                        raise result
                fetched = got[0]
                assert isinstance(fetched, dict)
                from forkd.controller.travel import placer  # travel.py imports this module

                eager_place = placer(plan, fetched)
                served = {m.blob.sha: m.fuse.path for m in imp.mems}

                def place(sha: str, size: int, dest: Path) -> None:
                    if sha in served:  # the FUSE file, until the blob is complete
                        os.symlink(served[sha], dest)
                    else:
                        eager_place(sha, size, dest)

                imp.created = await asyncio.to_thread(self._travel.apply, plan, place,
                                                      f"store {store.url} (lazily)")
        except BaseException:
            imp.stop.set()
            imp.registered.set()
            if imp.thread is not None:  # its GETs still write to the fill files: let them end first
                await asyncio.to_thread(imp.thread.join, 30)
            await asyncio.to_thread(self._drop, imp, unregister=False)
            raise
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        try:
            for m in imp.mems:
                m.snap_mem = Path(self._snapshots.get(m.tag).dir) / "mem"
            for record in imp.created:
                self._imports[record.tag] = imp
        finally:
            imp.registered.set()  # whatever happens: the fill thread must not wait forever
        self._travel.pulls += 1
        self.count += 1
        # A chunk the fill already found corrupt or missing: say so now rather than start children
        # that would fail on it (the fill thread removes the snapshots).
        await self.raise_failure(manifest.tag)
        log.info("%s is here lazily from %s in %.2fs: %d snapshot(s), memory arriving in the background",
                 manifest.tag, store.url, time.monotonic() - started, len(imp.created))

    def _serve_mems(self, store: ObjectStore, plan: ImportPlan, mem_of: dict[str, str],
                    imp: _LazyImport) -> list[_LazyMem]:
        """Open each new ``mem`` blob lazily and mount its FUSE file (the target's first)."""
        sizes = plan.manifest.blobs()
        order = sorted(mem_of, key=lambda sha: mem_of[sha] != plan.manifest.tag)
        for sha in order:
            index, read = store.open_blob(sha, sizes[sha])
            blob = LazyBlob(sha, index, read, imp.workdir / f"{sha}.fill")
            mount = imp.workdir / f"{sha}.mem"
            mount.touch(mode=0o600)
            fuse = fusefile.FuseFile(mount, index.size, blob.read, on_end=blob.close,
                                     on_error=lambda exc: log.error(
                                         "lazy memory: a read failed (the child reading it fails): %s", exc))
            mem = _LazyMem(mem_of[sha], blob, fuse, Path())  # snap_mem: once registered
            imp.mems.append(mem)  # before start: a failure from here on unmounts it
            fuse.start()
        # The rest of the memory starts now, not once the small parts are here and registered.
        imp.thread = threading.Thread(target=self._fill, args=(imp,), name=f"lazy-{plan.manifest.tag}",
                                      daemon=True)
        imp.thread.start()
        return imp.mems

    def _fill(self, imp: _LazyImport) -> None:
        """Background: the rest of each ``mem`` (the target's first), then each becomes an
        ordinary file and its mount is detached; a failure removes the import's snapshots."""
        try:
            for m in imp.mems:
                # The chunks a restore touched where the snapshot was made first: what the
                # children restoring here now fault on.
                m.blob.fill(imp.manifest.snapshot(m.tag).restore_chunks, stop=imp.stop)
                imp.registered.wait()  # snap_mem is known once start() registered the snapshots
                if imp.stop.is_set():
                    imp.settled.set()
                    return
                os.replace(m.blob.dest, m.snap_mem)  # over the symlink: new children map the file
                m.done = True
                m.fuse.detach()  # children that map it are still served, from the same fd
                log.info("lazy memory of %s complete after %.2fs (%d GETs, %d bytes)", m.tag,
                         time.monotonic() - imp.started, m.blob.gets, m.blob.bytes_fetched)
        except BaseException as exc:  # reported through lazy_failure and the log
            imp.failure = exc
            # Once start() registered the snapshots they are ours to remove; if it gave up
            # (stop), it undoes the import itself.
            imp.registered.wait()
            if not imp.stop.is_set():
                log.error("lazy import of %s failed: %s; its snapshots are removed", imp.manifest.tag, exc)
                self._drop(imp, unregister=True)
            imp.settled.set()
            return
        imp.settled.set()
        # Every mem is an ordinary file now; the served copies go once no child maps them.
        for m in imp.mems:
            m.fuse.wait_ended()  # (its end closes the blob)
        shutil.rmtree(imp.workdir, ignore_errors=True)
        for record in imp.created:
            if self._imports.get(record.tag) is imp:
                del self._imports[record.tag]

    def _drop(self, imp: _LazyImport, *, unregister: bool, abort: bool = True) -> None:
        """Undo a lazy import that failed or is being closed: its snapshots that are not complete
        (``unregister``), its mounts (detached; aborted with ``abort``), its fill files."""
        imp.stop.set()
        if unregister:
            for record in reversed(imp.created):
                self._snapshots.unregister(record.tag)
                # Aside first: a child restored meanwhile may still write its restore-chunks
                # record there, which a plain rmtree racing it would leave behind.
                layout.discard(Path(record.dir))
        for m in imp.mems:
            if abort:
                m.fuse.abort()
            else:
                m.fuse.detach()
        for m in imp.mems:
            if not m.fuse.wait_ended(5 if abort else 0):
                log.warning("lazy memory of %s: a child still maps it; served until it exits", m.tag)
        shutil.rmtree(imp.workdir, ignore_errors=True)

    async def close(self) -> None:
        """Daemon stop (after its sandboxes are gone): snapshots whose memory had not all arrived
        are removed (a later spawn fetches them again), and every mount goes."""
        imports = {id(imp): imp for imp in self._imports.values()}.values()
        for imp in imports:
            imp.stop.set()
        for imp in imports:
            if imp.thread is not None:
                await asyncio.to_thread(imp.thread.join, 30)
            complete = all(m.done for m in imp.mems)
            await asyncio.to_thread(self._drop, imp, unregister=not complete and imp.failure is None)
        self._imports.clear()

    def recover(self) -> None:
        """At start: mounts and snapshots a previous daemon left mid-way through a lazy import."""
        lazydir = self._travel.travel_dir / "lazy"
        for point in fusefile.mounts_under(lazydir):
            with contextlib.suppress(OSError):
                fusefile.umount(point)
        for record in self._snapshots.all():
            mem = Path(record.dir) / "mem"
            if mem.is_symlink() and str(os.readlink(mem)).startswith(str(lazydir)):
                log.warning("snapshot %s was still arriving lazily when forkd stopped; removing it",
                            record.tag)
                self._snapshots.unregister(record.tag)
                layout.discard(Path(record.dir))
        shutil.rmtree(lazydir, ignore_errors=True)


__all__ = ["LazyImports"]
