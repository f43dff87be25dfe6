"""The guest agent's wire schema: one typed request and one typed reply per action.

``protocol.py`` holds the action names, limits, framing and the checks both ends share; this module
holds the shapes of the messages. The host's typed calls (``forkd.guest.client.AgentClient``) build
the requests and read the replies with these, and the agent declares its answers with them, so mypy
checks both ends. Stdlib only, like ``protocol``: the guest image carries both
(``forkd.image.rootfs.agent_files``).
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

# One request and one reply type per action (the fields beside the envelope's id and action). The
# host's typed calls (forkd.guest.client.AgentClient) build the requests and read the replies with
# these, so mypy checks both; the agent reads a request field by field anyway (it trusts nothing).
# total=False where a field may be absent; the agent supplies defaults.


class PingReply(TypedDict):
    pong: bool
    pid: int
    agent_version: str
    python_version: str
    numpy_version: str | None
    warm: list[str]  # the modules it imported at boot
    warm_errors: Any
    restores: int
    capabilities: NotRequired[list[str]]  # absent from agents older than "13": see Capabilities.of


class ExecRequest(TypedDict, total=False):
    args: list[str]  # required
    timeout_secs: float
    env: dict[str, str]
    cwd: str
    stdin: str
    max_output_bytes: int
    user: str  # CAP_USER


class ExecReply(TypedDict):
    exit_code: int | None
    error: str | None
    timed_out: bool
    duration_ms: NotRequired[float]
    stdout: str  # the stdout events' bytes, decoded by the host
    stderr: str
    stdout_bytes: NotRequired[int]
    stderr_bytes: NotRequired[int]
    stdout_truncated: NotRequired[bool]
    stderr_truncated: NotRequired[bool]
    signal: NotRequired[int]


class EvalRequest(TypedDict, total=False):
    code: str  # required
    timeout_secs: float


class EvalReply(TypedDict):
    result: str | None
    error: str | None
    exit_code: int


class EvalCancelReply(TypedDict):
    cancelled: bool


class RestoredRequest(TypedDict, total=False):
    entropy: str  # hex
    time_ns: int
    clock_only: bool  # only step the clock (a resume after a pause): no reseed, no inputs
    env: dict[str, str]  # and every other RestoreInputs field (RestoreInputs.to_wire)
    hostname: str


class RestoredReply(TypedDict, total=False):
    reseeded: bool
    clock_stepped: bool
    time_ns: int
    env_set: int
    steps_us: dict[str, int]
    thawed: bool  # a live branch's frozen filesystem, thawed in the child
    agent_version: str  # from "12"
    capabilities: list[str]  # from "13"


class SyncReply(TypedDict):
    synced: bool


class FsfreezeReply(TypedDict):
    frozen: bool


class FsthawReply(TypedDict):
    thawed: bool


class FileInfo(TypedDict):
    path: str
    name: str
    type: str  # file, dir, symlink, other
    size: int
    mode: int
    mtime: float
    owner: NotRequired[str]
    group: NotRequired[str]
    target: NotRequired[str]
    metadata: NotRequired[dict[str, str]]  # CAP_METADATA


class FileStatRequest(TypedDict, total=False):
    path: str  # required
    user: str


class FileListRequest(TypedDict, total=False):
    path: str  # required
    user: str


class FileListReply(TypedDict):
    path: str
    entries: list[FileInfo]
    truncated: bool


class FileMkdirRequest(TypedDict, total=False):
    path: str  # required
    parents: bool
    user: str


class FileMkdirReply(TypedDict):
    created: bool


class FileRemoveRequest(TypedDict, total=False):
    path: str  # required
    recursive: bool
    user: str


class FileRemoveReply(TypedDict):
    removed: bool


class FileReadRequest(TypedDict, total=False):
    path: str  # required
    offset: int
    length: int
    user: str


class FileReadReply(TypedDict):
    data: str  # base64
    eof: bool


class FileWriteOpenRequest(TypedDict, total=False):
    path: str  # required
    mode: int
    metadata: dict[str, str]  # CAP_METADATA
    user: str


class FileWriteOpenReply(TypedDict):
    handle: str


class FileWriteRequest(TypedDict):
    handle: str
    offset: int
    data: str  # base64


class FileWriteReply(TypedDict):
    written: int


class FileWriteCloseRequest(TypedDict):
    handle: str
    commit: bool


class FileMoveRequest(TypedDict, total=False):
    source: str  # required
    destination: str  # required
    user: str
