"""The ops a shared volume's FUSE server waits on the host for, and the host's polls that take them.

Its own module because it is the one place where the guest meets its host for a shared volume:
FUSE threads queue an op and wait for its answer (``ask``); the host's ``vol_poll`` takes what is
queued, or is held until something is (or ``wait_secs`` pass); ``vol_reply`` answers an op. An op
stays queued until answered, so a host that goes away (or a restored copy of this guest, whose host
is another) loses nothing: the next poll that asks with ``resend`` gets it again.
"""

from __future__ import annotations

import errno
import threading
from dataclasses import dataclass, field
from typing import Any

from forkd.guest import volume_messages as vm
from forkd.guest.agent.channel import Channel
from forkd.guest.agent.fuse_wire import FuseError
from forkd.guest.volume_messages import VolOp, VolPollReply, VolReplyNotice


@dataclass
class _Pending:
    op: VolOp
    sent: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    reply: VolReplyNotice | None = None


class HostQueue:
    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._next_seq = 1
        self._poll: tuple[Any, threading.Timer] | None = None  # the host's waiting vol_poll

    def ask(self, op: dict[str, Any]) -> VolReplyNotice:
        """Queue one op for the host and wait for its answer; its errno raised as ``FuseError``."""
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            op["seq"] = seq
            pending = _Pending(op)  # type: ignore[arg-type]  # the op's fields are set by its caller
            self._pending[seq] = pending
            waiting, ops = self._poll, []
            if waiting is not None:
                self._poll = None
                ops = self._take()
        if waiting is not None:
            waiting[1].cancel()
            self._channel.reply(waiting[0], {"ops": ops})
        if not pending.done.wait(vm.OP_TIMEOUT_SECS):
            with self._lock:
                self._pending.pop(seq, None)
            raise FuseError(errno.EIO)
        reply = pending.reply
        assert reply is not None
        if reply["errno"]:
            raise FuseError(reply["errno"])
        return reply

    def poll(self, req_id: Any, resend: bool, wait_secs: float) -> VolPollReply | None:
        """The ops queued for the host, or None: the request is held and answered when one is queued
        or ``wait_secs`` pass. ``resend``: every op not yet answered is queued again."""
        timer: threading.Timer | None = None
        with self._lock:
            if resend:
                for p in self._pending.values():
                    p.sent = False
            old, self._poll = self._poll, None
            ops = self._take()
            if not ops:
                timer = threading.Timer(wait_secs, self._expire, args=(req_id,))
                timer.daemon = True
                self._poll = (req_id, timer)
        if old is not None:  # the host asks again: its earlier request is answered (empty), not lost
            old[1].cancel()
            self._channel.reply(old[0], {"ops": []})
        if timer is None:
            return {"ops": ops}
        timer.start()
        return None

    def answer(self, notice: VolReplyNotice) -> None:
        with self._lock:
            pending = self._pending.pop(notice["seq"], None)
        if pending is not None:
            pending.reply = notice
            pending.done.set()

    def host_gone(self) -> None:
        """The host that polled went away (or this is a restored copy): its waiting poll is nobody's,
        and the ops it took are handed out again to the next one."""
        with self._lock:
            poll, self._poll = self._poll, None
            for p in self._pending.values():
                p.sent = False
        if poll is not None:
            poll[1].cancel()
            self._channel.forget(poll[0])

    def _expire(self, req_id: Any) -> None:
        with self._lock:
            if self._poll is None or self._poll[0] != req_id:
                return
            self._poll = None
        self._channel.reply(req_id, {"ops": []})

    def _take(self) -> list[VolOp]:
        """Ops not yet handed out, oldest first, within one answer's bounds (lock held)."""
        ops: list[VolOp] = []
        data = 0
        for p in self._pending.values():
            if p.sent:
                continue
            size = len(p.op.get("data", ""))
            if ops and (len(ops) >= vm.MAX_POLL_OPS or data + size > vm.MAX_POLL_DATA * 4 // 3):
                break
            p.sent = True
            ops.append(p.op)
            data += size
        return ops


__all__ = ["HostQueue"]
