"""REST routes for processes in a sandbox: streaming exec, background processes, eval cancel.

A stream is an NDJSON response (``application/x-ndjson``), one event a line,
written as the process produces output; the connection's own flow control is
the only buffer: a client that reads slowly slows the process's stream down
(back to the guest), it never grows the daemon's memory. A client that goes
away before a streaming exec ends has its process group killed; a background
process runs on when its watchers leave. Semantics live in
``forkd.controller.processes``.

Output is bytes in the guest. ``encoding=text`` (default) sends each chunk as
UTF-8 text (a character split between chunks is joined again; invalid bytes
become U+FFFD); ``encoding=base64`` sends the exact bytes as base64.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Response, status
from fastapi.responses import StreamingResponse

from forkd.api.routes import (
    BAD_REQUEST,
    COMMON_ERRORS,
    GUEST_ERRORS,
    NO_SANDBOX,
    STARTING,
    TOO_LARGE,
    Runtime,
    SandboxIdPath,
)
from forkd.api.schemas import (
    CancelEvalResponse,
    ErrorBody,
    ExecStreamRequest,
    ProcessInfo,
    ProcessStartRequest,
    SignalRequest,
    SignalResponse,
    StdinRequest,
    StdinResponse,
)
from forkd.config import API_VERSION
from forkd.controller.results import CancelResult, ProcessEntry, SignalResult, StdinResult
from forkd.errors import ForkdError, InvalidRequest

NDJSON = "application/x-ndjson"


def _err(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


router = APIRouter(prefix=f"/{API_VERSION}", tags=["processes"],
                   responses={**COMMON_ERRORS, **BAD_REQUEST, **STARTING, **NO_SANDBOX, **GUEST_ERRORS})

PidPath = Annotated[int, Path(ge=1, le=(1 << 22), description="The process's pid in the guest.")]
NO_PROCESS: dict[int | str, dict[str, Any]] = {
    404: _err("No sandbox with that id is alive, or it has no such process (or not any more)."),
}
NOT_RUNNING: dict[int | str, dict[str, Any]] = {
    404: _err("No sandbox with that id is alive, or no such process is running."),
}
BUSY_STREAMS: dict[int | str, dict[str, Any]] = {
    409: _err("The process already has 8 watchers."),
    503: _err("The sandbox already has 32 process streams open (or the daemon is starting)."),
}
STREAM_DOC: dict[int | str, dict[str, Any]] = {
    200: {"content": {NDJSON: {"schema": {"type": "string"}}},
          "description": "NDJSON, one event a line: start, stdout/stderr (data), dropped, then exit; "
                         "or an error line if the stream broke (see docs/API.md)."},
}


class EventWriter:
    """Process events as NDJSON lines, output decoded per ``encoding``."""

    def __init__(self, encoding: Literal["text", "base64"]) -> None:
        self.encoding = encoding
        self._decoders = {name: codecs.getincrementaldecoder("utf-8")("replace")
                          for name in ("stdout", "stderr")}

    @staticmethod
    def line(body: dict[str, Any]) -> bytes:
        return (json.dumps(body, separators=(",", ":")) + "\n").encode()

    def render(self, event: Any) -> bytes:
        if event.type in ("stdout", "stderr"):
            if self.encoding == "base64":
                data = base64.b64encode(event.data).decode("ascii")
            else:
                data = self._decoders[event.type].decode(event.data)
                if not data:
                    return b""  # only part of a character so far
            return self.line({"type": event.type, "data": data})
        if event.type == "start":
            return self.line({"type": "start", "pid": event.pid})
        if event.type == "dropped":
            return self.line({"type": "dropped", "bytes": event.dropped})
        # exit: first what the decoders still hold (an incomplete character at the very end)
        tail = b""
        if self.encoding == "text":
            for name, decoder in self._decoders.items():
                rest = decoder.decode(b"", final=True)
                if rest:
                    tail += self.line({"type": name, "data": rest})
        return tail + self.line({"type": "exit", "pid": event.pid, "exit_code": event.exit_code,
                                 "signal": event.signal, "timed_out": event.timed_out, "error": event.error})


async def ndjson(events: Any, first: Any, encoding: Literal["text", "base64"]) -> AsyncIterator[bytes]:
    """The response body: ``first`` (already read, so that errors before it were HTTP errors),
    the rest as they come; closing it (a client that left) closes the stream."""
    writer = EventWriter(encoding)
    try:
        yield writer.render(first)
        async for event in events:
            chunk = writer.render(event)
            if chunk:
                yield chunk
    except ForkdError as exc:  # after the 200 has gone: say so in the stream itself
        yield writer.line({"type": "error", "error": str(exc)})
    finally:
        await events.aclose()


async def stream_response(events: Any, encoding: Literal["text", "base64"]) -> StreamingResponse:
    try:
        first = await events.__anext__()
    except BaseException:
        await events.aclose()
        raise
    # no-transform / X-Accel-Buffering: proxies must pass each line on as it comes.
    return StreamingResponse(ndjson(events, first, encoding), media_type=NDJSON,
                             headers={"Cache-Control": "no-cache, no-transform", "X-Accel-Buffering": "no"})


@router.post(
    "/sandboxes/{id}/exec/stream",
    response_class=StreamingResponse,
    summary="Run a process and stream its output (NDJSON) until it exits",
    responses={**STREAM_DOC, **TOO_LARGE, **BUSY_STREAMS},
)
async def exec_stream(sandbox_id: SandboxIdPath, req: ExecStreamRequest, rt: Runtime) -> StreamingResponse:
    events = await rt.processes.run(
        sandbox_id, req.args, timeout_secs=req.timeout_secs, env=req.env, cwd=req.cwd,
        stdin=req.stdin.encode() if req.stdin is not None else None, stdin_open=req.stdin_open,
        tag=req.tag, user=req.user)
    return await stream_response(events, req.encoding)


@router.post(
    "/sandboxes/{id}/processes",
    status_code=status.HTTP_201_CREATED,
    response_model=ProcessInfo,
    summary="Start a background process",
    responses={**TOO_LARGE, 409: _err("The sandbox already runs 64 processes that forkd started.")},
)
async def start_process(sandbox_id: SandboxIdPath, req: ProcessStartRequest, rt: Runtime) -> ProcessEntry:
    return await rt.processes.start(
        sandbox_id, req.args, env=req.env, cwd=req.cwd,
        stdin=req.stdin.encode() if req.stdin is not None else None, stdin_open=req.stdin_open,
        tag=req.tag, timeout_secs=req.timeout_secs, user=req.user)


@router.get(
    "/sandboxes/{id}/processes",
    response_model=list[ProcessInfo],
    summary="The running processes that forkd started in the sandbox",
)
async def list_processes(sandbox_id: SandboxIdPath, rt: Runtime) -> list[ProcessEntry]:
    return await rt.processes.list(sandbox_id)


@router.get(
    "/sandboxes/{id}/processes/{pid}",
    response_model=ProcessInfo,
    summary="One process, running or recently exited",
    responses=NO_PROCESS,
)
async def get_process(sandbox_id: SandboxIdPath, pid: PidPath, rt: Runtime) -> ProcessEntry:
    return await rt.processes.get(sandbox_id, pid)


@router.get(
    "/sandboxes/{id}/processes/{pid}/stream",
    response_class=StreamingResponse,
    summary="Stream a process's output (NDJSON): what its ring still holds, then live, then its exit",
    responses={**STREAM_DOC, **NO_PROCESS, **BUSY_STREAMS},
)
async def stream_process(
    sandbox_id: SandboxIdPath, pid: PidPath, rt: Runtime,
    since: Annotated[Literal["start", "now"], Query(
        alias="from", description="start: the oldest output the guest still keeps (up to 1 MiB); "
        "now: only what comes next.")] = "start",
    encoding: Annotated[Literal["text", "base64"], Query(description="text (UTF-8) or base64.")] = "text",
) -> StreamingResponse:
    events = await rt.processes.attach(sandbox_id, pid, from_start=since == "start")
    return await stream_response(events, encoding)


@router.post(
    "/sandboxes/{id}/processes/{pid}/stdin",
    response_model=StdinResponse,
    summary="Write to a process's standard input (and/or close it)",
    responses={**NO_PROCESS, **TOO_LARGE,
               409: _err("Its stdin is closed (start it with stdin_open), or 1 MiB it has not read "
                         "yet is pending.")},
)
async def write_stdin(sandbox_id: SandboxIdPath, pid: PidPath, req: StdinRequest,
                      rt: Runtime) -> StdinResult:
    if req.encoding == "base64":
        try:
            data = base64.b64decode(req.data, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest("data is not valid base64 (encoding=base64)") from None
    else:
        data = req.data.encode()
    return await rt.processes.write_stdin(sandbox_id, pid, data, eof=req.eof)


@router.post(
    "/sandboxes/{id}/processes/{pid}/signal",
    response_model=SignalResponse,
    summary="Send a signal to a process (its process group by default)",
    responses={**NOT_RUNNING, **TOO_LARGE},
)
async def signal_process(sandbox_id: SandboxIdPath, pid: PidPath, req: SignalRequest,
                         rt: Runtime) -> SignalResult:
    return await rt.processes.signal(sandbox_id, pid, req.signal, group=req.group)


@router.delete(
    "/sandboxes/{id}/processes/{pid}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    summary="Kill a process (SIGKILL to its process group)",
    responses=NOT_RUNNING,
)
async def kill_process(sandbox_id: SandboxIdPath, pid: PidPath, rt: Runtime) -> Response:
    await rt.processes.kill(sandbox_id, pid)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    "/sandboxes/{id}/eval/cancel",
    response_model=CancelEvalResponse,
    summary="Interrupt the sandbox's running eval (it answers CancelledError)",
)
async def cancel_eval(sandbox_id: SandboxIdPath, rt: Runtime) -> CancelResult:
    return await rt.cancel_eval(sandbox_id)
