"""The ``exec`` action: run a subprocess in the guest and capture its output.

Its own job because a subprocess must never block the agent: stdin is fed and
each pipe is drained from its own thread, output is capped per stream, a
timeout kills the whole process group, and a background process that keeps the
pipes open does not hold up the answer.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from typing import IO, Any

from forkd.guest.agent.reaper import Reaper
from forkd.guest.protocol import (
    EXEC_DEFAULT_TIMEOUT_SECS,
    EXEC_MAX_OUTPUT_CAP,
    EXEC_OUTPUT_CAP,
    RequestError,
    request_timeout,
)

# Once an exec's process has exited (or its group was killed), how long to keep
# reading its pipes: a background process it left behind (``server &``) may hold
# them open for ever, and must not hold up the answer.
OUTPUT_GRACE_SECS = 1.0
READ_CHUNK = 65536


class Capture:
    """What has been read from one pipe so far.

    Published as it is read (not only at EOF) so that the answer can be sent
    with the output seen so far while a background process still holds the pipe.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.kept = bytearray()
        self.total = 0

    def snapshot(self) -> tuple[bytes, int]:
        with self.lock:
            return bytes(self.kept), self.total


def drain(stream: IO[bytes], cap: int, out: Capture) -> None:
    """Keep the first ``cap`` bytes of a pipe, count the rest, never block the child."""
    try:
        while True:
            try:
                read1 = getattr(stream, "read1", None)
                chunk = read1(READ_CHUNK) if read1 is not None else stream.read(READ_CHUNK)
            except (OSError, ValueError):  # closed under us
                break
            if not chunk:
                break
            with out.lock:
                out.total += len(chunk)
                room = cap - len(out.kept)
                if room > 0:
                    out.kept += chunk[:room]
    finally:
        with contextlib.suppress(OSError):
            stream.close()


def feed(stream: IO[bytes], data: bytes) -> None:
    """Write stdin from its own thread: a child that never reads it must not
    block the agent before the timeout is even armed."""
    with contextlib.suppress(OSError, ValueError):  # BrokenPipeError is an OSError
        stream.write(data)
    with contextlib.suppress(OSError, ValueError):
        stream.close()


def run_exec(req: dict[str, Any], reaper: Reaper) -> dict[str, Any]:
    args = req.get("args")
    if not isinstance(args, list) or not args or not all(isinstance(a, str) for a in args):
        raise RequestError("exec needs 'args': a non-empty list of strings")
    timeout = request_timeout(req, EXEC_DEFAULT_TIMEOUT_SECS)
    cap = req.get("max_output_bytes", EXEC_OUTPUT_CAP)
    if not isinstance(cap, int) or not 0 <= cap <= EXEC_MAX_OUTPUT_CAP:
        raise RequestError(f"'max_output_bytes' must be an integer in 0..{EXEC_MAX_OUTPUT_CAP}")
    env = dict(os.environ)
    extra_env = req.get("env") or {}
    if not isinstance(extra_env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in extra_env.items()
    ):
        raise RequestError("'env' must map strings to strings")
    env.update(extra_env)
    cwd = req.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise RequestError("'cwd' must be a string")
    stdin_data = req.get("stdin")
    if stdin_data is not None and not isinstance(stdin_data, str):
        raise RequestError("'stdin' must be a string")

    started = time.monotonic()
    try:
        with reaper.lock:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=cwd,
                start_new_session=True,  # its own process group: a timeout kills all of it
            )
            reaper.owned.add(proc.pid)
    except FileNotFoundError as exc:
        missing = cwd if cwd and exc.filename == cwd else args[0]
        what = "working directory" if missing == cwd else "executable"
        message = f"{what} not found: {missing}"
        return exec_result("", f"{message}\n", 127, message, started)
    except PermissionError as exc:
        message = f"permission denied: {exc.filename or args[0]}"
        return exec_result("", f"{message}\n", 126, message, started)
    except OSError as exc:
        message = f"cannot start {args[0]}: {exc.strerror or exc}"
        return exec_result("", f"{message}\n", 126, message, started)

    assert proc.stdout is not None and proc.stderr is not None
    out = Capture()
    err = Capture()
    readers = [
        threading.Thread(target=drain, args=(proc.stdout, cap, out), daemon=True),
        threading.Thread(target=drain, args=(proc.stderr, cap, err), daemon=True),
    ]
    for t in readers:
        t.start()
    if stdin_data is not None:
        threading.Thread(target=feed, args=(proc.stdin, stdin_data.encode()), daemon=True).start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        with reaper.lock:
            reaper.owned.discard(proc.pid)
    # On a timeout the group was killed, so the pipes reach EOF at once. On a
    # normal exit a background process may still hold them (``daemon &``):
    # wait a bounded grace period in total (not per pipe), then answer with
    # what was read so far; the readers keep draining so it never blocks.
    deadline = time.monotonic() + OUTPUT_GRACE_SECS
    for t in readers:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    if timed_out:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    error = None
    exit_code = proc.returncode
    if timed_out:
        error = f"timed out after {timeout}s; process group killed"
        exit_code = 124
    out_data, out_total = out.snapshot()
    err_data, err_total = err.snapshot()
    result = exec_result(
        out_data.decode("utf-8", "replace"),
        err_data.decode("utf-8", "replace"),
        exit_code,
        error,
        started,
    )
    result["timed_out"] = timed_out
    for name, total in (("stdout", out_total), ("stderr", err_total)):
        result[f"{name}_bytes"] = total
        result[f"{name}_truncated"] = total > cap
    if proc.returncode is not None and proc.returncode < 0:
        result["signal"] = -proc.returncode
    return result


def exec_result(
    stdout: str, stderr: str, exit_code: int, error: str | None, started: float
) -> dict[str, Any]:
    return {
        "stdout": stdout,
        "stderr": stderr,
        "exit_code": exit_code,
        "error": error,
        "timed_out": False,
        "duration_ms": round((time.monotonic() - started) * 1000, 3),
    }
