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

The agent handles requests concurrently, one thread each: replies carry the id
of the request they answer and may arrive in any order. A line that is not a
JSON object is answered with ``"id": null``.
"""

from __future__ import annotations

import json
import math
import threading
from typing import Any

# The virtio-serial port's name (the kernel command line's forkd.port= overrides it).
PORT_NAME = "org.forkd.agent"

# --------------------------------------------------------------------- actions

PING = "ping"  # -> {"pong": true, "pid", "agent_version", "python_version", "warm", ...}
EXEC = "exec"  # args, timeout_secs, env, cwd, stdin, max_output_bytes -> {"stdout", "stderr", ...}
EVAL = "eval"  # code, timeout_secs -> {"result", "error", "exit_code"}
RESTORED = "restored"  # entropy (hex), time_ns, env? -> {"reseeded", "clock_stepped", "thawed", ...}
SYNC = "sync"  # -> {"synced": true}
FSFREEZE = "fsfreeze"  # -> {"frozen": true}
FSTHAW = "fsthaw"  # -> {"thawed": bool}
# Files (forkd.guest.agent.files). Transfers go in FILE_CHUNK pieces, base64 in
# the JSON line, so no line grows past ~1.4 MiB and other requests keep flowing.
FILE_STAT = "file_stat"  # path -> FileInfo {"path", "name", "type", "size", "mode", "mtime"}
FILE_LIST = "file_list"  # path -> {"entries": [FileInfo...], "truncated": bool}
FILE_MKDIR = "file_mkdir"  # path, parents -> {"created": bool}
FILE_REMOVE = "file_remove"  # path, recursive -> {"removed": true}
FILE_READ = "file_read"  # path, offset, length -> {"data": base64, "eof": bool}
FILE_WRITE_OPEN = "file_write_open"  # path, mode? -> {"handle": str} (a temp file beside path)
FILE_WRITE = "file_write"  # handle, offset, data (base64) -> {"written": n}
FILE_WRITE_CLOSE = "file_write_close"  # handle, commit -> FileInfo (commit) or {"aborted": true}
FILE_MOVE = "file_move"  # source, destination -> FileInfo of the destination
# Named code contexts (forkd.guest.agent.contexts): op run|create|list|remove|restart.
CONTEXT = "context"
ACTIONS = (PING, EXEC, EVAL, RESTORED, SYNC, FSFREEZE, FSTHAW, FILE_STAT, FILE_LIST, FILE_MKDIR,
           FILE_REMOVE, FILE_READ, FILE_WRITE_OPEN, FILE_WRITE, FILE_WRITE_CLOSE, FILE_MOVE, CONTEXT)

# ---------------------------------------------------------------------- limits

# A request line longer than this is refused (and skipped), not buffered for ever.
MAX_REQUEST_LINE = 64 << 20

EXEC_DEFAULT_TIMEOUT_SECS: float = 30  # an int, so that messages say "30s" as they always did
# When the host sends no timeout_secs with an eval, the agent interrupts it after
# this long; equal to the daemon's limit (forkd.bounds.EVAL_TIMEOUT_SECS).
EVAL_DEFAULT_TIMEOUT_SECS = 60.0
# The agent enforces a request's timeout_secs itself and then answers; the host
# waits this much longer before deciding that the guest is wedged.
REPLY_GRACE_SECS = 30.0

EXEC_OUTPUT_CAP = 1 << 20  # bytes kept per stream of an exec, unless max_output_bytes says less/more
EXEC_MAX_OUTPUT_CAP = 16 << 20  # the largest max_output_bytes the agent accepts

# The output is decoded as UTF-8 (bad bytes become U+FFFD) and JSON-escaped with
# ensure_ascii, so one byte of output takes at most 6 bytes on the wire ("\u0000").
JSON_BYTES_PER_OUTPUT_BYTE = 6
REPLY_ENVELOPE_BYTES = 64 << 10  # ids, keys, numbers and the error text around the streams


def max_exec_reply_bytes(cap: int) -> int:
    """The longest reply line an exec with ``max_output_bytes=cap`` can produce."""
    return 2 * cap * JSON_BYTES_PER_OUTPUT_BYTE + REPLY_ENVELOPE_BYTES


# The host's line limit: any reply the agent can send fits in it, or else the
# host's reader would fail and take every call in flight on that VM with it.
READ_LIMIT = max_exec_reply_bytes(EXEC_MAX_OUTPUT_CAP)


# Files: one transfer piece, the longest path, the most entries a listing returns.
FILE_CHUNK = 1 << 20
FILE_PATH_MAX = 4096
FILE_LIST_MAX = 10_000
FILE_NAME_MAX = 255  # bytes of one name, as Linux allows (longer names are bounded anyway)

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


def request(req_id: int, action: str, fields: dict[str, Any]) -> dict[str, Any]:
    """A request object; ``fields`` may not use the envelope's own keys."""
    clash = {"id", "action"} & fields.keys()
    if clash:
        raise ValueError(f"request fields may not be named {sorted(clash)}")
    return {"id": req_id, "action": action, **fields}


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


# -------------------------------------------------------------------- framing


def encode(message: dict[str, Any]) -> bytes:
    """One message as one line: compact JSON and a newline (JSON escapes any newline inside)."""
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def decode(line: bytes) -> Any:
    """Parse one line; raises ValueError (UnicodeDecodeError included) if it is not JSON."""
    return json.loads(line)


def decode_reply(line: bytes) -> dict[str, Any] | None:
    """A reply the host can match to a request, or None for anything else on the line.

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
