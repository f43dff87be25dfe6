"""Table ``secrets``: secrets by name, their values sealed (store/secret_box.py). Written only by
``controller.secrets.Secrets``; nothing here ever holds a value in the clear."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass

from forkd.store.rows.table import Table


@dataclass(frozen=True)
class SecretRow:
    name: str
    nonce: bytes
    sealed: bytes
    version: int
    metadata: dict[str, str]
    created_at_unix: float
    updated_at_unix: float


class SecretRows(Table):
    def put(self, row: SecretRow) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO secrets (name, nonce, sealed, version, metadata, created_at_unix, "
                "updated_at_unix) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (row.name, row.nonce, row.sealed, row.version, json.dumps(row.metadata),
                 row.created_at_unix, row.updated_at_unix))

    def get(self, name: str) -> SecretRow | None:
        with self._lock:
            r = self._db.execute("SELECT * FROM secrets WHERE name = ?", (name,)).fetchone()
        return None if r is None else _row(r)

    def all(self) -> list[SecretRow]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM secrets ORDER BY name").fetchall()
        return [_row(r) for r in rows]

    def delete(self, name: str) -> bool:
        with self._lock:
            return self._db.execute("DELETE FROM secrets WHERE name = ?", (name,)).rowcount > 0


def _row(r: sqlite3.Row) -> SecretRow:
    return SecretRow(str(r["name"]), bytes(r["nonce"]), bytes(r["sealed"]), int(r["version"]),
                     dict(json.loads(r["metadata"] or "{}")), float(r["created_at_unix"]),
                     float(r["updated_at_unix"]))
