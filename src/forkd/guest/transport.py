"""The line transport of the guest agent protocol (``forkd.guest.protocol``), over the VM's agent socket.

Framing, bounds, throttling and the routing of replies and events to the requests that wait for
them: nothing here knows what an action means. The typed calls (``forkd.guest.client.AgentClient``)
are built on it, as QEMU's ``QMPClient`` is on its ``AsyncProtocol``.

One connection per VM, multiplexed: every request carries an id and its reply may come back in
any order, so exec, eval and file calls to one sandbox run concurrently, and process streams
flow beside them.

The guest is not trusted, and this is the daemon's side of its channel, so
everything read from it is bounded:

* a line longer than ``protocol.MAX_REPLY_LINE`` is dropped as it arrives, never
  buffered whole (the call it answers, if its id can be read, fails at once);
* a line that is not a reply or an event we wait for (including one that
  does not decode, or nests deeper than ``bounds.MAX_JSON_DEPTH``, which is
  dropped before the parser sees it) is dropped and counted
  (``garbage_bytes``); past a small budget per second the connection stops
  being read for a while, so a flood costs the daemon little CPU and other
  sandboxes nothing (only this VM's calls wait);
* an exec's output is collected only up to the cap it asked for; a stream holds
  at most its window (``protocol.STREAM_WINDOW``) of events: the agent sends no
  more until this side has consumed and acknowledged them, and an agent that
  sends more anyway has the stream failed rather than buffered.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import contextlib
import itertools
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Self

from forkd import bounds, jsondepth
from forkd.errors import Conflict, ForkdError, GuestError, InvalidRequest, NotFound
from forkd.guest import protocol

# The guest's error text goes into API answers and logs: keep only this much of it.
MAX_ERROR_TEXT = 2000
# Bytes of lines nobody waits for that a VM may send per second, and at once.
GARBAGE_RATE = 256 << 10
GARBAGE_BURST = 1 << 20
# At most this long without reading a VM that floods its channel, at a time.
MAX_THROTTLE_SECS = 1.0
# A stream may run this far ahead of its window (the start event, rounding) before it is failed.
WINDOW_SLACK = 4 * protocol.EVENT_COST_MIN
EndCheck = Callable[[dict[str, Any]], dict[str, Any]]  # checks a stream's last reply (GuestError)
# The agent writes the id first ({"id":7,...}): enough to fail a call whose reply is too long.
_ID_PREFIX = re.compile(rb'^\{"id":\s*(\d{1,18})\s*,')

# Refusals the agent marks with a kind are the caller's mistake, not the guest's failure.
_ERROR_OF_KIND: dict[str, type[ForkdError]] = {
    protocol.NOT_FOUND: NotFound,
    protocol.INVALID: InvalidRequest,
    protocol.CONFLICT: Conflict,
}


def error_of(reply: dict[str, Any], action: str) -> ForkdError:
    """The exception an error reply stands for."""
    text = str(reply.get("error", "unknown error"))[:MAX_ERROR_TEXT]
    kind = reply.get("kind")
    error = _ERROR_OF_KIND.get(kind) if isinstance(kind, str) else None
    if error is not None:
        return error(text)
    if text.startswith("unknown action"):
        text += (f" (the sandbox's guest agent predates {action!r}: create its snapshot again "
                 "with this version of forkd)")
    return GuestError(f"guest agent: {text}")


def decode_output(ev: dict[str, Any], most: int = protocol.OUTPUT_CHUNK) -> bytes:
    """The bytes of a stdout/stderr event, checked: base64 of at most ``most`` bytes."""
    encoded = ev.get("data")
    if not isinstance(encoded, str) or len(encoded) > 4 * (most // 3 + 1):
        raise GuestError("guest agent sent a malformed or oversized output event")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise GuestError("guest agent sent output that is not base64") from None


# Calls the agent holds until it has something to say: not requests under way (``in_flight``).
LISTENING = frozenset({protocol.VOL_POLL})


class _Call:
    """A request awaiting its one reply; an exec's also collects the output events ahead of it."""

    def __init__(self, action: str, future: asyncio.Future[dict[str, Any]], output_cap: int | None) -> None:
        self.action = action
        self.future = future
        self.output_cap = output_cap  # None: events are not expected
        self.output: dict[str, list[bytes]] = {protocol.EV_STDOUT: [], protocol.EV_STDERR: []}
        self.sizes = {protocol.EV_STDOUT: 0, protocol.EV_STDERR: 0}

    def on_event(self, ev: dict[str, Any]) -> bool:
        """Keep an output event; False if it is not one this call can take."""
        kind = ev.get("type")
        if self.output_cap is None or kind not in self.output:
            return False
        data = decode_output(ev)
        self.sizes[kind] += len(data)
        if self.sizes[kind] > self.output_cap:
            raise GuestError(f"guest agent sent more {kind} than the {self.output_cap} bytes asked for")
        self.output[kind].append(data)
        return True

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


class AgentStream:
    """The events of one streaming request, in order, then its end; at most a window held.

    Iterate it (``async for event in stream``): each event is a dict with a
    ``type``; output events carry ``data`` as bytes. The reply that ends the
    stream is the last event (``{"type": "exit", ...}``); an error reply raises
    the matching ``ForkdError``. ``aclose`` detaches from an unfinished stream.
    """

    def __init__(self, client: AgentTransport, req_id: int, action: str, line_cost: bool = False,
                 end: EndCheck | None = None) -> None:
        self._client = client
        self.id = req_id
        self.action = action
        self._end_check = end  # checks the reply that ends it against its type (client.py)
        # A kernel stream: events are JSON as they are, each costing its line's length.
        self.line_cost = line_cost
        self._events: collections.deque[dict[str, Any]] = collections.deque()
        self._wakeup: asyncio.Future[None] | None = None
        self._end: dict[str, Any] | BaseException | None = None
        self._finished = False
        self._outstanding = 0  # window cost the agent has sent and we have not acknowledged
        self._unacked = 0  # cost consumed but not acknowledged yet

    # ---- fed by the client's reader

    def on_event(self, ev: dict[str, Any], line_bytes: int = 0) -> None:
        if self.line_cost:
            cost = protocol.line_cost(line_bytes)
        elif ev.get("type") in (protocol.EV_STDOUT, protocol.EV_STDERR):
            ev = {**ev, "data": decode_output(ev)}
            cost = protocol.event_cost(len(ev["data"]))
        else:
            cost = protocol.event_cost(0)
        self._outstanding += cost
        if self._outstanding > protocol.STREAM_WINDOW + WINDOW_SLACK:
            raise GuestError("guest agent sent more than the stream's window without acknowledgement")
        ev["_cost"] = cost
        self._events.append(ev)
        self._wake()

    def on_end(self, end: dict[str, Any] | BaseException) -> None:
        self._end = end
        self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    # ---- consumed by the caller

    def __aiter__(self) -> AgentStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        while not self._events:
            if self._finished:
                raise StopAsyncIteration
            end = self._end
            if end is not None:
                self._finished = True
                if isinstance(end, BaseException):
                    raise end
                if not end.get("ok"):
                    raise error_of(end, self.action)
                result = end.get("result")
                if not isinstance(result, dict):
                    raise GuestError("guest agent ended a stream with a malformed reply")
                return result if self._end_check is None else self._end_check(result)
            self._wakeup = asyncio.get_running_loop().create_future()
            try:
                await self._wakeup
            finally:
                self._wakeup = None
        ev = self._events.popleft()
        cost = ev.pop("_cost")
        self._outstanding -= cost
        self._unacked += cost
        # A kernel event may need the whole window: once caught up, give it all back.
        caught_up = self.line_cost and not self._events
        if (self._unacked >= protocol.STREAM_WINDOW // 4 or caught_up) and self._end is None:
            self._client.notify(protocol.PROC_ACK, stream=self.id, bytes=self._unacked)
            self._unacked = 0
        return ev

    async def aclose(self) -> None:
        """Stop watching: the agent is told (a stream that has ended needs nothing)."""
        self.close()

    def close(self) -> None:
        if self._finished:
            return
        self._finished = True
        self._events.clear()
        if self._client.forget_stream(self.id) and self._end is None:
            self._client.notify(protocol.PROC_DETACH, stream=self.id)


class _Protocol(asyncio.Protocol):
    def __init__(self, client: AgentTransport) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f"guest agent connection failed: {exc}" if exc else "guest agent connection closed"
        self.client.connection_lost(reason)

    def pause_writing(self) -> None:
        self.client.pause_writing()

    def resume_writing(self) -> None:
        self.client.resume_writing()


def _expire(future: asyncio.Future[Any]) -> None:
    """A call's timer: its reply did not come in time."""
    if not future.done():
        future.set_exception(TimeoutError())


class AgentTransport:
    """One multiplexed, bounded connection to a VM's agent: untyped requests (``call``, ``stream``,
    ``notify``) and their replies."""

    def __init__(self, path: Path, max_line: int = protocol.MAX_REPLY_LINE) -> None:
        self.path = path
        self.max_line = max_line
        self._ids = itertools.count(1)
        self._calls: dict[int, _Call] = {}
        self._streams: dict[int, AgentStream] = {}
        self._transport: asyncio.Transport | None = None
        self._closed_reason: str | None = None
        self._can_write: asyncio.Event | None = None
        self._buf = bytearray()
        self._scanned = 0
        self._discarding = False
        # What a flood has cost: lines dropped and their bytes (for tests and metrics).
        self.garbage_lines = 0
        self.garbage_bytes = 0
        self._budget = float(GARBAGE_BURST)
        self._budget_at = time.monotonic()
        self._throttled = False

    async def connect(self) -> Self:
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.create_unix_connection(lambda: _Protocol(self), str(self.path))
        except OSError as exc:
            raise GuestError(f"cannot connect to the guest agent socket {self.path}: {exc}") from exc
        self._transport = transport
        self._can_write = asyncio.Event()
        self._can_write.set()
        return self

    @property
    def in_flight(self) -> int:
        """Calls awaiting their answer plus streams open: what a hibernation would cut off. A shared
        volume's held poll is not one: it is the daemon listening, and asks the next VM again."""
        return sum(1 for c in self._calls.values() if c.action not in LISTENING) + len(self._streams)

    @property
    def connected(self) -> bool:
        return self._transport is not None and self._closed_reason is None

    # ------------------------------------------------------------- reading

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            nl = data.find(b"\n")
            if nl < 0:
                self._garbage(len(data))
                return
            self._garbage(nl + 1)
            self._discarding = False
            data = data[nl + 1:]
        self._buf += data
        while True:
            nl = self._buf.find(b"\n", self._scanned)
            if nl < 0:
                self._scanned = len(self._buf)
                if len(self._buf) > self.max_line:
                    self._oversized()
                return
            line = bytes(self._buf[:nl])
            del self._buf[:nl + 1]
            self._scanned = 0
            if len(line) > self.max_line:
                self._refuse_oversized(line)
            elif line.strip():
                self._dispatch(line)

    def _oversized(self) -> None:
        """A line past the limit and still growing: fail its call, drop it up to its newline."""
        self._refuse_oversized(bytes(self._buf[:64]), len(self._buf))
        self._buf.clear()
        self._scanned = 0
        self._discarding = True

    def _refuse_oversized(self, head: bytes, size: int | None = None) -> None:
        self._garbage(size if size is not None else len(head) + 1)
        match = _ID_PREFIX.match(head)
        if match is None:
            return
        error = GuestError(f"guest agent sent a reply longer than {self.max_line} bytes; it was dropped")
        req_id = int(match.group(1))
        call = self._calls.pop(req_id, None)
        if call is not None:
            call.fail(error)
        stream = self._streams.pop(req_id, None)
        if stream is not None:
            stream.on_end(error)

    def _dispatch(self, line: bytes) -> None:
        # A line that nests too deeply would make the parser raise RecursionError out of the
        # reader (or worse): it is garbage like any other undecodable line, and the channel stays.
        msg = None if jsondepth.too_deep(line, bounds.MAX_JSON_DEPTH) else protocol.decode_reply(line)
        if msg is None:
            self._garbage(len(line) + 1)
            return
        req_id = msg["id"]
        try:
            if "event" in msg:
                ev = msg["event"]
                stream = self._streams.get(req_id)
                call = self._calls.get(req_id) if stream is None else None
                if not isinstance(ev, dict):
                    self._garbage(len(line) + 1)
                elif stream is not None:
                    stream.on_event(ev, len(line))
                elif call is None or not call.on_event(ev):
                    self._garbage(len(line) + 1)  # late (a detached stream), or not ours
                return
            call = self._calls.pop(req_id, None)
            if call is not None:
                if not call.future.done():
                    call.future.set_result(msg)
                return
            stream = self._streams.pop(req_id, None)
            if stream is not None:
                stream.on_end(msg)
                return
            self._garbage(len(line) + 1)  # the reply to a call that gave up waiting
        except GuestError as exc:  # an event that broke its call's or its stream's bounds
            self._garbage(len(line) + 1)
            bad_call = self._calls.pop(req_id, None)
            if bad_call is not None:
                bad_call.fail(exc)
            bad_stream = self._streams.pop(req_id, None)
            if bad_stream is not None:
                bad_stream.on_end(exc)
                self.notify(protocol.PROC_DETACH, stream=req_id)

    def _garbage(self, size: int) -> None:
        """Count a dropped line; a VM over its budget is not read for a while."""
        self.garbage_lines += 1
        self.garbage_bytes += size
        now = time.monotonic()
        self._budget = min(float(GARBAGE_BURST), self._budget + (now - self._budget_at) * GARBAGE_RATE)
        self._budget_at = now
        self._budget -= size
        if self._budget < 0 and not self._throttled and self._transport is not None:
            self._throttled = True
            self._transport.pause_reading()
            delay = min(MAX_THROTTLE_SECS, -self._budget / GARBAGE_RATE)
            asyncio.get_running_loop().call_later(delay, self._resume_reading)

    def _resume_reading(self) -> None:
        self._throttled = False
        if self._transport is not None and self._closed_reason is None:
            self._transport.resume_reading()

    def connection_lost(self, reason: str) -> None:
        self._closed_reason = reason
        error = GuestError(reason)
        calls, self._calls = self._calls, {}
        for call in calls.values():
            call.fail(error)
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.on_end(error)
        if self._can_write is not None:
            self._can_write.set()

    # ------------------------------------------------------------- writing

    def pause_writing(self) -> None:
        if self._can_write is not None:
            self._can_write.clear()

    def resume_writing(self) -> None:
        if self._can_write is not None:
            self._can_write.set()

    async def _send(self, message: dict[str, Any]) -> None:
        if self._closed_reason:  # closed (or lost): a closed client does not reconnect
            raise GuestError(self._closed_reason)
        if self._transport is None:
            await self.connect()
        assert self._transport is not None and self._can_write is not None
        self._transport.write(protocol.encode(message))
        if not self._can_write.is_set():  # a large upload piece: wait for the socket to drain
            await self._can_write.wait()
            if self._closed_reason:
                raise GuestError(self._closed_reason)

    def notify(self, action: str, **args: Any) -> None:
        """A request that is never answered; written now, or dropped if the connection is gone."""
        if self._transport is not None and self._closed_reason is None:
            self._transport.write(protocol.encode(protocol.notification(action, args)))

    # --------------------------------------------------------------- calls

    async def call(self, action: str, timeout: float | None = 60.0, **args: Any) -> dict[str, Any]:
        """Send one request; return its ``result`` or raise GuestError with the agent's message.

        ``timeout`` is how long the host waits for the answer (None: for ever). The
        agent enforces exec's and eval's own ``timeout_secs`` argument; wait
        ``protocol.REPLY_GRACE_SECS`` longer than that, to hear it do so. An
        exec's output, which the agent streams ahead of its reply, is collected
        (up to ``max_output_bytes`` a stream) and returned as text in ``stdout``
        and ``stderr``, as ever.
        """
        req_id = next(self._ids)
        output_cap = None
        if action == protocol.EXEC:
            output_cap = args.get("max_output_bytes", protocol.EXEC_OUTPUT_CAP)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        call = _Call(action, future, output_cap)
        self._calls[req_id] = call
        timer: asyncio.TimerHandle | None = None
        try:
            await self._send(protocol.request(req_id, action, args))
            # One timer on the reply's own future (wait_for's waiter future and callbacks cost more
            # on every call, and every request to a sandbox is one).
            if timeout is not None:
                timer = loop.call_later(timeout, _expire, future)
            reply = await future
        except TimeoutError:
            raise GuestError(f"guest agent did not answer {action} within {timeout:g}s") from None
        except OSError as exc:
            raise GuestError(f"guest agent connection failed: {exc}") from exc
        finally:
            if timer is not None:
                timer.cancel()
            self._calls.pop(req_id, None)
        if not reply.get("ok"):
            raise error_of(reply, action)
        result = reply.get("result")
        if not isinstance(result, dict):
            raise GuestError(f"guest agent sent a malformed answer to {action}")
        if output_cap is not None:
            for name, pieces in call.output.items():
                if not isinstance(result.get(name), str):  # an agent older than "4" sends it inline
                    result[name] = b"".join(pieces).decode("utf-8", "replace")
        return result

    async def open_stream(self, action: str, args: Mapping[str, Any], line_cost: bool = False,
                          end: EndCheck | None = None) -> AgentStream:
        """A streaming request (``AgentStream``); ``line_cost``: a kernel stream; ``end``: its check."""
        req_id = next(self._ids)
        stream = AgentStream(self, req_id, action, line_cost, end)
        self._streams[req_id] = stream
        try:
            await self._send(protocol.request(req_id, action, dict(args)))
        except BaseException:
            self._streams.pop(req_id, None)
            raise
        return stream

    def forget_stream(self, req_id: int) -> bool:
        """Stop routing a stream's events; True if it was still open here."""
        return self._streams.pop(req_id, None) is not None

    async def close(self) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()
            with contextlib.suppress(Exception):
                await asyncio.sleep(0)  # let connection_lost run
        if self._closed_reason is None:
            self.connection_lost("guest agent connection closed")
