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
from forkd.controller.tags import TagReservations
from forkd.controller.travel import SnapshotTravel
from forkd.store.datalock import DataDirLock
from forkd.store.registry import Registry


@asynccontextmanager
async def offline_travel(data: DataDir) -> AsyncIterator[SnapshotTravel]:
    data = data.ensure()
    lock = DataDirLock.exclusive(data)
    try:
        registry = Registry(data.registry)
        try:
            tags = TagReservations(lambda t: registry.has_snapshot(t) or (data.snapshots / t).exists())
            yield SnapshotTravel(data, registry, tags, HostAccelerator(data))
        finally:
            registry.close()
    finally:
        lock.release()


__all__ = ["offline_travel"]
