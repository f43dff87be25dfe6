"""A terminal on a sandbox over a WebSocket: a login shell on a pty (the web console's, any client's).

``GET /v1/sandboxes/{id}/terminal?cols=80&rows=24&user=root`` upgrades to a
WebSocket (subprotocol ``forkd.terminal.v1``) and starts ``bash -l`` on a
terminal of that size in the sandbox, as ``user`` (root unless named), in its
home, with ``TERM=xterm-256color``:

* binary frames from the client are the keyboard (the shell's stdin, as is);
* a text frame from the client is a JSON control message:
  ``{"resize": [cols, rows]}``;
* binary frames from the daemon are the terminal's output, as the guest wrote it;
* the daemon's last message is a text frame ``{"exit_code": N}`` when the
  shell ends (or ``{"error": "..."}``), then it closes the socket.

Closing the socket kills the shell's process group. Authentication is the
daemon's as always: ``Authorization: Bearer``, or, from a browser (which cannot
set headers on a WebSocket), the subprotocol ``bearer.<base64url token>``
offered beside ``forkd.terminal.v1`` (api/auth.py). The shell is an ordinary
forkd process with a pty (controller/processes.py): it counts against the
sandbox's process and stream limits, and it wakes a hibernated sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, WebSocket, WebSocketDisconnect

from forkd import bounds
from forkd.api.routes import Runtime, SandboxIdPath
from forkd.config import API_VERSION
from forkd.errors import ForkdError

SUBPROTOCOL = "forkd.terminal.v1"
SHELL = ["/bin/bash", "-l"]
MAX_CONTROL_CHARS = 256  # a resize message is about 20
MAX_INPUT_BYTES = 64 << 10  # one frame of keyboard (a paste); the guest's stdin takes it in order

router = APIRouter(prefix=f"/{API_VERSION}", tags=["processes"])


@router.websocket("/sandboxes/{id}/terminal")
async def terminal(
    websocket: WebSocket, sandbox_id: SandboxIdPath, rt: Runtime,
    cols: Annotated[int, Query(ge=1, le=1000)] = 80,
    rows: Annotated[int, Query(ge=1, le=1000)] = 24,
    user: Annotated[str | None, Query(max_length=33, description=bounds.GUEST_USER_RULE)] = None,
) -> None:
    if SUBPROTOCOL not in websocket.scope.get("subprotocols", ()) and websocket.scope.get("subprotocols"):
        await websocket.close(code=1002, reason=f"speak {SUBPROTOCOL}")
        return
    try:
        home = {None: "/root", "root": "/root", "user": "/home/user"}.get(user)  # others: the agent's
        events = await rt.processes.run(sandbox_id, SHELL, env={"TERM": "xterm-256color"}, cwd=home,
                                        stdin_open=True, kill_on_close=True, user=user, pty=(cols, rows))
    except ForkdError as exc:
        await websocket.close(code=1011, reason=str(exc)[:120])
        return
    offered = websocket.scope.get("subprotocols") or ()
    await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    try:
        start = await events.__anext__()
        await _relay(websocket, rt, sandbox_id, start.pid, events)
    finally:
        await events.aclose()  # kills the shell if it is still running


async def _relay(websocket: WebSocket, rt: Any, sandbox_id: str, pid: int, events: Any) -> None:
    async def output() -> None:
        try:
            async for event in events:
                if event.type in ("stdout", "stderr") and event.data:
                    await websocket.send_bytes(event.data)
                elif event.type == "exit":
                    await websocket.send_text(json.dumps({"exit_code": event.exit_code}))
                    return
        except ForkdError as exc:
            await websocket.send_text(json.dumps({"error": str(exc)}))

    async def keyboard() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("bytes"):
                for at in range(0, len(message["bytes"]), MAX_INPUT_BYTES):
                    await rt.processes.write_stdin(sandbox_id, pid, message["bytes"][at:at + MAX_INPUT_BYTES])
            elif message.get("text"):
                try:
                    await _control(rt, sandbox_id, pid, message["text"])
                except ForkdError as exc:  # said, and the terminal goes on
                    await websocket.send_text(json.dumps({"error": str(exc)}))

    tasks = [asyncio.create_task(output()), asyncio.create_task(keyboard())]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if (exc := task.exception()) is not None and not isinstance(exc, WebSocketDisconnect):
                with contextlib.suppress(Exception):
                    await websocket.send_text(json.dumps({"error": str(exc) or type(exc).__name__}))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):  # the client may be gone already
            await websocket.close()


async def _control(rt: Any, sandbox_id: str, pid: int, text: str) -> None:
    """A control message: ``{"resize": [cols, rows]}``; anything else is refused (400's message)."""
    if len(text) > MAX_CONTROL_CHARS:
        raise ForkdError(f"a control message is at most {MAX_CONTROL_CHARS} characters")
    try:
        body = json.loads(text)
        cols, rows = body["resize"]
        await rt.processes.resize(sandbox_id, pid, int(cols), int(rows))
    except (ValueError, TypeError, KeyError):
        raise ForkdError('a text frame is a control message: {"resize": [cols, rows]}') from None
