"""Table ``paused_sandboxes``: sandboxes stopped after a branch of their state, to resume
under the same id. Written only by ``controller.suspend.Suspender``."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict
from typing import Protocol

from forkd.errors import Conflict, NotFound
from forkd.store.records import PausedRecord
from forkd.store.rows.table import Table


class PausedReader(Protocol):
    """Paused sandboxes, read-only."""

    def get(self, sandbox_id: str) -> PausedRecord: ...

    def has(self, sandbox_id: str) -> bool: ...

    def all(self) -> list[PausedRecord]: ...


class PausedRows(Table):
    def insert(self, paused: PausedRecord) -> None:
        meta = {k: v for k, v in asdict(paused).items() if k not in ("id", "state_tag")}
        with self._lock:
            try:
                self._db.execute("INSERT INTO paused_sandboxes (id, state_tag, meta) VALUES (?, ?, ?)",
                                 (paused.id, paused.state_tag, json.dumps(meta)))
            except sqlite3.IntegrityError:
                raise Conflict(f"sandbox {paused.id!r} is already paused") from None

    def get(self, sandbox_id: str) -> PausedRecord:
        with self._lock:
            row = self._db.execute("SELECT * FROM paused_sandboxes WHERE id = ?", (sandbox_id,)).fetchone()
        if row is None:
            raise NotFound(f"no paused sandbox {sandbox_id!r}")
        return PausedRecord(id=row["id"], state_tag=row["state_tag"], **json.loads(row["meta"]))

    def has(self, sandbox_id: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM paused_sandboxes WHERE id = ?",
                                    (sandbox_id,)).fetchone() is not None

    def all(self) -> list[PausedRecord]:
        with self._lock:
            ids = [r[0] for r in self._db.execute("SELECT id FROM paused_sandboxes ORDER BY id").fetchall()]
        return [self.get(i) for i in ids]

    def delete(self, sandbox_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM paused_sandboxes WHERE id = ?", (sandbox_id,))
