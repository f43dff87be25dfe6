"""A QMP peer that speaks the real wire protocol on a unix socket; and ``StubQMP``.

``forkd.vmm.qmp.QMP`` (QEMU's own ``qemu.qmp`` client underneath) connects to
it as to a QEMU. Tests script what each command returns and which events
follow, with delays, to reproduce orderings a real QEMU produces only now
and then (e.g. ``query-status`` saying "running" before the RESUME event).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forkd.errors import VMError

Handler = Callable[["FakeQMP", dict[str, Any]], Awaitable[Any] | Any]


class FakeQMP:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.handlers: dict[str, Handler] = {}
        self.commands: list[tuple[str, dict[str, Any]]] = []
        self.arrivals: list[tuple[str, float]] = []  # (command, when its bytes were read)
        self._writer: asyncio.StreamWriter | None = None
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, sock: socket.socket | None = None) -> FakeQMP:
        """Listen at ``path``, or on ``sock`` (a listening socket handed over, as QEMU is given one)."""
        if sock is None:
            self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        else:
            self._server = await asyncio.start_unix_server(self._serve, sock=sock)
        return self

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._writer is not None:
            self._writer.close()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    def on(self, command: str, handler: Handler) -> None:
        self.handlers[command] = handler

    async def _send(self, msg: dict[str, Any]) -> None:
        assert self._writer is not None
        self._writer.write((json.dumps(msg) + "\r\n").encode())
        await self._writer.drain()

    async def emit(self, event: str, data: dict[str, Any] | None = None, *, at: float | None = None) -> None:
        """Send event ``event`` now, stamped with ``at`` (wall-clock seconds; default now)."""
        t = time.time() if at is None else at
        msg: dict[str, Any] = {"event": event, "timestamp": {"seconds": int(t),
                                                             "microseconds": int((t % 1) * 1e6)}}
        if data is not None:
            msg["data"] = data
        await self._send(msg)

    def later(self, delay: float, coro_fn: Callable[[], Awaitable[None]]) -> None:
        """Run ``coro_fn`` after ``delay`` seconds (events that arrive late)."""
        async def run() -> None:
            await asyncio.sleep(delay)
            await coro_fn()

        task = asyncio.ensure_future(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        await self._send({"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7},
                                              "package": "fake"}, "capabilities": []}})
        # Like QEMU, parse a stream of JSON objects: qemu.qmp sends no newlines.
        decoder, buf = json.JSONDecoder(), ""
        while chunk := await reader.read(65536):
            arrived = time.monotonic()
            buf += chunk.decode()
            while buf.strip():
                try:
                    msg, end = decoder.raw_decode(buf.lstrip())
                except ValueError:
                    break  # incomplete: wait for more
                buf = buf.lstrip()[end:]
                self.arrivals.append((msg.get("execute"), arrived))
                await self._answer(msg)

    async def _answer(self, msg: dict[str, Any]) -> None:
        name, args, msg_id = msg["execute"], msg.get("arguments") or {}, msg.get("id")
        self.commands.append((name, args))
        if name == "qmp_capabilities":
            reply: dict[str, Any] = {"return": {}}
        elif name in self.handlers:
            try:
                result = self.handlers[name](self, args)
                if asyncio.iscoroutine(result):
                    result = await result
                reply = {"return": {} if result is None else result}
            except QMPError as exc:
                reply = {"error": {"class": "GenericError", "desc": str(exc)}}
        else:
            reply = {"return": {}}
        if msg_id is not None:
            reply["id"] = msg_id
        await self._send(reply)




class QMPError(Exception):
    """Raise from a handler to answer the command with a QMP error."""


@dataclass
class StubQMP:
    """A VM's QMP for owners that only send commands and ask the status (no protocol).

    ``stop``/``cont`` change the status as QEMU's do; ``query-migrate`` answers
    ``migration``; with ``fail`` every command fails as a dead QEMU's would.
    """

    status_: str = "running"
    commands: list[str] = field(default_factory=list)
    fail: bool = False
    migration: str = "none"

    async def cmd(self, command: str, **_: Any) -> Any:
        if self.fail:
            raise VMError(f"QMP {command} failed: stub")
        self.commands.append(command)
        if command == "query-migrate":
            return {"status": self.migration}
        self.status_ = {"stop": "paused", "cont": "running"}.get(command, self.status_)
        return {}

    async def status(self) -> str:
        return self.status_
