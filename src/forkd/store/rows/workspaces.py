"""Table ``workspaces``: named sandboxes that outlive suspend/resume. Written only by
``controller.workspaces.Workspaces``."""

from __future__ import annotations

import sqlite3

from forkd.errors import Conflict, NotFound
from forkd.store.records import WorkspaceRecord, now_unix
from forkd.store.rows.table import Table


class WorkspaceRows(Table):
    def insert(self, ws: WorkspaceRecord) -> None:
        with self._lock:
            try:
                self._db.execute(
                    "INSERT INTO workspaces (name, sandbox_id, source_tag, created_at_unix, "
                    "last_active_unix) VALUES (?, ?, ?, ?, ?)",
                    (ws.name, ws.sandbox_id, ws.source_tag, ws.created_at_unix, ws.last_active_unix))
            except sqlite3.IntegrityError:
                raise Conflict(f"workspace {ws.name!r} already exists; delete it first") from None

    def get(self, name: str) -> WorkspaceRecord:
        with self._lock:
            row = self._db.execute("SELECT * FROM workspaces WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"workspace {name!r} does not exist")
        return WorkspaceRecord(**dict(row))

    def all(self) -> list[WorkspaceRecord]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM workspaces ORDER BY created_at_unix, name").fetchall()
        return [WorkspaceRecord(**dict(r)) for r in rows]

    def touch(self, name: str, sandbox_id: str) -> None:
        with self._lock:
            self._db.execute("UPDATE workspaces SET sandbox_id = ?, last_active_unix = ? WHERE name = ?",
                             (sandbox_id, now_unix(), name))

    def delete(self, name: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM workspaces WHERE name = ?", (name,))
