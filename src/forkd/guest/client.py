"""The host's typed calls to the guest agent, on its line transport (``forkd.guest.transport``).

Each call takes its action's request type and returns its reply type (``forkd.guest.messages``,
``process_messages``, ``code_messages``), so mypy checks what the host sends and what it reads.
The guest is not trusted, so every reply is also checked against its type as it arrives
(``schema.check``): one that does not fit is a ``GuestError`` (502) naming the field, and what a
caller reads is at least of the documented types (bounds on lengths and counts stay the
caller's). ``require`` is the one place the host refuses (409) what an agent cannot do: every
feature newer than the base protocol is a capability the agent lists in ``ping`` (or, for
agents older than that list, that its version implies).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, cast

from forkd.errors import Conflict, GuestError, InvalidRequest
from forkd.guest import (
    capabilities,
    code_messages,
    messages,
    process_messages,
    protocol,
    schema,
    volume_messages,
)
from forkd.guest.capabilities import Capabilities
from forkd.guest.transport import AgentStream, AgentTransport, decode_output, error_of

# How long a call waits for its answer (None: for ever).
Timeout = float | None
T = TypeVar("T")

__all__ = ["AgentClient", "AgentStream", "checked_reply", "decode_output", "error_of", "require"]


def require(agent: Capabilities, *needed: str, subject: str = "the sandbox") -> None:
    """Refuse (409) a request that needs capabilities the agent lacks: an older agent would
    ignore the request's new fields, or not know its action (a snapshot made by an older forkd)."""
    missing = agent.lacks(*needed)
    for name in missing:  # one the image lacks, whatever the agent's version: the request's mistake
        cap = capabilities.CAPABILITIES.get(name)
        if cap is not None and cap.lacking and agent.agent_version >= cap.since:
            raise InvalidRequest(f"{subject} cannot run {cap.feature}: {cap.lacking}")
    if missing:
        known = capabilities.CAPABILITIES
        what = ", ".join(known[name].feature if name in known else name for name in missing)
        raise Conflict(f"{subject} runs guest agent version {agent.agent_version}, which predates "
                       f"{what}: create its snapshot again with this version of forkd")


def checked_reply(shape: type[T], result: Mapping[str, Any], action: str) -> T:
    """``result`` (an answer to ``action``) as a ``shape``, or a GuestError naming the field that
    does not fit: the 502 of a guest that lies."""
    try:
        return schema.check(shape, result, f"the {action} reply")
    except schema.ProtocolError as exc:
        raise GuestError(f"guest agent sent a malformed answer: {exc}") from None


def _end_check(shape: type[Any], action: str) -> Any:
    """A stream's check of its last reply (``AgentStream``'s ``end``)."""
    return functools.partial(checked_reply, shape, action=action)


class AgentClient(AgentTransport):
    """The typed calls. The transport's ``call``, ``open_stream`` and ``notify`` take any action;
    the rest of the daemon uses these instead (``AgentGateway`` offers nothing else)."""

    async def _ask(self, action: str, shape: type[T], req: Mapping[str, Any], timeout: Timeout) -> T:
        return checked_reply(shape, await self.call(action, timeout=timeout, **req), action)

    # ------------------------------------------------------------- base actions

    async def ping(self, timeout: Timeout = 30.0) -> messages.PingReply:
        return await self._ask(protocol.PING, messages.PingReply, {}, timeout)

    async def capabilities(self, timeout: Timeout = 30.0) -> Capabilities:
        """What this agent can do (one ping)."""
        return Capabilities.of(await self.ping(timeout))

    async def exec(self, req: messages.ExecRequest, timeout: Timeout) -> messages.ExecReply:
        return await self._ask(protocol.EXEC, messages.ExecReply, req, timeout)

    async def eval(self, req: messages.EvalRequest, timeout: Timeout) -> messages.EvalReply:
        return await self._ask(protocol.EVAL, messages.EvalReply, req, timeout)

    async def eval_cancel(self, timeout: Timeout = 30.0) -> messages.EvalCancelReply:
        return await self._ask(protocol.EVAL_CANCEL, messages.EvalCancelReply, {}, timeout)

    async def restored_with(self, req: messages.RestoredRequest, timeout: Timeout) -> messages.RestoredReply:
        return await self._ask(protocol.RESTORED, messages.RestoredReply, req, timeout)

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
        return await self._ask(protocol.SYNC, messages.SyncReply, {}, timeout)

    async def fsfreeze(self, timeout: Timeout, mounts: Sequence[str] = ()) -> messages.FsfreezeReply:
        """Freeze the root filesystem, and ``mounts`` (an agent with CAP_FREEZE_MOUNTS: ask first)."""
        req: messages.FsfreezeRequest = {"mounts": list(mounts)} if mounts else {}
        return await self._ask(protocol.FSFREEZE, messages.FsfreezeReply, req, timeout)

    # ------------------------------------------------------------- shared volumes

    async def vol_mount(self, req: volume_messages.VolMountRequest, timeout: Timeout
                        ) -> volume_messages.VolMountReply:
        return await self._ask(protocol.VOL_MOUNT, volume_messages.VolMountReply, req, timeout)

    async def vol_poll(self, req: volume_messages.VolPollRequest, timeout: Timeout
                       ) -> volume_messages.VolPollReply:
        """The ops the guest's FUSE server has queued for the host (held by the agent up to wait_secs)."""
        reply = await self._ask(protocol.VOL_POLL, volume_messages.VolPollReply, req, timeout)
        if len(reply["ops"]) > volume_messages.MAX_POLL_OPS:
            raise GuestError(f"guest agent sent more than {volume_messages.MAX_POLL_OPS} volume ops at once")
        return reply

    def vol_reply(self, notice: volume_messages.VolReplyNotice) -> None:
        self.notify(protocol.VOL_REPLY, **notice)

    async def fsthaw(self, timeout: Timeout) -> messages.FsthawReply:
        return await self._ask(protocol.FSTHAW, messages.FsthawReply, {}, timeout)

    async def pid1_defaults(self, req: messages.Pid1DefaultsRequest,
                            timeout: Timeout) -> messages.Pid1DefaultsReply:
        """PID 1's environment and cwd (CAP_PID1_DEFAULTS: ask first; older agents took an eval)."""
        return await self._ask(protocol.PID1_DEFAULTS, messages.Pid1DefaultsReply, req, timeout)

    # -------------------------------------------------------------------- files

    async def file_stat(self, req: messages.FileStatRequest, timeout: Timeout) -> messages.FileInfo:
        return await self._ask(protocol.FILE_STAT, messages.FileInfo, req, timeout)

    async def file_list(self, req: messages.FileListRequest, timeout: Timeout) -> messages.FileListReply:
        return await self._ask(protocol.FILE_LIST, messages.FileListReply, req, timeout)

    async def file_mkdir(self, req: messages.FileMkdirRequest, timeout: Timeout) -> messages.FileMkdirReply:
        return await self._ask(protocol.FILE_MKDIR, messages.FileMkdirReply, req, timeout)

    async def file_remove(self, req: messages.FileRemoveRequest,
                          timeout: Timeout) -> messages.FileRemoveReply:
        return await self._ask(protocol.FILE_REMOVE, messages.FileRemoveReply, req, timeout)

    async def file_read(self, req: messages.FileReadRequest, timeout: Timeout) -> messages.FileReadReply:
        return await self._ask(protocol.FILE_READ, messages.FileReadReply, req, timeout)

    async def file_write_open(self, req: messages.FileWriteOpenRequest,
                              timeout: Timeout) -> messages.FileWriteOpenReply:
        return await self._ask(protocol.FILE_WRITE_OPEN, messages.FileWriteOpenReply, req, timeout)

    async def file_write(self, req: messages.FileWriteRequest, timeout: Timeout) -> messages.FileWriteReply:
        return await self._ask(protocol.FILE_WRITE, messages.FileWriteReply, req, timeout)

    async def file_write_close(self, req: messages.FileWriteCloseRequest,
                               timeout: Timeout) -> messages.FileInfo | messages.FileWriteCloseAborted:
        """The committed file's FileInfo, or ``{"aborted": true}``."""
        if req["commit"]:
            return await self._ask(protocol.FILE_WRITE_CLOSE, messages.FileInfo, req, timeout)
        return await self._ask(protocol.FILE_WRITE_CLOSE, messages.FileWriteCloseAborted, req, timeout)

    async def file_move(self, req: messages.FileMoveRequest, timeout: Timeout) -> messages.FileInfo:
        return await self._ask(protocol.FILE_MOVE, messages.FileInfo, req, timeout)

    # ----------------------------------------------------------------- watchers

    async def watch_create(self, req: messages.WatchCreateRequest,
                           timeout: Timeout) -> messages.WatchCreateReply:
        return await self._ask(protocol.WATCH, messages.WatchCreateReply, req, timeout)

    async def watch_events(self, req: messages.WatchEventsRequest,
                           timeout: Timeout) -> messages.WatchEventsReply:
        return await self._ask(protocol.WATCH, messages.WatchEventsReply, req, timeout)

    async def watch_remove(self, req: messages.WatchRemoveRequest,
                           timeout: Timeout) -> messages.WatchRemoveReply:
        return await self._ask(protocol.WATCH, messages.WatchRemoveReply, req, timeout)

    # ---------------------------------------------------------------- processes

    async def proc_start(self, req: process_messages.ProcStartRequest,
                         timeout: Timeout) -> process_messages.ProcessInfo:
        """A background process; its ProcessInfo (``proc_start_stream`` streams one instead)."""
        return await self._ask(protocol.PROC_START, process_messages.ProcessInfo, req, timeout)

    async def proc_start_stream(self, req: process_messages.ProcStartRequest) -> AgentStream:
        """A process, streamed from its start; the stream ends with its ``ProcExit``."""
        return await self.open_stream(protocol.PROC_START, {**req, "stream": True},
                                      end=_end_check(process_messages.ProcExit, protocol.PROC_START))

    async def proc_attach(self, req: process_messages.ProcAttachRequest) -> AgentStream:
        """A running process's stream; it ends with its ``ProcExit``."""
        return await self.open_stream(protocol.PROC_ATTACH, req,
                                      end=_end_check(process_messages.ProcExit, protocol.PROC_ATTACH))

    async def proc_list(self, timeout: Timeout) -> process_messages.ProcListReply:
        return await self._ask(protocol.PROC_LIST, process_messages.ProcListReply, {}, timeout)

    async def proc_info(self, req: process_messages.ProcInfoRequest,
                        timeout: Timeout) -> process_messages.ProcessInfo:
        return await self._ask(protocol.PROC_INFO, process_messages.ProcessInfo, req, timeout)

    async def proc_input(self, req: process_messages.ProcInputRequest,
                         timeout: Timeout) -> process_messages.ProcInputReply:
        return await self._ask(protocol.PROC_INPUT, process_messages.ProcInputReply, req, timeout)

    async def proc_signal(self, req: process_messages.ProcSignalRequest,
                          timeout: Timeout) -> process_messages.ProcSignalReply:
        return await self._ask(protocol.PROC_SIGNAL, process_messages.ProcSignalReply, req, timeout)

    def proc_signal_now(self, req: process_messages.ProcSignalRequest) -> None:
        """``proc_signal`` as a notification: sent now, never answered (dropped if disconnected)."""
        self.notify(protocol.PROC_SIGNAL, **req)

    async def proc_resize(self, req: process_messages.ProcResizeRequest,
                          timeout: Timeout) -> process_messages.ProcResizeReply:
        return await self._ask(protocol.PROC_RESIZE, process_messages.ProcResizeReply, req, timeout)

    # -------------------------------------------------------- code contexts

    async def context_run(self, req: code_messages.ContextRunRequest,
                          timeout: Timeout) -> code_messages.ContextRunReply:
        return await self._ask(protocol.CONTEXT, code_messages.ContextRunReply, req, timeout)

    async def context_create(self, req: code_messages.ContextCreateRequest,
                             timeout: Timeout) -> code_messages.ContextInfo:
        return await self._ask(protocol.CONTEXT, code_messages.ContextInfo, req, timeout)

    async def context_list(self, timeout: Timeout) -> code_messages.ContextListReply:
        return await self._ask(protocol.CONTEXT, code_messages.ContextListReply, {"op": "list"}, timeout)

    async def context_remove(self, req: code_messages.ContextRemoveRequest,
                             timeout: Timeout) -> code_messages.ContextInfo:
        return await self._ask(protocol.CONTEXT, code_messages.ContextInfo, req, timeout)

    # ------------------------------------------------------------------ kernels

    async def kernel_available(self, timeout: Timeout) -> code_messages.KernelAvailableReply:
        return await self._ask(protocol.KERNEL, code_messages.KernelAvailableReply, {"op": "available"},
                               timeout)

    async def kernel_run(self, req: code_messages.KernelRunRequest,
                         timeout: Timeout) -> code_messages.KernelEnd:
        """A cell run to its end as one call (a silent one sends no events: a template's warm cell)."""
        return await self._ask(protocol.KERNEL, code_messages.KernelEnd, req, timeout)

    async def kernel_run_stream(self, req: code_messages.KernelRunRequest) -> AgentStream:
        """A cell, streamed (a kernel stream: each event costs its line); it ends with ``KernelEnd``."""
        return await self.open_stream(protocol.KERNEL, req, line_cost=True,
                                      end=_end_check(code_messages.KernelEnd, protocol.KERNEL))

    async def kernel_interrupt(self, req: code_messages.KernelInterruptRequest,
                               timeout: Timeout) -> code_messages.KernelInterruptReply:
        return await self._ask(protocol.KERNEL, code_messages.KernelInterruptReply, req, timeout)

    async def kernel_stop(self, req: code_messages.KernelStopRequest,
                          timeout: Timeout) -> code_messages.KernelEnd:
        """Shut a context's kernel down, or restart it."""
        return await self._ask(protocol.KERNEL, code_messages.KernelEnd, req, timeout)
