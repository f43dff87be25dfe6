"""A WebSocket relayed both ways: the port proxy's to a guest (api/port_proxy.py), and the fleet
gateway's to a sandbox's host (gateway/websockets.py).

Bounded both ways: a message's size, the frames read from the far end ahead of a client that does
not read, and what a send may leave buffered. Either side's close is passed on to the other. Only
the websockets library and ASGI's types: the gateway, which has neither the daemon's nor the E2B
layer's packages, relays with it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from starlette.types import Message, Receive, Scope, Send
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

log = logging.getLogger("forkd.api.ws_relay")

CONNECT_TIMEOUT_SECS = 5.0
MAX_WS_MESSAGE_BYTES = 16 << 20  # as uvicorn bounds what clients send (ws_max_size)
# Frames the relay reads from the guest ahead of its client: past this, the guest's socket is not
# read until the client has taken what is queued (websockets' own default is 16, i.e. up to 16 times
# MAX_WS_MESSAGE_BYTES held for a client that never reads). uvicorn, on the client's side, holds at
# most one message per direction (it waits for its write buffer to drain, and pauses reading until
# the app takes what it queued).
WS_QUEUE_FRAMES = 1
WS_WRITE_LIMIT_BYTES = 64 << 10  # what a send to the guest may leave buffered before it waits


async def relay_websocket(scope: Scope, receive: Receive, send: Send, url: str,
                          headers: list[tuple[str, str]], **connection: Any) -> None:
    """Relay a client's WebSocket (an ASGI ``websocket`` scope) to ``url``, both ways, bounded, until
    either side closes; ``headers`` go upstream as they are. ``connection``: passed to the event
    loop's ``create_connection`` (the fleet gateway names a host there, and keeps the client's Host
    as ``url``'s)."""
    first = await receive()
    if first["type"] != "websocket.connect":
        return
    try:
        upstream = await connect(
            url, additional_headers=headers, subprotocols=scope.get("subprotocols") or None,
            open_timeout=CONNECT_TIMEOUT_SECS,
            # Bounded both ways: a message's size, and what is read ahead of the client
            # (max_queue); sends wait for the other end to take the data (write_limit, bytes).
            max_size=MAX_WS_MESSAGE_BYTES, max_queue=WS_QUEUE_FRAMES, write_limit=WS_WRITE_LIMIT_BYTES,
            compression=None, proxy=None, **connection)
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        status = exc.response.status_code if isinstance(exc, InvalidStatus) else None
        reason = f"upstream answered {status}" if status else f"port not open ({type(exc).__name__})"
        await send({"type": "websocket.close", "code": 1011, "reason": reason})
        return
    async with upstream:
        await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
        await _pump(receive, send, upstream)


async def _pump(receive: Receive, send: Send, upstream: ClientConnection) -> None:
    """Both directions until either side closes; the other side is then closed with its code."""

    async def from_client() -> None:
        while True:
            message: Message = await receive()
            if message["type"] == "websocket.disconnect":
                await upstream.close(code=int(message.get("code", 1000)))
                return
            if message.get("bytes") is not None:
                await upstream.send(message["bytes"])
            elif message.get("text") is not None:
                await upstream.send(message["text"])

    async def from_guest() -> None:
        try:
            async for data in upstream:
                key = "bytes" if isinstance(data, bytes) else "text"
                await send({"type": "websocket.send", key: data})
        except ConnectionClosed:
            pass
        code = upstream.close_code or 1000
        with contextlib.suppress(Exception):  # the client may be gone already
            await send({"type": "websocket.close", "code": code if code != 1005 else 1000,
                        "reason": upstream.close_reason or ""})

    tasks = [asyncio.create_task(from_client()), asyncio.create_task(from_guest())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        results: list[Any] = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception) and not isinstance(result, ConnectionClosed):
                log.info("websocket relay ended: %s", type(result).__name__)


__all__ = ["MAX_WS_MESSAGE_BYTES", "WS_QUEUE_FRAMES", "relay_websocket"]
