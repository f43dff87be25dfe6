"""envd's Connect-RPC process service (E2B's ``commands``), on forkd's processes.

The messages and the ASGI application are the pinned ``e2b`` package's own
(``e2b.envd.process``); this module only implements the service, on the
Runtime's processes (``controller.processes``: addressed by their pid in the
guest, output as raw bytes, flow-controlled streams):

* ``Start`` starts ``cmd args`` (the SDK sends ``/bin/bash -l -c <command>``)
  as the call's guest user (``user`` unless the SDK names one, as ``root``;
  ``filesystem.call_user``), with that user's HOME/USER/LOGNAME and ``envs`` over
  the sandbox's environment, in ``cwd`` (default: the user's home; relative: under it),
  and streams ``start`` (the pid), the output as ``data`` (``stdout`` /
  ``stderr`` bytes, as written) and ``end`` (``exitCode``: negative for a
  signal; ``status``), with a ``keepalive`` after every ``KEEPALIVE_SECS`` of
  silence. As in E2B, a client that goes away only stops watching: the
  process runs on (``background=True`` reads just the start) until it ends or
  ``commands.kill``.
* ``Connect`` streams a running process from now on; ``List`` the running ones;
  ``SendInput``, ``StreamInput`` and ``CloseStdin`` feed its stdin;
  ``SendSignal`` sends SIGTERM, or SIGKILL and answers once it has ended. A pid
  that is not running is ``not_found`` (the SDK's ``kill`` then says False).
* ``Start`` with a ``pty`` runs the process on a pseudo-terminal of that size
  (``controller.processes``): its output (the terminal's, input echoed) streams as
  ``pty`` data, here and on a later ``Connect``; pty input (or stdin) is typed into
  it; ``Update`` with a ``pty`` size resizes it (the process gets SIGWINCH).
* ``Connect-Timeout-Ms`` (the SDK's ``timeout``) bounds a stream as in envd: at the
  deadline the stream ends with ``deadline_exceeded``, and a ``Start``'s process
  is killed (envd runs it under a context with that timeout); a ``Connect``'s
  process runs on.
* A stream whose sandbox goes away (killed, expired) ends with ``unavailable``
  and a message that does not say "was not found": the SDK then probes the
  sandbox's health and, finding it gone, raises ``SandboxNotRunningException``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.envd.process import process_connect, process_pb
from protobuf import Oneof

from forkd.api.e2b.connect_bounds import checked_codecs
from forkd.api.e2b.errors import as_connect, connect_errors
from forkd.api.e2b.filesystem import guest_path, sandbox_of, user_of
from forkd.bounds import check_guest_text
from forkd.controller.results import ProcessEntry
from forkd.errors import ForkdError, GuestError, InvalidRequest

if TYPE_CHECKING:
    from forkd.controller.runtime import ProcessEvent, ProcessEvents, Runtime

# E2B's SDK asks envd for a keep-alive this often (its Keepalive-Ping-Interval header).
KEEPALIVE_SECS = 50.0


def event(ev: ProcessEvent, pty: bool = False) -> process_pb.ProcessEvent | None:
    """forkd's process event as envd's; None for one E2B has no word for (``dropped``). A process
    on a terminal (``pty``) has one output, the terminal's, which forkd streams as stdout."""
    pb = process_pb.ProcessEvent
    if ev.type == "start":
        start: Oneof[Literal["start"], process_pb.ProcessEvent.StartEvent] = Oneof(
            "start", pb.StartEvent(pid=ev.pid))
        return pb(event=start)
    if ev.type in ("stdout", "stderr"):
        if pty:
            terminal: Oneof[Literal["pty"], bytes] = Oneof("pty", ev.data)
            on_pty: Oneof[Literal["data"], process_pb.ProcessEvent.DataEvent] = Oneof(
                "data", pb.DataEvent(output=terminal))
            return pb(event=on_pty)
        stdout: Oneof[Literal["stdout"], bytes] = Oneof("stdout", ev.data)
        stderr: Oneof[Literal["stderr"], bytes] = Oneof("stderr", ev.data)
        data: Oneof[Literal["data"], process_pb.ProcessEvent.DataEvent] = Oneof(
            "data", pb.DataEvent(output=stdout if ev.type == "stdout" else stderr))
        return pb(event=data)
    if ev.type == "exit":
        code = ev.exit_code if ev.exit_code is not None else -1
        status = f"signal: {ev.signal}" if ev.signal else f"exit status {code}"
        end: Oneof[Literal["end"], process_pb.ProcessEvent.EndEvent] = Oneof("end", pb.EndEvent(
            exit_code=code, exited=not ev.signal, status=status, error=ev.error))
        return pb(event=end)
    return None


_KEEPALIVE: Oneof[Literal["keepalive"], process_pb.ProcessEvent.KeepAlive] = Oneof(
    "keepalive", process_pb.ProcessEvent.KeepAlive())
KEEPALIVE = process_pb.ProcessEvent(event=_KEEPALIVE)


class DeadlineExceeded(Exception):
    """The stream's ``Connect-Timeout-Ms`` ran out."""


def deadline_of(ctx: RequestContext[Any, Any]) -> float | None:
    """The loop time at which the call's ``Connect-Timeout-Ms`` runs out (None: no timeout)."""
    left_ms = ctx.timeout_ms
    return None if left_ms is None else asyncio.get_running_loop().time() + left_ms / 1000.0


async def events_with_keepalive(events: ProcessEvents, deadline: float | None = None, pty: bool = False,
                                ) -> AsyncIterator[process_pb.ProcessEvent]:
    """The stream's events as envd's, a keepalive in every long silence; it stops watching at the end.
    At ``deadline`` (loop time) it raises ``DeadlineExceeded``; a stream that ends without the
    process's exit (the sandbox went away) raises ``ForkdError`` like a failed read."""
    loop = asyncio.get_running_loop()
    nxt: asyncio.Future[ProcessEvent] | None = None
    try:
        while True:
            nxt = asyncio.ensure_future(events.__anext__())
            while True:
                wait = KEEPALIVE_SECS if deadline is None else min(KEEPALIVE_SECS, deadline - loop.time())
                if wait <= 0:
                    raise DeadlineExceeded
                if (await asyncio.wait({nxt}, timeout=wait))[0]:
                    break
                if deadline is None or loop.time() < deadline:
                    yield KEEPALIVE
            try:
                ev = nxt.result()
            except StopAsyncIteration:
                raise GuestError("the process stream ended before the process did") from None
            out = event(ev, pty)
            if out is not None:
                yield out
            if ev.type == "exit":
                return
    finally:
        if nxt is not None and not nxt.done():
            nxt.cancel()
            with contextlib.suppress(BaseException):
                await nxt
        await events.aclose()


def _gone(sandbox_id: str, exc: ForkdError) -> ConnectError:
    """A stream cut by its sandbox's end: ``unavailable``, worded so that the SDK probes the sandbox
    (not "was not found", which it would take for the proxy's own answer)."""
    return ConnectError(Code.UNAVAILABLE, f"the connection to sandbox {sandbox_id} ended before the "
                        f"stream completed ({exc})")


async def relay(events: ProcessEvents, sandbox_id: str, deadline: float | None,
                on_deadline: Callable[[int], Awaitable[None]] | None, pty: bool = False,
                ) -> AsyncIterator[process_pb.ProcessEvent]:
    """``events_with_keepalive`` with its endings as Connect errors: ``deadline_exceeded`` at the
    deadline (``on_deadline(pid)`` first: a ``Start`` kills its process) and ``unavailable`` when
    the sandbox goes away mid-stream."""
    try:
        async for ev in events_with_keepalive(events, deadline, pty):
            yield ev
    except DeadlineExceeded:
        if on_deadline is not None and events.pid is not None:
            with contextlib.suppress(ForkdError):
                await on_deadline(events.pid)
        raise ConnectError(Code.DEADLINE_EXCEEDED, "the command's timeout (Connect-Timeout-Ms) ran out"
                           + (" and it was killed" if on_deadline is not None else "")) from None
    except ForkdError as exc:
        if exc.status in (400, 409, 413, 429):
            raise as_connect(exc) from None
        raise _gone(sandbox_id, exc) from None


class ProcessService(process_connect.Process):
    def __init__(self, runtime: Callable[[], Runtime]) -> None:
        self._runtime = runtime

    async def _pid(self, sandbox: str, selector: process_pb.ProcessSelector | None) -> int:
        chosen = selector.selector if selector is not None else None
        if chosen is None:
            raise ConnectError(Code.INVALID_ARGUMENT, "a process selector (pid or tag) is required")
        if chosen.field == "pid":
            return int(chosen.value)
        with connect_errors():
            running = await self._runtime().processes.list(sandbox)
        for info in running:
            if info["tag"] == chosen.value:
                return int(info["pid"])
        raise ConnectError(Code.NOT_FOUND, f"no running process tagged {chosen.value!r}")

    def start(self, request: process_pb.StartRequest,
              ctx: RequestContext[process_pb.StartRequest, process_pb.StartResponse], /,
              ) -> AsyncIterator[process_pb.StartResponse]:
        return self._start(request, ctx)

    async def _start(self, request: process_pb.StartRequest,
                     ctx: RequestContext[process_pb.StartRequest, process_pb.StartResponse],
                     ) -> AsyncIterator[process_pb.StartResponse]:
        pty = _size(request.pty) if request.has_field("pty") else None
        config = request.process or process_pb.ProcessConfig()
        if not config.cmd:
            raise ConnectError(Code.INVALID_ARGUMENT, "process.cmd is required")
        sandbox, deadline = sandbox_of(ctx), deadline_of(ctx)
        with connect_errors():
            argv, env, cwd = _command(config)
            events = await self._runtime().processes.run(
                sandbox, argv, env=env or None, cwd=cwd,
                user=user_of(ctx),
                stdin_open=pty is not None or (request.stdin if request.has_field("stdin") else False),
                tag=request.tag if request.has_field("tag") else None, kill_on_close=False, pty=pty)

        async def kill(pid: int) -> None:
            await self._runtime().processes.kill(sandbox, pid)

        async for ev in relay(events, sandbox, deadline, kill, pty is not None):
            yield process_pb.StartResponse(event=ev)

    def connect(self, request: process_pb.ConnectRequest,
                ctx: RequestContext[process_pb.ConnectRequest, process_pb.ConnectResponse], /,
                ) -> AsyncIterator[process_pb.ConnectResponse]:
        return self._connect(request, ctx)

    async def _connect(self, request: process_pb.ConnectRequest,
                       ctx: RequestContext[process_pb.ConnectRequest, process_pb.ConnectResponse],
                       ) -> AsyncIterator[process_pb.ConnectResponse]:
        sandbox, deadline = sandbox_of(ctx), deadline_of(ctx)
        pid = await self._pid(sandbox, request.process)
        with connect_errors():
            on_pty = (await self._runtime().processes.get(sandbox, pid))["pty"] is not None
            events = await self._runtime().processes.attach(sandbox, pid, from_start=False)
        async for ev in relay(events, sandbox, deadline, None, on_pty):
            yield process_pb.ConnectResponse(event=ev)

    async def list(self, request: process_pb.ListRequest,
                   ctx: RequestContext[process_pb.ListRequest, process_pb.ListResponse], /,
                   ) -> process_pb.ListResponse:
        with connect_errors():
            running = await self._runtime().processes.list(sandbox_of(ctx))
        return process_pb.ListResponse(processes=[_info(p) for p in running])

    async def send_input(self, request: process_pb.SendInputRequest,
                         ctx: RequestContext[process_pb.SendInputRequest, process_pb.SendInputResponse], /,
                         ) -> process_pb.SendInputResponse:
        sandbox = sandbox_of(ctx)
        pid = await self._pid(sandbox, request.process)
        await self._write(sandbox, pid, request.input)
        return process_pb.SendInputResponse()

    async def stream_input(self, request: AsyncIterator[process_pb.StreamInputRequest],
                           ctx: RequestContext[process_pb.StreamInputRequest,
                                               process_pb.StreamInputResponse], /,
                           ) -> process_pb.StreamInputResponse:
        sandbox = sandbox_of(ctx)
        pid: int | None = None
        async for message in request:
            chosen = message.event
            if chosen is None or chosen.field == "keepalive":
                continue
            if chosen.field == "start":
                pid = await self._pid(sandbox, chosen.value.process)
            elif pid is None:
                raise ConnectError(Code.INVALID_ARGUMENT, "stream input must start with a start event")
            else:
                await self._write(sandbox, pid, chosen.value.input)
        return process_pb.StreamInputResponse()

    async def _write(self, sandbox: str, pid: int, data: process_pb.ProcessInput | None) -> None:
        chosen = data.input if data is not None else None
        if chosen is None:
            return
        # "pty" is typed into the process's terminal, which is its stdin (the agent's pty side).
        with connect_errors():
            await self._runtime().processes.write_stdin(sandbox, pid, bytes(chosen.value))

    async def update(self, request: process_pb.UpdateRequest,
                     ctx: RequestContext[process_pb.UpdateRequest, process_pb.UpdateResponse], /,
                     ) -> process_pb.UpdateResponse:
        """A terminal's new size (the SDK's ``pty.resize``); nothing else can be updated."""
        sandbox = sandbox_of(ctx)
        pid = await self._pid(sandbox, request.process)
        if not request.has_field("pty"):
            raise ConnectError(Code.INVALID_ARGUMENT, "an update needs a pty size (all it can change)")
        cols, rows = _size(request.pty)
        with connect_errors():
            await self._runtime().processes.resize(sandbox, pid, cols, rows)
        return process_pb.UpdateResponse()

    async def close_stdin(self, request: process_pb.CloseStdinRequest,
                          ctx: RequestContext[process_pb.CloseStdinRequest, process_pb.CloseStdinResponse], /,
                          ) -> process_pb.CloseStdinResponse:
        sandbox = sandbox_of(ctx)
        pid = await self._pid(sandbox, request.process)
        with connect_errors():
            await self._runtime().processes.write_stdin(sandbox, pid, b"", eof=True)
        return process_pb.CloseStdinResponse()

    async def send_signal(self, request: process_pb.SendSignalRequest,
                          ctx: RequestContext[process_pb.SendSignalRequest, process_pb.SendSignalResponse], /,
                          ) -> process_pb.SendSignalResponse:
        sandbox = sandbox_of(ctx)
        pid = await self._pid(sandbox, request.process)
        with connect_errors():
            if request.signal == process_pb.Signal.SIGKILL:
                await self._runtime().processes.kill(sandbox, pid)  # answers once it has ended
            elif request.signal == process_pb.Signal.SIGTERM:
                await self._runtime().processes.signal(sandbox, pid, "SIGTERM")
            else:
                raise ConnectError(Code.INVALID_ARGUMENT, "signal must be SIGTERM or SIGKILL")
        return process_pb.SendSignalResponse()


def _command(config: process_pb.ProcessConfig) -> tuple[list[str], dict[str, str], str | None]:
    """argv, environment and working directory of a Start, each string one the guest can take (400
    naming the field otherwise: a NUL or lone surrogate was a 500/502 from deep in the guest call,
    issue 38)."""
    argv = [check_guest_text("process.cmd", config.cmd),
            *(check_guest_text(f"process.args[{i}]", arg) for i, arg in enumerate(config.args))]
    env: dict[str, str] = {}
    for name, value in config.envs.items():
        field = f"process.envs[{name!a}]"
        if not name or "=" in name:
            raise InvalidRequest(f"field {field}: an environment variable's name is non-empty, without '='")
        env[check_guest_text(f"{field} (its name)", name)] = check_guest_text(field, value)
    cwd = None
    if config.has_field("cwd") and config.cwd:
        cwd = guest_path(check_guest_text("process.cwd", config.cwd))
    return argv, env, cwd


def _size(pty: process_pb.PTY | None) -> tuple[int, int]:
    """A ``PTY``'s size as (cols, rows); its bounds are checked where the terminal is made."""
    size = pty.size if pty is not None and pty.has_field("size") else None
    if size is None:
        raise ConnectError(Code.INVALID_ARGUMENT, "pty.size (cols and rows) is required")
    return int(size.cols), int(size.rows)


def _info(raw: ProcessEntry) -> process_pb.ProcessInfo:
    args = raw["args"] or [""]
    config = process_pb.ProcessConfig(cmd=args[0], args=args[1:], envs=raw["env"], cwd=raw["cwd"])
    return process_pb.ProcessInfo(config=config, pid=raw["pid"], tag=raw["tag"])


def process_app(runtime: Callable[[], Runtime], read_max_bytes: int) -> Any:
    """The SDK package's own Connect ASGI application, serving ``ProcessService``."""
    return process_connect.ProcessASGIApplication(ProcessService(runtime), read_max_bytes=read_max_bytes,
                                                 codecs=checked_codecs())
