"""The MCP tools for processes that outlive one call: start, read output, send input, list, kill.

A model cannot hold a stream open between tool calls, so a process's output is
read in stretches by byte offset: each reply says where the next read starts
(``next_offset``). Every read watches the process from the oldest output the
guest still keeps (its 1 MiB ring, see docs/API.md "Processes in a sandbox"),
counts bytes up to ``offset`` and returns what follows, for at most
``wait_secs`` and ``max_bytes``: the model's context is bounded as much as the
daemon's memory.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from dataclasses import dataclass, field
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from pydantic import Field

from forkd.api.schemas import CancelEvalResponse, SignalName, SignalResponse, StdinResponse
from forkd.mcp.models import ProcessList, ProcessOutput
from forkd.mcp.tooling import CREATES, DESTROYS, READ_ONLY, Command, Cwd, ExtraEnv, SandboxId, call
from forkd.sdk import AsyncController

DEFAULT_OUTPUT_BYTES = 32 * 1024
MAX_OUTPUT_BYTES = 1024 * 1024  # the guest keeps no more of a process's output than this
MAX_WAIT_SECS = 300.0

Pid = Annotated[int, Field(ge=1, le=1 << 22,
                           description="The process's pid (from start_process or list_processes).")]
MaxBytes = Annotated[int, Field(ge=1, le=MAX_OUTPUT_BYTES, description=(
    "Return at most this many bytes of output (stdout and stderr together): the reply comes once "
    "they are there; `more` says if more output was already waiting."))]


def char_boundary(data: bytes, n: int) -> int:
    """The largest cut at most ``n`` (and at most 3 bytes earlier) that splits no UTF-8 character."""
    k = n
    while 0 < k < len(data) and n - k < 3 and data[k] & 0xC0 == 0x80:
        k -= 1
    return k if k >= len(data) or data[k] & 0xC0 != 0x80 else n


@dataclass
class OutputWindow:
    """The bytes of one read: from ``offset`` (counted over stdout and stderr together), at most ``limit``."""

    offset: int
    limit: int
    cursor: int = 0  # everything before this offset is returned or known lost
    position: int = 0  # the offset of the next byte the stream brings
    returned: int = 0
    lost: int = 0
    more: bool = False
    out: dict[str, bytearray] = field(default_factory=lambda: {"stdout": bytearray(), "stderr": bytearray()})
    exit: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.cursor = self.offset

    def _skip_to(self, end: int) -> None:
        """Bytes up to ``end`` that will never come: lost, if they lie past the cursor."""
        if end > self.cursor:
            self.lost += end - self.cursor
            self.cursor = end

    def take(self, event: dict[str, Any]) -> bool:
        """Account for one event of the process's stream (base64); True when the read is complete."""
        kind = event.get("type")
        if kind == "dropped":
            self.position += max(0, int(event.get("bytes") or 0))
            self._skip_to(self.position)
        elif kind in ("stdout", "stderr"):
            data = base64.b64decode(str(event.get("data") or ""))
            start, self.position = self.position, self.position + len(data)
            self._skip_to(start)
            piece = data[max(0, self.cursor - start):] if self.position > self.cursor else b""
            room = self.limit - self.returned
            if len(piece) > room:
                keep = char_boundary(piece, room)
                piece, self.more = piece[:keep if keep or self.returned else room], True
            self.out[str(kind)] += piece
            self.cursor += len(piece)
            self.returned += len(piece)
        elif kind == "exit":
            self.exit = event
        return self.more or self.returned >= self.limit or self.exit is not None

    def text(self, stream: str) -> str:
        return self.out[stream].decode("utf-8", errors="replace")


async def read_output(c: AsyncController, sandbox_id: str, pid: int, *, offset: int, max_bytes: int,
                      wait_secs: float) -> ProcessOutput:
    """What process ``pid`` wrote from ``offset`` on, read for at most ``wait_secs``."""
    window = OutputWindow(offset=offset, limit=max_bytes)
    events = c.stream_process(sandbox_id, pid, from_start=True, encoding="base64")
    try:
        # Ends at the exit, at max_bytes, or when the wait is over (the process keeps running).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_secs):
                async for event in events:
                    if window.take(event):
                        break
    finally:
        await events.aclose()
    ended = window.exit
    if ended is None:  # not seen in this read: ask how it stands
        info = await c.get_process(sandbox_id, pid)
        ended = None if info["running"] else dict(info)
    return ProcessOutput(
        pid=pid, running=ended is None, stdout=window.text("stdout"), stderr=window.text("stderr"),
        offset=offset, next_offset=window.cursor, lost_bytes=window.lost, more=window.more,
        exit_code=ended.get("exit_code") if ended else None,
        timed_out=bool(ended.get("timed_out")) if ended else False,
        error=ended.get("error") if ended else None,
    )


def process_tools(server: MCPServer[AsyncController]) -> None:
    @server.tool(annotations=CREATES)
    async def start_process(
        ctx: Context[Any, Any],
        sandbox_id: SandboxId,
        command: Command,
        wait_secs: Annotated[float, Field(ge=0, le=MAX_WAIT_SECS, description=(
            "Wait this long for it (0: return at once). If it ends sooner, the reply has its whole "
            "output and exit_code."))] = 2,
        timeout_secs: Annotated[float | None, Field(gt=0, le=86400, description=(
            "Kill it after this long (default: it runs until it exits or is killed)."))] = None,
        stdin_open: Annotated[bool, Field(description=(
            "Keep its standard input open, to feed it with send_process_input."))] = False,
        cwd: Cwd = None,
        env: ExtraEnv = None,
        tag: Annotated[str | None, Field(max_length=256, description=(
            "A label shown by list_processes, e.g. 'web-server'."))] = None,
        max_bytes: MaxBytes = DEFAULT_OUTPUT_BYTES,
    ) -> ProcessOutput:
        """Start a command in the background and return after at most wait_secs: with its
        output so far and its `pid` while it keeps running, or with its whole output and
        exit_code if it finished. Use it for servers, long builds or training runs, and
        interactive programs; then read_process_output (more output, optionally waiting
        for it), send_process_input (with stdin_open) and kill_process. For a quick
        command whose result you just need, exec_command is simpler."""
        async def start(c: AsyncController) -> ProcessOutput:
            info = await c.start_process(sandbox_id, command, timeout_secs=timeout_secs, env=env, cwd=cwd,
                                         stdin_open=stdin_open, tag=tag)
            return await read_output(c, sandbox_id, int(info["pid"]), offset=0, max_bytes=max_bytes,
                                     wait_secs=wait_secs)

        return await call(ctx, start)

    @server.tool(annotations=READ_ONLY)
    async def read_process_output(
        ctx: Context[Any, Any],
        sandbox_id: SandboxId,
        pid: Pid,
        offset: Annotated[int, Field(ge=0, description=(
            "Skip the output before this byte offset: pass the `next_offset` of the previous "
            "start_process or read_process_output reply to get only what is new (0: from the start)."))] = 0,
        wait_secs: Annotated[float, Field(ge=0, le=MAX_WAIT_SECS, description=(
            "Wait up to this long for output; the reply comes sooner if the process ends or "
            "max_bytes are collected. Set it long (e.g. 60) to wait for a process to finish."))] = 1,
        max_bytes: MaxBytes = DEFAULT_OUTPUT_BYTES,
    ) -> ProcessOutput:
        """Read what a background process (start_process) wrote, from `offset` on, and
        whether it is still running (else its exit_code). Its stdout and stderr come back
        apart; `next_offset` is where the next read starts. The sandbox keeps the newest
        1 MiB of each process's output: older output is reported in `lost_bytes`."""
        return await call(ctx, lambda c: read_output(c, sandbox_id, pid, offset=offset, max_bytes=max_bytes,
                                                     wait_secs=wait_secs))

    @server.tool(annotations=CREATES)
    async def send_process_input(
        ctx: Context[Any, Any],
        sandbox_id: SandboxId,
        pid: Pid,
        data: Annotated[str, Field(
            description="Text to write to its standard input; end a line with '\\n'.")],
        eof: Annotated[bool, Field(description="Close its standard input afterwards (it reads end-of-file).")]
            = False,
    ) -> StdinResponse:
        """Type into a background process: write text to the standard input of a process
        started by start_process with stdin_open=true. Read its answer with
        read_process_output. Refused (409) if its stdin is not open."""
        body = await call(ctx, lambda c: c.send_stdin(sandbox_id, pid, data, eof=eof))
        return StdinResponse.model_validate(body)

    @server.tool(annotations=READ_ONLY)
    async def list_processes(ctx: Context[Any, Any], sandbox_id: SandboxId) -> ProcessList:
        """List the processes forkd started in a sandbox that are still running (start_process,
        exec_command): pid, args, tag, when each started, whether its stdin is open."""
        infos = await call(ctx, lambda c: c.list_processes(sandbox_id))
        return ProcessList.model_validate({"processes": infos})

    @server.tool(annotations=DESTROYS)
    async def kill_process(
        ctx: Context[Any, Any],
        sandbox_id: SandboxId,
        pid: Pid,
        signal: Annotated[SignalName, Field(description=(
            "SIGKILL (default) ends it for sure; SIGTERM or SIGINT let it clean up first."))] = "SIGKILL",
    ) -> SignalResponse:
        """Stop a process running in a sandbox (a server, a stuck build), with everything it
        started: the signal goes to its whole process group. The sandbox keeps running;
        use kill_sandbox to stop the sandbox itself."""
        body = await call(ctx, lambda c: c.signal_process(sandbox_id, pid, signal))
        return SignalResponse.model_validate(body)

    @server.tool(annotations=CREATES)
    async def cancel_eval(ctx: Context[Any, Any], sandbox_id: SandboxId) -> CancelEvalResponse:
        """Interrupt the eval_python call still running in a sandbox, e.g. one whose caller
        gave up waiting: later eval_python calls of that sandbox wait for it otherwise. Its
        variables stay. `cancelled` is false if no eval was running."""
        return CancelEvalResponse.model_validate(await call(ctx, lambda c: c.cancel_eval(sandbox_id)))
