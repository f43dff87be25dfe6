"""Table ``snapshots``: one row per registered snapshot (lifecycle and lineage; its VM config
lives in its ``snapshot.json``). Written only by ``controller.snapshots.SnapshotStore``."""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Protocol

from forkd.errors import Conflict, NotFound
from forkd.store.records import SnapshotRecord
from forkd.store.rows.table import Table


class SnapshotReader(Protocol):
    """Snapshot rows, read-only."""

    def get(self, tag: str) -> SnapshotRecord: ...

    def has(self, tag: str) -> bool: ...

    def all(self) -> list[SnapshotRecord]: ...


# Typed fields kept in the ``meta`` JSON column (the SQL columns hold the rest).
def _snapshot_meta(s: SnapshotRecord) -> dict[str, Any]:
    return {"mode": s.mode, "source_layers": s.source_layers, "warning": s.warning,
            "auto_delete": s.auto_delete, "checkpoint_of": s.checkpoint_of, "fs_freeze_ms": s.fs_freeze_ms,
            "diff_measure": s.diff_measure, "compacted_from": s.compacted_from, "volumes": s.volumes}


_SNAPSHOT_COLUMNS = ("tag", "dir", "created_at_unix", "status", "branched_from", "parent_tag",
                     "pause_ms", "error")


def _snapshot_from_row(row: sqlite3.Row) -> SnapshotRecord:
    meta = json.loads(row["meta"] or "{}")
    return SnapshotRecord(
        **{k: row[k] for k in _SNAPSHOT_COLUMNS}, mode=meta.get("mode"),
        source_layers=list(meta.get("source_layers") or []),
        warning=meta.get("warning") or meta.get("source_error"),
        auto_delete=bool(meta.get("auto_delete")), checkpoint_of=meta.get("checkpoint_of"),
        fs_freeze_ms=meta.get("fs_freeze_ms"),
        diff_measure=meta.get("diff_measure"), compacted_from=meta.get("compacted_from"),
        volumes=list(meta.get("volumes") or []),
    )


class SnapshotRows(Table):
    def insert(self, snap: SnapshotRecord) -> None:
        row = {k: getattr(snap, k) for k in _SNAPSHOT_COLUMNS}
        row["meta"] = json.dumps(_snapshot_meta(snap))
        with self._lock:
            try:
                self._db.execute(
                    f"INSERT INTO snapshots ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                    list(row.values()),
                )
            except sqlite3.IntegrityError:
                raise Conflict(f"snapshot {snap.tag!r} already exists; delete it first") from None

    def save(self, snap: SnapshotRecord) -> None:
        """Write every field of an already registered snapshot."""
        row = {k: getattr(snap, k) for k in _SNAPSHOT_COLUMNS if k != "tag"}
        row["meta"] = json.dumps(_snapshot_meta(snap))
        sets = ", ".join(f"{k} = ?" for k in row)
        with self._lock:
            self._db.execute(f"UPDATE snapshots SET {sets} WHERE tag = ?", [*row.values(), snap.tag])

    def set_auto_delete(self, tag: str, auto_delete: bool) -> None:
        snap = self.get(tag)
        snap.auto_delete = auto_delete
        self.save(snap)

    def retire_checkpoint(self, tag: str) -> None:
        """Out of its policy's window but still needed: dropped with its last user."""
        snap = self.get(tag)
        snap.auto_delete = True
        snap.checkpoint_of = None
        self.save(snap)

    def set_status(self, tag: str, status: str, error: str | None = None) -> None:
        with self._lock:
            self._db.execute("UPDATE snapshots SET status = ?, error = ? WHERE tag = ?", (status, error, tag))

    def get(self, tag: str) -> SnapshotRecord:
        with self._lock:
            row = self._db.execute("SELECT * FROM snapshots WHERE tag = ?", (tag,)).fetchone()
        if row is None:
            raise NotFound(f"snapshot {tag!r} is not registered")
        return _snapshot_from_row(row)

    def has(self, tag: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM snapshots WHERE tag = ?", (tag,)).fetchone() is not None

    def all(self) -> list[SnapshotRecord]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM snapshots ORDER BY created_at_unix, tag").fetchall()
        return [_snapshot_from_row(r) for r in rows]

    def delete(self, tag: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM snapshots WHERE tag = ?", (tag,))
