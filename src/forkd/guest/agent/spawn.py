"""What a process request asks for, and starting the process.

Its own module so that the ``exec`` action (run and wait), ``proc_start`` (a
process to watch) and the other process requests read their fields the same
way, with the same messages, and so that starting a subprocess (``spawn``) and
its failures are written once. The running itself belongs to ``processes``.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import os
import struct
import subprocess
import termios
import time
from dataclasses import dataclass, field
from typing import Any

from forkd.guest.agent.reaper import Reaper
from forkd.guest.agent.users import GuestUser, user_field
from forkd.guest.protocol import (
    EXEC_DEFAULT_TIMEOUT_SECS,
    EXEC_MAX_OUTPUT_CAP,
    EXEC_OUTPUT_CAP,
    INVALID,
    PTY_MAX_SIZE,
    TAG_MAX,
    RequestError,
    request_timeout,
)


@dataclass
class ProcessSpec:
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to the agent's own environment
    cwd: str | None = None
    stdin: bytes | None = None  # written first; None: nothing
    keep_stdin_open: bool = False  # else stdin is closed after ``stdin`` (or is /dev/null)
    timeout_secs: float | None = None
    tag: str | None = None
    user: GuestUser | None = None  # None: the agent's own user (root) and environment
    pty: tuple[int, int] | None = None  # (cols, rows): on a pseudo-terminal of that size


def parse_common(req: dict[str, Any]) -> ProcessSpec:
    args = req.get("args")
    if not isinstance(args, list) or not args or not all(isinstance(a, str) for a in args):
        raise RequestError("exec needs 'args': a non-empty list of strings", INVALID)
    extra_env = req.get("env") or {}
    if not isinstance(extra_env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in extra_env.items()
    ):
        raise RequestError("'env' must map strings to strings", INVALID)
    cwd = req.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise RequestError("'cwd' must be a string", INVALID)
    user = user_field(req)
    if user is not None and cwd is None:
        cwd = user.workdir()  # as a login would; without a user, the agent's own cwd
    return ProcessSpec(args=args, env=extra_env, cwd=cwd, user=user)


def parse_exec(req: dict[str, Any]) -> tuple[ProcessSpec, int]:
    """An ``exec`` request: its spec (a timeout always) and its output cap per stream."""
    spec = parse_common(req)
    spec.timeout_secs = request_timeout(req, EXEC_DEFAULT_TIMEOUT_SECS)
    cap = req.get("max_output_bytes", EXEC_OUTPUT_CAP)
    if isinstance(cap, bool) or not isinstance(cap, int) or not 0 <= cap <= EXEC_MAX_OUTPUT_CAP:
        raise RequestError(f"'max_output_bytes' must be an integer in 0..{EXEC_MAX_OUTPUT_CAP}", INVALID)
    stdin = req.get("stdin")
    if stdin is not None and not isinstance(stdin, str):
        raise RequestError("'stdin' must be a string", INVALID)
    spec.stdin = stdin.encode() if stdin is not None else None
    return spec, cap


def parse_start(req: dict[str, Any]) -> ProcessSpec:
    """A ``proc_start`` request: no timeout unless asked, input as base64, a tag."""
    spec = parse_common(req)
    if req.get("timeout_secs") is not None:
        spec.timeout_secs = request_timeout(req, EXEC_DEFAULT_TIMEOUT_SECS)
    data = req.get("input")
    if data is not None:
        spec.stdin = decode_b64(data, "input")
    keep_open = req.get("stdin", False)
    if not isinstance(keep_open, bool):
        raise RequestError("'stdin' must be a boolean (keep the process's stdin open)", INVALID)
    spec.keep_stdin_open = keep_open
    tag = req.get("tag")
    if tag is not None and (not isinstance(tag, str) or len(tag) > TAG_MAX):
        raise RequestError(f"'tag' must be a string of at most {TAG_MAX} characters", INVALID)
    spec.tag = tag
    if req.get("pty") is not None:
        spec.pty = parse_size(req.get("pty"))
        spec.keep_stdin_open = True  # a terminal's input is its keyboard: open while it runs
    return spec


def parse_size(raw: object) -> tuple[int, int]:
    """A terminal size ``{"cols", "rows"}``, each 1..PTY_MAX_SIZE, as (cols, rows)."""
    if not isinstance(raw, dict):
        raise RequestError("'pty' must be {\"cols\": n, \"rows\": n}", INVALID)
    size = []
    for name in ("cols", "rows"):
        value = raw.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= PTY_MAX_SIZE:
            raise RequestError(f"the terminal's {name!r} must be an integer in 1..{PTY_MAX_SIZE}", INVALID)
        size.append(value)
    return size[0], size[1]


def set_size(fd: int, cols: int, rows: int) -> None:
    """A terminal's size, on either side of it (the kernel sends its foreground group SIGWINCH)."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _take_terminal() -> None:
    """In the child, after its new session began: stdin (the pty) becomes its controlling
    terminal, so that the shell has job control and Ctrl-C reaches its foreground job."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def int_field(req: dict[str, Any], name: str) -> int:
    value = req.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{name!r} must be an integer", INVALID)
    return value


def bool_field(req: dict[str, Any], name: str, default: bool) -> bool:
    value = req.get(name, default)
    if not isinstance(value, bool):
        raise RequestError(f"{name!r} must be a boolean", INVALID)
    return value


def decode_b64(data: object, name: str) -> bytes:
    if not isinstance(data, str):
        raise RequestError(f"{name!r} must be base64 text", INVALID)
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(f"{name!r} is not valid base64", INVALID) from None


class SpawnError(Exception):
    """The process could not start: what to tell the user, and the shell's exit status for it."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def spawn(spec: ProcessSpec, reaper: Reaper) -> subprocess.Popen[bytes]:
    """Start ``spec`` in a session (process group) of its own, its pipes non-blocking.

    The pid is registered with the reaper in the same step, so that the reaper
    never waits for it in Popen's place.
    """
    env = dict(os.environ)
    user = spec.user
    if user is not None:
        env.update(user.env())
    env.update(spec.env)
    # As the user: the child takes its groups and ids after fork, before exec (root: nothing to drop).
    ids: dict[str, Any] = {} if user is None or user.uid == 0 else {
        "user": user.uid, "group": user.gid, "extra_groups": list(user.groups)}
    piped_stdin = spec.stdin is not None or spec.keep_stdin_open
    if spec.pty is not None:
        return _spawn_on_pty(spec, spec.pty, reaper, env, ids)
    try:
        with reaper.lock:
            proc = subprocess.Popen(
                spec.args,
                stdin=subprocess.PIPE if piped_stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=spec.cwd,
                start_new_session=True,  # its own process group: a kill reaches all of it
                **ids,
            )
            reaper.owned.add(proc.pid)
    except FileNotFoundError as exc:
        missing = spec.cwd if spec.cwd and exc.filename == spec.cwd else spec.args[0]
        what = "working directory" if missing == spec.cwd else "executable"
        raise SpawnError(f"{what} not found: {missing}", 127) from None
    except PermissionError as exc:
        raise SpawnError(f"permission denied: {exc.filename or spec.args[0]}", 126) from None
    except OSError as exc:
        raise SpawnError(f"cannot start {spec.args[0]}: {exc.strerror or exc}", 126) from None
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            os.set_blocking(pipe.fileno(), False)
    return proc


def _spawn_on_pty(spec: ProcessSpec, size: tuple[int, int], reaper: Reaper, env: dict[str, str],
                  ids: dict[str, Any]) -> subprocess.Popen[bytes]:
    """``spawn`` on a new pseudo-terminal: the child's stdin, stdout and stderr are its slave
    side. The returned Popen's ``stdout`` reads the master side and its ``stdin`` writes it (two
    descriptors of the one master, so that the I/O thread waits on each for its own direction)."""
    master, slave = os.openpty()
    try:
        set_size(master, *size)
        os.set_inheritable(slave, False)  # Popen dups it onto 0, 1 and 2; none other is needed
        with reaper.lock:
            proc = subprocess.Popen(
                spec.args, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=spec.cwd,
                start_new_session=True, preexec_fn=_take_terminal, **ids,
            )
            reaper.owned.add(proc.pid)
    except FileNotFoundError as exc:
        os.close(master)
        missing = spec.cwd if spec.cwd and exc.filename == spec.cwd else spec.args[0]
        what = "working directory" if missing == spec.cwd else "executable"
        raise SpawnError(f"{what} not found: {missing}", 127) from None
    except PermissionError as exc:
        os.close(master)
        raise SpawnError(f"permission denied: {exc.filename or spec.args[0]}", 126) from None
    except (OSError, subprocess.SubprocessError) as exc:
        os.close(master)
        raise SpawnError(f"cannot start {spec.args[0]} on a terminal: {exc}", 126) from None
    finally:
        os.close(slave)  # the child's copies only: the master then reads EIO once they are closed
    writer = os.dup(master)
    for fd in (master, writer):
        os.set_blocking(fd, False)
    proc.stdout = open(master, "rb", buffering=0)  # noqa: SIM115 (the process table closes it)
    proc.stdin = open(writer, "wb", buffering=0)  # noqa: SIM115
    return proc


def exec_result(exit_code: int | None, error: str | None, started: float) -> dict[str, Any]:
    """The summary an ``exec`` answers with; its output went ahead as events."""
    return {
        "exit_code": exit_code,
        "error": error,
        "timed_out": False,
        "duration_ms": round((time.monotonic() - started) * 1000, 3),
    }
