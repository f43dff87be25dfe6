"""Table ``snapshot_names``: more names for a snapshot (E2B's template tags: ``alias:tag``
pointing at a build). Written only by ``controller.snapshots.SnapshotStore``, which drops a
snapshot's names with it."""

from __future__ import annotations

from forkd.store.rows.table import Table


class SnapshotNameRows(Table):
    def set(self, name: str, tag: str, created_unix: float) -> None:
        """From now on ``name`` stands for the snapshot ``tag`` (a name moves if it had one)."""
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO snapshot_names (name, tag, created_unix) "
                             "VALUES (?, ?, ?)", (name, tag, created_unix))

    def get(self, name: str) -> str | None:
        """The snapshot tag ``name`` stands for, or None."""
        with self._lock:
            row = self._db.execute("SELECT tag FROM snapshot_names WHERE name = ?", (name,)).fetchone()
        return None if row is None else str(row[0])

    def of(self, tag: str) -> list[tuple[str, float]]:
        """The names of ``tag``, oldest first, each with when it was given."""
        with self._lock:
            rows = self._db.execute("SELECT name, created_unix FROM snapshot_names WHERE tag = ? "
                                    "ORDER BY created_unix, name", (tag,)).fetchall()
        return [(str(r[0]), float(r[1])) for r in rows]

    def delete(self, name: str) -> bool:
        with self._lock:
            return self._db.execute("DELETE FROM snapshot_names WHERE name = ?", (name,)).rowcount > 0

    def delete_of(self, tag: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM snapshot_names WHERE tag = ?", (tag,))
