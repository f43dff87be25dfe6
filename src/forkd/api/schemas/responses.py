"""Response bodies of the REST API v1 (pydantic v2).

Open to extra fields: the runtime may report more than the seeds list (e.g.
exec timings) and the API passes that through rather than drop it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

from forkd.api.schemas.common import (
    ResponseModel,
)


class SnapshotInfo(ResponseModel):
    tag: str
    dir: str
    created_at_unix: int
    branched_from: str | None = Field(
        None, description="Source sandbox id; present only for snapshots made by BRANCH."
    )
    pause_ms: int | float | None = Field(
        None, description="Measured source pause window in ms; present only for BRANCH snapshots."
    )
    fs_freeze_ms: int | float | None = Field(
        None, description="Live BRANCH only: how long the source's root filesystem was frozen (its "
        "disk writes waited; its CPU work went on), in ms.",
    )
    status: Literal["ready", "writing", "failed"] | None = Field(
        None, description="writing while a live no-wait branch copies memory; then ready or failed."
    )
    error: str | None = Field(None, description="Why the snapshot failed (status=failed).")
    auto_delete: bool | None = Field(
        None, description="Present (true) on a fork's intermediate snapshot: deleted once no sandbox "
        "runs from it and no snapshot depends on it.",
    )
    checkpoint_of: str | None = Field(None, description="The sandbox whose checkpoint policy made it.")
    compacted_from: str | None = Field(None, description="The snapshot a compaction flattened into this one.")
    diff_physical_bytes: int | None = Field(
        None, description="measure_diff: RAM bytes the source wrote since its restore (its private "
        "copy-on-write pages), measured just before the pause: what a dirty-page diff saves.")
    diff_logical_bytes: int | None = Field(None, description="measure_diff: the guest RAM size.")
    diff_ms: float | None = Field(
        None, description="measure_diff: an estimate, not a second capture: this branch's pause "
        "scaled to the share of its captured RAM stream that the written pages make up.")


class SnapshotDetail(SnapshotInfo):
    ancestors: list[str] = Field(
        default_factory=list, description="Snapshot tags this one descends from, nearest first."
    )
    dependents: list[str] = Field(
        default_factory=list,
        description="Snapshot tags descending from this one (all generations), which depend on its files.",
    )
    parent_tag: str | None = Field(None, description="The snapshot this one was branched from, if any.")
    sandboxes: list[str] = Field(default_factory=list, description="Ids of alive sandboxes forked from it.")


class SandboxNetwork(ResponseModel):
    guest_ip: str = Field(description="eth0's address inside the guest: the same in every sandbox.",
                          examples=["172.16.0.2"])
    host_gateway: str = Field(description="The host as the guest sees it (its default gateway).",
                              examples=["10.201.0.1"])
    dns: list[str] = Field(description="The resolvers in the guest's /etc/resolv.conf.")
    allow_internet_access: bool
    allow_out: list[str]
    deny_out: list[str]
    allow_public_traffic: bool = Field(False, description="Whether its ports are open to anyone through the "
                                       "daemon's port proxy, without a token.")
    mask_request_host: str | None = Field(None, description="The Host header its ports get from the proxy.")


class HibernationInfo(ResponseModel):
    hibernated_at_unix: float
    memory: bool = Field(description="Whether its memory was kept. False: a disk-only "
                         "hibernation (pages and devices_bytes 0); its wake cold-boots its disk: "
                         "a fresh kernel, no process, cell or file descriptor of before.")
    pages: int = Field(description="Guest pages (4 KiB) it had changed since its restore: all that "
                       "was saved of its memory (the rest is its snapshot's).")
    memory_bytes: int = Field(description="Those pages on disk, compressed.")
    devices_bytes: int = Field(description="Its device state on disk.")
    disk_mib: float = Field(description="memory_bytes + devices_bytes, in MiB: the disk a hibernated "
                            "sandbox takes beyond its disk layers (disk_used_mib).")
    pause_ms: float = Field(description="From its VM's stop to its state on disk.")


class SandboxInfo(ResponseModel):
    id: str = Field(examples=["sb-67a1b3-0000"])
    snapshot_tag: str
    netns: str | None = Field(None, description="The network namespace its QEMU runs in: forkd-child-<i> "
                              "(per_child_netns), forkd-<id> (a snapshot with a NIC), else null.")
    ip: str | None = Field(None, description="Where the host reaches this sandbox: every port of this "
                           "address is forwarded to the guest. Present for snapshots with a NIC.",
                           examples=["10.201.0.7"])
    network: SandboxNetwork | None = Field(None, description="Its network: the guest's view and its egress "
                                           "policy. Present for snapshots with a NIC.")
    guest_addr: str = Field(
        description="How the host reaches the guest agent; here unix:<path> (virtio-serial).",
        examples=["unix:/var/lib/forkd/sandboxes/sb-67a1b3-0000/agent.sock"],
    )
    created_at_unix: int
    pid: int | None = Field(None, description="Host PID of the sandbox's QEMU process.")
    memory_limit_mib: int | None = None
    cpu_limit: float | None = Field(None, description="CPU bandwidth limit in cores, if one was set.")
    pids_limit: int | None = Field(None, description="Task limit of its QEMU's cgroup, if one was set.")
    disk_quota_mib: int | None = Field(None, description="Its disk quota (MiB), if it has one.")
    disk_used_mib: float | None = Field(
        None, description="Host disk its own layers take now (MiB): what it wrote since its spawn, "
        "counted against disk_quota_mib.",
    )
    live_fork: bool | None = None
    timings: dict[str, float] | None = Field(
        None,
        description="Where the fork's time went: seconds from the start of the restore until QEMU was up "
        "(qemu_up_s), the guest ran from the loaded state (restored_s) and its agent answered (ready_s).",
    )
    metadata: dict[str, str] | None = Field(
        None, description="Labels given at spawn; fork-tree children also carry fork_tree_id, "
        "fork_parent_id and fork_index.",
    )
    expires_at_unix: float | None = Field(
        None, description="When the sandbox is killed (unix seconds); absent without a timeout_secs.",
    )
    idle_pause_secs: float | None = Field(
        None, description="Paused after this many idle seconds; absent without idle_pause_secs.",
    )
    idle_hibernate_secs: float | None = Field(
        None, description="Hibernated after this many idle seconds; absent without idle_hibernate_secs.",
    )
    hibernate_on_timeout: bool | None = Field(
        None, description="At its deadline it is hibernated rather than killed; absent unless set.",
    )
    hibernation: HibernationInfo | None = Field(
        None, description="While hibernated: when, and what its saved state takes on disk.",
    )
    state: Literal["running", "paused", "hibernated"] = Field(
        "running", description="paused: stopped after idle_pause_secs without a request; hibernated: "
        "on disk with no QEMU (POST /v1/sandboxes/{id}/hibernate, idle_hibernate_secs or "
        "hibernate_on_timeout). The next request of any kind resumes or wakes it.",
    )


class WorkspaceInfo(ResponseModel):
    id: str = Field(examples=["ws-agent-1"])
    name: str
    source_snapshot_tag: str
    status: Literal["running", "suspended", "stale"] = Field(
        description="running: its sandbox is alive; suspended: paused, resumable; stale: neither "
        "(killed or expired); resume starts it again from source_snapshot_tag.")
    live_sandbox_id: str | None = Field(None, description="Its sandbox, while running (the same id "
                                        "across suspend/resume).")
    current_state_tag: str | None = Field(None, description="The state snapshot it resumes from, "
                                          "while suspended.")
    created_at_unix: int
    last_active_unix: int


class SandboxMemory(ResponseModel):
    """What a sandbox costs the host, in bytes, read from the host (never the guest)."""

    sandbox_id: str
    ram_bytes: int = Field(description="The guest's RAM.")
    shared_bytes: int = Field(description="Pages read from its snapshot and never written: held once in "
                              "the host's page cache, shared with the snapshot and every sibling that "
                              "read them.")
    private_bytes: int = Field(description="Pages it wrote since its restore: its own copies.")
    untouched_bytes: int = Field(description="Pages it has not touched yet (neither shared nor private).")
    disk_bytes: int = Field(description="What its own disk layers (its copy-on-write overlay, and those "
                            "its branches froze) take on the host.")


class ForkError(ResponseModel):
    index: int = Field(description="Which child (0-based) failed.")
    error: str


class ForkResponse(ResponseModel):
    parent_id: str = Field(description="The source sandbox (it keeps running).")
    snapshot_tag: str = Field(description="The intermediate snapshot the children were forked from.")
    children: list[SandboxInfo]
    errors: list[ForkError] = Field(description="One entry per child that failed; it left nothing behind.")
    pause_ms: int | float | None = Field(None, description="How long the source was paused.")
    tree_id: str | None = Field(None, description="fork-tree only: the id stamped on every child.")
    memory: list[SandboxMemory] = Field(
        default_factory=list, description="What each child costs the host right after its restore, by "
        "sandbox_id (as GET /v1/sandboxes/{id}/memory answers): most of its RAM is shared with its "
        "siblings at first. A child that could not be read is left out.")


class Deletion(ResponseModel):
    id: str
    deleted: bool
    error: str | None = None


class PromoteResponse(ResponseModel):
    winner: SandboxInfo
    tree_id: str
    deleted: list[Deletion] = Field(description="Each sibling (and the parent, with replace_parent) killed.")
    replaced_parent: str | None = Field(None, description="The source id that now names the winner.")


class CheckpointPolicy(ResponseModel):
    every: int
    keep: int
    mode: str


class CheckpointList(ResponseModel):
    sandbox_id: str
    policy: CheckpointPolicy | None = Field(description="null once the policy was deleted (or never set).")
    calls: int = Field(description="exec/eval calls counted since the policy was set.")
    checkpoints: list[SnapshotInfo] = Field(description="The kept checkpoints, oldest first.")
    last_error: str | None = Field(None, description="Why the latest checkpoint attempt failed, if it did.")


class PoolInfo(ResponseModel):
    tag: str
    size: int = Field(description="Target: paused children kept ready (0: no pool).")
    ready: int = Field(description="Members restored, reseeded and paused right now.")
    memory_limit_mib: int | None = Field(None, description="The spawn options a spawn must match to draw "
                                         "from the pool: memory limit, per_child_netns, live_fork.")
    per_child_netns: bool = False
    live_fork: bool = False
    allow_internet_access: bool = False
    network: dict[str, list[str]] | None = Field(None, description="allow_out / deny_out of the members.")
    claims: int = Field(0, description="Children handed out from the pool since the daemon started.")
    misses: int = Field(0, description="Children of this snapshot restored fresh instead (pool empty, "
                        "options differed, or a member failed its claim).")
    last_error: str | None = Field(None, description="Why the latest refill failed (retried with back-off).")


class FileInfo(ResponseModel):
    path: str = Field(examples=["/work/data.csv"])
    name: str = Field(description="The last component of path.")
    type: Literal["file", "dir", "symlink", "other"] = Field(
        description="symlink only for a dangling link (stat follows links).")
    size: int = Field(description="Bytes.")
    mode: int = Field(description="Permission bits (e.g. 420 = 0o644).")
    mtime: float = Field(description="Last modification, seconds since the epoch (guest clock).")
    owner: str | None = Field(None, description="The owner's user name (its uid when the guest has no name).")
    group: str | None = Field(None, description="The group's name (its gid when the guest has no name).")
    metadata: dict[str, str] | None = Field(None, description=(
        "The file's metadata (its user.e2b.* extended attributes, the prefix stripped; set by an "
        "upload's X-Metadata-<key> headers); absent when it has none."))


class FileList(ResponseModel):
    path: str
    entries: list[FileInfo] = Field(description="Sorted by name; symlinks are not followed.")
    truncated: bool = Field(description="True when the directory had more entries than the cap (10000).")


class MkdirResponse(ResponseModel):
    path: str
    created: bool = Field(description="False when parents=true and the directory already existed.")


class PingResponse(ResponseModel):
    pong: bool
    numpy_version: str | None = None
    pid: int | None = None


class ProcessInfo(ResponseModel):
    pid: int = Field(description="Its pid in the guest: how every process route names it.")
    tag: str | None = None
    args: list[str]
    env: dict[str, str] = Field(description="The extra environment it was started with.")
    cwd: str | None = None
    user: str | None = Field(None, description="The user it runs as; null: root, as the agent.")
    running: bool
    exit_code: int | None = Field(description="Once ended: its status (negative: killed by that signal; "
                                  "124: timed out).")
    signal: int | None = Field(description="The signal that ended it, if one did.")
    timed_out: bool
    stdin_open: bool
    started_at: float | None = Field(description="Seconds since the epoch (guest clock).")
    ended_at: float | None = None
    pty: dict[str, int] | None = Field(None, description="Its terminal's size, {\"cols\", \"rows\"}, for a "
                                       "process started on one (E2B's pty); null otherwise.")


class StdinResponse(ResponseModel):
    pid: int
    written: int = Field(description="Bytes queued for the process (it reads them at its pace).")
    stdin_open: bool


class SignalResponse(ResponseModel):
    pid: int
    signal: int
    signalled: bool


class CancelEvalResponse(ResponseModel):
    cancelled: bool = Field(description="False when no eval was running.")


class ExecResponse(ResponseModel):
    stdout: str
    stderr: str
    exit_code: int | None = Field(description="Exit status; null if the process did not exit.")
    error: str | None = None
    timed_out: bool | None = None
    stdout_truncated: bool | None = None
    stderr_truncated: bool | None = None


class EvalResponse(ResponseModel):
    result: str | None
    error: str | None
    exit_code: int




class PushResult(ResponseModel):
    tag: str
    store: str = Field(description="The object store, s3://bucket/prefix.")
    lineage: list[str] = Field(description="The snapshots pushed, oldest first: the chain its disk needs.")
    blobs: int = Field(description="Distinct files the chain is made of (base image included).")
    blobs_uploaded: int = Field(description="Those the store lacked (content-addressed: the rest were "
                                "there).")
    bytes_uploaded: int = Field(description="Compressed bytes sent.")


class PullResult(ResponseModel):
    tag: str
    created: list[str] = Field(description="Snapshots registered here by this pull, oldest first.")
    reused: list[str] = Field(description="Snapshots of the chain this host already held (same content).")
    bytes_downloaded: int = Field(description="Compressed bytes fetched.")


class ErrorBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    error: str = Field(description="Human-readable message.", examples=["snapshot 'py' is not registered"])


class Health(BaseModel):
    ok: bool


class Version(BaseModel):
    version: str = Field(examples=["0.1.0"])
    api: str = Field(examples=["v1"])


class BuildContextInfo(ResponseModel):
    context: str = Field(description="The tar's sha256: name it as a build's `context`.")
    bytes: int = Field(description="The tar's size.")
