"""The snapshot store: what is registered, how snapshots descend from each other,
and deleting them (with their subtree, on request).

It alone holds the writable snapshot rows (``store.rows.snapshots.SnapshotRows``):
every other owner that makes, finishes or retires a snapshot does it through the
store (``register``, ``set_status``, ``set_auto_delete``, ``retire_checkpoint``,
``unregister``), and reads raw rows through ``records`` (a ``SnapshotReader``).

A snapshot's VM configuration is read from its own ``snapshot.json`` (written
once, when it is published); the registry row holds only lifecycle and lineage.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forkd.controller.tags import TagReservations
from forkd.errors import Conflict, ForkdError, NotFound, VMError
from forkd.host.accel import VMConfig
from forkd.host.shm import ShmMemory
from forkd.store.layout import SnapshotDir, check_tag
from forkd.store.records import SnapshotRecord
from forkd.store.rows.snapshot_names import SnapshotNameRows
from forkd.store.rows.snapshots import SnapshotReader, SnapshotRows
from forkd.store.volume_spec import disk_indices


@dataclass(frozen=True)
class Forkable:
    """A ready snapshot, with what restoring a child from it needs."""

    record: SnapshotRecord
    dir: SnapshotDir
    config: VMConfig
    tap: str | None  # a NIC is part of the device config: children need a tap of this name
    dns: tuple[str, ...] = ()  # the resolvers baked into the guest (a NIC's snapshot only)
    # Its attached volumes (store/volume_spec.py): part of the device config, like the NIC.
    volumes: tuple[dict[str, Any], ...] = ()


class SnapshotStore:
    def __init__(self, rows: SnapshotRows, names: SnapshotNameRows, snapshots_dir: Path,
                 tags: TagReservations, shm: ShmMemory) -> None:
        self._rows = rows
        self._names = names
        self._dir = snapshots_dir
        self._tags = tags
        self._shm = shm

    @property
    def records(self) -> SnapshotReader:
        """The snapshot rows, read-only (no tag check: for tags the daemon made itself)."""
        return self._rows

    def exists(self, tag: str) -> bool:
        """Registered, or its directory is on disk (a leftover we must not overwrite)."""
        return self._rows.has(tag) or (self._dir / tag).exists()

    def all(self) -> list[SnapshotRecord]:
        return self._rows.all()

    def get(self, tag: str) -> SnapshotRecord:
        return self._rows.get(check_tag(tag))

    def dir(self, tag: str) -> SnapshotDir:
        return SnapshotDir(self._dir / tag)

    def on_image(self, name: str) -> list[str]:
        """The snapshots whose root disks stand on guest image ``name`` (templates and the
        branches that inherit their image), sorted; one whose metadata cannot be read counts."""
        users = []
        for snap in self._rows.all():
            try:
                image = SnapshotDir(Path(snap.dir)).read_meta().get("image") or {}
            except (OSError, ValueError, ForkdError):
                users.append(snap.tag)  # unreadable: keep its image rather than guess
                continue
            if isinstance(image, dict) and image.get("name") == name:
                users.append(snap.tag)
        return sorted(users)

    def forkable(self, tag: str) -> Forkable:
        snap = self.get(tag)
        snap.check_forkable()
        sdir = SnapshotDir(Path(snap.dir))
        if not sdir.complete():
            raise VMError(f"snapshot {tag!r} is missing files under {sdir.path}")
        meta = sdir.read_meta()  # each field checked (store/snapshot_meta.py)
        if "config" not in meta:
            raise VMError(f"snapshot {tag!r} records no VM config in {sdir.meta_path}")
        volumes = tuple(meta.get("volumes") or ())
        missing = [str(sdir.volume(i)) for i in disk_indices(volumes) if not sdir.volume(i).exists()]
        if missing:
            raise VMError(f"snapshot {tag!r} is missing its volume layer(s) {missing}")
        return Forkable(snap, sdir, VMConfig.from_json(meta["config"]), meta.get("tap"),
                        tuple(meta.get("dns") or ()), volumes)

    # ---------------------------------------------------------------- rows

    def register(self, record: SnapshotRecord) -> None:
        """A snapshot made (or arriving) elsewhere: its row; 409 if the tag is registered."""
        self._rows.insert(record)

    def set_status(self, tag: str, status: str, error: str | None = None) -> None:
        """A snapshot written in the background is now ``ready`` (or ``failed``, with why)."""
        self._rows.set_status(tag, status, error)

    def set_auto_delete(self, tag: str, auto_delete: bool) -> None:
        """Whether ``tag`` goes once nothing needs it (the Forker's ``collect``)."""
        self._rows.set_auto_delete(tag, auto_delete)

    def retire_checkpoint(self, tag: str) -> None:
        """A checkpoint out of its policy's window but still needed: dropped with its last user."""
        self._rows.retire_checkpoint(tag)

    def unregister(self, tag: str) -> None:
        """Drop ``tag``'s row only (a write that failed; its files are the caller's)."""
        self._rows.delete(tag)

    # ---------------------------------------------------------------- names

    def name(self, name: str, tag: str) -> None:
        """``name`` stands for the snapshot ``tag`` from now on (moved if it stood for another)."""
        check_tag(name)
        self.get(tag)  # 404 unless registered
        if name != tag and self._rows.has(name):
            raise Conflict(f"{name!r} is a snapshot's own tag; a name cannot stand for another")
        self._names.set(name, tag, time.time())

    def unname(self, name: str) -> bool:
        """Forget ``name``; False if it stood for nothing."""
        return self._names.delete(name)

    def names(self, tag: str) -> list[tuple[str, float]]:
        """The names that stand for ``tag``, oldest first, each with when it was given."""
        return self._names.of(tag)

    def resolve(self, name: str) -> str:
        """The tag of the snapshot ``name`` is: a registered tag itself, else what it stands for."""
        if self._rows.has(name):
            return name
        return self._names.get(name) or name

    # ---------------------------------------------------------------- lineage

    def lineage(self, tag: str, sandboxes: list[str]) -> dict[str, Any]:
        """SnapshotInfo plus ancestors, dependents and the sandboxes forked from it."""
        snap = self.get(tag)
        ancestors = []
        parent = snap.parent_tag
        while parent:
            ancestors.append(parent)
            try:
                parent = self._rows.get(parent).parent_tag
            except NotFound:
                break
        return {**snap.info(), "parent_tag": snap.parent_tag, "ancestors": ancestors,
                "dependents": self.dependents(tag), "sandboxes": sorted(sandboxes)}

    def dependents(self, tag: str) -> list[str]:
        """Snapshots whose disk chain runs through ``tag`` (all descendants), breadth first."""
        children: dict[str, list[str]] = {}
        for s in self._rows.all():
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
        registered = self._rows.has(tag)
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
        self._rows.delete(tag)
        self._names.delete_of(tag)
        shutil.rmtree(self._dir / tag, ignore_errors=True)
        self._shm.remove(tag)
