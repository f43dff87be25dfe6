"""Compaction (forkd 0.5's ``POST /v1/snapshots/{tag}/compact``): a branch chain made standalone.

A branch's disk is a qcow2 layer over its parent's, so a snapshot deep in a
chain needs every snapshot above it, and each layer costs a little on every
read. Compacting ``tag`` into ``to`` writes a new snapshot with the same memory,
device state and disk content whose disk is one layer straight on the guest
image (like a template's), and no parent: it depends on no other snapshot, and
``tag``'s chain can be deleted afterwards.

RAM is never chained (every snapshot has its whole ``mem``), so the memory and
device-state files are hard links where the filesystem allows (nothing writes a
published snapshot's files), copies otherwise. The disk is flattened by
``vmm.disk.flatten_onto``, the same rebase the standalone checkpoints use.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from pathlib import Path

from forkd.controller import volumes
from forkd.controller.snapshots import SnapshotStore
from forkd.controller.tags import TagReservations
from forkd.errors import InvalidRequest
from forkd.store import layout
from forkd.store.layout import SnapshotDir, check_tag
from forkd.store.records import SnapshotRecord, now_unix
from forkd.vmm import disk as disk_mod


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


class Compactor:
    def __init__(self, snapshots_dir: Path, store: SnapshotStore, tags: TagReservations) -> None:
        self._snapshots = snapshots_dir
        self._store = store
        self._tags = tags

    async def compact(self, tag: str, to: str) -> SnapshotRecord:
        check_tag(tag)
        check_tag(to)
        if tag == to:
            raise InvalidRequest("compact needs a new tag in 'to', not the snapshot's own")
        source = self._store.forkable(tag)  # 404, 409 while writing or failed
        # Its volumes' layers stand on its parents' as its disk does: flattening the disk alone
        # would let a parent go that they still need.
        volumes.require_none(source.record, "compaction")
        with self._tags.reserved(to):  # 409 if it exists or is being written
            staging = layout.staging_dir(self._snapshots, to)
            try:
                await asyncio.to_thread(self._write, source.dir, staging)
                meta = source.dir.read_meta()
                created = now_unix()
                staging.write_meta({**meta, "tag": to, "created_at_unix": created, "parent_tag": None,
                                    "branched_from": None, "mode": None, "compacted_from": tag})
                final = layout.publish(staging, self._snapshots, to)
            except BaseException:
                shutil.rmtree(staging.path, ignore_errors=True)
                raise
            record = SnapshotRecord(tag=to, dir=str(final.path), created_at_unix=created,
                                    compacted_from=tag)
            try:
                self._store.register(record)
            except BaseException:
                with contextlib.suppress(OSError):
                    shutil.rmtree(final.path)
                raise
            return record

    @staticmethod
    def _write(source: SnapshotDir, staging: SnapshotDir) -> None:
        _link_or_copy(source.mem, staging.mem)
        _link_or_copy(source.state, staging.state)
        bottom, fmt = disk_mod.chain_bottom(source.disk)
        disk_mod.flatten_onto(source.disk, bottom, staging.disk, base_format=fmt)


__all__ = ["Compactor"]
