"""Host side of the guest agent protocol (``forkd.guest.protocol``), over the VM's agent socket.

One connection per VM, multiplexed: every request carries an id and its reply
may come back in any order, so exec and eval calls to one sandbox run concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from pathlib import Path
from typing import Any

from forkd.errors import Conflict, ForkdError, GuestError, InvalidRequest, NotFound
from forkd.guest import protocol

# Any reply line the agent can send fits (see protocol.READ_LIMIT): a longer one
# would break the connection, and every call in flight on it.
READ_LIMIT = protocol.READ_LIMIT
# The guest's error text goes into API answers and logs: keep only this much of it.
MAX_ERROR_TEXT = 2000

# Refusals the agent marks with a kind are the caller's mistake, not the guest's failure.
_ERROR_OF_KIND: dict[str, type[ForkdError]] = {
    protocol.NOT_FOUND: NotFound,
    protocol.INVALID: InvalidRequest,
    protocol.CONFLICT: Conflict,
}


class AgentClient:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self._closed_reason: str | None = None

    async def connect(self) -> AgentClient:
        try:
            self._reader, self._writer = await asyncio.open_unix_connection(
                str(self.path), limit=READ_LIMIT
            )
        except OSError as exc:
            raise GuestError(f"cannot connect to the guest agent socket {self.path}: {exc}") from exc
        self._task = asyncio.create_task(self._read_loop(), name=f"agent-reader:{self.path}")
        return self

    @property
    def connected(self) -> bool:
        return self._writer is not None and self._closed_reason is None

    async def _read_loop(self) -> None:
        assert self._reader is not None
        reason = "guest agent connection closed"
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    break
                msg = protocol.decode_reply(line)
                if msg is None:
                    continue  # stray bytes (e.g. left from before a restore) are not replies
                fut = self._pending.pop(msg["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        except (OSError, ValueError, asyncio.LimitOverrunError) as exc:
            reason = f"guest agent connection failed: {exc}"
        finally:
            self._closed_reason = reason
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(GuestError(reason))
            self._pending.clear()

    async def call(self, action: str, timeout: float | None = 60.0, **args: Any) -> dict[str, Any]:
        """Send one request; return its ``result`` or raise GuestError with the agent's message.

        ``timeout`` is how long the host waits for the answer (None: for ever). The
        agent enforces exec's and eval's own ``timeout_secs`` argument; wait
        ``protocol.REPLY_GRACE_SECS`` longer than that, to hear it do so.
        """
        if self._writer is None:
            await self.connect()
        if self._closed_reason:
            raise GuestError(self._closed_reason)
        req_id = next(self._ids)
        data = protocol.encode(protocol.request(req_id, action, args))
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[req_id] = fut
        try:
            async with self._write_lock:
                assert self._writer is not None
                self._writer.write(data)
                await self._writer.drain()
            reply = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise GuestError(f"guest agent did not answer {action} within {timeout:g}s") from None
        except OSError as exc:
            raise GuestError(f"guest agent connection failed: {exc}") from exc
        finally:
            self._pending.pop(req_id, None)
        if not reply.get("ok"):
            text = str(reply.get("error", "unknown error"))[:MAX_ERROR_TEXT]
            kind = reply.get("kind")
            error = _ERROR_OF_KIND.get(kind) if isinstance(kind, str) else None
            if error is not None:
                raise error(text)
            raise GuestError(f"guest agent: {text}")
        result: dict[str, Any] = reply["result"]
        return result

    async def restored(self) -> dict[str, Any]:
        """Tell a freshly restored child to reseed its RNGs and step its clock."""
        return await self.call(
            protocol.RESTORED, timeout=30, entropy=os.urandom(64).hex(), time_ns=time.time_ns()
        )

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        self._writer = None
