"""One process the agent started: its pipes, its output and who watches it, its end.

Its own module so that what happens to one process's bytes (kept, captured,
sent to each watcher within its credit) and how its end is reported is written
once, apart from the table (``processes``) and the thread that moves the bytes
(``process_io``). Everything here runs under the table's lock.
"""

from __future__ import annotations

import base64
import subprocess
import time
from typing import Any

from forkd.guest import protocol
from forkd.guest.agent.channel import Channel
from forkd.guest.agent.ring import STDERR, STDOUT, Capture, Ring, Watch
from forkd.guest.agent.spawn import ProcessSpec, exec_result


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class Process:
    def __init__(self, popen: subprocess.Popen[bytes], spec: ProcessSpec, retain: bool) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.spec = spec
        self.retain = retain  # kept after it ends (proc_start), or forgotten (exec)
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.pipes: dict[str, Any] = {}  # "stdout"/"stderr"/"stdin" -> its pipe, while open
        for name, pipe in ((STDOUT, popen.stdout), (STDERR, popen.stderr), ("stdin", popen.stdin)):
            if pipe is not None:
                self.pipes[name] = pipe
        self.pidfd: int | None = None
        self.ring = Ring(protocol.PROCESS_RING_BYTES)
        self.watches: dict[Any, Watch] = {}
        self.capture: Capture | None = None
        self.stdin_pending = bytearray(spec.stdin or b"")
        self.close_stdin_after = not spec.keep_stdin_open
        self.deadline = time.monotonic() + spec.timeout_secs if spec.timeout_secs else None
        self.timed_out = False
        self.returncode: int | None = None
        self.grace_until: float | None = None
        self.ended = False

    @property
    def stdin_open(self) -> bool:
        return "stdin" in self.pipes and not self.close_stdin_after and not self.ended

    @property
    def reading(self) -> bool:
        """Whether any of its output pipes is still open."""
        return STDOUT in self.pipes or STDERR in self.pipes

    def held_back(self) -> bool:
        """The ring is full of output a lossless watch has not been sent: stop reading."""
        return self.ring.over()

    def info(self) -> dict[str, Any]:
        rc = self.returncode
        return {
            "pid": self.pid,
            "tag": self.spec.tag,
            "args": self.spec.args,
            "env": self.spec.env,
            "cwd": self.spec.cwd,
            "user": self.spec.user.name if self.spec.user is not None else None,
            "running": not self.ended,
            "exit_code": 124 if self.timed_out else rc,
            "signal": -rc if rc is not None and rc < 0 else None,
            "timed_out": self.timed_out,
            "stdin_open": self.stdin_open,
            "pty": None if self.spec.pty is None else {"cols": self.spec.pty[0], "rows": self.spec.pty[1]},
            "started_at": self.started_at,
            "ended_at": self.ended_at,
        }

    def timeout_error(self) -> str | None:
        if not self.timed_out:
            return None
        return f"timed out after {self.spec.timeout_secs}s; process group killed"

    def exit_event(self) -> dict[str, Any]:
        info = self.info()
        return {"type": protocol.EV_EXIT, "pid": self.pid, "exit_code": info["exit_code"],
                "signal": info["signal"], "timed_out": self.timed_out, "error": self.timeout_error()}

    def exec_summary(self, capture: Capture) -> dict[str, Any]:
        """What the ``exec`` action answers with (its output went ahead as events)."""
        result = exec_result(124 if self.timed_out else self.returncode, self.timeout_error(),
                             capture.started)
        result["timed_out"] = self.timed_out
        for name in (STDOUT, STDERR):
            result[f"{name}_bytes"] = capture.total[name]
            result[f"{name}_truncated"] = capture.total[name] > capture.cap
        if self.returncode is not None and self.returncode < 0:
            result["signal"] = -self.returncode
        return result

    # ------------------------------------------------------------- output

    def output(self, name: str, data: bytes, channel: Channel) -> list[Watch]:
        """Bytes read from a pipe: captured, kept, sent on; the watches that got everything."""
        if self.capture is not None:
            piece = self.capture.keep(name, data)
            if piece:
                channel.event(self.capture.req_id, {"type": name, "data": b64(piece)})
        self.ring.append(name, data)
        done = [w for w in list(self.watches.values()) if self.pump(w, channel)]
        self.evict()
        return done

    def pump(self, watch: Watch, channel: Channel) -> bool:
        """Send ``watch`` what it may of the ring, and its end once the process ended and it has
        all; True then (it is removed from ``watches``)."""
        ring = self.ring
        while watch.credit > 0:
            if watch.cursor < ring.start:
                lost = ring.start - watch.cursor
                channel.event(watch.id, {"type": protocol.EV_DROPPED, "bytes": lost})
                watch.cursor = ring.start
                watch.credit -= protocol.event_cost(0)
                continue
            got = ring.read(watch.cursor, min(watch.credit, protocol.OUTPUT_CHUNK))
            if got is None:
                break
            name, piece = got
            channel.event(watch.id, {"type": name, "data": b64(piece)})
            watch.cursor += len(piece)
            watch.credit -= protocol.event_cost(len(piece))
        if self.ended and watch.cursor >= ring.end:
            self.watches.pop(watch.id, None)
            channel.reply(watch.id, self.exit_event())
            return True
        return False

    def evict(self) -> bool:
        """Let the ring shrink past what every lossless watch has been sent; True if that
        ended a hold-back (reading may resume)."""
        was_held = self.held_back()
        lossless = [w.cursor for w in self.watches.values() if w.lossless]
        self.ring.evict(min(lossless) if lossless else self.ring.end)
        return was_held and not self.held_back()
