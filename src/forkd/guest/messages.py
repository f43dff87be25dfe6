"""The guest agent's wire schema: one typed request and one typed reply per action.

``protocol.py`` holds the action names, limits, framing and the checks both ends share; this module
and its siblings hold the shapes of the messages: the base actions, files and watchers here,
processes in ``process_messages``, code contexts and kernels in ``code_messages``. The host's typed
calls (``forkd.guest.client.AgentClient``) build the requests and check each reply against its type
(``schema.check``: a reply that does not fit is a GuestError naming the field), and the agent checks
each request against its type (``request_type``) before a handler reads it, then declares its
answers with them, so mypy checks both ends and both check what they read at run time. Stdlib only,
like ``protocol``: the guest image carries them (``forkd.image.rootfs.GUEST_SHARED_MODULES``).
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from forkd.guest import code_messages, process_messages, protocol, schema, volume_messages
from forkd.guest.schema import Seconds

# One request and one reply type per action (the fields beside the envelope's id and action).
# total=False where a field may be absent; the agent supplies defaults. A handler still checks a
# field's value (a path's form, a bound) after ``schema.check`` has checked its type.


class PingReply(TypedDict):
    pong: bool
    # NotRequired: what older agents may leave out (only pong is checked for presence).
    pid: NotRequired[int]
    agent_version: NotRequired[str]
    python_version: NotRequired[str]
    numpy_version: NotRequired[str | None]
    warm: NotRequired[list[str]]  # the modules it imported at boot
    warm_errors: NotRequired[Any]
    restores: NotRequired[int]
    # From "13". Any: Capabilities.of reads it defensively (a malformed list counts as none).
    capabilities: NotRequired[Any]


class ExecRequest(TypedDict, total=False):
    """An exec: its output comes as stdout/stderr events (base64; at most max_output_bytes of each
    in all), then its ExecReply.

    ``user`` (here, on proc_start, and on every file action but file_write/file_write_close, which
    act as their file_write_open did): a name in the guest's /etc/passwd (unknown: an "invalid"
    error). Absent: the agent itself (root, its environment and cwd); given: that user's ids and
    groups, HOME/USER/LOGNAME, and its home as the default cwd (forkd.guest.agent.users). Agents
    older than protocol.USER_AGENT_VERSION ignore it: the host asks first (CAP_USER).
    """

    args: list[str]  # required
    timeout_secs: Seconds
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
    timeout_secs: Seconds


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
    capabilities: Any  # from "13"; read by Capabilities.of, which ignores junk


class SyncReply(TypedDict):
    synced: bool


class FsfreezeRequest(TypedDict, total=False):
    mounts: list[str]  # besides the root filesystem (agent/freeze.check_freeze_mounts); CAP_FREEZE_MOUNTS


class FsfreezeReply(TypedDict):
    frozen: bool


class FsthawReply(TypedDict):
    thawed: bool


class Pid1DefaultsRequest(TypedDict, total=False):
    env: dict[str, str]  # set in PID 1's environment, which every later exec and eval inherits
    cwd: str  # PID 1's working directory, made if missing (an absolute path)


class Pid1DefaultsReply(TypedDict):
    applied: bool


class FileInfo(TypedDict):
    path: str
    name: str
    type: str  # file, dir, symlink, other
    size: int
    mode: int
    mtime: float
    owner: NotRequired[str | None]
    group: NotRequired[str | None]
    target: NotRequired[str | None]
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
    """An upload's start: a temp file beside ``path``, renamed over it by file_write_close.

    ``metadata`` (E2B's file metadata: string pairs kept as the extended attributes
    "user.e2b.<key>"): the temp file gets them before any data, so the upload lands with exactly
    that metadata (none given: none, an overwrite clears the old); every FileInfo carries
    "metadata" when its file has some (protocol.check_metadata's bounds; others are skipped).
    Older agents ignore it: the host asks for protocol.METADATA_AGENT_VERSION first.
    """

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


class FileWriteCloseAborted(TypedDict):
    aborted: bool


# ------------------------------------------------------------------ watch


class WatchCreateRequest(TypedDict):
    """A watcher of a directory. One made with "entries" answers each event with the FileInfo of
    what it names ("entry"), unless that is gone (always for remove and rename). Older agents answer
    "unknown action": the host asks for protocol.WATCH_AGENT_VERSION first, and
    WATCH_ENTRY_AGENT_VERSION before "entries"."""

    op: Literal["create"]
    path: str
    recursive: NotRequired[bool]
    entries: NotRequired[bool]  # CAP_WATCH_ENTRIES: each event carries its FileInfo


class WatchCreateReply(TypedDict):
    watcher: str


class WatchEventsRequest(TypedDict):
    op: Literal["events"]
    watcher: str
    wait_ms: NotRequired[int]  # wait that long (at most 1000) for the first event


class WatchEvent(TypedDict):
    name: str  # relative to the watched directory
    type: Literal["create", "write", "remove", "rename", "chmod"]
    entry: NotRequired[FileInfo | None]


class WatchEventsReply(TypedDict):
    events: list[WatchEvent]
    overflowed: NotRequired[bool]


class WatchRemoveRequest(TypedDict):
    op: Literal["remove"]
    watcher: str


class WatchRemoveReply(TypedDict):
    removed: bool


# ------------------------------------------------------------ the registry

# Each action's request type, for the agent to check a request against before it is handled.
# Actions without fields (ping, sync, ...) have none; context, kernel and watch pick theirs by op.
REQUESTS: dict[str, type] = {
    protocol.EXEC: ExecRequest, protocol.EVAL: EvalRequest, protocol.RESTORED: RestoredRequest,
    protocol.FSFREEZE: FsfreezeRequest,
    protocol.FILE_STAT: FileStatRequest, protocol.FILE_LIST: FileListRequest,
    protocol.FILE_MKDIR: FileMkdirRequest, protocol.FILE_REMOVE: FileRemoveRequest,
    protocol.FILE_READ: FileReadRequest, protocol.FILE_WRITE_OPEN: FileWriteOpenRequest,
    protocol.FILE_WRITE: FileWriteRequest, protocol.FILE_WRITE_CLOSE: FileWriteCloseRequest,
    protocol.FILE_MOVE: FileMoveRequest,
    protocol.PROC_START: process_messages.ProcStartRequest,
    protocol.PROC_ATTACH: process_messages.ProcAttachRequest,
    protocol.PROC_DETACH: process_messages.ProcStreamNotice,
    protocol.PROC_ACK: process_messages.ProcAckNotice,
    protocol.PROC_INFO: process_messages.ProcInfoRequest,
    protocol.PROC_INPUT: process_messages.ProcInputRequest,
    protocol.PROC_SIGNAL: process_messages.ProcSignalRequest,
    protocol.PROC_RESIZE: process_messages.ProcResizeRequest,
    protocol.VOL_MOUNT: volume_messages.VolMountRequest,
    protocol.VOL_POLL: volume_messages.VolPollRequest,
    protocol.VOL_REPLY: volume_messages.VolReplyNotice,
}
_WATCH_OPS: dict[object, type] = {"create": WatchCreateRequest, "events": WatchEventsRequest,
                                  "remove": WatchRemoveRequest}


def request_type(action: str, req: dict[str, Any]) -> type | None:
    """The type ``req`` (a request for ``action``) must fit; None where it has no fields to check,
    or names an op that is not one (its handler refuses that, listing the ops there are)."""
    if action in (protocol.CONTEXT, protocol.KERNEL):
        return code_messages.request_type(action, req)
    if action == protocol.WATCH:
        op = req.get("op")
        return _WATCH_OPS.get(op) if isinstance(op, str) else None
    return REQUESTS.get(action)


def check_request(action: str, req: dict[str, Any]) -> None:
    """Refuse (``RequestError``, INVALID, naming the field) a request whose fields do not fit its
    action's request type: the agent's check of what it reads, before a handler reads it."""
    shape = request_type(action, req)
    if shape is not None:
        try:
            schema.check(shape, req, f"the {action} request")
        except schema.ProtocolError as exc:
            raise protocol.RequestError(str(exc), protocol.INVALID) from None
