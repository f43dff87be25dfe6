"""A branch of a *hibernated* sandbox, taken without waking it: what a fork of it starts from.

E2B users ask to fork a paused sandbox without resuming it (e2b-dev/infra#3424): the
children start from its saved state and it stays hibernated, costing no CPU or RAM.

A hibernated sandbox's state is its snapshot's ``mem`` plus the pages it had changed and
its device state (``hibernation/`` in its run directory, controller/hibernation.py), and its
disk layers. Under the sandbox's lock (so no wake starts meanwhile, which would remove
those files), after checking the saved files' digests as a wake does:

* a helper QEMU loads the saved state without running the guest and writes the stream a
  full BRANCH would have captured (``vmm.hibernation.saved_to_stream``);
* the sandbox's disk layers (its unpublished ones and its active overlay, which nothing
  writes while it sleeps) are copied into the branch, layered on its parent as any
  branch's are;

then, with the lock released, the stream becomes the branch's ``mem`` and ``state`` as
for any branch. The sandbox itself is only read: its row, files and disk are as before,
and it wakes from them later as it would have. Only a hibernation that kept the memory
can be forked so (409 for a disk-only one: it has no state to fork but its disk), and only one
without volumes (a fork wakes one with volumes first, and branches it as it runs).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from pathlib import Path

from forkd.controller.branch import Brancher
from forkd.controller.hibernation import SAVED_DIR
from forkd.controller.sandboxes import SandboxTable
from forkd.controller.snapshots import SnapshotStore
from forkd.controller.tags import TagReservations
from forkd.errors import Conflict, ForkdError, VMError
from forkd.store import layout
from forkd.store.layout import SnapshotDir
from forkd.store.records import SandboxRecord, SnapshotRecord, now_unix
from forkd.vmm import branching
from forkd.vmm import disk as disk_mod
from forkd.vmm import hibernation as mechanics

log = logging.getLogger("forkd.branch")


class HibernatedBrancher:
    def __init__(self, brancher: Brancher, snapshots_dir: Path, table: SandboxTable,
                 store: SnapshotStore, tags: TagReservations) -> None:
        self._brancher = brancher  # the owner of the branch sequence: it names the branch
        self._snapshots = snapshots_dir
        self._table = table
        self._store = store
        self._tags = tags

    async def branch(self, sandbox_id: str) -> SnapshotRecord:
        """A ``ready`` branch of the hibernated ``sandbox_id`` (tag ``branch-<id>-<seq>``); it
        stays hibernated. 409 if it is not hibernated with its memory."""
        record = self._hibernated(sandbox_id)
        tag = self._brancher.new_tag(sandbox_id)
        self._tags.reserve(tag)
        staging: SnapshotDir | None = None
        registered = False
        try:
            started = time.monotonic()
            async with self._table.lock(sandbox_id):
                record = self._hibernated(sandbox_id)  # it may have woken while we waited
                snap = self._store.forkable(record.snapshot_tag)
                saved = Path(record.dir) / SAVED_DIR
                digests = record.hibernation.digests if record.hibernation is not None else {}
                if digests:  # as a wake does: a file that changed on disk is refused, naming it
                    await asyncio.to_thread(mechanics.verify, saved, digests)
                staging = layout.staging_dir(self._snapshots, tag)
                helper = staging.path / "helper-load"
                helper.mkdir()
                active = Path(record.disk.file)
                try:
                    await mechanics.saved_to_stream(
                        helper, record.config, mem_path=snap.dir.mem, snapshot_state=snap.dir.state,
                        disk_size=disk_mod.qcow2_virtual_size(active), saved=saved,
                        stream=staging.path / "stream", tap=record.tap)
                except ForkdError as exc:
                    raise VMError(f"branch of hibernated sandbox {sandbox_id} failed loading its saved "
                                  f"state: {branching.stream_error(staging.path / 'stream') or exc}") from exc
                shutil.rmtree(helper, ignore_errors=True)
                layers = [*(Path(p) for p in record.disk.pending_layers), active]
                base = SnapshotDir(self._snapshots / record.disk.parent_tag).disk
                await asyncio.to_thread(disk_mod.copy_layers, layers, base, staging.disk,
                                        self._snapshots / tag)
            snapshot = SnapshotRecord(
                tag=tag, dir=str(self._snapshots / tag), created_at_unix=now_unix(), status="writing",
                branched_from=sandbox_id, parent_tag=record.disk.parent_tag, pause_ms=0.0, mode="full")
            self._store.register(snapshot)
            registered = True
            await self._brancher.publish_stream(snapshot, record, staging, staging.path / "stream")
            staging = None
            log.info("branched hibernated %s into %s in %.0f ms; it stays hibernated", sandbox_id, tag,
                     (time.monotonic() - started) * 1000)
            return snapshot
        except BaseException:
            if staging is not None:
                branching.clear_stream_error(staging.path / "stream")
                shutil.rmtree(staging.path, ignore_errors=True)
            if registered and self._store.exists(tag) and self._store.get(tag).status == "writing":
                self._store.unregister(tag)
            raise
        finally:
            self._tags.release(tag)

    def _hibernated(self, sandbox_id: str) -> SandboxRecord:
        record = self._table.records.get(sandbox_id)  # 404 if there is no such sandbox
        if record.hibernation is None:
            raise Conflict(f"sandbox {sandbox_id!r} is not hibernated")
        if record.volumes:
            # Their disks would have to be cut and copied with the root disk's, as a BRANCH of the
            # running sandbox does (controller/branch.py); a fork wakes such a one first.
            raise Conflict(f"sandbox {sandbox_id!r} has volumes; a fork of it wakes it first")
        if not record.hibernation.memory:
            raise Conflict(f"sandbox {sandbox_id!r} was hibernated without its memory (memory: false), so "
                           "there is no state to fork but its disk; resume it and fork the running sandbox, "
                           "or hibernate it with its memory")
        return record


__all__ = ["HibernatedBrancher"]
