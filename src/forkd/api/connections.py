"""Connections the daemon accepts: bounded in number and in idle time, with a quiet log.

Anyone who can reach the port can open TCP connections without a token. Left
alone, 20,000 idle ones used every file descriptor of the daemon: ``/healthz``
and authenticated calls timed out, and asyncio logged "Too many open files"
430,000 times in 45 s. So:

* a connection that has sent nothing gets ``FIRST_REQUEST_SECS`` to start a
  request, as a kept-alive one gets uvicorn's keep-alive timeout;
* at most a quarter of the daemon's file-descriptor limit is spent on client
  connections (the rest is for QEMU sockets, disks and the registry). At that
  cap, a new connection evicts the connection idle the longest; a request in
  flight is never evicted. Only when none is idle is the new one refused;
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

log = logging.getLogger("forkd.connections")

# Seconds a new connection may stay silent before its first request.
FIRST_REQUEST_SECS = 10.0
# The share of RLIMIT_NOFILE that client connections may hold.
CONNECTION_SHARE = 4
MIN_CONNECTIONS = 16
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


class _ConnectionGuard:
    """The first-request timeout and the connection cap, for either of uvicorn's protocols.

    Mixed in before the protocol class; it uses only what both share: ``connections``
    (the server's set), ``timeout_keep_alive_task``/``_handler`` and ``on_response_complete``.
    """

    refused = 0  # connections closed at once: at the cap with none idle (all protocols)
    evicted = 0  # idle connections closed to make room

    connections: set[Any]
    timeout_keep_alive_task: asyncio.TimerHandle | None
    loop: asyncio.AbstractEventLoop

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.idle_since = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if len(self.connections) >= connection_cap() and not self._evict_one():
            _ConnectionGuard.refused += 1
            cast(asyncio.Transport, transport).abort()
            return
        super().connection_made(transport)  # type: ignore[misc]
        # Like a kept-alive connection: it must start a request within the timeout.
        self.idle_since = time.monotonic()
        self.timeout_keep_alive_task = self.loop.call_later(FIRST_REQUEST_SECS,
                                                            self.timeout_keep_alive_handler)

    def timeout_keep_alive_handler(self) -> None:
        super().timeout_keep_alive_handler()  # type: ignore[misc]

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self.idle_since = time.monotonic()

    def _evict_one(self) -> bool:
        """Close the connection that has waited longest for a request; False if none waits."""
        idle = [c for c in self.connections
                if isinstance(c, _ConnectionGuard) and c.timeout_keep_alive_task is not None]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.idle_since)
        oldest.timeout_keep_alive_handler()
        oldest.connections.discard(oldest)  # counted free now, not when the loop gets to it
        _ConnectionGuard.evicted += 1
        return True


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

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._writer = _CoalescingWriter(cast(asyncio.Transport, transport), self.loop)

        def on_headers_complete(self) -> None:
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

        def on_url(self, url: bytes) -> None:
            self._count_head(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count_head(len(name) + len(value) + 4)
            super().on_header(name, value)

        def _count_head(self, size: int) -> None:
            self._head_bytes += size
            if self._head_bytes > MAX_HEAD_BYTES and not self._head_refused:
                self._head_refused = True
                error = f"request line and headers exceed {MAX_HEAD_BYTES} bytes"
                body = json.dumps({"error": error}).encode()
                self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                                     b"content-type: application/json\r\nconnection: close\r\n"
                                     b"content-length: %d\r\n\r\n%s" % (len(body), body))
                self.transport.close()
                # Stops the parser; uvicorn then answers 400, which send_400_response drops.
                raise ValueError("request head too large")

        def send_400_response(self, msg: str) -> None:
            if getattr(self, "_head_refused", False):
                return  # answered 431 already
            super().send_400_response(msg)


HTTP_PARSERS = ("httptools", "h11")


def http_protocol(parser: str = "httptools") -> type[asyncio.Protocol]:
    """The guarded protocol for ``parser`` (``HTTP_PARSERS``); h11's where httptools is missing."""
    if parser == "httptools" and HttpToolsProtocol is not None:
        return GuardedHttpToolsProtocol
    if parser == "httptools":
        log.warning("httptools is not installed: serving with h11, which costs more CPU per request")
    return GuardedH11Protocol


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


__all__ = ["ACCEPT_BATCH", "FIRST_REQUEST_SECS", "HTTP_PARSERS", "MAX_HEAD_BYTES", "GuardedH11Protocol",
           "LogRepeatFilter", "connection_cap", "http_protocol", "install_log_filter", "raise_fd_limit"]
