"""The egress inspector of one sandbox: a guest's TCP connection is let through only for an allowed name.

nft redirects a sandbox's TCP to the inspector's listener (in that sandbox's namespace). It reads
the connection's first bytes within bounds (``egress_peek.MAX_PEEK`` bytes, ``first_bytes_s``
seconds), reads the name from them (SNI for TLS, ``Host`` for HTTP/1), asks the policy, and only
then connects to the connection's original destination and splices the two. A connection is
refused (closed, nothing forwarded) when no name can be read, the name is not allowed, or the
hello is encrypted (ECH); each decision goes to the caller's log with its reason. At most
``max_connections`` are open at once, so a guest cannot exhaust the daemon's descriptors.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from forkd.host.egress_peek import MAX_PEEK, Peek, Verdict, peek_http, peek_tls

_SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h
_TLS_HANDSHAKE = 0x16
NOT_ALLOWED = "name not allowed"
UNREACHABLE = "destination unreachable"
CONNECT_SECS = 10.0  # to reach a connection's original destination

Address = tuple[str, int]
# (name or None, destination, allowed, reason)
LogFn = Callable[[str | None, Address, bool, str], None]
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]
# Opens the connection to the original destination (the daemon's: from the sandbox's namespace).
DialFn = Callable[[Address], Awaitable[Streams]]
# Serves a connection whose name has a header rule (host/egress_tls.py): given the guest's streams,
# the bytes already read and the destination; says whether it went through, and why.
ServeFn = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes, Address], Awaitable[tuple[bool, str]]]
# For a connection's name and whether it is TLS: how to serve it (None: spliced untouched).
InterceptFn = Callable[[str, bool], ServeFn | None]


async def _dial_here(dst: Address) -> Streams:
    return await asyncio.open_connection(*dst)


def original_dst(sock: socket.socket) -> Address:
    """Where the guest meant to connect before nft's redirect (IPv4)."""
    raw = sock.getsockopt(socket.SOL_IP, _SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack_from("!2xH4s", raw)
    return socket.inet_ntoa(packed), port


@dataclass(frozen=True, slots=True)
class Limits:
    first_bytes_s: float = 10.0
    connect_s: float = CONNECT_SECS
    max_connections: int = 64
    chunk: int = 65536


def _peek(data: bytes) -> Peek:
    # The protocol is read from the bytes, not the port: TLS on port 80 is still checked by SNI.
    return peek_tls(data) if data[:1] == bytes([_TLS_HANDSHAKE]) else peek_http(data)


class Inspector:
    """One sandbox's inspector. ``allowed(name, dst)`` is its policy's answer for a name."""

    def __init__(
        self,
        allowed: Callable[[str, Address], bool],
        log: LogFn,
        limits: Limits | None = None,
        destination: Callable[[socket.socket], Address] = original_dst,
        dial: DialFn = _dial_here,
        intercept: InterceptFn | None = None,
        passthrough: bool = False,
    ) -> None:
        """``passthrough``: for connections the policy lets through by address anyway (the open
        internet, when the inspector is there only to find hosts with a rule): one without a name,
        or whose name does not come in time, is spliced rather than refused; a name the policy
        refuses (a deny_out name) is still refused."""
        self._allowed = allowed
        self._log = log
        self._limits = limits or Limits()
        self._destination = destination
        self._dial = dial
        self._intercept = intercept
        self._passthrough = passthrough
        self._open = 0
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def open_connections(self) -> int:
        return self._open

    async def close(self) -> None:
        """End every connection it holds (the sandbox goes, or its names do)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            if self._open >= self._limits.max_connections:
                self._log(None, ("", 0), False, "too many connections open")
                return
            self._open += 1
            try:
                await self._inspect(reader, writer)
            finally:
                self._open -= 1
        finally:
            writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await writer.wait_closed()

    async def _inspect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        try:
            dst = self._destination(sock)
        except OSError:
            self._log(None, ("", 0), False, "no original destination")
            return
        if dst == sock.getsockname()[:2]:
            # Straight to the inspector, not redirected there: it would dial itself.
            self._log(None, dst, False, "no original destination")
            return
        head, peek, timed_out = await self._read_head(reader)
        if timed_out and not self._passthrough:
            self._log(None, dst, False, "no name within the time allowed")
            return
        reason = None if timed_out else {
            Verdict.ECH: "encrypted ClientHello (ECH): the name cannot be checked",
            Verdict.NO_NAME: "no name (SNI or Host) to check",
            Verdict.MALFORMED: "first bytes are neither a TLS ClientHello nor an HTTP/1 request",
            Verdict.NEED_MORE: "connection closed before a name",
        }.get(peek.verdict)
        if reason is None and peek.name is not None and not self._allowed(peek.name, dst):
            reason = NOT_ALLOWED
        # Pass-through: only a refused name is refused; the rest of what came is spliced.
        if reason is not None and not (self._passthrough and head and reason != NOT_ALLOWED):
            self._log(peek.name, dst, False, reason)
            return
        named = peek.verdict is Verdict.NAME and not timed_out and peek.name is not None
        tls = head[:1] == bytes([_TLS_HANDSHAKE])
        serve = self._intercept(peek.name, tls) if self._intercept and named and peek.name else None
        if serve is not None:
            allowed, detail = await serve(reader, writer, head, dst)
            self._log(peek.name, dst, allowed, detail)
            return
        passed = "name allowed" if named else f"passed ({reason or 'no name in time'}; its address is open)"
        try:
            up_r, up_w = await asyncio.wait_for(self._dial(dst), self._limits.connect_s)
        except (OSError, TimeoutError):
            self._log(peek.name, dst, False, UNREACHABLE)
            return
        self._log(peek.name, dst, True, passed)
        try:
            up_w.write(head)
            await asyncio.gather(self._pipe(reader, up_w), self._pipe(up_r, writer))
        finally:
            up_w.close()
            with contextlib.suppress(OSError, ConnectionError):
                await up_w.wait_closed()

    async def _read_head(self, reader: asyncio.StreamReader) -> tuple[bytes, Peek, bool]:
        """The first bytes, what they say, and whether the time for them ran out first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._limits.first_bytes_s
        head = b""
        while len(head) < MAX_PEEK:
            try:
                chunk = await asyncio.wait_for(reader.read(MAX_PEEK - len(head)), deadline - loop.time())
            except TimeoutError:
                return head, Peek(Verdict.NEED_MORE), True
            if not chunk:
                break
            head += chunk
            peek = _peek(head)
            if peek.verdict is not Verdict.NEED_MORE:
                return head, peek, False
        return head, (_peek(head) if head else Peek(Verdict.NEED_MORE)), False

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while chunk := await src.read(self._limits.chunk):
                dst.write(chunk)
                await dst.drain()
            if dst.can_write_eof():
                dst.write_eof()
