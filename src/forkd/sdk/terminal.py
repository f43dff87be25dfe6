"""A terminal on a sandbox: a login shell on a pty, over the daemon's WebSocket (docs/API.md).

``Terminal`` (blocking) and ``AsyncTerminal`` (asyncio) speak the same protocol
(api/terminal_routes.py): what you ``send`` is the keyboard, ``recv`` returns the
terminal's output as the guest wrote it, ``resize`` changes its size, and when the
shell ends ``recv`` raises :class:`TerminalClosed` with ``exit_code`` set.
Get one from ``Controller.open_terminal`` / ``Sandbox.terminal`` (and their
async twins); closing it kills the shell.
"""

from __future__ import annotations

import base64
import json
import ssl
from types import TracebackType
from typing import Any, Self

from forkd.errors import ForkdError

SUBPROTOCOL = "forkd.terminal.v1"


class TerminalClosed(ForkdError):
    """The terminal ended: its shell exited (``exit_code``), or the connection closed."""

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def terminal_url(base: str, sandbox_id: str, cols: int, rows: int, user: str | None) -> str:
    scheme, rest = base.split("://", 1)
    query = f"cols={int(cols)}&rows={int(rows)}" + (f"&user={user}" if user else "")
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}/v1/sandboxes/{sandbox_id}/terminal?{query}"


def subprotocols(token: str | None) -> list[str]:
    """The protocol, and the token the way a browser must send it (no headers on a WebSocket)."""
    out = [SUBPROTOCOL]
    if token:
        out.append("bearer." + base64.urlsafe_b64encode(token.encode()).decode("ascii").rstrip("="))
    return out


def tls(url: str, verify: bool | ssl.SSLContext) -> ssl.SSLContext | None:
    if not url.startswith("wss://"):
        return None
    if isinstance(verify, ssl.SSLContext):
        return verify
    context = ssl.create_default_context()
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class _Frames:
    """What both flavours do with a message from the daemon."""

    exit_code: int | None = None

    def output(self, message: str | bytes) -> bytes | None:
        """Output bytes, or None for a control message (an error raises, an exit is kept)."""
        if isinstance(message, bytes):
            return message
        body: dict[str, Any] = json.loads(message)
        if "error" in body:
            raise ForkdError(f"terminal: {body['error']}")
        if "exit_code" in body:
            self.exit_code = body["exit_code"]
        return None

    def closed(self) -> TerminalClosed:
        if self.exit_code is not None:
            return TerminalClosed(f"the shell exited with {self.exit_code}", self.exit_code)
        return TerminalClosed("the terminal's connection closed")


class Terminal(_Frames):
    """A blocking terminal (``websockets.sync``)."""

    def __init__(self, connection: Any) -> None:
        self._ws = connection

    @classmethod
    def open(cls, url: str, token: str | None, verify: bool | ssl.SSLContext, *,
             timeout: float = 60) -> Terminal:
        from websockets.exceptions import InvalidHandshake
        from websockets.sync.client import connect

        try:
            # Entered by hand: websockets 17 wants its sync connect() used as a context manager
            # (earlier versions return the connection itself, whose __enter__ returns it).
            opened = connect(url, subprotocols=subprotocols(token), ssl=tls(url, verify),  # type: ignore[arg-type]
                             open_timeout=timeout, max_size=16 << 20, compression=None, proxy=None)
            return cls(opened.__enter__())
        except (OSError, InvalidHandshake) as exc:
            raise ForkdError(f"cannot open a terminal at {url.split('?')[0]}: {exc}") from None

    def send(self, keys: str | bytes) -> None:
        """Type ``keys`` (text is sent as UTF-8)."""
        self._ws.send(keys.encode() if isinstance(keys, str) else keys)

    def resize(self, cols: int, rows: int) -> None:
        self._ws.send(json.dumps({"resize": [int(cols), int(rows)]}))

    def recv(self, timeout: float | None = None) -> bytes:
        """The next piece of output; :class:`TerminalClosed` once the shell has ended."""
        from websockets.exceptions import ConnectionClosed

        while True:
            try:
                message = self._ws.recv(timeout=timeout)
            except ConnectionClosed:
                raise self.closed() from None
            data = self.output(message)
            if data is not None:
                return data

    def close(self) -> None:
        """Close the connection: the shell is killed if it still runs."""
        self._ws.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class AsyncTerminal(_Frames):
    """An asyncio terminal (``websockets.asyncio``)."""

    def __init__(self, connection: Any) -> None:
        self._ws = connection

    @classmethod
    async def open(cls, url: str, token: str | None, verify: bool | ssl.SSLContext, *,
                   timeout: float = 60) -> AsyncTerminal:
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidHandshake

        try:
            return cls(await connect(url, subprotocols=subprotocols(token), ssl=tls(url, verify),  # type: ignore[arg-type]
                                     open_timeout=timeout, max_size=16 << 20, compression=None, proxy=None))
        except (OSError, InvalidHandshake) as exc:
            raise ForkdError(f"cannot open a terminal at {url.split('?')[0]}: {exc}") from None

    async def send(self, keys: str | bytes) -> None:
        """Type ``keys`` (text is sent as UTF-8)."""
        await self._ws.send(keys.encode() if isinstance(keys, str) else keys)

    async def resize(self, cols: int, rows: int) -> None:
        await self._ws.send(json.dumps({"resize": [int(cols), int(rows)]}))

    async def recv(self, timeout: float | None = None) -> bytes:
        """The next piece of output; :class:`TerminalClosed` once the shell has ended."""
        import asyncio

        from websockets.exceptions import ConnectionClosed

        while True:
            try:
                message = await asyncio.wait_for(self._ws.recv(), timeout)
            except ConnectionClosed:
                raise self.closed() from None
            data = self.output(message)
            if data is not None:
                return data

    async def close(self) -> None:
        """Close the connection: the shell is killed if it still runs."""
        await self._ws.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()


__all__ = ["AsyncTerminal", "Terminal", "TerminalClosed", "terminal_url"]
