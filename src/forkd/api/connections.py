"""Connections the daemon accepts: bounded in number and in idle time, with a quiet log.

Anyone who can reach the port can open TCP connections without a token. Left
alone, 20,000 idle ones used every file descriptor of the daemon: ``/healthz``
and authenticated calls timed out, and asyncio logged "Too many open files"
430,000 times in 45 s. So:

* a new connection must start its first request within the head timeout
  (``--header-timeout``, ``HEAD_TIMEOUT_SECS`` by default), or it is closed, as a
  kept-alive one is after uvicorn's keep-alive timeout;
* a request head (request line and headers) once begun must be complete within
  the same head timeout, or the connection is answered 408 and closed. uvicorn has
  no such deadline: its keep-alive timer stops at the first byte, so 600 connections
  that each sent 9 bytes and stopped held every slot for as long as they liked
  (issue 38, slowloris);
* at most a quarter of the daemon's file-descriptor limit is spent on client
  connections (the rest is for QEMU sockets, disks and the registry). At that
  cap, a new connection evicts the connection with the oldest unfinished head,
  else the one idle the longest; a request in flight is never evicted. Only when
  none is idle or partial is the new one refused;
* a reserve of the cap (``RESERVE_SHARE``) is kept for ``/healthz`` and for requests
  that carry a credential: once the others in flight would take it, another one is
  answered 503 at once (httptools only: the h11 fallback has the cap and deadlines);
* a log line repeated within ``LogRepeatFilter.window`` is counted, not written.

* a request's head (request line and headers) may hold at most ``MAX_HEAD_BYTES``,
  as h11 bounds it; a longer one is answered 431 and the connection closed.

uvicorn's HTTP/1.1 protocols are extended rather than replaced: only their connection
bookkeeping changes. The httptools one (a C parser) is served when installed, because it
costs the daemon less CPU per request than h11 (pure Python); ``GuardedH11Protocol``
stays for a daemon without it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from typing import Any, cast

from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is not installed: h11 serves
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

from forkd.api.settings import DEFAULT_HEADER_TIMEOUT

log = logging.getLogger("forkd.connections")

# Seconds a new connection may stay silent before its first request, and a request head, once
# begun, has to be complete (the default of --header-timeout).
HEAD_TIMEOUT_SECS = DEFAULT_HEADER_TIMEOUT
# The share of RLIMIT_NOFILE that client connections may hold.
CONNECTION_SHARE = 4
MIN_CONNECTIONS = 16
# 1/RESERVE_SHARE of the cap (at least MIN_RESERVE) is never taken by requests in flight that
# carry no credential (and are not /healthz): those are the ones anyone can hold open.
RESERVE_SHARE = 8
MIN_RESERVE = 8
# A request carrying one of these is served from the reserve. Its credential is checked by the
# app, at once and before any work: a forged one is a quick 401, which frees the slot.
CREDENTIAL_HEADERS = frozenset({b"authorization", b"x-api-key", b"x-access-token",
                                b"e2b-traffic-access-token"})
RESERVED_PATHS = frozenset({b"/healthz"})
# The listen backlog, which is also how many sockets asyncio accepts in one go. Sockets
# are over the cap for a loop turn or two: accepted but not yet through connection_made,
# or evicted but not yet closed (asyncio closes a transport's socket on its next turn).
# Up to four batches can be in that state during a burst, and they must fit, with the
# daemon's own fds, in the three quarters of the limit the cap leaves: 4 x 512 did not
# at a limit of 2,048 (one EMFILE on accept, in CI, on a loaded host); 4 x 128 does.
ACCEPT_BATCH = 128
# A request line and headers larger than this are refused (h11's own default bound).
MAX_HEAD_BYTES = 16 * 1024


def raise_fd_limit() -> int:
    """Lift the soft file-descriptor limit to the hard one; the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the file-descriptor limit from %d to %d: %s", soft, target, exc)
    return soft


def connection_cap() -> int:
    """How many client connections the daemon holds at once (read each time: ``prlimit`` may change it)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(MIN_CONNECTIONS, soft // CONNECTION_SHARE)


def open_share(cap: int) -> int:
    """How many of ``cap`` connections may have a request without a credential in flight."""
    return cap - min(cap // 2, max(MIN_RESERVE, cap // RESERVE_SHARE))


class _ConnectionGuard:
    """The first-request and head timeouts and the connection cap, for either of uvicorn's protocols.

    Mixed in before the protocol class; it uses only what both share: ``connections``
    (the server's set), ``cycle`` (the request in flight, once its head is complete),
    ``timeout_keep_alive_task``/``_handler`` and ``on_response_complete``.
    """

    refused = 0  # connections closed at once: at the cap with none idle (all protocols)
    evicted = 0  # idle or partial connections closed to make room
    head_timeouts = 0  # connections closed for a head not complete in time
    head_timeout = HEAD_TIMEOUT_SECS  # set per server by http_protocol()

    connections: set[Any]
    cycle: Any
    transport: asyncio.Transport
    timeout_keep_alive_task: asyncio.TimerHandle | None
    loop: asyncio.AbstractEventLoop

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.idle_since = time.monotonic()
        self.head_since = 0.0
        self._head_timer: asyncio.TimerHandle | None = None
        # The request in flight carries no credential and is not /healthz (see RESERVE_SHARE).
        self.open_request = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if len(self.connections) >= connection_cap() and not self._evict_one():
            _ConnectionGuard.refused += 1
            cast(asyncio.Transport, transport).abort()
            return
        super().connection_made(transport)  # type: ignore[misc]
        # Like a kept-alive connection: it must start a request within the timeout.
        self.idle_since = time.monotonic()
        self.timeout_keep_alive_task = self.loop.call_later(self.head_timeout,
                                                            self.timeout_keep_alive_handler)

    def data_received(self, data: bytes) -> None:
        # uvicorn's own stops the keep-alive timer at the first byte, and arms nothing in its place.
        super().data_received(data)  # type: ignore[misc]
        if self._head_timer is None:
            # Bytes arrived and no request is in flight: a head began and is not complete. Armed
            # only then, so a head that arrives in one read (the usual case) costs no timer.
            if self.waiting_for_head() and self in self.connections and not self.transport.is_closing():
                self.head_since = time.monotonic()
                self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)
        elif not self.waiting_for_head() or self not in self.connections:
            self.stop_head_timer()  # complete (or upgraded to a WebSocket, or closed)

    def waiting_for_head(self) -> bool:
        """No request in flight: what arrives now is (part of) the next head."""
        return self.cycle is None or bool(self.cycle.response_complete)

    @property
    def head_pending(self) -> bool:
        """Whether a request head has begun and not completed (its deadline is running)."""
        return self._head_timer is not None

    def stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self.waiting_for_head():
            return
        _ConnectionGuard.head_timeouts += 1
        error = f"request head not complete within {self.head_timeout:g} s"
        self._answer_and_close(b"408 Request Timeout", error)

    def _answer_and_close(self, status: bytes, error: str) -> None:
        body = json.dumps({"error": error}).encode()
        self.transport.write(b"HTTP/1.1 %s\r\ncontent-type: application/json\r\nconnection: close\r\n"
                             b"content-length: %d\r\n\r\n%s" % (status, len(body), body))
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_head_timer()
        super().connection_lost(exc)  # type: ignore[misc]

    def timeout_keep_alive_handler(self) -> None:
        super().timeout_keep_alive_handler()  # type: ignore[misc]

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self.idle_since = time.monotonic()

    def _evict_one(self) -> bool:
        """Close the connection whose head began longest ago, else the one that has waited
        longest for a request; False if none is partial or idle."""
        partial: _ConnectionGuard | None = None
        idle: _ConnectionGuard | None = None
        for c in self.connections:
            if not isinstance(c, _ConnectionGuard):
                continue
            if c.head_pending:
                if partial is None or c.head_since < partial.head_since:
                    partial = c
            elif c.timeout_keep_alive_task is not None and (idle is None or c.idle_since < idle.idle_since):
                idle = c
        victim = partial or idle
        if victim is None:
            return False
        victim.stop_head_timer()
        victim.timeout_keep_alive_handler()  # closes the transport (a partial one too)
        victim.connections.discard(victim)  # counted free now, not when the loop gets to it
        _ConnectionGuard.evicted += 1
        return True

    def reserve_refuses(self) -> bool:
        """True if a request with no credential must not start now: the others in flight
        already take every slot outside the reserve."""
        share = open_share(connection_cap())
        if len(self.connections) <= share:  # the common case: no count needed
            return False
        in_flight = sum(1 for c in self.connections
                        if c is not self and isinstance(c, _ConnectionGuard) and c.open_request
                        and not c.waiting_for_head())
        return in_flight >= share


class GuardedH11Protocol(_ConnectionGuard, H11Protocol):
    """uvicorn's h11 protocol with a first-request timeout and a connection cap (h11 bounds the head)."""


class _CoalescingWriter:
    """What a response cycle writes with: its writes of one loop turn leave in one ``send``.

    uvicorn writes a response's head and its body separately, and on loopback each
    ``send`` costs about as much CPU as the rest of a small request together. The
    writes are held until the loop's next turn (or until ``FLUSH_BYTES`` pile up, or
    the cycle closes), then written as one; everything else is the transport's own.
    """

    FLUSH_BYTES = 64 * 1024

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._size = 0

    def write(self, data: bytes) -> None:
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(data)
        self._size += len(data)
        if self._size >= self.FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        if self._held:
            data = b"".join(self._held) if len(self._held) > 1 else self._held[0]
            self._held.clear()
            self._size = 0
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


if HttpToolsProtocol is not None:
    class GuardedHttpToolsProtocol(_ConnectionGuard, HttpToolsProtocol):
        """uvicorn's httptools protocol with the same guards, and a bound on the head.

        httptools (llhttp) itself does not bound the request line or the headers, and
        uvicorn keeps every header it is given: without ``MAX_HEAD_BYTES`` one request
        could grow the daemon's memory without end.
        """

        _credentialed = False  # the head being read carries one of CREDENTIAL_HEADERS

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._writer = _CoalescingWriter(cast(asyncio.Transport, transport), self.loop)

        def on_headers_complete(self) -> None:
            if not self.parser.should_upgrade():  # a WebSocket leaves this protocol: not counted
                reserved = self._credentialed or self.url.partition(b"?")[0] in RESERVED_PATHS
                if not reserved and self.reserve_refuses():
                    self._head_refused = True
                    self._answer_and_close(b"503 Service Unavailable",
                                           "the daemon is at its connection cap for requests without "
                                           "a credential; retry shortly")
                    raise ValueError("connection reserve")  # stops the parser, as _count_head does
                self.open_request = not reserved
            # The cycle made here answers through the coalescing writer; the protocol's
            # own writes (400s, upgrades) keep the transport itself.
            transport = self.transport
            self.transport = cast(asyncio.Transport, self._writer)
            try:
                super().on_headers_complete()
            finally:
                self.transport = transport

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_bytes = 0
            self._head_refused = False
            self._credentialed = False

        def on_url(self, url: bytes) -> None:
            self._count_head(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count_head(len(name) + len(value) + 4)
            if not self._credentialed and name.lower() in CREDENTIAL_HEADERS:
                self._credentialed = True
            super().on_header(name, value)

        def _count_head(self, size: int) -> None:
            self._head_bytes += size
            if self._head_bytes > MAX_HEAD_BYTES and not self._head_refused:
                self._head_refused = True
                self._answer_and_close(b"431 Request Header Fields Too Large",
                                       f"request line and headers exceed {MAX_HEAD_BYTES} bytes")
                # Stops the parser; uvicorn then answers 400, which send_400_response drops.
                raise ValueError("request head too large")

        def send_400_response(self, msg: str) -> None:
            if getattr(self, "_head_refused", False):
                return  # answered 431 or 503 already
            super().send_400_response(msg)


HTTP_PARSERS = ("httptools", "h11")


def http_protocol(parser: str = "httptools",
                  head_timeout: float = HEAD_TIMEOUT_SECS) -> type[asyncio.Protocol]:
    """The guarded protocol for ``parser`` (``HTTP_PARSERS``); h11's where httptools is missing.

    ``head_timeout``: seconds a begun request head has to be complete (``--header-timeout``).
    """
    chosen: type[_ConnectionGuard]
    if parser == "httptools" and HttpToolsProtocol is not None:
        chosen = GuardedHttpToolsProtocol
    else:
        if parser == "httptools":
            log.warning("httptools is not installed: serving with h11, which costs more CPU per request")
        chosen = GuardedH11Protocol
    if head_timeout != chosen.head_timeout:
        # uvicorn builds the protocol itself, from a class: the timeout travels as a class attribute.
        chosen = type(chosen.__name__, (chosen,), {"head_timeout": head_timeout})
    return cast(type[asyncio.Protocol], chosen)


class LogRepeatFilter(logging.Filter):
    """Let one record through per (logger, message) and ``window``; count the rest.

    The next record let through says how many were held back, so a flood is
    visible without writing it out.
    """

    def __init__(self, window: float = 10.0) -> None:
        super().__init__()
        self.window = window
        self._last: dict[tuple[str, str], float] = {}
        self._held: dict[tuple[str, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        # One record reaches every handler the filter sits on: decide once per record.
        decided = getattr(record, "forkd_repeat_pass", None)
        if isinstance(decided, bool):
            return decided
        passed = self._decide(record)
        record.forkd_repeat_pass = passed
        return passed

    def _decide(self, record: logging.LogRecord) -> bool:
        # The text as written (a "%s" template would lump different lines together).
        key = (record.name, record.getMessage()[:200])
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.window:
            self._held[key] = self._held.get(key, 0) + 1
            return False
        self._last[key] = now
        held = self._held.pop(key, 0)
        if held:
            record.msg = f"{record.msg} ({held} more like this in the last {self.window:.0f} s not logged)"
        if len(self._last) > 4096:  # bounded: forget the oldest keys
            for stale in sorted(self._last, key=self._last.__getitem__)[:2048]:
                self._last.pop(stale, None)
        return True


def install_log_filter(window: float = 10.0) -> LogRepeatFilter:
    """Put one repeat filter on the handlers of the root logger (asyncio's records reach it)
    and of uvicorn's loggers (they do not propagate)."""
    flt = LogRepeatFilter(window)
    for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access"):
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(flt)
    return flt


__all__ = ["ACCEPT_BATCH", "HEAD_TIMEOUT_SECS", "HTTP_PARSERS", "MAX_HEAD_BYTES",
           "GuardedH11Protocol", "LogRepeatFilter", "connection_cap", "http_protocol", "install_log_filter",
           "open_share", "raise_fd_limit"]
