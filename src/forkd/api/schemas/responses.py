"""Response bodies of the REST API v1 (pydantic v2).

Open to extra fields: the runtime may report more than the seeds list (e.g.
exec timings) and the API passes that through rather than drop it.

A model decorated with ``derived_from`` is the wire form of a controller result
record (``controller/results.py``): its fields, their types, defaults and
descriptions are the record's keys; its body names only the keys whose wire type
is another response model. The rest (sandboxes, snapshots, forks) are the wire
form of the store's records and are written here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

from forkd.api.schemas.common import (
    ResponseModel,
)
from forkd.api.schemas.derive import derived_from
from forkd.controller import results


class VolumeAttachment(ResponseModel):
    """A volume a snapshot attaches (and so every child and branch of it), as snapshot.json records it."""

    name: str | None = Field(None, description="The volume of /v1/volumes it layers on.")
    host_path: str | None = Field(None, description="The host directory it was copied from.")
    mount: str = Field(description="Where the guest has it mounted.", examples=["/mnt/data"])
    read_only: bool
    fork: str = Field(description="copy: each child and branch has its own copy-on-write view.")
    size_bytes: int = Field(description="Its size: the most a guest can write to it.")


VOLUMES_HELP = "Its volumes, in device order; omitted when it has none."


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
    volumes: list[VolumeAttachment] | None = Field(None, description=VOLUMES_HELP)


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
    rules: dict[str, list[dict[str, Any]]] = Field(
        default_factory=dict, description="Its header transforms by host (as given: secrets appear only "
        "as their `${secrets.NAME}` placeholders).")


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
    volumes: list[VolumeAttachment] | None = Field(None, description=VOLUMES_HELP)
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


@derived_from(results.WorkspaceReport)
class WorkspaceInfo(ResponseModel):
    pass


@derived_from(results.VolumeReport)
class VolumeInfo(ResponseModel):
    pass


@derived_from(results.VolumeExportReport)
class VolumeExport(ResponseModel):
    pass


@derived_from(results.SandboxCost)
class SandboxMemory(ResponseModel):
    """What a sandbox costs the host, in bytes, read from the host (never the guest)."""


class NetworkDecision(ResponseModel):
    time: float = Field(description="When the guest asked (Unix seconds).")
    kind: Literal["dns", "connect"] = Field(
        description="`dns`: a name asked of the sandbox's resolver; `connect`: a TCP connection to an "
        "answered address, checked by the name it carried (TLS SNI or HTTP Host).")
    name: str = Field(description="The name asked for, or the name the connection carried (\"\": none).")
    address: str = Field(description="`connect`: the address and port it was for (\"\" otherwise).")
    allowed: bool = Field(description="Whether the sandbox's egress policy let it through.")
    detail: str = Field(description="The addresses answered (and opened), or why it was refused.")


class NetworkLog(ResponseModel):
    sandbox_id: str
    entries: list[NetworkDecision] = Field(
        description="The latest names its guest asked for, oldest first (at most 256; none without "
        "names in its egress policy).")


@derived_from(results.FsChange)
class FsChange(ResponseModel):
    """One path added, modified or deleted."""


@derived_from(results.FsDiff)
class SandboxDiff(ResponseModel):
    """What a sandbox's filesystem changed (GET /v1/sandboxes/{id}/diff?format=json)."""

    added: list[FsChange]
    modified: list[FsChange]
    deleted: list[FsChange]


@derived_from(results.ApplyResult)
class ApplyResponse(ResponseModel):
    """What POST /v1/sandboxes/{id}/apply wrote."""


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


@derived_from(results.Deletion)
class Deletion(ResponseModel):
    pass


@derived_from(results.PromoteResult)
class PromoteResponse(ResponseModel):
    winner: SandboxInfo
    deleted: list[Deletion]


class CheckpointPolicy(ResponseModel):
    every: int
    keep: int
    mode: str


@derived_from(results.CheckpointReport)
class CheckpointList(ResponseModel):
    policy: CheckpointPolicy | None
    checkpoints: list[SnapshotInfo]


@derived_from(results.PoolReport)
class PoolInfo(ResponseModel):
    pass


@derived_from(results.FileEntry)
class FileInfo(ResponseModel):
    pass


@derived_from(results.DirListing)
class FileList(ResponseModel):
    entries: list[FileInfo]


@derived_from(results.MkdirResult)
class MkdirResponse(ResponseModel):
    pass


@derived_from(results.PingResult)
class PingResponse(ResponseModel):
    pass


@derived_from(results.ProcessEntry)
class ProcessInfo(ResponseModel):
    pass


@derived_from(results.StdinResult)
class StdinResponse(ResponseModel):
    pass


@derived_from(results.SignalResult)
class SignalResponse(ResponseModel):
    pass


@derived_from(results.CancelResult)
class CancelEvalResponse(ResponseModel):
    pass


@derived_from(results.ExecResult)
class ExecResponse(ResponseModel):
    pass


@derived_from(results.EvalResult)
class EvalResponse(ResponseModel):
    pass


@derived_from(results.PushReport)
class PushResult(ResponseModel):
    pass


@derived_from(results.PullReport)
class PullResult(ResponseModel):
    pass


class ErrorBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    error: str = Field(description="Human-readable message.", examples=["snapshot 'py' is not registered"])
    # Only a host at its ceiling sets it (errors.NoCapacity, handlers.py): a fleet's gateway reads it
    # to try another host. Documented here because the OpenAPI must describe what the daemon sends.
    code: str | None = Field(default=None, description="Machine-readable cause, when there is one: "
                             "'no_capacity' on the 503 of a host at its sandbox or memory ceiling.",
                             examples=["no_capacity"])


class Health(BaseModel):
    ok: bool


class Version(BaseModel):
    version: str = Field(examples=["0.1.0"])
    api: str = Field(examples=["v1"])


@derived_from(results.ContextReport)
class BuildContextInfo(ResponseModel):
    pass
