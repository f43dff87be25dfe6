"""What the Runtime and its sub-APIs answer, as typed records.

The routes hand these to FastAPI, which serialises them through the response
models of ``api/schemas/responses.py`` (the wire's source of truth, and what the
SDKs are generated from). They are TypedDicts rather than dataclasses because
each is already a JSON object on its way out: a guest's reply checked key by key
(``controller.files.checked_info``, ``controller.processes.process_info``) or a
record's ``info()``. Typing them here lets mypy check every producer and every
reader of a key, which ``dict[str, Any]`` did not.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

# A record's own serialisation (SnapshotRecord.info(), SandboxRecord.info(), ...): the records
# are the typed dataclasses of store/records.py; this is their JSON form.
RecordJson = dict[str, Any]


# ------------------------------------------------------------------ the guest agent's answers

class PingResult(TypedDict):
    pong: bool
    numpy_version: NotRequired[str | None]
    pid: NotRequired[int | None]
    # The rest of the agent's answer (guest/agent/server.py), which /v1's PingResponse leaves out.
    agent_version: NotRequired[int]
    python_version: NotRequired[str]
    warm: NotRequired[bool]
    warm_errors: NotRequired[list[str]]
    restores: NotRequired[int]


class ExecResult(TypedDict):
    stdout: str
    stderr: str
    exit_code: int | None
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
    cancelled: bool


# ----------------------------------------------------------------------------------- files

class FileEntry(TypedDict):
    path: str
    name: str
    type: str
    size: int
    mode: int
    mtime: float
    owner: NotRequired[str]
    group: NotRequired[str]
    target: NotRequired[str]
    metadata: NotRequired[dict[str, str]]


class DirListing(TypedDict):
    path: str
    entries: list[FileEntry]
    truncated: bool


class MkdirResult(TypedDict):
    path: str
    created: bool


# ------------------------------------------------------------------------------- processes

class ProcessEntry(TypedDict):
    pid: int
    tag: str | None
    args: list[str]
    env: dict[str, str]
    cwd: str | None
    user: str | None
    running: bool
    exit_code: int | None
    signal: int | None
    timed_out: bool
    stdin_open: bool
    pty: dict[str, int] | None
    started_at: float | None
    ended_at: float | None


class StdinResult(TypedDict):
    pid: int
    written: int
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
    winner: RecordJson
    tree_id: str
    deleted: list[Deletion]
    replaced_parent: str | None


class CheckpointReport(TypedDict):
    sandbox_id: str
    policy: RecordJson | None
    calls: int
    checkpoints: list[RecordJson]
    last_error: NotRequired[str]


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


# -------------------------------------------------------------------- pools, workspaces, travel

class PoolReport(TypedDict):
    tag: str
    size: int
    ready: int
    memory_limit_mib: int | None
    per_child_netns: bool
    live_fork: bool
    allow_internet_access: bool
    network: dict[str, list[str]] | None
    claims: int
    misses: int
    last_error: NotRequired[str]


class WorkspaceReport(TypedDict):
    id: str
    name: str
    source_snapshot_tag: str
    status: str  # running, suspended or stale (controller/workspaces.py)
    live_sandbox_id: NotRequired[str]
    current_state_tag: NotRequired[str]
    created_at_unix: int
    last_active_unix: int


class PushReport(TypedDict):
    tag: str
    store: str
    lineage: list[str]
    blobs: int
    blobs_uploaded: int
    bytes_uploaded: int


class PullReport(TypedDict):
    tag: str
    created: list[str]
    reused: list[str]
    bytes_downloaded: int


class ContextReport(TypedDict):
    context: str
    bytes: int


class SandboxCost(TypedDict):
    """``GET /v1/sandboxes/{id}/memory``: bytes. ``ram_bytes``: the guest's RAM; ``shared_bytes``:
    pages read from the snapshot and not written (in the page cache once, shared with the snapshot
    and its siblings); ``private_bytes``: pages it wrote (its own); ``untouched_bytes``: neither
    yet; ``disk_bytes``: what its own disk layers (its copy-on-write overlay, and those its
    branches froze) hold on the host."""

    sandbox_id: str
    ram_bytes: int
    shared_bytes: int
    private_bytes: int
    untouched_bytes: int
    disk_bytes: int
