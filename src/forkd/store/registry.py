"""The SQLite registry of snapshots and sandboxes (WAL mode, one file): the database.

It is the daemon's memory across restarts: on start-up every sandbox row is
checked against its QEMU process and either re-adopted or reaped.

``Registry`` opens the file, creates and migrates the schema, and holds the one
connection and its lock; each table is its own object (``store/rows/``), handed
by ``controller/runtime.py`` to the one owner that writes it, and as a read-only
view (a ``...Reader`` Protocol) to owners that only read it.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from forkd.store.records import (
    AutoCheckpoint,
    DiskChain,
    PausedRecord,
    PoolConfig,
    PoolKey,
    SandboxRecord,
    SnapshotRecord,
    VolumeRecord,
    WorkspaceRecord,
    now_unix,
)
from forkd.store.rows.aliases import MAX_ALIAS_HOPS, AliasRows
from forkd.store.rows.paused import PausedRows
from forkd.store.rows.pools import PoolRows
from forkd.store.rows.prefixes import PrefixRows
from forkd.store.rows.sandboxes import SandboxRows
from forkd.store.rows.secrets import SecretRows
from forkd.store.rows.snapshot_names import SnapshotNameRows
from forkd.store.rows.snapshots import SnapshotRows
from forkd.store.rows.volumes import VolumeRows
from forkd.store.rows.workspaces import WorkspaceRows

__all__ = [
    "MAX_ALIAS_HOPS", "AutoCheckpoint", "DiskChain", "PausedRecord", "PoolConfig", "PoolKey", "Registry",
    "SandboxRecord", "SnapshotRecord", "VolumeRecord", "WorkspaceRecord", "now_unix",
]

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
    pooled INTEGER NOT NULL DEFAULT 0,
    meta TEXT NOT NULL DEFAULT '{}'
);
-- The list's order (creation time, then rowid): a page of thousands reads no more than it shows.
CREATE INDEX IF NOT EXISTS sandboxes_by_creation ON sandboxes (created_at_unix);
CREATE TABLE IF NOT EXISTS snapshot_names (
    name TEXT PRIMARY KEY,
    tag TEXT NOT NULL,
    created_unix REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS sandbox_aliases (
    alias TEXT PRIMARY KEY,
    target TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS paused_sandboxes (
    id TEXT PRIMARY KEY,
    state_tag TEXT NOT NULL,
    meta TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS workspaces (
    name TEXT PRIMARY KEY,
    sandbox_id TEXT NOT NULL,
    source_tag TEXT NOT NULL,
    created_at_unix INTEGER NOT NULL,
    last_active_unix INTEGER NOT NULL
);
-- Every sandbox id prefix (sb-<6 hex>, one per spawn batch) this data dir ever issued:
-- an id is never handed out twice, so nothing keyed by an id (an E2B access token, an
-- audit line, a branch tag) can come to name another sandbox.
CREATE TABLE IF NOT EXISTS issued_prefixes (
    prefix TEXT PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS volumes (
    name TEXT PRIMARY KEY,
    size_bytes INTEGER NOT NULL,
    fs TEXT NOT NULL,
    created_at_unix INTEGER NOT NULL
);
-- Secrets (controller/secrets.py): values sealed with the daemon's key (store/secret_box.py).
CREATE TABLE IF NOT EXISTS secrets (
    name TEXT PRIMARY KEY,
    nonce BLOB NOT NULL,
    sealed BLOB NOT NULL,
    version INTEGER NOT NULL,
    metadata TEXT NOT NULL DEFAULT '{}',
    created_at_unix REAL NOT NULL,
    updated_at_unix REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS pools (
    tag TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    memory_limit_mib INTEGER,
    per_child_netns INTEGER NOT NULL DEFAULT 0,
    live_fork INTEGER NOT NULL DEFAULT 0,
    egress TEXT
);
"""
# Columns added after a table was first shipped: (table, column, declaration).
MIGRATIONS = (("pools", "egress", "TEXT"), ("sandboxes", "pooled", "INTEGER NOT NULL DEFAULT 0"))
# What a new column is filled with from the rows an older forkd wrote (it kept the flag in meta).
BACKFILLS = {("sandboxes", "pooled"):
             "UPDATE sandboxes SET pooled = 1 WHERE coalesce(json_extract(meta, '$.pooled'), 0)"}


class Registry:
    """The database: one connection, one lock, and a table object per table.

    Thread-safe: the daemon calls it from the event loop and from worker threads.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Private whatever the umask: it names every sandbox, snapshot and path.
        path.touch(mode=0o600, exist_ok=True)
        path.chmod(0o600)
        self.path = path
        self._lock = threading.RLock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(SCHEMA)
        self._migrate()
        self._record_issued_prefixes()
        self.snapshots = SnapshotRows(self._db, self._lock)
        self.snapshot_names = SnapshotNameRows(self._db, self._lock)
        self.sandboxes = SandboxRows(self._db, self._lock)
        self.aliases = AliasRows(self._db, self._lock)
        self.paused = PausedRows(self._db, self._lock)
        self.workspaces = WorkspaceRows(self._db, self._lock)
        self.pools = PoolRows(self._db, self._lock)
        self.volumes = VolumeRows(self._db, self._lock)
        self.prefixes = PrefixRows(self._db, self._lock)
        self.secrets = SecretRows(self._db, self._lock)

    def _migrate(self) -> None:
        """Add the columns a registry written by an older forkd lacks."""
        with self._lock:
            for table, column, decl in MIGRATIONS:
                have = {r["name"] for r in self._db.execute(f"PRAGMA table_info({table})")}
                if column not in have:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
                    if (table, column) in BACKFILLS:
                        self._db.execute(BACKFILLS[table, column])

    def _record_issued_prefixes(self) -> None:
        """The prefixes of the ids already here (a registry older than the table) count as issued."""
        with self._lock:
            ids = [r[0] for q in ("SELECT id FROM sandboxes", "SELECT id FROM paused_sandboxes",
                                  "SELECT alias FROM sandbox_aliases", "SELECT target FROM sandbox_aliases")
                   for r in self._db.execute(q)]
            self._db.executemany("INSERT OR IGNORE INTO issued_prefixes (prefix) VALUES (?)",
                                 [(i.rsplit("-", 1)[0],) for i in ids if "-" in i])

    def close(self) -> None:
        with self._lock:
            self._db.close()
