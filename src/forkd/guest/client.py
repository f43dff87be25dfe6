"""The host's typed calls to the guest agent, on its line transport (``forkd.guest.transport``).

Each call builds its action's request type and returns its reply type from
``forkd.guest.protocol``, so mypy checks what the host sends and what it reads.
``require`` is the one place the host refuses (409) what an agent cannot do:
every feature newer than the base protocol is a capability the agent lists in
``ping`` (or, for agents older than that list, that its version implies).

The reply types describe what a well-behaved agent sends; the guest is not
trusted, so a reader still checks a value before it matters (the transport has
already bounded the line and checked that the result is an object).
"""

from __future__ import annotations

import os
import time
from typing import Any, cast

from forkd.errors import Conflict
from forkd.guest import messages, protocol
from forkd.guest.transport import AgentStream, AgentTransport, decode_output, error_of

# How long a call waits for its answer (None: for ever).
Timeout = float | None

__all__ = ["AgentClient", "AgentStream", "decode_output", "error_of", "require"]


def require(capabilities: protocol.Capabilities, *needed: str, subject: str = "the sandbox") -> None:
    """Refuse (409) a request that needs capabilities the agent lacks: an older agent would
    ignore the request's new fields, or not know its action (a snapshot made by an older forkd)."""
    missing = capabilities.lacks(*needed)
    if missing:
        what = ", ".join(protocol.CAPABILITIES[name].feature if name in protocol.CAPABILITIES else name
                         for name in missing)
        raise Conflict(f"{subject} runs guest agent version {capabilities.agent_version}, which predates "
                       f"{what}: create its snapshot again with this version of forkd")


class AgentClient(AgentTransport):
    """The typed calls; ``call``/``stream``/``notify`` (the transport's) remain for the actions
    that have no typed call yet."""

    async def ping(self, timeout: Timeout = 30.0) -> messages.PingReply:
        return cast(messages.PingReply, await self.call(protocol.PING, timeout=timeout))

    async def capabilities(self, timeout: Timeout = 30.0) -> protocol.Capabilities:
        """What this agent can do (one ping)."""
        return protocol.Capabilities.of(await self.ping(timeout))

    async def exec(self, req: messages.ExecRequest, timeout: Timeout) -> messages.ExecReply:
        return cast(messages.ExecReply, await self.call(protocol.EXEC, timeout=timeout, **req))

    async def eval(self, req: messages.EvalRequest, timeout: Timeout) -> messages.EvalReply:
        return cast(messages.EvalReply, await self.call(protocol.EVAL, timeout=timeout, **req))

    async def eval_cancel(self, timeout: Timeout = 30.0) -> messages.EvalCancelReply:
        return cast(messages.EvalCancelReply, await self.call(protocol.EVAL_CANCEL, timeout=timeout))

    async def restored_with(self, req: messages.RestoredRequest, timeout: Timeout) -> messages.RestoredReply:
        return cast(messages.RestoredReply, await self.call(protocol.RESTORED, timeout=timeout, **req))

    async def restored(self, inputs: protocol.RestoreInputs | None = None,
                       timeout: Timeout = 30.0) -> messages.RestoredReply:
        """Tell a freshly restored child to reseed its RNGs, step its clock and take its inputs."""
        req: messages.RestoredRequest = {"entropy": os.urandom(64).hex(), "time_ns": time.time_ns()}
        wire: dict[str, Any] = (inputs or protocol.RestoreInputs()).to_wire()
        req.update(cast(messages.RestoredRequest, wire))
        return await self.restored_with(req, timeout)

    async def step_clock(self, timeout: Timeout) -> messages.RestoredReply:
        """Step the guest's clock to the host's (no reseed). Fresh entropy goes along only so that
        an agent older than ``clock_only`` still accepts the call (it then reseeds too, harmlessly)."""
        return await self.restored_with({"clock_only": True, "time_ns": time.time_ns(),
                                         "entropy": os.urandom(32).hex()}, timeout)

    async def sync(self, timeout: Timeout) -> messages.SyncReply:
        return cast(messages.SyncReply, await self.call(protocol.SYNC, timeout=timeout))

    async def fsfreeze(self, timeout: Timeout) -> messages.FsfreezeReply:
        return cast(messages.FsfreezeReply, await self.call(protocol.FSFREEZE, timeout=timeout))

    async def fsthaw(self, timeout: Timeout) -> messages.FsthawReply:
        return cast(messages.FsthawReply, await self.call(protocol.FSTHAW, timeout=timeout))

    async def file_stat(self, req: messages.FileStatRequest, timeout: Timeout) -> messages.FileInfo:
        return cast(messages.FileInfo, await self.call(protocol.FILE_STAT, timeout=timeout, **req))

    async def file_list(self, req: messages.FileListRequest, timeout: Timeout) -> messages.FileListReply:
        return cast(messages.FileListReply, await self.call(protocol.FILE_LIST, timeout=timeout, **req))

    async def file_mkdir(self, req: messages.FileMkdirRequest, timeout: Timeout) -> messages.FileMkdirReply:
        return cast(messages.FileMkdirReply, await self.call(protocol.FILE_MKDIR, timeout=timeout, **req))

    async def file_remove(self, req: messages.FileRemoveRequest,
                          timeout: Timeout) -> messages.FileRemoveReply:
        return cast(messages.FileRemoveReply, await self.call(protocol.FILE_REMOVE, timeout=timeout, **req))

    async def file_read(self, req: messages.FileReadRequest, timeout: Timeout) -> messages.FileReadReply:
        return cast(messages.FileReadReply, await self.call(protocol.FILE_READ, timeout=timeout, **req))

    async def file_write_open(self, req: messages.FileWriteOpenRequest,
                              timeout: Timeout) -> messages.FileWriteOpenReply:
        return cast(messages.FileWriteOpenReply,
                    await self.call(protocol.FILE_WRITE_OPEN, timeout=timeout, **req))

    async def file_write(self, req: messages.FileWriteRequest, timeout: Timeout) -> messages.FileWriteReply:
        return cast(messages.FileWriteReply, await self.call(protocol.FILE_WRITE, timeout=timeout, **req))

    async def file_write_close(self, req: messages.FileWriteCloseRequest,
                               timeout: Timeout) -> messages.FileInfo | dict[str, Any]:
        """The committed file's FileInfo, or ``{"aborted": true}``."""
        return await self.call(protocol.FILE_WRITE_CLOSE, timeout=timeout, **req)

    async def file_move(self, req: messages.FileMoveRequest, timeout: Timeout) -> messages.FileInfo:
        return cast(messages.FileInfo, await self.call(protocol.FILE_MOVE, timeout=timeout, **req))
