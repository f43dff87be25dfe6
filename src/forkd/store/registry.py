"""The SQLite registry of snapshots and sandboxes (WAL mode, one file).

It is the daemon's memory across restarts: on start-up every sandbox row is
checked against its QEMU process and either re-adopted or reaped.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from forkd.errors import Conflict, NotFound

SCHEMA = """
CREATE TABLE IF NOT EXISTS snapshots (
    tag TEXT PRIMARY KEY,
    dir TEXT NOT NULL,
    created_at_unix INTEGER NOT NULL,
    status TEXT NOT NULL,
    branched_from TEXT,
    parent_tag TEXT,
    pause_ms REAL,
    error TEXT,
    meta TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY,
    snapshot_tag TEXT NOT NULL,
    dir TEXT NOT NULL,
    created_at_unix INTEGER NOT NULL,
    pid INTEGER,
    netns TEXT,
    memory_limit_mib INTEGER,
    live_fork INTEGER NOT NULL DEFAULT 0,
    branch_seq INTEGER NOT NULL DEFAULT 0,
    meta TEXT NOT NULL DEFAULT '{}'
);
"""


@dataclass
class SnapshotRecord:
    tag: str
    dir: str
    created_at_unix: int
    status: str = "ready"  # ready | writing | failed
    branched_from: str | None = None  # source sandbox id, for BRANCH snapshots
    parent_tag: str | None = None  # the snapshot the source sandbox was forked from
    pause_ms: float | None = None
    error: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def info(self) -> dict[str, Any]:
        """SnapshotInfo as the seeds define it: optional fields omitted when unset."""
        out: dict[str, Any] = {"tag": self.tag, "dir": self.dir, "created_at_unix": self.created_at_unix}
        if self.branched_from is not None:
            out["branched_from"] = self.branched_from
        if self.pause_ms is not None:
            out["pause_ms"] = self.pause_ms
        out["status"] = self.status
        if self.error:
            out["error"] = self.error
        if self.meta.get("source_error"):
            out["warning"] = self.meta["source_error"]
        return out


@dataclass
class SandboxRecord:
    id: str
    snapshot_tag: str
    dir: str
    created_at_unix: int
    pid: int | None = None
    netns: str | None = None
    memory_limit_mib: int | None = None
    live_fork: bool = False
    branch_seq: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def agent_socket(self) -> str:
        return str(Path(self.dir) / "agent.sock")

    def info(self) -> dict[str, Any]:
        """SandboxInfo as the seeds define it."""
        out: dict[str, Any] = {
            "id": self.id,
            "snapshot_tag": self.snapshot_tag,
            "netns": self.netns,
            # No vsock/TCP on these hosts: the agent is reached over a virtio-serial
            # port whose host end is this unix socket (the daemon proxies exec/eval).
            "guest_addr": f"unix:{self.agent_socket}",
            "created_at_unix": self.created_at_unix,
        }
        if self.pid is not None:
            out["pid"] = self.pid
        if self.memory_limit_mib is not None:
            out["memory_limit_mib"] = self.memory_limit_mib
        out["live_fork"] = self.live_fork
        return out


def _row_to(cls: type, row: sqlite3.Row) -> Any:
    names = {f.name for f in fields(cls)}
    values = {k: row[k] for k in row.keys() if k in names}  # noqa: SIM118 (Row has no __iter__ of keys)
    values["meta"] = json.loads(values.get("meta") or "{}")
    if "live_fork" in values:
        values["live_fork"] = bool(values["live_fork"])
    return cls(**values)


class Registry:
    """Thread-safe: the daemon calls it from the event loop and from worker threads."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.RLock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --------------------------------------------------------------- snapshots

    def insert_snapshot(self, snap: SnapshotRecord) -> None:
        row = asdict(snap)
        row["meta"] = json.dumps(snap.meta)
        with self._lock:
            try:
                self._db.execute(
                    f"INSERT INTO snapshots ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                    list(row.values()),
                )
            except sqlite3.IntegrityError:
                raise Conflict(f"snapshot {snap.tag!r} already exists; delete it first") from None

    def update_snapshot(self, tag: str, **changes: Any) -> None:
        if "meta" in changes:
            changes["meta"] = json.dumps(changes["meta"])
        sets = ", ".join(f"{k} = ?" for k in changes)
        with self._lock:
            self._db.execute(f"UPDATE snapshots SET {sets} WHERE tag = ?", [*changes.values(), tag])

    def get_snapshot(self, tag: str) -> SnapshotRecord:
        with self._lock:
            row = self._db.execute("SELECT * FROM snapshots WHERE tag = ?", (tag,)).fetchone()
        if row is None:
            raise NotFound(f"snapshot {tag!r} is not registered")
        return _row_to(SnapshotRecord, row)

    def has_snapshot(self, tag: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM snapshots WHERE tag = ?", (tag,)).fetchone() is not None

    def list_snapshots(self) -> list[SnapshotRecord]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM snapshots ORDER BY created_at_unix, tag").fetchall()
        return [_row_to(SnapshotRecord, r) for r in rows]

    def delete_snapshot(self, tag: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM snapshots WHERE tag = ?", (tag,))

    # --------------------------------------------------------------- sandboxes

    def insert_sandbox(self, sb: SandboxRecord) -> None:
        row = asdict(sb)
        row["meta"] = json.dumps(sb.meta)
        row["live_fork"] = int(sb.live_fork)
        with self._lock:
            self._db.execute(
                f"INSERT INTO sandboxes ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                list(row.values()),
            )

    def update_sandbox(self, sandbox_id: str, **changes: Any) -> None:
        if "meta" in changes:
            changes["meta"] = json.dumps(changes["meta"])
        sets = ", ".join(f"{k} = ?" for k in changes)
        with self._lock:
            self._db.execute(f"UPDATE sandboxes SET {sets} WHERE id = ?", [*changes.values(), sandbox_id])

    def next_branch_seq(self, sandbox_id: str) -> int:
        """Monotonic per source sandbox, persisted so a daemon restart does not reuse one."""
        with self._lock:
            self._db.execute("UPDATE sandboxes SET branch_seq = branch_seq + 1 WHERE id = ?", (sandbox_id,))
            row = self._db.execute("SELECT branch_seq FROM sandboxes WHERE id = ?", (sandbox_id,)).fetchone()
        if row is None:
            raise NotFound(f"sandbox {sandbox_id!r} is not alive")
        return int(row[0])

    def get_sandbox(self, sandbox_id: str) -> SandboxRecord:
        with self._lock:
            row = self._db.execute("SELECT * FROM sandboxes WHERE id = ?", (sandbox_id,)).fetchone()
        if row is None:
            raise NotFound(f"sandbox {sandbox_id!r} is not alive")
        return _row_to(SandboxRecord, row)

    def list_sandboxes(self) -> list[SandboxRecord]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM sandboxes ORDER BY created_at_unix, id").fetchall()
        return [_row_to(SandboxRecord, r) for r in rows]

    def delete_sandbox(self, sandbox_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM sandboxes WHERE id = ?", (sandbox_id,))


def now_unix() -> int:
    return int(time.time())
