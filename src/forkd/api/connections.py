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

uvicorn's HTTP/1.1 protocol (h11) is extended rather than replaced: only its
connection bookkeeping changes.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("forkd.connections")

# Seconds a new connection may stay silent before its first request.
FIRST_REQUEST_SECS = 10.0
# The share of RLIMIT_NOFILE that client connections may hold.
CONNECTION_SHARE = 4
MIN_CONNECTIONS = 16
# The listen backlog, which is also how many sockets asyncio accepts in one go.
ACCEPT_BATCH = 512


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


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a first-request timeout and a connection cap."""

    refused = 0  # connections closed at once: at the cap with none idle (all protocols)
    evicted = 0  # idle connections closed to make room

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.idle_since = time.monotonic()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= connection_cap() and not self._evict_one():
            type(self).refused += 1
            transport.abort()
            return
        super().connection_made(transport)
        # Like a kept-alive connection: it must start a request within the timeout.
        self.idle_since = time.monotonic()
        self.timeout_keep_alive_task = self.loop.call_later(FIRST_REQUEST_SECS,
                                                            self.timeout_keep_alive_handler)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.idle_since = time.monotonic()

    def _evict_one(self) -> bool:
        """Close the connection that has waited longest for a request; False if none waits."""
        idle = [c for c in self.connections
                if isinstance(c, GuardedH11Protocol) and c.timeout_keep_alive_task is not None]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.idle_since)
        oldest.timeout_keep_alive_handler()
        oldest.connections.discard(oldest)  # counted free now, not when the loop gets to it
        type(self).evicted += 1
        return True


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


__all__ = ["ACCEPT_BATCH", "FIRST_REQUEST_SECS", "GuardedH11Protocol", "LogRepeatFilter", "connection_cap",
           "install_log_filter", "raise_fd_limit"]
