"""`SandboxProcesses`: processes in a sandbox, started, watched, fed and signalled through its agent.

Processes are addressed by their pid in the guest. A process's output reaches
the host as ``ProcessEvent``s carrying raw bytes (how to show them is the
caller's business: the REST API sends text or base64). Every stream is
flow-controlled end to end: the agent sends a window ahead, this side holds at
most that, and a caller that stops reading (a slow HTTP client) stops the flow
rather than grow the daemon's memory. Open streams per sandbox are bounded too.

The guest is not trusted: what it says about a process is checked for shape
before anyone sees it.
"""

from __future__ import annotations

import base64
import signal as signals
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from forkd import bounds
from forkd.controller.agent_gateway import AgentGateway
from forkd.controller.guest_streams import GuestEvents, StreamSlots
from forkd.controller.results import ProcessEntry, SignalResult, StdinResult
from forkd.controller.sandbox_events import SandboxEvents
from forkd.errors import GuestError, InvalidRequest
from forkd.guest import capabilities, process_messages, protocol
from forkd.guest.client import AgentClient, AgentStream
from forkd.guest.process_messages import ProcStartRequest

# Process streams a sandbox may have open at once (each holds up to a window).
MAX_STREAMS_PER_SANDBOX = 32
CALL_TIMEOUT_SECS = 30.0
# A kill answers once the process has ended (it leaves the list), or after this long.
KILL_WAIT_MS = 5000

EventType = Literal["start", "stdout", "stderr", "dropped", "exit"]


@dataclass(frozen=True)
class ProcessEvent:
    """One event of a process stream.

    ``start`` (``pid``), then ``stdout``/``stderr`` (``data``: raw bytes, as the
    process wrote them, in order), possibly ``dropped`` (``dropped``: bytes lost
    from the guest's ring before this stream read them; only on a late attach),
    and last ``exit`` (``exit_code``: the status, negative for a signal, 124 after
    a timeout; ``signal``; ``timed_out``; ``error``).
    """

    type: EventType
    pid: int
    data: bytes = b""
    dropped: int = 0
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    error: str | None = None


def _opt(value: Any, kind: type | tuple[type, ...]) -> Any:
    """``value`` if it is None or of ``kind`` (a bool is not a number here); else the guest lied."""
    if value is None:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise GuestError("guest agent sent a malformed process record")
    return value


def process_info(info: process_messages.ProcessInfo) -> ProcessEntry:
    """A ProcessInfo from the guest (checked against its type as it came), with only its
    documented keys (those an older agent leaves out: their defaults)."""
    pty = info.get("pty")
    return {
        "pid": info["pid"],
        "tag": info.get("tag"),
        "args": info["args"],
        "env": info.get("env") or {},
        "cwd": info.get("cwd"),
        "user": info.get("user"),
        "running": info.get("running") is True,
        "exit_code": info.get("exit_code"),
        "signal": info.get("signal"),
        "timed_out": info.get("timed_out") is True,
        "stdin_open": info.get("stdin_open") is True,
        "pty": None if pty is None else {"cols": pty["cols"], "rows": pty["rows"]},
        "started_at": info.get("started_at"),
        "ended_at": info.get("ended_at"),
    }


def check_pty_size(cols: int, rows: int) -> tuple[int, int]:
    """A terminal size (columns, rows), each 1..PTY_MAX_SIZE; 400 otherwise."""
    for name, value in (("cols", cols), ("rows", rows)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= protocol.PTY_MAX_SIZE:
            raise InvalidRequest(f"a terminal's {name} must be an integer from 1 to {protocol.PTY_MAX_SIZE}")
    return cols, rows


def signal_number(sig: int | str) -> int:
    """``9``, ``"SIGKILL"`` or ``"KILL"`` -> 9; 400 for anything else."""
    if isinstance(sig, bool):
        raise InvalidRequest(f"signal must be a signal name or number, not {sig!r}")
    if isinstance(sig, int):
        if sig in {int(s) for s in signals.valid_signals()} and sig > 0:
            return sig
        raise InvalidRequest(f"no signal number {sig}")
    name = sig.upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    member = getattr(signals.Signals, name, None) if name.isidentifier() else None
    if not isinstance(member, signals.Signals):
        raise InvalidRequest(f"unknown signal {sig!r} (e.g. SIGTERM, SIGKILL, SIGINT, or a number)")
    return int(member)


class ProcessEvents(GuestEvents[ProcessEvent]):
    """A process stream: ``async for event in events``; ``aclose()`` stops watching.

    With ``kill_on_close`` (a foreground run), closing before the exit kills the
    process's group: a client that goes away leaves nothing running.
    """

    def __init__(self, owner: SandboxProcesses, slots: StreamSlots, sandbox_id: str, stream: AgentStream,
                 kill_on_close: bool) -> None:
        super().__init__(slots, sandbox_id, stream)
        self._owner = owner
        self._kill_on_close = kill_on_close
        self.pid: int | None = None

    def _is_last(self, event: ProcessEvent) -> bool:
        return event.type == "exit"

    def _on_close(self) -> None:
        if self._kill_on_close and self.pid is not None:
            self._owner.kill_now(self._sandbox_id, self.pid)

    def _event(self, raw: dict[str, Any]) -> ProcessEvent:
        kind = raw.get("type")
        pid = raw.get("pid", self.pid)
        if isinstance(pid, bool) or not isinstance(pid, int):
            raise GuestError("guest agent sent a process event without a pid")
        if kind == protocol.EV_START:
            self.pid = pid
            return ProcessEvent("start", pid)
        if self.pid is None:
            raise GuestError("guest agent sent process output before its start")
        if kind in (protocol.EV_STDOUT, protocol.EV_STDERR):
            data = raw.get("data")
            assert isinstance(data, bytes)  # decoded and checked by the client
            return ProcessEvent(kind, self.pid, data=data)
        if kind == protocol.EV_DROPPED:
            return ProcessEvent("dropped", self.pid, dropped=max(0, _opt(raw.get("bytes"), int) or 0))
        if kind == protocol.EV_EXIT:
            error = _opt(raw.get("error"), str)
            return ProcessEvent("exit", self.pid, exit_code=_opt(raw.get("exit_code"), int),
                                signal=_opt(raw.get("signal"), int), timed_out=bool(raw.get("timed_out")),
                                error=error[:2000] if error else None)
        raise GuestError(f"guest agent sent an unknown process event {str(kind)[:40]!r}")


class SandboxProcesses:
    def __init__(self, agents: AgentGateway, events: SandboxEvents) -> None:
        self._agents = agents
        self._events = events  # told of every process started (a turn of work)
        self._slots = StreamSlots(agents, MAX_STREAMS_PER_SANDBOX, "process streams open",
                                  "close one (or let it end) and retry")

    async def _open_stream(self, sandbox_id: str, kill_on_close: bool,
                           open_: Callable[[AgentClient], Awaitable[AgentStream]]) -> ProcessEvents:
        sandbox_id = self._agents.resolve(sandbox_id)
        stream = await self._slots.open(sandbox_id, lambda: self._agents.stream(sandbox_id, open_))
        return ProcessEvents(self, self._slots, sandbox_id, stream, kill_on_close)

    @staticmethod
    def _start_args(args: list[str], env: dict[str, str] | None, cwd: str | None, stdin: bytes | None,
                    stdin_open: bool, tag: str | None, timeout_secs: float | None,
                    user: str | None, pty: tuple[int, int] | None = None) -> ProcStartRequest:
        if not args or not all(isinstance(a, str) for a in args):
            raise InvalidRequest("args must be a non-empty list of strings")
        if any("\0" in a for a in args):
            raise InvalidRequest("args must not contain NUL characters")
        if timeout_secs is not None:
            bounds.EXEC_TIMEOUT_SECS.check(timeout_secs)
        if tag is not None and len(tag) > protocol.TAG_MAX:
            raise InvalidRequest(f"tag must be at most {protocol.TAG_MAX} characters")
        req: ProcStartRequest = {"args": args, "stdin": stdin_open}
        if env is not None:
            req["env"] = env
        if cwd is not None:
            req["cwd"] = cwd
        if tag is not None:
            req["tag"] = tag
        if timeout_secs is not None:
            req["timeout_secs"] = timeout_secs
        if (as_user := bounds.check_guest_user(user)) is not None:
            req["user"] = as_user
        if stdin is not None:
            req["input"] = base64.b64encode(stdin).decode("ascii")
        if pty is not None:
            cols, rows = check_pty_size(*pty)
            req["pty"] = {"cols": cols, "rows": rows}
        return req

    async def _require(self, sandbox_id: str, user: str | None, pty: tuple[int, int] | None) -> None:
        """409 on an agent too old for the request's user or terminal (it would ignore them)."""
        await self._agents.require_user_support(sandbox_id, user)
        if pty is not None:
            await self._agents.require_agent(sandbox_id, capabilities.CAP_PTY)

    # ------------------------------------------------------------- requests

    async def run(self, sandbox_id: str, args: list[str], *, env: dict[str, str] | None = None,
                  cwd: str | None = None, stdin: bytes | None = None, stdin_open: bool = False,
                  tag: str | None = None, timeout_secs: float | None = None,
                  kill_on_close: bool = True, user: str | None = None,
                  pty: tuple[int, int] | None = None) -> ProcessEvents:
        """Start a process and stream it from its first byte, losslessly (see ``ProcessEvents``).
        With ``pty`` (cols, rows) it runs on a terminal of that size: its output is ``stdout``, its
        stdin stays open (the keyboard), and ``resize`` changes the size."""
        req = self._start_args(args, env, cwd, stdin, stdin_open, tag, timeout_secs, user, pty)
        await self._require(sandbox_id, user, pty)
        events = await self._open_stream(sandbox_id, kill_on_close,
                                         lambda agent: agent.proc_start_stream(req))
        await self._events.turn_done(sandbox_id)
        return events

    async def start(self, sandbox_id: str, args: list[str], *, env: dict[str, str] | None = None,
                    cwd: str | None = None, stdin: bytes | None = None, stdin_open: bool = False,
                    tag: str | None = None, timeout_secs: float | None = None,
                    user: str | None = None) -> ProcessEntry:
        """Start a background process (as ``user``: None is root); its ProcessInfo."""
        req = self._start_args(args, env, cwd, stdin, stdin_open, tag, timeout_secs, user)
        await self._agents.require_user_support(sandbox_id, user)
        info = process_info(await self._agents.call(sandbox_id, lambda agent: agent.proc_start(
            req, CALL_TIMEOUT_SECS)))
        await self._events.turn_done(sandbox_id)
        return info

    async def attach(self, sandbox_id: str, pid: int, *, from_start: bool = True) -> ProcessEvents:
        """Stream a process: from the oldest output its ring still holds (``from_start``) or from now.

        This stream never holds the process back: if it reads slower than the
        process writes, what the ring lost is reported as a ``dropped`` event."""
        await self.get(sandbox_id, pid)  # 404 before any response has started
        return await self._open_stream(sandbox_id, False, lambda agent: agent.proc_attach(
            {"pid": pid, "from_start": from_start}))

    async def resize(self, sandbox_id: str, pid: int, cols: int, rows: int) -> None:
        """Set the size of a process's terminal (409 for a process without one, 404 once ended)."""
        cols, rows = check_pty_size(cols, rows)
        await self._agents.require_agent(sandbox_id, capabilities.CAP_PTY)
        await self._agents.call(sandbox_id, lambda agent: agent.proc_resize(
            {"pid": pid, "cols": cols, "rows": rows}, CALL_TIMEOUT_SECS))

    async def list(self, sandbox_id: str) -> list[ProcessEntry]:
        result = await self._agents.call(sandbox_id, lambda agent: agent.proc_list(CALL_TIMEOUT_SECS))
        if len(result["processes"]) > protocol.MAX_PROCESSES:
            raise GuestError("guest agent sent an overlong process list")
        return [process_info(p) for p in result["processes"]]

    async def get(self, sandbox_id: str, pid: int) -> ProcessEntry:
        return process_info(await self._agents.call(sandbox_id, lambda agent: agent.proc_info(
            {"pid": pid}, CALL_TIMEOUT_SECS)))

    async def write_stdin(self, sandbox_id: str, pid: int, data: bytes, *,
                          eof: bool = False) -> StdinResult:
        """Queue ``data`` for the process's stdin (409 if its stdin is closed or its buffer full)."""
        result = await self._agents.call(sandbox_id, lambda agent: agent.proc_input(
            {"pid": pid, "data": base64.b64encode(data).decode("ascii"), "eof": eof}, CALL_TIMEOUT_SECS))
        return {"pid": pid, "written": result["written"], "stdin_open": not eof}

    async def signal(self, sandbox_id: str, pid: int, sig: int | str, *,
                     group: bool = True) -> SignalResult:
        """Send ``sig`` to the process (its whole process group unless ``group`` is False)."""
        number = signal_number(sig)
        await self._agents.call(sandbox_id, lambda agent: agent.proc_signal(
            {"pid": pid, "signal": number, "group": group}, CALL_TIMEOUT_SECS))
        return {"pid": pid, "signal": number, "signalled": True}

    async def kill(self, sandbox_id: str, pid: int) -> None:
        """SIGKILL the process's group and wait (a few seconds at most) until it has ended, so
        that it has left the process list (404 if it was not running)."""
        await self._agents.call(sandbox_id, lambda agent: agent.proc_signal(
            {"pid": pid, "signal": int(signals.SIGKILL), "group": True, "wait_ms": KILL_WAIT_MS},
            CALL_TIMEOUT_SECS))

    def kill_now(self, sandbox_id: str, pid: int) -> None:
        """SIGKILL a process's group without waiting (a foreground run whose client left)."""
        self._agents.notify(sandbox_id, lambda agent: agent.proc_signal_now(
            {"pid": pid, "signal": int(signals.SIGKILL), "group": True}))
