"""Table ``volumes``: named volumes. Written only by ``controller.volumes.Volumes``."""

from __future__ import annotations

import sqlite3

from forkd.errors import Conflict, NotFound
from forkd.store.records import VolumeRecord
from forkd.store.rows.table import Table


class VolumeRows(Table):
    def insert(self, vol: VolumeRecord) -> None:
        with self._lock:
            try:
                self._db.execute(
                    "INSERT INTO volumes (name, size_bytes, fs, created_at_unix) VALUES (?, ?, ?, ?)",
                    (vol.name, vol.size_bytes, vol.fs, vol.created_at_unix))
            except sqlite3.IntegrityError:
                raise Conflict(f"volume {vol.name!r} already exists; delete it first") from None

    def get(self, name: str) -> VolumeRecord:
        with self._lock:
            row = self._db.execute("SELECT * FROM volumes WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"volume {name!r} does not exist")
        return VolumeRecord(**dict(row))

    def all(self) -> list[VolumeRecord]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM volumes ORDER BY created_at_unix, name").fetchall()
        return [VolumeRecord(**dict(r)) for r in rows]

    def delete(self, name: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM volumes WHERE name = ?", (name,))
