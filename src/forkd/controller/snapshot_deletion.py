"""Deleting a snapshot: who still needs it is asked first, then each owner lets go of it.

A snapshot is needed by the sandboxes forked from it, the paused sandboxes that resume
from it and, with ``cascade``, the snapshots layered on it (``SnapshotStore.deletion_plan``
names them all, or refuses). ``force`` kills and forgets those users; without it, any of
them is a 409 and nothing changes. Then its pools drain, its layers go back to the sources
that still write on them (``Brancher.unpublish``), its files go, and a fork snapshot it was
the last dependent of is collected.
"""

from __future__ import annotations

from forkd.controller.branch import Brancher
from forkd.controller.forks import Forker
from forkd.controller.pools import PoolKeeper
from forkd.controller.results import RecordJson
from forkd.controller.sandboxes import SandboxTable
from forkd.controller.snapshots import SnapshotStore
from forkd.controller.suspend import Suspender
from forkd.errors import Conflict


class SnapshotDeletion:
    def __init__(self, snapshots: SnapshotStore, sandboxes: SandboxTable, suspender: Suspender,
                 pools: PoolKeeper, brancher: Brancher, forker: Forker) -> None:
        self._snapshots = snapshots
        self._sandboxes = sandboxes
        self._suspender = suspender
        self._pools = pools
        self._brancher = brancher
        self._forker = forker

    def _users(self, tags: set[str] | list[str]) -> list[str]:
        return [sb.id for sb in self._sandboxes.records.all() if not sb.pooled and sb.snapshot_tag in tags]

    def lineage(self, tag: str) -> RecordJson:
        return self._snapshots.lineage(tag, self._users([tag]))

    async def delete(self, tag: str, *, cascade: bool = False, force: bool = False) -> None:
        doomed = self._snapshots.deletion_plan(tag, cascade=cascade, force=force)
        # A sandbox needs the snapshot it was forked from. (A branch's *source* does
        # not: it keeps its own copies of the layers; see Brancher.unpublish.)
        users = self._users(doomed)
        if users and not force:
            raise Conflict(
                f"sandboxes {users} are running from {tag!r}; kill them first or pass force=true"
            )
        paused = self._suspender.holding(doomed)
        if paused and not force:
            raise Conflict(f"paused sandboxes {paused} resume from {tag!r}; kill them first or pass "
                           "force=true")
        for sb_id in paused:
            self._suspender.discard(sb_id)
        for t in doomed:
            await self._pools.drop(t)  # a pool holds no one's work: it just drains
        for sb_id in users:
            await self._sandboxes.kill(sb_id)
        for t in doomed:
            self._brancher.unpublish(t)
            self._snapshots.remove(t)
        await self._forker.collect()  # it may have been the last dependent of a fork snapshot


__all__ = ["SnapshotDeletion"]
