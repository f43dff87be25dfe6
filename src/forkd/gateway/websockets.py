"""WebSockets through the gateway: a sandbox's port, as E2B's ``get_host`` names it.

A WebSocket to ``{port}-{sandbox id}.{domain}`` (the same Host form the gateway routes plain
HTTP by) is relayed to the sandbox's host, which relays it on to the guest (api/port_proxy.py)
and checks the sandbox's traffic policy there. The TCP connection goes to the host's address;
the client's Host is kept, since it is what names the sandbox and the port to the host. The relay
is the daemon's own (api/ws_relay.py): bounded messages and read-ahead, either side's close
passed on. The gateway adds no credential: a traffic token or API key the client sent goes to the
host unchanged, and the host decides.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from forkd.api.e2b.paths import SANDBOX_HOST
from forkd.api.ws_relay import relay_websocket
from forkd.fleet.membership import Membership
from forkd.store.layout import host_of

# Not passed on: the WebSocket handshake's own headers (the gateway makes its own handshake with
# the host) and hop-by-hop ones. Credentials are, for the host to check.
_OWN = frozenset({"host", "connection", "upgrade", "keep-alive", "te", "trailer", "transfer-encoding",
                  "proxy-authorization", "proxy-authenticate", "content-length", "sec-websocket-key",
                  "sec-websocket-version", "sec-websocket-extensions", "sec-websocket-protocol"})
# A Host the relay will name: a port, a sandbox id and a domain, at most 300 characters. It becomes
# the URL of the gateway's own handshake with the host, so nothing else (no '@', '/', spaces) may pass.
_HOST = re.compile(r"[A-Za-z0-9.:-]{1,300}")


class WebSocketRelay:
    """ASGI middleware: WebSockets that name a sandbox go to its host; everything else to ``app``."""

    def __init__(self, app: ASGIApp, membership: Membership) -> None:
        self._app = app
        self._membership = membership

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self._app(scope, receive, send)
            return
        headers = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope.get("headers", ())]
        host_header = next((v for k, v in headers if k == "host"), "")
        m = SANDBOX_HOST.match(host_header) if _HOST.fullmatch(host_header) else None
        owner = self._membership.get(host_of(m.group("id")) or "") if m else None
        if owner is None:
            # Refused before the handshake: the client sees a 403 and no upgrade.
            await receive()
            await send({"type": "websocket.close", "code": 1008,
                        "reason": "no sandbox of this fleet is named by this host" if m is None
                        else f"sandbox {m.group('id')}'s host is not in the fleet"})
            return
        target = urlsplit(owner.url)
        query = scope.get("query_string", b"").decode("latin-1")
        # raw_path is the path as sent (ASGI: without the query string).
        url = f"ws://{host_header}{scope.get('raw_path', b'').decode('latin-1') or scope['path']}"
        if query:
            url += f"?{query}"
        await relay_websocket(scope, receive, send, url, [(k, v) for k, v in headers if k not in _OWN],
                              host=target.hostname, port=target.port or 80)


__all__ = ["WebSocketRelay"]
