"""The snapshot store: what is registered, how snapshots descend from each other,
and deleting them (with their subtree, on request).

A snapshot's VM configuration is read from its own ``snapshot.json`` (written
once, when it is published); the registry row holds only lifecycle and lineage.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forkd.controller.tags import TagReservations
from forkd.errors import Conflict, NotFound, VMError
from forkd.host.accel import VMConfig
from forkd.host.shm import ShmMemory
from forkd.store.layout import SnapshotDir, check_tag
from forkd.store.registry import Registry, SnapshotRecord


@dataclass(frozen=True)
class Forkable:
    """A ready snapshot, with what restoring a child from it needs."""

    record: SnapshotRecord
    dir: SnapshotDir
    config: VMConfig
    tap: str | None  # a NIC is part of the device config: children need a tap of this name
    dns: tuple[str, ...] = ()  # the resolvers baked into the guest (a NIC's snapshot only)


class SnapshotStore:
    def __init__(self, registry: Registry, snapshots_dir: Path, tags: TagReservations,
                 shm: ShmMemory) -> None:
        self._registry = registry
        self._dir = snapshots_dir
        self._tags = tags
        self._shm = shm

    def exists(self, tag: str) -> bool:
        """Registered, or its directory is on disk (a leftover we must not overwrite)."""
        return self._registry.has_snapshot(tag) or (self._dir / tag).exists()

    def all(self) -> list[SnapshotRecord]:
        return self._registry.list_snapshots()

    def get(self, tag: str) -> SnapshotRecord:
        return self._registry.get_snapshot(check_tag(tag))

    def dir(self, tag: str) -> SnapshotDir:
        return SnapshotDir(self._dir / tag)

    def forkable(self, tag: str) -> Forkable:
        snap = self.get(tag)
        snap.check_forkable()
        sdir = SnapshotDir(Path(snap.dir))
        if not sdir.complete():
            raise VMError(f"snapshot {tag!r} is missing files under {sdir.path}")
        meta = sdir.read_meta()
        return Forkable(snap, sdir, VMConfig.from_json(meta["config"]), meta.get("tap"),
                        tuple(meta.get("dns") or ()))

    # ---------------------------------------------------------------- lineage

    def lineage(self, tag: str, sandboxes: list[str]) -> dict[str, Any]:
        """SnapshotInfo plus ancestors, dependents and the sandboxes forked from it."""
        snap = self.get(tag)
        ancestors = []
        parent = snap.parent_tag
        while parent:
            ancestors.append(parent)
            try:
                parent = self._registry.get_snapshot(parent).parent_tag
            except NotFound:
                break
        return {**snap.info(), "parent_tag": snap.parent_tag, "ancestors": ancestors,
                "dependents": self.dependents(tag), "sandboxes": sorted(sandboxes)}

    def dependents(self, tag: str) -> list[str]:
        """Snapshots whose disk chain runs through ``tag`` (all descendants), breadth first."""
        children: dict[str, list[str]] = {}
        for s in self._registry.list_snapshots():
            if s.parent_tag:
                children.setdefault(s.parent_tag, []).append(s.tag)
        out, todo = [], list(children.get(tag, []))
        while todo:
            t = todo.pop(0)
            out.append(t)
            todo.extend(children.get(t, []))
        return out

    # ---------------------------------------------------------------- delete

    def deletion_plan(self, tag: str, *, cascade: bool, force: bool) -> list[str]:
        """The tags to delete, deepest first; 404/409 if ``tag`` cannot go."""
        check_tag(tag)
        registered = self._registry.has_snapshot(tag)
        if not registered and not (self._dir / tag).exists():
            raise NotFound(f"snapshot {tag!r} is not registered")
        if self._tags.in_flight(tag):
            raise Conflict(f"snapshot {tag!r} is still being written")
        dependents = self.dependents(tag) if registered else []
        if dependents and not cascade:
            # force kills sandboxes, but cannot make dependents forkable without their base:
            # their disk chains run through this snapshot's files.
            raise Conflict(
                f"snapshot {tag!r} has dependent snapshots {dependents}: delete them first, "
                "or pass cascade=true to delete the subtree (force=true alone does not: the "
                "dependents could no longer be forked)"
            )
        return [*reversed(dependents), tag] if cascade else [tag]

    def remove(self, tag: str) -> None:
        """Unregister ``tag`` and delete its files (the caller checked it may go)."""
        self._registry.delete_snapshot(tag)
        shutil.rmtree(self._dir / tag, ignore_errors=True)
        self._shm.remove(tag)
