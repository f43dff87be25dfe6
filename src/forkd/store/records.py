"""The records the registry's tables hold: snapshots, sandboxes (with their disk chain and
checkpoint policy), paused sandboxes, workspaces and warm-pool targets.

Plain data: the tables that read and write them are under ``store/rows/``.
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from forkd.errors import Conflict
from forkd.host import netns as netns_mod
from forkd.host.accel import VMConfig
from forkd.host.egress import EgressPolicy
from forkd.host.netplan import ChildNet

# A volume's layer beside a disk layer (store/layout.py volume_file).
VOLUME_LAYER_RE = re.compile(r"\.vol\d+\.qcow2$")


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

    def outbound(self) -> PoolKey:
        """The key without the egress policy's inbound settings, which do not shape a child."""
        return dataclasses.replace(self, egress=self.egress.outbound())


@dataclass(frozen=True)
class PoolConfig:
    """A warm pool's target: keep ``size`` paused children matching ``key`` ready."""

    key: PoolKey
    size: int

    @property
    def tag(self) -> str:
        return self.key.tag


class SandboxState(StrEnum):
    """A sandbox's one state: what ``/v1`` (SandboxInfo ``state``), E2B (``e2b``) and the console
    all show, derived here from the record alone (``SandboxRecord.state``, ``PausedRecord.state``).

    * ``running``: its VM runs.
    * ``paused``: its vCPUs stopped, in memory (``idle_pause_secs``); its next request resumes it.
    * ``hibernated``: its changed memory and device state on disk, no QEMU (controller/hibernation.py);
      its next request wakes it. A disk-only hibernation keeps only its disk: the wake cold-boots it.
    * ``suspended``: branched to a state snapshot and stopped (E2B's pause, a workspace's suspend);
      ``resume``/``connect`` starts it again under the same id.
    * ``pool``: a warm-pool member nobody has claimed (hidden from every list); a spawn claims it.

    Every state but ``pool`` goes back to ``running``; only ``running`` goes to another.
    """

    RUNNING = "running"
    PAUSED = "paused"
    HIBERNATED = "hibernated"
    SUSPENDED = "suspended"
    POOL = "pool"

    @property
    def e2b(self) -> str:
        """E2B's two states: "paused" is what needs ``connect`` (or its traffic) to run again; an
        idle-paused sandbox is "running" there, since any request resumes it at once."""
        return "paused" if self in (SandboxState.HIBERNATED, SandboxState.SUSPENDED) else "running"


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
    idle_hibernate_secs: float | None = None  # and its hibernation policies (E2B's autoPause)
    hibernate_on_timeout: bool = False
    hibernate_on_timeout_memory: bool = True
    started_unix: float = 0.0  # the sandbox's, sub-second (SandboxRecord.started_unix)

    def __post_init__(self) -> None:
        # Not given, or out of step with created_at_unix (a copy made with another one): the
        # whole second stands for it.
        if int(self.started_unix) != self.created_at_unix:
            self.started_unix = float(self.created_at_unix)

    @property
    def state(self) -> SandboxState:
        return SandboxState.SUSPENDED

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


@dataclass(frozen=True)
class VolumeRecord:
    """A named volume (``/v1/volumes``) of ``size_bytes`` (its quota). ``fs`` ext4: a filesystem in
    ``<data>/volumes/<name>/disk.qcow2``; snapshots that attach it keep their own layers over that
    file. ``fs`` hostdir: files in ``<data>/volumes/<name>/files``, served to every sandbox that
    mounts it (``fork: "shared"``)."""

    name: str
    size_bytes: int
    fs: str
    created_at_unix: int


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
    # Its attached volumes, as its snapshot.json records them (store/volume_spec.py).
    volumes: list[dict[str, Any]] = field(default_factory=list)

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
        if self.volumes:
            out["volumes"] = [dict(v) for v in self.volumes]
        return out


@dataclass
class Hibernation:
    """A sandbox on disk (controller/hibernation.py): when, and what its files hold."""

    at_unix: float
    pages: int  # guest pages it had changed since its restore, saved
    memory_bytes: int  # those pages compressed, on disk
    devices_bytes: int  # its device state
    pause_ms: float  # from the VM's stop to its state on disk
    # False: disk only (no pages, no device state); its wake cold-boots its disk.
    memory: bool = True
    # Each saved file's BLAKE2b, taken as it was written, checked before a wake (vmm/hibernation.py);
    # empty for a disk-only one, and for one an older forkd wrote.
    digests: dict[str, str] = field(default_factory=dict)

    def info(self) -> dict[str, Any]:
        return {"hibernated_at_unix": round(self.at_unix, 3), "memory": self.memory, "pages": self.pages,
                "memory_bytes": self.memory_bytes, "devices_bytes": self.devices_bytes,
                "disk_mib": round((self.memory_bytes + self.devices_bytes) / (1 << 20), 3),
                "pause_ms": round(self.pause_ms, 1)}


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
    # Hibernated after this many idle seconds (controller/idle.py); None: never.
    idle_hibernate_secs: float | None = None
    # At its deadline it is hibernated rather than killed (E2B's autoPause; controller/lifetimes.py).
    hibernate_on_timeout: bool = False
    # False: that hibernation keeps its disk alone, and its wake cold-boots it (E2B's autoPauseMemory).
    hibernate_on_timeout_memory: bool = True
    # E2B's autoResume: whether E2B traffic (envd, the interpreter) wakes it once hibernated.
    # False: only an explicit resume does (E2B's connect); forkd's own API always wakes it.
    auto_resume: bool = True
    # On disk, no QEMU (controller/hibernation.py); None: running (or paused).
    hibernation: Hibernation | None = None
    # When it was started, to the sub-second (``created_at_unix`` is whole seconds): what lists
    # sort by, as E2B's does by startedAt. Not given: created_at_unix stands for it.
    started_unix: float = 0.0
    # Its volumes, after the root disk in device order, as its snapshot records them
    # (store/volume_spec.py); each rw one's layers mirror its disk chain's (layout.volume_file).
    volumes: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Not given, or out of step with created_at_unix (a copy made with another one): the
        # whole second stands for it.
        if int(self.started_unix) != self.created_at_unix:
            self.started_unix = float(self.created_at_unix)

    @property
    def per_child_netns(self) -> bool:
        """Spawned with ``per_child_netns`` (in ``forkd-child-<i>``; other namespaces are forkd's own)."""
        return netns_mod.netns_index(self.netns) is not None

    @property
    def egress(self) -> EgressPolicy:
        return self.network.egress if self.network is not None else EgressPolicy()

    @property
    def ip(self) -> str | None:
        """Where the host reaches the guest (every port of it), if it has a network."""
        return self.network.ip if self.network is not None else None

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
        directory: what it wrote since its spawn); None if it has none (yet). Its volumes'
        layers (``disk*.vol<i>.qcow2``) are not counted: each is bounded by its volume's size."""
        total, found = 0, False
        for layer in Path(self.dir).glob("disk*.qcow2"):
            if VOLUME_LAYER_RE.search(layer.name):
                continue
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
        if self.idle_hibernate_secs is not None:
            out["idle_hibernate_secs"] = self.idle_hibernate_secs
        if self.hibernate_on_timeout:
            out["hibernate_on_timeout"] = True
        if self.hibernation is not None:
            out["hibernation"] = self.hibernation.info()
        if self.volumes:
            out["volumes"] = [dict(v) for v in self.volumes]
        out["state"] = self.state.value
        return out

    @property
    def state(self) -> SandboxState:
        """Its one state (``SandboxState``); ``paused`` is set by the runtime from the IdlePauser."""
        if self.pooled:
            return SandboxState.POOL
        if self.hibernation is not None:
            return SandboxState.HIBERNATED
        return SandboxState.PAUSED if self.paused else SandboxState.RUNNING


def now_unix() -> int:
    return int(time.time())
