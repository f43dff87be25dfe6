"""The SQLite registry of snapshots and sandboxes (WAL mode, one file).

It is the daemon's memory across restarts: on start-up every sandbox row is
checked against its QEMU process and either re-adopted or reaped.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from forkd.errors import Conflict, NotFound
from forkd.host import netns as netns_mod
from forkd.host.accel import VMConfig
from forkd.host.egress import EgressPolicy
from forkd.host.netplan import ChildNet

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
MIGRATIONS = (("pools", "egress", "TEXT"),)

# Alias hops followed before giving up: promote(replace_parent) chains are short,
# and a loop (which promote never makes) must not hang a lookup.
MAX_ALIAS_HOPS = 32


@dataclass
class DiskChain:
    """Where a running sandbox's disk stands, for BRANCH.

    The sandbox writes ``file`` (QEMU block node ``node``), which sits on a chain
    of frozen overlays in its run directory (``pending_layers``, oldest first)
    over the disk of ``parent_tag``, the newest published snapshot that holds
    everything older. A branch copies the pending layers plus the frozen
    ``file`` into the new snapshot, and the source moves on to a new overlay.
    """

    node: str
    file: str
    parent_tag: str
    pending_layers: list[str] = field(default_factory=list)

    @classmethod
    def fresh(cls, run_dir: Path, snapshot_tag: str) -> DiskChain:
        return cls(node="disk0", file=str(run_dir / "disk.qcow2"), parent_tag=snapshot_tag)


@dataclass(frozen=True)
class AutoCheckpoint:
    """Branch a sandbox after every ``every`` exec/eval calls; keep the newest ``keep``."""

    every: int
    keep: int
    mode: str = "diff"

    def info(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PoolKey:
    """What a spawn must ask for to be served from a pool: the snapshot and the spawn options
    that shape a child at restore time (its cgroup, its namespace, its RAM's backing, the egress
    rules of its network)."""

    tag: str
    memory_limit_mib: int | None = None
    per_child_netns: bool = False
    live_fork: bool = False
    egress: EgressPolicy = field(default_factory=EgressPolicy)


@dataclass(frozen=True)
class PoolConfig:
    """A warm pool's target: keep ``size`` paused children matching ``key`` ready."""

    key: PoolKey
    size: int

    @property
    def tag(self) -> str:
        return self.key.tag


@dataclass
class PausedRecord:
    """A sandbox stopped after a branch of its state (E2B's pause, a workspace's suspend).

    It resumes under the same ``id`` from ``state_tag``, with the spawn options it had.
    """

    id: str
    state_tag: str
    template: str  # the snapshot it was first forked from (E2B's templateID)
    created_at_unix: int  # when it was first started
    paused_at_unix: int
    metadata: dict[str, str] = field(default_factory=dict)
    memory_limit_mib: int | None = None
    cpu_limit: float | None = None
    pids_limit: int | None = None
    per_child_netns: bool = False
    live_fork: bool = False
    vcpus: int = 1
    mem_mib: int = 0
    disk_mib: int = 0  # the guest disk's size
    egress: dict[str, Any] = field(default_factory=dict)  # its network's EgressPolicy.info()
    idle_pause_secs: float | None = None  # kept through the pause: the resumed sandbox idles the same way
    disk_quota_mib: int | None = None  # kept through the pause too

    def info(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class WorkspaceRecord:
    """A named sandbox that outlives suspend/resume (forkd 0.5's ``/v1/workspaces``)."""

    name: str
    sandbox_id: str
    source_tag: str
    created_at_unix: int
    last_active_unix: int


@dataclass
class SnapshotRecord:
    """A registered snapshot. Its VM config lives in its ``snapshot.json`` only."""

    tag: str
    dir: str
    created_at_unix: int
    status: str = "ready"  # ready | writing | failed
    branched_from: str | None = None  # source sandbox id, for BRANCH snapshots
    parent_tag: str | None = None  # the snapshot the source sandbox was forked from
    pause_ms: float | None = None
    error: str | None = None
    mode: str | None = None  # BRANCH mode: full | diff | live
    # The source's own copies of this branch's disk layers: if the branch is
    # deleted while the source lives, they are its base again.
    source_layers: list[str] = field(default_factory=list)
    warning: str | None = None  # e.g. the source could not be resumed after a good capture
    # Made by a fork of a running sandbox with keep_snapshot false: removed once
    # no sandbox runs from it and no snapshot depends on it.
    auto_delete: bool = False
    checkpoint_of: str | None = None  # the sandbox whose auto-checkpoint policy made it
    fs_freeze_ms: float | None = None  # live BRANCH: how long the guest's disk writes waited
    # measure_diff of a full BRANCH: diff_physical_bytes, diff_logical_bytes, diff_ms.
    diff_measure: dict[str, float] | None = None
    compacted_from: str | None = None  # POST /v1/snapshots/{tag}/compact: the flattened snapshot

    def check_forkable(self) -> None:
        """409 unless children can be forked from it (status "ready")."""
        if self.status == "writing":
            raise Conflict(f"snapshot {self.tag!r} is still being written (status 'writing'); "
                           "wait until its status is 'ready'")
        if self.status != "ready":
            raise Conflict(f"snapshot {self.tag!r} failed and cannot be forked: {self.error}")

    def info(self) -> dict[str, Any]:
        """SnapshotInfo as the seeds define it: optional fields omitted when unset."""
        out: dict[str, Any] = {"tag": self.tag, "dir": self.dir, "created_at_unix": self.created_at_unix}
        if self.branched_from is not None:
            out["branched_from"] = self.branched_from
        if self.pause_ms is not None:
            out["pause_ms"] = self.pause_ms
        if self.fs_freeze_ms is not None:
            out["fs_freeze_ms"] = self.fs_freeze_ms
        out["status"] = self.status
        if self.error:
            out["error"] = self.error
        if self.warning:
            out["warning"] = self.warning
        if self.auto_delete:
            out["auto_delete"] = True
        if self.checkpoint_of:
            out["checkpoint_of"] = self.checkpoint_of
        if self.diff_measure:
            out.update(self.diff_measure)
        if self.compacted_from:
            out["compacted_from"] = self.compacted_from
        return out


@dataclass
class SandboxRecord:
    id: str
    snapshot_tag: str
    dir: str
    created_at_unix: int
    config: VMConfig
    disk: DiskChain
    pid: int | None = None
    netns: str | None = None
    memory_limit_mib: int | None = None
    live_fork: bool = False
    branch_seq: int = 0
    cgroup: str | None = None  # the cgroup directory holding its QEMU
    tap: str | None = None  # the tap its NIC is attached to (in netns, or the host's)
    timings: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)  # user labels; fork-tree stamps
    checkpoints: AutoCheckpoint | None = None
    # A warm-pool member: restored, reseeded and paused, hidden from every
    # per-sandbox endpoint until a spawn claims it (controller/pools.py).
    pooled: bool = False
    # When the reaper kills it (unix seconds; controller/lifetimes.py); None: never.
    expires_at_unix: float | None = None
    cpu_limit: float | None = None  # cores (cgroup CPU bandwidth)
    pids_limit: int | None = None  # tasks in its QEMU's cgroup
    # v1 hosts: its cpu and pids cgroups, one per hierarchy (``cgroup`` holds the first).
    cgroup_extra: list[str] = field(default_factory=list)
    # Paused after this many idle seconds (controller/idle.py); None: never.
    idle_pause_secs: float | None = None
    # Not stored: whether it is paused right now, set by the runtime from the IdlePauser.
    paused: bool = False
    # Its namespace, links, address and egress rules, as controller/network.py made them.
    network: ChildNet | None = None
    # How far its own disk layers may grow on the host (controller/disk_quota.py); None: no quota.
    disk_quota_mib: int | None = None

    @property
    def per_child_netns(self) -> bool:
        """Spawned with ``per_child_netns`` (in ``forkd-child-<i>``; other namespaces are forkd's own)."""
        return netns_mod.netns_index(self.netns) is not None

    @property
    def egress(self) -> EgressPolicy:
        return self.network.egress if self.network is not None else EgressPolicy()

    @property
    def pool_key(self) -> PoolKey:
        """The spawn options this child was restored with, as a pool matches them."""
        return PoolKey(self.snapshot_tag, self.memory_limit_mib, self.per_child_netns, self.live_fork,
                       self.egress)

    @property
    def agent_socket(self) -> str:
        return str(Path(self.dir) / "agent.sock")

    def disk_used_bytes(self) -> int | None:
        """Host bytes its own disk layers take (its overlay and the frozen ones in its run
        directory: what it wrote since its spawn); None if it has none (yet)."""
        total, found = 0, False
        for layer in Path(self.dir).glob("disk*.qcow2"):
            try:
                total += layer.stat().st_blocks * 512
                found = True
            except OSError:
                continue
        return total if found else None

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
        if self.network is not None and self.network.ip:
            # Where the host reaches the guest's every port (forwarded inside its namespace).
            out["ip"] = self.network.ip
            out["network"] = self.network.info()
        if self.pid is not None:
            out["pid"] = self.pid
        if self.memory_limit_mib is not None:
            out["memory_limit_mib"] = self.memory_limit_mib
        if self.cpu_limit is not None:
            out["cpu_limit"] = self.cpu_limit
        if self.pids_limit is not None:
            out["pids_limit"] = self.pids_limit
        if self.disk_quota_mib is not None:
            out["disk_quota_mib"] = self.disk_quota_mib
        used = self.disk_used_bytes()
        if used is not None:
            out["disk_used_mib"] = round(used / (1 << 20), 2)
        out["live_fork"] = self.live_fork
        if self.timings:
            # Where its fork's time went, seconds since the restore began.
            out["timings"] = {k: round(v, 4) for k, v in self.timings.items()}
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        if self.expires_at_unix is not None:
            out["expires_at_unix"] = round(self.expires_at_unix, 3)
        if self.idle_pause_secs is not None:
            out["idle_pause_secs"] = self.idle_pause_secs
        out["state"] = "paused" if self.paused else "running"
        return out


# Typed fields kept in the ``meta`` JSON column (the SQL columns hold the rest).
def _snapshot_meta(s: SnapshotRecord) -> dict[str, Any]:
    return {"mode": s.mode, "source_layers": s.source_layers, "warning": s.warning,
            "auto_delete": s.auto_delete, "checkpoint_of": s.checkpoint_of, "fs_freeze_ms": s.fs_freeze_ms,
            "diff_measure": s.diff_measure, "compacted_from": s.compacted_from}


def _sandbox_meta(s: SandboxRecord) -> dict[str, Any]:
    return {"config": s.config.to_json(), "disk": asdict(s.disk), "cgroup": s.cgroup, "tap": s.tap,
            "timings": s.timings, "metadata": s.metadata,
            "checkpoints": s.checkpoints.info() if s.checkpoints else None, "pooled": s.pooled,
            "expires_at_unix": s.expires_at_unix, "cpu_limit": s.cpu_limit, "pids_limit": s.pids_limit,
            "cgroup_extra": s.cgroup_extra, "idle_pause_secs": s.idle_pause_secs,
            "disk_quota_mib": s.disk_quota_mib,
            "network": s.network.to_json() if s.network is not None else None}


_SNAPSHOT_COLUMNS = ("tag", "dir", "created_at_unix", "status", "branched_from", "parent_tag",
                     "pause_ms", "error")
_SANDBOX_COLUMNS = ("id", "snapshot_tag", "dir", "created_at_unix", "pid", "netns", "memory_limit_mib",
                    "live_fork", "branch_seq")


def _snapshot_from_row(row: sqlite3.Row) -> SnapshotRecord:
    meta = json.loads(row["meta"] or "{}")
    return SnapshotRecord(
        **{k: row[k] for k in _SNAPSHOT_COLUMNS}, mode=meta.get("mode"),
        source_layers=list(meta.get("source_layers") or []),
        warning=meta.get("warning") or meta.get("source_error"),
        auto_delete=bool(meta.get("auto_delete")), checkpoint_of=meta.get("checkpoint_of"),
        fs_freeze_ms=meta.get("fs_freeze_ms"),
        diff_measure=meta.get("diff_measure"), compacted_from=meta.get("compacted_from"),
    )


def _sandbox_from_row(row: sqlite3.Row) -> SandboxRecord:
    meta = json.loads(row["meta"] or "{}")
    values = {k: row[k] for k in _SANDBOX_COLUMNS}
    values["live_fork"] = bool(values["live_fork"])
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
                         pooled=bool(meta.get("pooled")), expires_at_unix=meta.get("expires_at_unix"),
                         cpu_limit=meta.get("cpu_limit"), pids_limit=meta.get("pids_limit"),
                         cgroup_extra=list(meta.get("cgroup_extra") or []),
                         idle_pause_secs=meta.get("idle_pause_secs"),
                         disk_quota_mib=meta.get("disk_quota_mib"),
                         network=ChildNet.from_json(meta["network"]) if meta.get("network") else None)


class Registry:
    """Thread-safe: the daemon calls it from the event loop and from worker threads."""

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

    def _migrate(self) -> None:
        """Add the columns a registry written by an older forkd lacks."""
        with self._lock:
            for table, column, decl in MIGRATIONS:
                have = {r["name"] for r in self._db.execute(f"PRAGMA table_info({table})")}
                if column not in have:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")

    def _record_issued_prefixes(self) -> None:
        """The prefixes of the ids already here (a registry older than the table) count as issued."""
        with self._lock:
            ids = [r[0] for q in ("SELECT id FROM sandboxes", "SELECT id FROM paused_sandboxes",
                                  "SELECT alias FROM sandbox_aliases", "SELECT target FROM sandbox_aliases")
                   for r in self._db.execute(q)]
            self._db.executemany("INSERT OR IGNORE INTO issued_prefixes (prefix) VALUES (?)",
                                 [(i.rsplit("-", 1)[0],) for i in ids if "-" in i])

    def claim_prefix(self, prefix: str) -> bool:
        """Record ``prefix`` as issued; False if this data dir issued it before."""
        with self._lock:
            cur = self._db.execute("INSERT OR IGNORE INTO issued_prefixes (prefix) VALUES (?)", (prefix,))
            return cur.rowcount == 1

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --------------------------------------------------------------- snapshots

    def insert_snapshot(self, snap: SnapshotRecord) -> None:
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

    def save_snapshot(self, snap: SnapshotRecord) -> None:
        """Write every field of an already registered snapshot."""
        row = {k: getattr(snap, k) for k in _SNAPSHOT_COLUMNS if k != "tag"}
        row["meta"] = json.dumps(_snapshot_meta(snap))
        sets = ", ".join(f"{k} = ?" for k in row)
        with self._lock:
            self._db.execute(f"UPDATE snapshots SET {sets} WHERE tag = ?", [*row.values(), snap.tag])

    def set_auto_delete(self, tag: str, auto_delete: bool) -> None:
        snap = self.get_snapshot(tag)
        snap.auto_delete = auto_delete
        self.save_snapshot(snap)

    def retire_checkpoint(self, tag: str) -> None:
        """Out of its policy's window but still needed: dropped with its last user."""
        snap = self.get_snapshot(tag)
        snap.auto_delete = True
        snap.checkpoint_of = None
        self.save_snapshot(snap)

    def set_snapshot_status(self, tag: str, status: str, error: str | None = None) -> None:
        with self._lock:
            self._db.execute("UPDATE snapshots SET status = ?, error = ? WHERE tag = ?", (status, error, tag))

    def get_snapshot(self, tag: str) -> SnapshotRecord:
        with self._lock:
            row = self._db.execute("SELECT * FROM snapshots WHERE tag = ?", (tag,)).fetchone()
        if row is None:
            raise NotFound(f"snapshot {tag!r} is not registered")
        return _snapshot_from_row(row)

    def has_snapshot(self, tag: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM snapshots WHERE tag = ?", (tag,)).fetchone() is not None

    def list_snapshots(self) -> list[SnapshotRecord]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM snapshots ORDER BY created_at_unix, tag").fetchall()
        return [_snapshot_from_row(r) for r in rows]

    def delete_snapshot(self, tag: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM snapshots WHERE tag = ?", (tag,))

    # --------------------------------------------------------------- sandboxes

    def insert_sandbox(self, sb: SandboxRecord) -> None:
        row = {k: getattr(sb, k) for k in _SANDBOX_COLUMNS}
        row["meta"] = json.dumps(_sandbox_meta(sb))
        row["live_fork"] = int(sb.live_fork)
        with self._lock:
            self._db.execute(
                f"INSERT INTO sandboxes ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                list(row.values()),
            )

    def save_sandbox(self, sb: SandboxRecord) -> None:
        """Write every field of an already registered sandbox (a pool member being claimed)."""
        row = {k: getattr(sb, k) for k in _SANDBOX_COLUMNS if k != "id"}
        row["meta"] = json.dumps(_sandbox_meta(sb))
        row["live_fork"] = int(sb.live_fork)
        sets = ", ".join(f"{k} = ?" for k in row)
        with self._lock:
            self._db.execute(f"UPDATE sandboxes SET {sets} WHERE id = ?", [*row.values(), sb.id])

    def set_disk_chain(self, sandbox_id: str, disk: DiskChain) -> None:
        """Record where a sandbox's disk stands (it moves with every branch)."""
        self._update_sandbox_meta(sandbox_id, "disk", asdict(disk))

    def set_expiry(self, sandbox_id: str, expires_at_unix: float | None) -> None:
        """When the reaper kills the sandbox (None: never)."""
        self._update_sandbox_meta(sandbox_id, "expires_at_unix", expires_at_unix)

    def set_idle_pause(self, sandbox_id: str, idle_pause_secs: float | None) -> None:
        """After how many idle seconds the sandbox is paused (None: never)."""
        self._update_sandbox_meta(sandbox_id, "idle_pause_secs", idle_pause_secs)

    def set_checkpoint_policy(self, sandbox_id: str, policy: AutoCheckpoint | None) -> None:
        self._update_sandbox_meta(sandbox_id, "checkpoints", policy.info() if policy else None)

    def _update_sandbox_meta(self, sandbox_id: str, key: str, value: Any) -> None:
        with self._lock:
            row = self._db.execute("SELECT meta FROM sandboxes WHERE id = ?", (sandbox_id,)).fetchone()
            if row is None:
                return
            meta = json.loads(row["meta"] or "{}")
            meta[key] = value
            self._db.execute("UPDATE sandboxes SET meta = ? WHERE id = ?", (json.dumps(meta), sandbox_id))

    def next_branch_seq(self, sandbox_id: str) -> int:
        """Monotonic per source sandbox, persisted so a daemon restart does not reuse one."""
        with self._lock:
            self._db.execute("UPDATE sandboxes SET branch_seq = branch_seq + 1 WHERE id = ?", (sandbox_id,))
            row = self._db.execute("SELECT branch_seq FROM sandboxes WHERE id = ?", (sandbox_id,)).fetchone()
        if row is None:
            raise NotFound(f"sandbox {sandbox_id!r} is not alive")
        return int(row[0])

    def has_sandbox(self, sandbox_id: str) -> bool:
        with self._lock:
            row = self._db.execute("SELECT 1 FROM sandboxes WHERE id = ?", (sandbox_id,)).fetchone()
        return row is not None

    def get_sandbox(self, sandbox_id: str) -> SandboxRecord:
        with self._lock:
            row = self._db.execute("SELECT * FROM sandboxes WHERE id = ?", (sandbox_id,)).fetchone()
        if row is None:
            raise NotFound(f"sandbox {sandbox_id!r} is not alive")
        return _sandbox_from_row(row)

    def list_sandboxes(self) -> list[SandboxRecord]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM sandboxes ORDER BY created_at_unix, id").fetchall()
        return [_sandbox_from_row(r) for r in rows]

    def delete_sandbox(self, sandbox_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM sandboxes WHERE id = ?", (sandbox_id,))

    # --------------------------------------------------------------- aliases

    def set_alias(self, alias: str, target: str) -> None:
        """From now on ``alias`` names ``target`` (promote with replace_parent)."""
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO sandbox_aliases (alias, target) VALUES (?, ?)",
                             (alias, target))

    def resolve_alias(self, sandbox_id: str) -> str:
        """The sandbox ``sandbox_id`` names now: itself, or where its aliases lead."""
        current = sandbox_id
        with self._lock:
            for _ in range(MAX_ALIAS_HOPS):
                row = self._db.execute("SELECT target FROM sandbox_aliases WHERE alias = ?",
                                       (current,)).fetchone()
                if row is None:
                    return current
                current = str(row[0])
        return current

    # --------------------------------------------------------------- paused sandboxes

    def insert_paused(self, paused: PausedRecord) -> None:
        meta = {k: v for k, v in asdict(paused).items() if k not in ("id", "state_tag")}
        with self._lock:
            try:
                self._db.execute("INSERT INTO paused_sandboxes (id, state_tag, meta) VALUES (?, ?, ?)",
                                 (paused.id, paused.state_tag, json.dumps(meta)))
            except sqlite3.IntegrityError:
                raise Conflict(f"sandbox {paused.id!r} is already paused") from None

    def get_paused(self, sandbox_id: str) -> PausedRecord:
        with self._lock:
            row = self._db.execute("SELECT * FROM paused_sandboxes WHERE id = ?", (sandbox_id,)).fetchone()
        if row is None:
            raise NotFound(f"no paused sandbox {sandbox_id!r}")
        return PausedRecord(id=row["id"], state_tag=row["state_tag"], **json.loads(row["meta"]))

    def has_paused(self, sandbox_id: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM paused_sandboxes WHERE id = ?",
                                    (sandbox_id,)).fetchone() is not None

    def list_paused(self) -> list[PausedRecord]:
        with self._lock:
            ids = [r[0] for r in self._db.execute("SELECT id FROM paused_sandboxes ORDER BY id").fetchall()]
        return [self.get_paused(i) for i in ids]

    def delete_paused(self, sandbox_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM paused_sandboxes WHERE id = ?", (sandbox_id,))

    # --------------------------------------------------------------- workspaces

    def insert_workspace(self, ws: WorkspaceRecord) -> None:
        with self._lock:
            try:
                self._db.execute(
                    "INSERT INTO workspaces (name, sandbox_id, source_tag, created_at_unix, "
                    "last_active_unix) VALUES (?, ?, ?, ?, ?)",
                    (ws.name, ws.sandbox_id, ws.source_tag, ws.created_at_unix, ws.last_active_unix))
            except sqlite3.IntegrityError:
                raise Conflict(f"workspace {ws.name!r} already exists; delete it first") from None

    def get_workspace(self, name: str) -> WorkspaceRecord:
        with self._lock:
            row = self._db.execute("SELECT * FROM workspaces WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"workspace {name!r} does not exist")
        return WorkspaceRecord(**dict(row))

    def list_workspaces(self) -> list[WorkspaceRecord]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM workspaces ORDER BY created_at_unix, name").fetchall()
        return [WorkspaceRecord(**dict(r)) for r in rows]

    def touch_workspace(self, name: str, sandbox_id: str) -> None:
        with self._lock:
            self._db.execute("UPDATE workspaces SET sandbox_id = ?, last_active_unix = ? WHERE name = ?",
                             (sandbox_id, now_unix(), name))

    def delete_workspace(self, name: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM workspaces WHERE name = ?", (name,))

    # --------------------------------------------------------------- pools

    def set_pool(self, pool: PoolConfig) -> None:
        """Keep (or replace) the pool target of ``pool.tag``; one pool per tag."""
        k = pool.key
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO pools "
                "(tag, size, memory_limit_mib, per_child_netns, live_fork, egress) VALUES (?, ?, ?, ?, ?, ?)",
                (k.tag, pool.size, k.memory_limit_mib, int(k.per_child_netns), int(k.live_fork),
                 json.dumps(k.egress.info())))

    def delete_pool(self, tag: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM pools WHERE tag = ?", (tag,))

    def list_pools(self) -> list[PoolConfig]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM pools ORDER BY tag").fetchall()
        return [PoolConfig(PoolKey(r["tag"], r["memory_limit_mib"], bool(r["per_child_netns"]),
                                   bool(r["live_fork"]),
                                   EgressPolicy.from_info(json.loads(r["egress"] or "{}"))),
                           int(r["size"])) for r in rows]


def now_unix() -> int:
    return int(time.time())
