"""``SnapshotTravel`` without a daemon, for the offline ``forkd pack``/``unpack``.

The same owner the daemon runs (with its ``TagReservations`` and accelerator),
on the data dir taken alone (``store.datalock``): it refuses while a daemon, or
any other Runtime, has the dir open, and no daemon opens it meanwhile. So the
registry is never written by two processes at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from forkd.config import DataDir
from forkd.controller.host_accel import HostAccelerator
from forkd.controller.snapshots import SnapshotStore
from forkd.controller.tags import TagReservations
from forkd.controller.travel import SnapshotTravel
from forkd.host.shm import ShmMemory
from forkd.store.datalock import DataDirLock
from forkd.store.registry import Registry


@asynccontextmanager
async def offline_travel(data: DataDir) -> AsyncIterator[SnapshotTravel]:
    data = data.ensure()
    lock = DataDirLock.exclusive(data)
    try:
        registry = Registry(data.registry)
        try:
            # The daemon's wiring, for this one owner: snapshot rows only through the SnapshotStore.
            tags = TagReservations(lambda t: snapshots.exists(t))
            snapshots = SnapshotStore(registry.snapshots, registry.snapshot_names,
                                      data.snapshots, tags, ShmMemory(data.root))
            yield SnapshotTravel(data, snapshots, tags, HostAccelerator(data))
        finally:
            registry.close()
    finally:
        lock.release()


__all__ = ["offline_travel"]
