"""The guest agent's wire protocol, shared by the agent (in the guest) and the host client.

Both ends import this one module, so a name, a limit or the shape of a line is
written once. It is installed into the guest image beside the agent package,
so it is stdlib only and must import under ``MIN_GUEST_PYTHON``
(see ``forkd.guest.agent``).

Framing: newline-delimited JSON over the VM's virtio-serial port, one object a
line, both directions::

    -> {"id": 7, "action": "ping"}
    <- {"id": 7, "ok": true, "result": {"pong": true, "pid": 1, ...}}
    -> {"id": 8, "action": "x"}
    <- {"id": 8, "ok": false, "error": "unknown action 'x'"}

Requests are handled concurrently: replies carry the id of the request they
answer and may arrive in any order. A line that is not a JSON object is
answered with ``"id": null``. A request without an ``id`` is a notification:
it is acted on and never answered (``proc_ack``, ``proc_detach``).

Streams: a request that streams (``proc_start`` with ``stream``,
``proc_attach``, and ``exec``) is answered by any number of event messages,
then by its one ordinary reply, which ends it::

    <- {"id": 9, "event": {"type": "start", "pid": 42}}
    <- {"id": 9, "event": {"type": "stdout", "data": "<base64>"}}
    <- {"id": 9, "ok": true, "result": {"type": "exit", "exit_code": 0, ...}}

Output travels as base64 of the raw bytes, at most ``OUTPUT_CHUNK`` bytes an
event. A process stream is flow-controlled: the agent sends at most
``STREAM_WINDOW`` bytes of output that the host has not acknowledged
(``proc_ack``), so the host holds at most that much per stream. Every line the
agent sends is at most ``MAX_REPLY_LINE`` bytes; the host drops longer ones.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

# The virtio-serial port's name (the kernel command line's forkd.port= overrides it).
PORT_NAME = "org.forkd.agent"

# --------------------------------------------------------------------- actions

# Each action's request and reply are typed in the message modules (one source for each shape):
# messages (the base actions, files, watchers), process_messages (proc_*), code_messages (context,
# kernel). Here: the names, and the agent version that brought what an older agent would ignore.
PING = "ping"  # PingReply
EXEC = "exec"  # ExecRequest -> stdout/stderr events, then ExecReply
EVAL = "eval"  # EvalRequest -> EvalReply
EVAL_CANCEL = "eval_cancel"  # -> EvalCancelReply: interrupts the eval that is running, if any
RESTORED = "restored"  # RestoredRequest (a RestoreInputs' fields, or clock_only) -> RestoredReply
SYNC = "sync"  # -> SyncReply
FSFREEZE = "fsfreeze"  # FsfreezeRequest -> FsfreezeReply
FSTHAW = "fsthaw"  # -> FsthawReply
PID1_DEFAULTS = "pid1_defaults"  # Pid1DefaultsRequest -> Pid1DefaultsReply: a build's ENV and WORKDIR
# A process start and every file action take an optional "user" (messages.ExecRequest says how).
USER_AGENT_VERSION = 7
# Files (forkd.guest.agent.files). Transfers go in FILE_CHUNK pieces, base64 in
# the JSON line, so no line grows past ~1.4 MiB and other requests keep flowing.
FILE_STAT = "file_stat"  # FileStatRequest -> FileInfo
FILE_LIST = "file_list"  # FileListRequest -> FileListReply
FILE_MKDIR = "file_mkdir"  # FileMkdirRequest -> FileMkdirReply
FILE_REMOVE = "file_remove"  # FileRemoveRequest -> FileRemoveReply
FILE_READ = "file_read"  # FileReadRequest -> FileReadReply
FILE_WRITE_OPEN = "file_write_open"  # FileWriteOpenRequest -> FileWriteOpenReply (a temp file beside path)
FILE_WRITE = "file_write"  # FileWriteRequest -> FileWriteReply
FILE_WRITE_CLOSE = "file_write_close"  # FileWriteCloseRequest -> FileInfo, or FileWriteCloseAborted
FILE_MOVE = "file_move"  # FileMoveRequest -> the destination's FileInfo
METADATA_AGENT_VERSION = 10  # file metadata (messages.FileWriteOpenRequest's, FileInfo's)
CONTEXT = "context"  # named code contexts (forkd.guest.agent.contexts): code_messages
KERNEL = "kernel"  # cells on Jupyter kernels (forkd.guest.agent.kernels): code_messages
LANGUAGE_AGENT_VERSION = 11  # a context's and a kernel run's "language" (code_messages.KERNEL_LANGUAGES)
WATCH = "watch"  # directory watchers on inotify (forkd.guest.agent.watches): messages.Watch*
WATCH_AGENT_VERSION = 8
WATCH_ENTRY_AGENT_VERSION = 10  # a watcher's "entries"
# Processes (forkd.guest.agent.processes), addressed by their guest pid: process_messages.
PROC_START = "proc_start"  # ProcStartRequest -> ProcessInfo; with stream, a process stream
PROC_ATTACH = "proc_attach"  # ProcAttachRequest -> a process stream, from the ring's oldest output or now
PROC_DETACH = "proc_detach"  # ProcStreamNotice; a notification
PROC_ACK = "proc_ack"  # ProcAckNotice: output bytes the host has consumed; a notification
PROC_LIST = "proc_list"  # -> ProcListReply (the running ones)
PROC_INFO = "proc_info"  # ProcInfoRequest -> ProcessInfo (running or recently exited)
PROC_INPUT = "proc_input"  # ProcInputRequest -> ProcInputReply
PROC_SIGNAL = "proc_signal"  # ProcSignalRequest -> ProcSignalReply
PROC_RESIZE = "proc_resize"  # ProcResizeRequest -> ProcResizeReply (a terminal: proc_start's "pty")
PTY_AGENT_VERSION = 9
# Shared volumes (forkd.guest.agent.volfs): volume_messages. The host polls for the FUSE server's ops.
VOL_MOUNT = "vol_mount"  # VolMountRequest -> VolMountReply
VOL_POLL = "vol_poll"  # VolPollRequest -> VolPollReply, held until an op is queued or wait_secs pass
VOL_REPLY = "vol_reply"  # VolReplyNotice; a notification
SHARED_VOLUMES_AGENT_VERSION = 17
PTY_MAX_SIZE = 4096  # the most columns (or rows) a terminal may have; the least is 1
ACTIONS = (PING, EXEC, EVAL, EVAL_CANCEL, RESTORED, SYNC, FSFREEZE, FSTHAW, PID1_DEFAULTS, FILE_STAT,
           FILE_LIST, FILE_MKDIR, FILE_REMOVE, FILE_READ, FILE_WRITE_OPEN, FILE_WRITE, FILE_WRITE_CLOSE,
           FILE_MOVE, CONTEXT, KERNEL, WATCH, PROC_START, PROC_ATTACH, PROC_DETACH, PROC_ACK, PROC_LIST,
           PROC_INFO, PROC_INPUT, PROC_SIGNAL, PROC_RESIZE, VOL_MOUNT, VOL_POLL, VOL_REPLY)

# The events of a stream ("event" messages), each {"type": ...}:
EV_START = "start"  # {"type": "start", "pid"}
EV_STDOUT = "stdout"  # {"type": "stdout", "data": base64}
EV_STDERR = "stderr"  # {"type": "stderr", "data": base64}
EV_DROPPED = "dropped"  # {"type": "dropped", "bytes": n}: output the ring lost before it was sent
# A process stream's reply is process_messages.ProcExit (or an error). A stream the host ends
# first (proc_detach) gets no reply.
EV_EXIT = "exit"

# ---------------------------------------------------------------------- limits

# A request line longer than this is refused (and skipped), not buffered for ever.
MAX_REQUEST_LINE = 64 << 20
# The longest line the agent sends, and so the most the host buffers per VM: a
# file piece (FILE_CHUNK as base64) and its envelope fit. A longer reply the
# agent replaces by an error; a longer line the host drops unread.
MAX_REPLY_LINE = 2 << 20

EXEC_DEFAULT_TIMEOUT_SECS: float = 30  # an int, so that messages say "30s" as they always did
# When the host sends no timeout_secs with an eval, the agent interrupts it after
# this long; equal to the daemon's limit (forkd.bounds.EVAL_TIMEOUT_SECS).
EVAL_DEFAULT_TIMEOUT_SECS = 60.0
# The agent enforces a request's timeout_secs itself and then answers; the host
# waits this much longer before deciding that the guest is wedged.
REPLY_GRACE_SECS = 30.0
# An eval's result (a repr) is cut to this many characters, so that its reply fits
# in MAX_REPLY_LINE even when each character is escaped ("\uXXXX", 6 bytes).
EVAL_RESULT_MAX_CHARS = 256 << 10

EXEC_OUTPUT_CAP = 1 << 20  # bytes kept per stream of an exec, unless max_output_bytes says less/more
EXEC_MAX_OUTPUT_CAP = 16 << 20  # the largest max_output_bytes the agent accepts

# Output: the most raw bytes one event carries, and the most a process stream has
# in flight unacknowledged, which is the most the host holds for it.
OUTPUT_CHUNK = 64 << 10
STREAM_WINDOW = 256 << 10
# Every event counts as at least this many bytes against the window, so that a
# window also bounds how many events are in flight (a process writing one byte
# at a time must not fill the host with tiny events).
EVENT_COST_MIN = 256


def event_cost(data_bytes: int) -> int:
    """What one event carrying ``data_bytes`` bytes of output costs against a stream's window."""
    return max(data_bytes, EVENT_COST_MIN)


def line_cost(line_bytes: int) -> int:
    """What one kernel event costs against its stream's window: its line's length (without
    the newline), at most the whole window (so one large result still goes, alone)."""
    return min(STREAM_WINDOW, event_cost(line_bytes))


# Per process, the output kept for a later attach: a ring, the oldest goes first.
PROCESS_RING_BYTES = 1 << 20
# Processes the agent tracks at once: running ones, plus the last exited ones
# (kept for their exit code and output), of which the oldest is forgotten first.
MAX_PROCESSES = 64
MAX_EXITED_PROCESSES = 16
# Streams (attached clients) per process.
MAX_STREAMS_PER_PROCESS = 8
# Bytes written to a process's stdin that it has not read yet; more is refused.
STDIN_BUFFER_BYTES = 1 << 20
TAG_MAX = 256  # characters of a process tag


# Files: one transfer piece, the longest path, the most entries a listing returns.
FILE_CHUNK = 1 << 20
FILE_PATH_MAX = 4096
FILE_LIST_MAX = 10_000
FILE_NAME_MAX = 255  # bytes of one name, as Linux allows (longer names are bounded anyway)
# File metadata (E2B's bounds, which are the kernel's): an xattr name is at most 255 bytes, so a key
# after the prefix at most 246; keys (each with the prefix) and values together fit one ext4
# inode's xattr block; printable US-ASCII only (they travel as HTTP header names and values).
METADATA_XATTR_PREFIX = "user.e2b."
METADATA_KEY_MAX = 255 - len(METADATA_XATTR_PREFIX)
METADATA_TOTAL_MAX = 4096
METADATA_MAX_KEYS = 128

# Error kinds an error reply may carry ("kind"), so the host can answer with the
# right status instead of a generic guest failure.
NOT_FOUND = "not_found"  # 404
INVALID = "invalid"  # 400: a bad path or argument
CONFLICT = "conflict"  # 409: a directory where a file is expected, a non-empty directory, ...
ERROR_KINDS = (NOT_FOUND, INVALID, CONFLICT)


# ------------------------------------------------------------------- requests


class RequestError(Exception):
    """A request the agent refuses; its message goes back as ``{"ok": false, "error": ...}``.

    ``kind`` (one of ``ERROR_KINDS``, or None) goes back as the reply's ``"kind"``.
    """

    def __init__(self, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind


def check_path(path: object) -> str:
    """A guest path for the file actions: an absolute string without NUL, length-bounded.

    Checked by the daemon before it calls the guest, and again by the agent.
    """
    if not isinstance(path, str) or not path:
        raise RequestError("path must be a non-empty string", INVALID)
    if "\0" in path:
        raise RequestError("path must not contain NUL characters", INVALID)
    if not path.startswith("/"):
        raise RequestError(f"path must be absolute (start with /): {path[:200]!r}", INVALID)
    try:
        path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise RequestError("path is not valid UTF-8", INVALID) from None
    if len(path) > FILE_PATH_MAX:  # characters, as the API's schema counts them
        raise RequestError(f"path is longer than {FILE_PATH_MAX} characters", INVALID)
    return path


def _printable(text: str) -> bool:
    return all(" " <= ch <= "~" for ch in text)


def metadata_size(key: str, value: str) -> int:
    """What one pair counts against METADATA_TOTAL_MAX: its xattr name and its value."""
    return len(METADATA_XATTR_PREFIX) + len(key) + len(value)


def check_metadata(metadata: object) -> dict[str, str]:
    """File metadata, validated (None is none): keys of 1..METADATA_KEY_MAX printable US-ASCII
    characters, printable US-ASCII values, at most METADATA_MAX_KEYS pairs of METADATA_TOTAL_MAX
    bytes in all. Checked by the daemon before it calls the guest, by the agent, and by the
    daemon again on what the agent answers."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise RequestError("metadata must be an object of strings", INVALID)
    if len(metadata) > METADATA_MAX_KEYS:
        raise RequestError(f"at most {METADATA_MAX_KEYS} metadata keys", INVALID)
    total = 0
    for key, value in metadata.items():
        if not isinstance(key, str) or not 0 < len(key) <= METADATA_KEY_MAX or not _printable(key):
            raise RequestError(f"metadata keys must be 1 to {METADATA_KEY_MAX} printable US-ASCII "
                               f"characters: {str(key)[:64]!r}", INVALID)
        if not isinstance(value, str) or not _printable(value):
            raise RequestError(f"the value of metadata key {key!r} must be printable US-ASCII", INVALID)
        total += metadata_size(key, value)
    if total > METADATA_TOTAL_MAX:
        raise RequestError(f"metadata is {total} bytes (keys with their prefix {METADATA_XATTR_PREFIX!r}, "
                           f"and values); at most {METADATA_TOTAL_MAX}", INVALID)
    return dict(metadata)


def check_env(env: object) -> dict[str, str]:
    """A per-child environment (the ``restored`` action's ``env``), validated; None is empty.

    Checked by the daemon before any VM starts, and again by the agent.
    """
    if env is None:
        return {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\0" not in k + v
        for k, v in env.items()
    ):
        raise RequestError("env must map variable names (non-empty, no '=' or NUL) to strings without NUL")
    return env


# A guest hostname: RFC 1123 labels (letters, digits, inner hyphens; 1-63 each) joined by dots, at
# most HOSTNAME_MAX characters in all (the kernel's __NEW_UTS_LEN).
HOSTNAME_MAX = 64
HOSTNAME_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME_RE = re.compile(rf"{HOSTNAME_LABEL}(\.{HOSTNAME_LABEL})*")
# Agents older than this ignore a RestoreInputs' hostname (CAP_RESTORE_HOSTNAME).
HOSTNAME_AGENT_VERSION = 12


def check_hostname(hostname: object) -> str | None:
    """A per-child hostname (the ``restored`` action's ``hostname``), validated; None is none.

    Checked by the daemon before any VM starts, and again by the agent.
    """
    if hostname is None:
        return None
    if not isinstance(hostname, str) or len(hostname) > HOSTNAME_MAX or not HOSTNAME_RE.fullmatch(hostname):
        raise RequestError(f"hostname must be RFC 1123 labels (letters, digits and inner hyphens, 1-63 "
                           f"characters each) joined by dots, at most {HOSTNAME_MAX} characters in all")
    return hostname


FREEZE_MOUNTS_AGENT_VERSION = 14  # fsfreeze's "mounts" (checked by guest/agent/freeze.py)
RUNTIME_AGENT_VERSION = 15  # "python" listed (absent on forkd's runtime: image/guest_runtime.py)
TRUST_AGENT_VERSION = 16  # a RestoreInputs' trust (the sandbox's egress CA)

# A certificate the guest is given to trust (``RestoreInputs.trust``): one PEM certificate, small.
TRUST_MAX_CHARS = 8192
_PEM_CERT = re.compile(r"-----BEGIN CERTIFICATE-----\n[A-Za-z0-9+/=\n]+-----END CERTIFICATE-----\n?")


def check_trust(pem: object) -> str | None:
    """A per-child certificate to trust (the ``restored`` action's ``trust``), validated; None is none.
    Only a single PEM certificate's characters: nothing else can ride into the trust store."""
    if pem is None:
        return None
    if not isinstance(pem, str) or len(pem) > TRUST_MAX_CHARS or not _PEM_CERT.fullmatch(pem):
        raise RequestError(f"trust must be one PEM certificate of at most {TRUST_MAX_CHARS} characters")
    return pem


@dataclass(frozen=True)
class RestoreInputs:
    """What one child is given with its post-restore call, beside the fresh entropy and the clock
    that every call carries: the same value goes to ``VM.restore`` and to a warm-pool claim.

    A new input is one field here (validated in ``__post_init__``, which the daemon runs before
    any VM starts and the agent runs again on ``from_wire``), its step in
    forkd/guest/agent/restore.py and, where older agents would ignore it, its entry in
    guest/capabilities.py's ``RESTORE_INPUTS``. ``env``: set in the agent's environment (eval's
    os.environ, every exec's); ``hostname``: the guest's hostname (the kernel's, /etc/hostname and
    /etc/hosts); ``trust``: a CA certificate (PEM) added to the guest's trust store, the sandbox's
    own egress CA when its policy has header rules (host/egress_tls.py; set by the daemon, not by a
    request).
    """

    env: dict[str, str] = field(default_factory=dict)
    hostname: str | None = None
    trust: str | None = None

    # Fields only the daemon sets (no request may name what a guest trusts).
    DAEMON_ONLY: ClassVar[tuple[str, ...]] = ("trust",)

    def __post_init__(self) -> None:
        check_env(self.env)
        check_hostname(self.hostname)
        check_trust(self.trust)

    def to_wire(self) -> dict[str, Any]:
        """The fields of a ``restored`` request: those that differ from the defaults."""
        default = RestoreInputs()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}

    @classmethod
    def from_wire(cls, req: dict[str, Any]) -> RestoreInputs:
        """A ``restored`` request's inputs (other keys are the envelope's, entropy and time_ns)."""
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{n: req[n] for n in names if req.get(n) is not None})


def agent_version_of(reply: Mapping[str, object]) -> int:
    """The ``agent_version`` an answer (ping's, restored's) reports; 0 where it has none."""
    reported = str(reply.get("agent_version", "0"))
    return int(reported) if reported.isdigit() else 0


def request(req_id: int, action: str, fields: dict[str, Any]) -> dict[str, Any]:
    """A request object; ``fields`` may not use the envelope's own keys."""
    clash = {"id", "action"} & fields.keys()
    if clash:
        raise ValueError(f"request fields may not be named {sorted(clash)}")
    return {"id": req_id, "action": action, **fields}


def notification(action: str, fields: dict[str, Any]) -> dict[str, Any]:
    """A request that is never answered (it has no id)."""
    if "id" in fields or "action" in fields:
        raise ValueError("notification fields may not be named 'id' or 'action'")
    return {"action": action, **fields}


def request_timeout(req: dict[str, Any], default: float) -> float:
    """A request's ``timeout_secs``: a positive, finite number of seconds, as given."""
    value = req.get("timeout_secs", default)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 < value < math.inf  # also refuses NaN
    ):
        raise RequestError("'timeout_secs' must be a positive number")
    # threading waits refuse longer timeouts (OverflowError): this is centuries anyway.
    return value if value <= threading.TIMEOUT_MAX else threading.TIMEOUT_MAX


# --------------------------------------------------------------------- replies


def ok_reply(req_id: Any, result: Any) -> dict[str, Any]:
    return {"id": req_id, "ok": True, "result": result}


def error_reply(req_id: Any, error: str, kind: str | None = None) -> dict[str, Any]:
    reply = {"id": req_id, "ok": False, "error": error}
    if kind is not None:
        reply["kind"] = kind
    return reply


def event(req_id: int, ev: dict[str, Any]) -> dict[str, Any]:
    """One event of the stream that request ``req_id`` opened (its reply ends it)."""
    return {"id": req_id, "event": ev}


# -------------------------------------------------------------------- framing


def encode(message: dict[str, Any]) -> bytes:
    """One message as one line: compact JSON and a newline (JSON escapes any newline inside)."""
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def decode(line: bytes) -> Any:
    """Parse one line; raises ValueError (UnicodeDecodeError included) if it is not JSON, or
    nests too deeply for the parser (its RecursionError): either way, a line to drop."""
    try:
        return json.loads(line)
    except RecursionError:
        raise ValueError("the line nests too deeply") from None


def decode_reply(line: bytes) -> dict[str, Any] | None:
    """A reply or an event the host can match to a request, or None for anything else.

    Stray bytes (say, left in the port's buffer from before a restore) and replies
    with no usable id (``"id": null`` answers a malformed line) are not replies.
    """
    try:
        msg = decode(line)
    except ValueError:
        return None
    if not isinstance(msg, dict) or isinstance(msg.get("id"), bool) or not isinstance(msg.get("id"), int):
        return None
    return msg
