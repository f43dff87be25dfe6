"""What the Runtime and its sub-APIs answer, as typed records: the one definition of each shape.

They are TypedDicts rather than dataclasses because each is already a JSON object
on its way out: a guest's reply checked key by key (``controller.files.checked_info``,
``controller.processes.process_info``) or a record's ``info()``. Typing them here
lets mypy check every producer and every reader of a key.

The REST API's response models (``api/schemas/responses.py``, what the OpenAPI
document and the SDKs are generated from) are derived from these records by
``api/schemas/derive.py``: a key's type, whether it is required, and what the
wire says of it (``Wire``: its description, default and examples) are written
here once. A response model names only what the wire shows differently: a nested
model where a record carries a record's JSON (``RecordJson``) or a nested record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, NotRequired, TypedDict

# A record's own serialisation (SnapshotRecord.info(), SandboxRecord.info(), ...): the records
# are the typed dataclasses of store/records.py; this is their JSON form.
RecordJson = dict[str, Any]

REQUIRED: Any = object()  # Wire.default when the wire has none of its own


@dataclass(frozen=True)
class Wire:
    """How the REST API documents a key (``Annotated`` metadata; mypy ignores it).

    ``default``: what the OpenAPI document says a missing key means; without one, a
    ``NotRequired`` key is nullable and defaults to null, and a required key is required. ``listed``:
    False for a key the daemon passes through (response models keep extra keys)
    but the OpenAPI document leaves out.
    """

    description: str | None = None
    default: Any = REQUIRED
    examples: list[Any] | None = None
    listed: bool = True


# ------------------------------------------------------------------ the guest agent's answers

class PingResult(TypedDict):
    pong: bool
    numpy_version: NotRequired[str | None]
    pid: NotRequired[int | None]
    # The rest of the agent's answer (guest/agent/server.py), which /v1's PingResponse leaves out.
    agent_version: NotRequired[Annotated[int, Wire(listed=False)]]
    python_version: NotRequired[Annotated[str, Wire(listed=False)]]
    warm: NotRequired[Annotated[bool, Wire(listed=False)]]
    warm_errors: NotRequired[Annotated[list[str], Wire(listed=False)]]
    restores: NotRequired[Annotated[int, Wire(listed=False)]]


class ExecResult(TypedDict):
    stdout: str
    stderr: str
    exit_code: Annotated[int | None, Wire("Exit status; null if the process did not exit.")]
    error: NotRequired[str | None]
    timed_out: NotRequired[bool | None]
    stdout_truncated: NotRequired[bool | None]
    stderr_truncated: NotRequired[bool | None]


class EvalResult(TypedDict):
    result: str | None
    error: str | None
    exit_code: int


class SandboxCounts(TypedDict):
    """What /metrics and the fleet's host record count, without reading every row."""

    listed: int  # every sandbox a list shows (running, paused, hibernated)
    paused: int  # of those, paused in memory by their idle policy


class CancelResult(TypedDict):
    cancelled: Annotated[bool, Wire("False when no eval was running.")]


# ----------------------------------------------------------------------------------- files

class FileEntry(TypedDict):
    path: Annotated[str, Wire(examples=["/work/data.csv"])]
    name: Annotated[str, Wire("The last component of path.")]
    type: Annotated[Literal["file", "dir", "symlink", "other"],
                    Wire("symlink only for a dangling link (stat follows links).")]
    size: Annotated[int, Wire("Bytes.")]
    mode: Annotated[int, Wire("Permission bits (e.g. 420 = 0o644).")]
    mtime: Annotated[float, Wire("Last modification, seconds since the epoch (guest clock).")]
    owner: NotRequired[Annotated[str, Wire(
        "The owner's user name (its uid when the guest has no name).")]]
    group: NotRequired[Annotated[str, Wire(
        "The group's name (its gid when the guest has no name).")]]
    # Where a symbolic link resolves to: E2B's EntryInfo.symlink_target; /v1 passes it through.
    target: NotRequired[Annotated[str, Wire(listed=False)]]
    metadata: NotRequired[Annotated[dict[str, str], Wire(
        "The file's metadata (its user.e2b.* extended attributes, the prefix stripped; set by an "
        "upload's X-Metadata-<key> headers); absent when it has none.")]]


class DirListing(TypedDict):
    path: str
    entries: Annotated[list[FileEntry], Wire("Sorted by name; symlinks are not followed.")]
    truncated: Annotated[bool, Wire("True when the directory had more entries than the cap (10000).")]


class MkdirResult(TypedDict):
    path: str
    created: Annotated[bool, Wire("False when parents=true and the directory already existed.")]


# ------------------------------------------------------------------------------- processes

class ProcessEntry(TypedDict):
    pid: Annotated[int, Wire("Its pid in the guest: how every process route names it.")]
    tag: Annotated[str | None, Wire(default=None)]
    args: list[str]
    env: Annotated[dict[str, str], Wire("The extra environment it was started with.")]
    cwd: Annotated[str | None, Wire(default=None)]
    user: Annotated[str | None, Wire("The user it runs as; null: root, as the agent.", default=None)]
    running: bool
    exit_code: Annotated[int | None, Wire(
        "Once ended: its status (negative: killed by that signal; 124: timed out).")]
    signal: Annotated[int | None, Wire("The signal that ended it, if one did.")]
    timed_out: bool
    stdin_open: bool
    started_at: Annotated[float | None, Wire("Seconds since the epoch (guest clock).")]
    ended_at: Annotated[float | None, Wire(default=None)]
    pty: Annotated[dict[str, int] | None, Wire(
        "Its terminal's size, {\"cols\", \"rows\"}, for a process started on one (E2B's pty); "
        "null otherwise.", default=None)]


class StdinResult(TypedDict):
    pid: int
    written: Annotated[int, Wire("Bytes queued for the process (it reads them at its pace).")]
    stdin_open: bool


class SignalResult(TypedDict):
    pid: int
    signal: int
    signalled: bool


# ------------------------------------------------------------------ snapshots and sandboxes

class Deletion(TypedDict):
    id: str
    deleted: bool
    error: NotRequired[str]


class PromoteResult(TypedDict):
    winner: RecordJson  # on the wire: a SandboxInfo
    tree_id: str
    deleted: Annotated[list[Deletion], Wire(
        "Each sibling (and the parent, with replace_parent) killed.")]
    replaced_parent: Annotated[str | None, Wire("The source id that now names the winner.", default=None)]


class CheckpointReport(TypedDict):
    sandbox_id: str
    policy: Annotated[RecordJson | None, Wire(  # on the wire: a CheckpointPolicy
        "null once the policy was deleted (or never set).")]
    calls: Annotated[int, Wire("exec/eval calls counted since the policy was set.")]
    checkpoints: Annotated[list[RecordJson], Wire(  # on the wire: SnapshotInfos
        "The kept checkpoints, oldest first.")]
    last_error: NotRequired[Annotated[str, Wire(
        "Why the latest checkpoint attempt failed, if it did.")]]


class SandboxView(TypedDict):
    """A running, hibernated or paused sandbox as the E2B layer describes it."""

    id: str
    template: str
    state: str  # SandboxState.e2b: "running" or "paused"
    started: float
    ends: float | None
    vcpus: int
    mem_mib: int
    disk_mb: int
    metadata: dict[str, str]
    egress: RecordJson
    auto_resume: bool  # False: E2B traffic does not wake it once hibernated (only connect does)
    volume_mounts: list[dict[str, str]]  # its shared volumes as E2B's volumeMounts: {"name", "path"}


# -------------------------------------------------------------------- pools, workspaces, travel

class PoolReport(TypedDict):
    tag: str
    size: Annotated[int, Wire("Target: paused children kept ready (0: no pool).")]
    ready: Annotated[int, Wire("Members restored, reseeded and paused right now.")]
    memory_limit_mib: Annotated[int | None, Wire(
        "The spawn options a spawn must match to draw from the pool: memory limit, per_child_netns, "
        "live_fork.", default=None)]
    per_child_netns: Annotated[bool, Wire(default=False)]
    live_fork: Annotated[bool, Wire(default=False)]
    allow_internet_access: Annotated[bool, Wire(default=False)]
    network: Annotated[dict[str, list[str]] | None, Wire(
        "allow_out / deny_out of the members.", default=None)]
    claims: Annotated[int, Wire("Children handed out from the pool since the daemon started.", default=0)]
    misses: Annotated[int, Wire(
        "Children of this snapshot restored fresh instead (pool empty, options differed, or a member "
        "failed its claim).", default=0)]
    last_error: NotRequired[Annotated[str, Wire(
        "Why the latest refill failed (retried with back-off).")]]


WorkspaceStatus = Literal["running", "suspended", "stale"]  # controller/workspaces.py


class VolumeReport(TypedDict):
    name: Annotated[str, Wire(examples=["data"])]
    size_mib: Annotated[int, Wire("Its size: the most a guest can write to it (the host file grows no "
                                  "further, but for qcow2 metadata).")]
    fs: Annotated[str, Wire("ext4: a disk each child copies (fork copy); hostdir: files on the daemon's "
                            "host that running sandboxes share (fork shared).", examples=["ext4"])]
    created_at_unix: int
    used_mib: Annotated[float, Wire("What it takes on the host: its own disk file (ext4), or its files "
                                    "(hostdir).")]
    snapshots: Annotated[list[str], Wire("The snapshots that attach it: while there are any, it "
                                         "cannot be deleted (409).")]
    sandboxes: Annotated[list[str], Wire("The sandboxes that mount it (hostdir): while there are any, it "
                                         "cannot be deleted (409).")]


class VolumeExportReport(TypedDict):
    name: str
    to: Annotated[str, Wire("The new host directory its files were copied into.")]
    snapshot: NotRequired[Annotated[str, Wire("The snapshot whose view of the volume was copied.")]]


class WorkspaceReport(TypedDict):
    id: Annotated[str, Wire(examples=["ws-agent-1"])]
    name: str
    source_snapshot_tag: str
    status: Annotated[WorkspaceStatus, Wire(
        "running: its sandbox is alive; suspended: paused, resumable; stale: neither (killed or "
        "expired); resume starts it again from source_snapshot_tag.")]
    live_sandbox_id: NotRequired[Annotated[str, Wire(
        "Its sandbox, while running (the same id across suspend/resume).")]]
    current_state_tag: NotRequired[Annotated[str, Wire(
        "The state snapshot it resumes from, while suspended.")]]
    created_at_unix: int
    last_active_unix: int


class PushReport(TypedDict):
    tag: str
    store: Annotated[str, Wire("The object store, s3://bucket/prefix.")]
    lineage: Annotated[list[str], Wire("The snapshots pushed, oldest first: the chain its disk needs.")]
    blobs: Annotated[int, Wire("Distinct files the chain is made of (base image included).")]
    blobs_uploaded: Annotated[int, Wire(
        "Those the store lacked (content-addressed: the rest were there).")]
    bytes_uploaded: Annotated[int, Wire("Compressed bytes sent.")]


class PullReport(TypedDict):
    tag: str
    created: Annotated[list[str], Wire("Snapshots registered here by this pull, oldest first.")]
    reused: Annotated[list[str], Wire("Snapshots of the chain this host already held (same content).")]
    bytes_downloaded: Annotated[int, Wire("Compressed bytes fetched.")]


class ContextReport(TypedDict):
    context: Annotated[str, Wire("The tar's sha256: name it as a build's `context`.")]
    bytes: Annotated[int, Wire("The tar's size.")]


class SandboxCost(TypedDict):
    """What a sandbox costs the host (controller/costs.py), in bytes, read from the host, never the
    guest: ``GET /v1/sandboxes/{id}/memory``."""

    sandbox_id: str
    ram_bytes: Annotated[int, Wire("The guest's RAM.")]
    shared_bytes: Annotated[int, Wire(
        "Pages read from its snapshot and never written: held once in the host's page cache, shared "
        "with the snapshot and every sibling that read them.")]
    private_bytes: Annotated[int, Wire("Pages it wrote since its restore: its own copies.")]
    untouched_bytes: Annotated[int, Wire("Pages it has not touched yet (neither shared nor private).")]
    disk_bytes: Annotated[int, Wire(
        "What its own disk layers (its copy-on-write overlay, and those its branches froze) take on "
        "the host.")]


# ------------------------------------------------------------------ diff and apply (diffs.py, applies.py)

class FsChange(TypedDict):
    """One path a sandbox added, modified or deleted (``GET /v1/sandboxes/{id}/diff``)."""

    path: Annotated[str, Wire("The path in the guest.", examples=["/work/pkg/core.py"])]
    type: Annotated[str, Wire("file | dir | symlink | other (the new side's; the old one's for a "
                              "deletion)")]
    size: Annotated[int, Wire("Its size in bytes (the old size for a deletion).")]
    mode: Annotated[int, Wire("Its permission bits (e.g. 420 = 0644).")]
    uid: int
    gid: int
    old_mode: NotRequired[Annotated[int | None, Wire("The permission bits before, where they changed.")]]
    old_uid: NotRequired[Annotated[int | None, Wire("The owner before, where it changed.")]]
    old_gid: NotRequired[Annotated[int | None, Wire("The group before, where it changed.")]]
    content_changed: Annotated[bool, Wire("Whether the content (or a link's target) differs; false "
                                          "for a change of mode or owner only.")]
    target: NotRequired[Annotated[str | None, Wire("A symbolic link's target.")]]


class FsDiff(TypedDict):
    """What a sandbox's filesystem changed against another state (controller/diffs.py)."""

    sandbox_id: str
    against: Annotated[str, Wire("What it was compared with: snapshot:TAG or sandbox:ID.")]
    method: Annotated[str, Wire("How the changed files were found: layers (the copy-on-write "
                                "layers' changed blocks, mapped to inodes).")]
    added: list[FsChange]
    modified: list[FsChange]
    deleted: list[FsChange]
    skipped: Annotated[int, Wire("Changed names left out because they are not printable UTF-8.",
                                 default=0)]
    elapsed_ms: float


class ApplyResult(TypedDict):
    """``POST /v1/sandboxes/{id}/apply``: a child's changes written into a sandbox
    (controller/applies.py)."""

    sandbox_id: str
    source: Annotated[str, Wire("The sandbox whose changes were applied.")]
    against: Annotated[str, Wire("The state both were compared with: the source's snapshot.")]
    written: Annotated[list[str], Wire("Paths written (added or modified).")]
    deleted: Annotated[list[str], Wire("Paths removed.")]
    unchanged: Annotated[list[str], Wire("Paths the target already had as the source has them.")]
