"""Table ``sandboxes``: one row per sandbox this daemon started (re-adopted or reaped at
start-up). Written by ``controller.sandboxes.SandboxTable``; the other owners that keep a
column of the row get a narrow writer (a reader plus that column's setter), below."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from forkd.errors import NotFound
from forkd.host.accel import VMConfig
from forkd.host.netplan import ChildNet
from forkd.store.records import AutoCheckpoint, DiskChain, Hibernation, SandboxRecord
from forkd.store.rows.table import Table


class SandboxReader(Protocol):
    """Sandbox rows, read-only."""

    def get(self, sandbox_id: str) -> SandboxRecord: ...

    def has(self, sandbox_id: str) -> bool: ...

    def all(self) -> list[SandboxRecord]: ...

    def scan(self, after: str | None = None) -> Iterator[SandboxRecord]: ...

    def count_listed(self) -> int: ...


class DiskChainRows(SandboxReader, Protocol):
    """The brancher's columns: where a sandbox's disk stands, and its branch sequence."""

    def set_disk_chain(self, sandbox_id: str, disk: DiskChain) -> None: ...

    def next_branch_seq(self, sandbox_id: str) -> int: ...


class CheckpointPolicyRows(SandboxReader, Protocol):
    """The checkpointer's column (and the branch sequence its checkpoint tags count with)."""

    def set_checkpoint_policy(self, sandbox_id: str, policy: AutoCheckpoint | None) -> None: ...

    def next_branch_seq(self, sandbox_id: str) -> int: ...


class IdlePauseRows(SandboxReader, Protocol):
    """The idle pauser's columns."""

    def set_idle_pause(self, sandbox_id: str, idle_pause_secs: float | None) -> None: ...

    def set_idle_hibernate(self, sandbox_id: str, idle_hibernate_secs: float | None) -> None: ...


class ExpiryRows(SandboxReader, Protocol):
    """The deadline keeper's columns: when, and whether it then hibernates rather than dies."""

    def set_expiry(self, sandbox_id: str, expires_at_unix: float | None) -> None: ...

    def set_hibernate_on_timeout(self, sandbox_id: str, hibernate: bool, memory: bool = True) -> None: ...

    def set_auto_resume(self, sandbox_id: str, auto_resume: bool) -> None: ...


class NetworkRows(SandboxReader, Protocol):
    """The network owner's column: a sandbox's network, with its egress policy (an update)."""

    def set_network(self, sandbox_id: str, net: ChildNet) -> None: ...


def _sandbox_meta(s: SandboxRecord) -> dict[str, Any]:
    return {"config": s.config.to_json(), "disk": asdict(s.disk), "cgroup": s.cgroup, "tap": s.tap,
            "timings": s.timings, "metadata": s.metadata,
            "checkpoints": s.checkpoints.info() if s.checkpoints else None,
            "expires_at_unix": s.expires_at_unix, "cpu_limit": s.cpu_limit, "pids_limit": s.pids_limit,
            "cgroup_extra": s.cgroup_extra, "idle_pause_secs": s.idle_pause_secs,
            "disk_quota_mib": s.disk_quota_mib, "idle_hibernate_secs": s.idle_hibernate_secs,
            "hibernate_on_timeout": s.hibernate_on_timeout,
            "hibernate_on_timeout_memory": s.hibernate_on_timeout_memory, "auto_resume": s.auto_resume,
            "hibernation": asdict(s.hibernation) if s.hibernation is not None else None,
            "network": s.network.to_json() if s.network is not None else None,
            "volumes": s.volumes}


# Rows read per query of a scan: a page of a long list parses only the rows it shows.
SCAN_BATCH = 256

_SANDBOX_COLUMNS = ("id", "snapshot_tag", "dir", "created_at_unix", "pid", "netns", "memory_limit_mib",
                    "live_fork", "branch_seq", "pooled")


def _started(sb: SandboxRecord) -> float:
    """The created_at_unix column's value: the sub-second start, unless created_at_unix was
    changed alone since (then the whole second it names)."""
    return sb.started_unix if int(sb.started_unix) == sb.created_at_unix else float(sb.created_at_unix)


def _sandbox_from_row(row: sqlite3.Row) -> SandboxRecord:
    meta = json.loads(row["meta"] or "{}")
    values = {k: row[k] for k in _SANDBOX_COLUMNS}
    # The column holds the sub-second start (rows before it: whole seconds), so that the list's
    # ORDER BY, on its index, is the order of start; the record's created_at_unix stays whole.
    values["created_at_unix"] = int(row["created_at_unix"])
    values["started_unix"] = float(row["created_at_unix"])
    values["live_fork"] = bool(values["live_fork"])
    values["pooled"] = bool(values["pooled"])
    disk = meta.get("disk") or {  # rows written before the disk chain was typed
        "node": meta.get("disk_node", "disk0"),
        "file": meta.get("disk_file", str(Path(row["dir"]) / "disk.qcow2")),
        "parent_tag": meta.get("disk_parent_tag", row["snapshot_tag"]),
        "pending_layers": meta.get("pending_layers", []),
    }
    policy = meta.get("checkpoints")
    return SandboxRecord(**values, config=VMConfig.from_json(meta["config"]), disk=DiskChain(**disk),
                         cgroup=meta.get("cgroup"), tap=meta.get("tap"), timings=meta.get("timings") or {},
                         metadata=dict(meta.get("metadata") or {}),
                         checkpoints=AutoCheckpoint(**policy) if policy else None,
                         expires_at_unix=meta.get("expires_at_unix"),
                         cpu_limit=meta.get("cpu_limit"), pids_limit=meta.get("pids_limit"),
                         cgroup_extra=list(meta.get("cgroup_extra") or []),
                         idle_pause_secs=meta.get("idle_pause_secs"),
                         disk_quota_mib=meta.get("disk_quota_mib"),
                         idle_hibernate_secs=meta.get("idle_hibernate_secs"),
                         hibernate_on_timeout=bool(meta.get("hibernate_on_timeout")),
                         hibernate_on_timeout_memory=bool(meta.get("hibernate_on_timeout_memory", True)),
                         auto_resume=bool(meta.get("auto_resume", True)),
                         hibernation=Hibernation(**meta["hibernation"]) if meta.get("hibernation") else None,
                         network=ChildNet.from_json(meta["network"]) if meta.get("network") else None,
                         volumes=list(meta.get("volumes") or []))


class SandboxRows(Table):
    # While ``reads_kept`` is active: what all() parsed, handed out again until the next write.
    _kept: list[SandboxRecord] | None = None
    _keeping = 0
    _writes = 0  # every write counts, so a parse that a write overtook is not kept

    @contextlib.contextmanager
    def reads_kept(self) -> Iterator[None]:
        """While active, all() parses the table once and hands out the same records again until
        something writes to it. For the daemon's start, where a dozen owners each read every row
        in turn and none changes a record it reads (10,000 rows: 12 parses took 5.6 of 7 s)."""
        self._keeping += 1
        try:
            yield
        finally:
            self._keeping -= 1
            if not self._keeping:
                self._kept = None

    def _wrote(self) -> None:
        self._writes += 1
        self._kept = None

    def insert(self, sb: SandboxRecord) -> None:
        row = {k: getattr(sb, k) for k in _SANDBOX_COLUMNS}
        row["created_at_unix"] = _started(sb)
        row["meta"] = json.dumps(_sandbox_meta(sb))
        row["live_fork"], row["pooled"] = int(sb.live_fork), int(sb.pooled)
        with self._lock:
            self._db.execute(
                f"INSERT INTO sandboxes ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                list(row.values()),
            )
            self._wrote()

    def save(self, sb: SandboxRecord) -> None:
        """Write every field of an already registered sandbox (a pool member being claimed)."""
        row = {k: getattr(sb, k) for k in _SANDBOX_COLUMNS if k != "id"}
        row["created_at_unix"] = _started(sb)
        row["meta"] = json.dumps(_sandbox_meta(sb))
        row["live_fork"], row["pooled"] = int(sb.live_fork), int(sb.pooled)
        sets = ", ".join(f"{k} = ?" for k in row)
        with self._lock:
            self._db.execute(f"UPDATE sandboxes SET {sets} WHERE id = ?", [*row.values(), sb.id])
            self._wrote()

    def set_disk_chain(self, sandbox_id: str, disk: DiskChain) -> None:
        """Record where a sandbox's disk stands (it moves with every branch)."""
        self._update_meta(sandbox_id, "disk", asdict(disk))

    def set_expiry(self, sandbox_id: str, expires_at_unix: float | None) -> None:
        """When the reaper kills the sandbox (None: never)."""
        self._update_meta(sandbox_id, "expires_at_unix", expires_at_unix)

    def set_idle_pause(self, sandbox_id: str, idle_pause_secs: float | None) -> None:
        """After how many idle seconds the sandbox is paused (None: never)."""
        self._update_meta(sandbox_id, "idle_pause_secs", idle_pause_secs)

    def set_idle_hibernate(self, sandbox_id: str, idle_hibernate_secs: float | None) -> None:
        """After how many idle seconds the sandbox is hibernated (None: never)."""
        self._update_meta(sandbox_id, "idle_hibernate_secs", idle_hibernate_secs)

    def set_hibernate_on_timeout(self, sandbox_id: str, hibernate: bool, memory: bool = True) -> None:
        """At its deadline the sandbox is hibernated (True) or killed; ``memory`` False: that
        hibernation keeps its disk alone."""
        self._update_meta(sandbox_id, "hibernate_on_timeout", hibernate)
        self._update_meta(sandbox_id, "hibernate_on_timeout_memory", memory)

    def set_auto_resume(self, sandbox_id: str, auto_resume: bool) -> None:
        """Whether E2B traffic wakes the sandbox once hibernated (E2B's autoResume)."""
        self._update_meta(sandbox_id, "auto_resume", auto_resume)

    def set_network(self, sandbox_id: str, net: ChildNet) -> None:
        """The sandbox's network as its owner last made it (an egress update rewrites it)."""
        self._update_meta(sandbox_id, "network", net.to_json())

    def set_checkpoint_policy(self, sandbox_id: str, policy: AutoCheckpoint | None) -> None:
        self._update_meta(sandbox_id, "checkpoints", policy.info() if policy else None)

    def _update_meta(self, sandbox_id: str, key: str, value: Any) -> None:
        with self._lock:
            row = self._db.execute("SELECT meta FROM sandboxes WHERE id = ?", (sandbox_id,)).fetchone()
            if row is None:
                return
            meta = json.loads(row["meta"] or "{}")
            meta[key] = value
            self._db.execute("UPDATE sandboxes SET meta = ? WHERE id = ?", (json.dumps(meta), sandbox_id))
            self._wrote()

    def next_branch_seq(self, sandbox_id: str) -> int:
        """Monotonic per source sandbox, persisted so a daemon restart does not reuse one."""
        with self._lock:
            self._db.execute("UPDATE sandboxes SET branch_seq = branch_seq + 1 WHERE id = ?", (sandbox_id,))
            self._wrote()
            row = self._db.execute("SELECT branch_seq FROM sandboxes WHERE id = ?", (sandbox_id,)).fetchone()
        if row is None:
            raise NotFound(f"sandbox {sandbox_id!r} is not alive")
        return int(row[0])

    def has(self, sandbox_id: str) -> bool:
        with self._lock:
            row = self._db.execute("SELECT 1 FROM sandboxes WHERE id = ?", (sandbox_id,)).fetchone()
        return row is not None

    def get(self, sandbox_id: str) -> SandboxRecord:
        with self._lock:
            row = self._db.execute("SELECT * FROM sandboxes WHERE id = ?", (sandbox_id,)).fetchone()
        if row is None:
            raise NotFound(f"sandbox {sandbox_id!r} is not alive")
        return _sandbox_from_row(row)

    def all(self) -> list[SandboxRecord]:
        with self._lock:
            if self._kept is not None:
                return list(self._kept)
            # created_at_unix holds the sub-second start; rowid breaks a tie.
            rows = self._db.execute("SELECT * FROM sandboxes ORDER BY created_at_unix, rowid").fetchall()
            writes = self._writes
        records = [_sandbox_from_row(r) for r in rows]  # outside the lock: 10,000 rows take a while
        with self._lock:
            if self._keeping and writes == self._writes:  # nothing wrote since the read
                self._kept = records
        return list(records)

    def count_listed(self) -> int:
        """The rows a list shows (every sandbox but unclaimed pool members), counted in SQL: the
        metrics scrape asks on every scrape, and parsing ten thousand rows takes a second."""
        with self._lock:
            row = self._db.execute("SELECT COUNT(*) FROM sandboxes WHERE pooled = 0").fetchone()
        return int(row[0])

    def scan(self, after: str | None = None) -> Iterator[SandboxRecord]:
        """Every row in ``all()``'s order, from the one after ``after`` (404 if it has no row), read
        SCAN_BATCH rows per query, so a caller that stops early (one page of thousands) parses only
        what it took, and no lock is held between batches."""
        cursor: tuple[Any, int] | None = None
        if after is not None:
            with self._lock:
                row = self._db.execute("SELECT created_at_unix, rowid FROM sandboxes WHERE id = ?",
                                       (after,)).fetchone()
            if row is None:
                raise NotFound(f"sandbox {after!r} to list after is not alive: list again from the start")
            cursor = (row[0], row[1])
        while True:
            with self._lock:
                if cursor is None:
                    rows = self._db.execute(
                        "SELECT *, rowid AS row_order FROM sandboxes ORDER BY created_at_unix, rowid LIMIT ?",
                        (SCAN_BATCH,)).fetchall()
                else:
                    rows = self._db.execute(
                        "SELECT *, rowid AS row_order FROM sandboxes WHERE (created_at_unix, rowid) > (?, ?) "
                        "ORDER BY created_at_unix, rowid LIMIT ?", (*cursor, SCAN_BATCH)).fetchall()
            for r in rows:
                yield _sandbox_from_row(r)
            if len(rows) < SCAN_BATCH:
                return
            cursor = (rows[-1]["created_at_unix"], rows[-1]["row_order"])

    def delete(self, sandbox_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM sandboxes WHERE id = ?", (sandbox_id,))
            self._wrote()
