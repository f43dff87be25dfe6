"""The port proxy: HTTP and WebSocket traffic to a sandbox's ports, addressed by the Host header.

E2B's ``get_host(port)`` names a sandbox's port as the host ``{port}-{sandbox id}.{domain}``.
Where ``{domain}`` resolves to the daemon (docs/E2B.md says how to set that up), a
request with such a Host reaches this middleware before anything else of the API,
which relays it to ``port`` of the sandbox's guest, over the host's route to the
sandbox (its SandboxInfo ``ip``). So a sandbox needs a network device (a snapshot
made with ``nic``) for its ports to be reached.

Who may come in is the sandbox's network policy (host/egress.py):
``allow_public_traffic`` lets anyone who reaches the daemon in; otherwise the
request needs the sandbox's traffic token (``E2B-Traffic-Access-Token``, what E2B
answers a create with) or the daemon's bearer token. Neither goes on to the guest:
a tenant's server must not learn the daemon's token. ``mask_request_host`` replaces
the Host header the guest sees (HTTP only: a WebSocket's Host is the guest's own
address).

A relayed request wakes a hibernated sandbox and resumes a paused one, as any
request does (its ``autoResume``, for E2B's, is respected), and holds it awake
until the response or the WebSocket ends. A port nothing listens on is a 502;
every answer the proxy makes itself is ``{"error": ...}`` (a sandbox that is not
running also carries E2B's proxy shape, ``{"message", "sandboxId", "code"}``).

What a client sends is bounded before it goes anywhere (docs/SECURITY.md):

* Only an origin-form request-target (a path beginning with ``/``) is relayed;
  ``*`` (``OPTIONS *``, ``*@host:port/``) and absolute or authority forms are a
  400. The upstream URL is built from its parts (scheme, the guest's address,
  the port, the path, the query), never by pasting the target after an address.
* A relay ends with its client: an HTTP response stops being read from the guest
  (and its connection is closed) once the client hangs up.
* A WebSocket message is at most ``ws_relay.MAX_WS_MESSAGE_BYTES`` either way, and each
  direction reads only as fast as the other end takes: at most
  ``ws_relay.WS_QUEUE_FRAMES`` frames are read ahead of a client that does not read.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import httpx
from starlette.types import ASGIApp, Receive, Scope, Send

from forkd.api.e2b.errors import not_running, not_running_body
from forkd.api.limits import ErrorShape, forkd_error, send_error
from forkd.api.ws_relay import relay_websocket
from forkd.errors import ForkdError

if TYPE_CHECKING:
    from forkd.api.e2b.tokens import AccessTokens
    from forkd.controller.runtime import Runtime
    from forkd.store.records import SandboxRecord

log = logging.getLogger("forkd.api.port_proxy")

# {port}-{sandbox id}. then the domain (at least one more label). Ids with a '.' cannot be
# named this way (they would split the label); forkd's own ids have none.
HOST_RE = re.compile(r"^(?P<port>[1-9][0-9]{0,4})-(?P<id>[A-Za-z0-9][A-Za-z0-9_-]{0,47})\.[^.]")
TRAFFIC_HEADER = "e2b-traffic-access-token"
# Hop-by-hop headers (RFC 9110 7.6.1) are the proxy's own, and the credentials are the daemon's.
_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                  "transfer-encoding", "upgrade", "host", TRAFFIC_HEADER})
_WS_OWN = _HOP | {"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
                  "sec-websocket-protocol", "content-length"}
CONNECT_TIMEOUT_SECS = 5.0
# A response that sends nothing for this long is cut (a long poll or a slow stream stays under it).
READ_TIMEOUT_SECS = 600.0


# Bytes a URL cannot carry as they are: escaped as a browser would (the guest decodes the same bytes).
_UNSAFE = re.compile(rb"[^\x21-\x7e]|#")


def request_target(scope: Scope) -> bytes | None:
    """A request's path and query, if its request-target is origin-form (a path beginning with
    ``/``); None for any other form (``*``, authority or absolute), which the proxy refuses.

    httptools hands over ``*...`` targets as the path, and one pasted after ``http://ip:port``
    named another host: ``*@127.0.0.1:22/`` reached the host's port 22."""
    raw_path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
    if not raw_path.startswith(b"/"):
        return None
    query: bytes = scope.get("query_string") or b""
    target = raw_path + (b"?" + query if query else b"")
    return _UNSAFE.sub(lambda m: b"%%%02X" % m[0][0], target)


def upstream_url(scheme: str, ip: str, port: int, target: bytes) -> httpx.URL:
    """The guest's URL: built from its parts (``target`` from request_target), never by pasting
    text after an address, so the host and port are the guest's whatever the target says."""
    url = httpx.URL(scheme=scheme, host=ip, port=port, raw_path=target)
    if url.host != ip or url.port != port:  # not possible with the parts above; never relay if it were
        raise ValueError(f"upstream URL {url} is not port {port} of {ip}")
    return url


def target(scope: Scope) -> tuple[int, str] | None:
    """The ``(port, sandbox id)`` a request's Host names, or None for the daemon's own traffic."""
    for name, value in scope.get("headers", ()):
        if name == b"host":
            match = HOST_RE.match(value.decode("latin-1"))
            if match is None or not 1 <= int(match["port"]) <= 65535:
                return None
            return int(match["port"]), match["id"]
    return None


class PortClients:
    """The proxy's HTTP client (its connections to guests kept alive), made on first use and closed
    with the daemon (the app's lifespan)."""

    def __init__(self) -> None:
        self._client: httpx.AsyncClient | None = None

    def http(self) -> httpx.AsyncClient:
        if self._client is None:
            # No proxies from the environment, no redirects followed, no decoding: relayed as is.
            self._client = httpx.AsyncClient(
                trust_env=False, follow_redirects=False,
                timeout=httpx.Timeout(READ_TIMEOUT_SECS, connect=CONNECT_TIMEOUT_SECS),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


class PortProxy:
    """ASGI middleware: requests whose Host names a sandbox port are relayed there, the rest go on."""

    def __init__(self, app: ASGIApp, runtime: Callable[[], Runtime | None], tokens: AccessTokens,
                 api_token: str | None, max_body_bytes: int, clients: PortClients) -> None:
        self.app = app
        self._runtime = runtime
        self._tokens = tokens
        self._api_token = api_token
        self._max_body_bytes = max_body_bytes
        self._clients = clients

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        where = target(scope) if scope["type"] in ("http", "websocket") else None
        if where is None:
            await self.app(scope, receive, send)
            return
        port, sandbox_id = where
        path = request_target(scope)
        if path is None:  # before anything else: no lookup, no wake, no connection for these
            await self._refuse(scope, receive, send, 400, (
                "the port proxy relays only origin-form request-targets (a path beginning with '/'); "
                "'*', authority and absolute forms are refused"))
            return
        runtime = self._runtime()
        if runtime is None:
            await self._refuse(scope, receive, send, 503, "the daemon is starting")
            return
        try:
            record = runtime.get_sandbox(sandbox_id)
        except ForkdError as exc:
            if exc.status == 404:  # as E2B's proxy answers, which its SDK reads as "not running"
                body = {"error": not_running(sandbox_id), **not_running_body(sandbox_id)}
                await self._refuse(scope, receive, send, 502, not_running(sandbox_id), shape=lambda *_: body)
            else:
                await self._refuse(scope, receive, send, exc.status,
                                   f"sandbox {sandbox_id} is not running: {exc}")
            return
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope.get("headers", ())]
        if not self._admits(sandbox_id, record, headers):
            await self._refuse(scope, receive, send, 403, (
                f"sandbox {sandbox_id}'s ports are not public: send its traffic access token in "
                f"{TRAFFIC_HEADER} (or create it with network.allow_public_traffic)"))
            return
        if record.hibernation is not None and not record.auto_resume:
            await self._refuse(scope, receive, send, 502, (
                f"sandbox {sandbox_id} is paused and its autoResume is off: connect resumes it"))
            return
        if record.ip is None:
            await self._refuse(scope, receive, send, 502, (
                f"sandbox {sandbox_id} has no network device, so none of its ports can be reached: "
                "fork it from a snapshot made with nic"))
            return
        try:
            async with runtime.relaying(sandbox_id) as awake:
                ip = awake.ip or record.ip
                forwarded = self._forwarded(headers, record.egress.request_host(port))
                if scope["type"] == "websocket":
                    await self._websocket(scope, receive, send, upstream_url("ws", ip, port, path), forwarded)
                else:
                    await self._http(scope, receive, send, upstream_url("http", ip, port, path), port,
                                     sandbox_id, forwarded)
        except ForkdError as exc:  # the wake or resume failed: nothing was sent yet
            await self._refuse(scope, receive, send, exc.status if 400 <= exc.status <= 599 else 502,
                               f"sandbox {sandbox_id} could not be woken: {exc}")

    def _admits(self, sandbox_id: str, record: SandboxRecord, headers: list[tuple[str, str]]) -> bool:
        if record.egress.allow_public_traffic:
            return True
        for name, value in headers:
            if name == TRAFFIC_HEADER and hmac.compare_digest(
                    value.encode(), self._tokens.traffic(sandbox_id).encode()):
                return True
            if name == "authorization" and self._is_api_token(value):
                return True
        return False

    def _is_api_token(self, authorization: str) -> bool:
        scheme, _, token = authorization.partition(" ")
        return (self._api_token is not None and scheme.lower() == "bearer"
                and hmac.compare_digest(token.strip().encode(), self._api_token.encode()))

    def _forwarded(self, headers: list[tuple[str, str]], masked_host: str | None) -> list[tuple[str, str]]:
        out = [(k, v) for k, v in headers
               if k not in _HOP and not (k == "authorization" and self._is_api_token(v))]
        host = masked_host or next((v for k, v in headers if k == "host"), None)
        return [("Host", host), *out] if host else out  # as a client spells it: some servers care

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, status: int, message: str,
                      shape: ErrorShape = forkd_error) -> None:
        if scope["type"] == "websocket":
            # Closed before the handshake is accepted: the client gets an HTTP 403 from the server.
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008 if status == 403 else 1011,
                        "reason": message[:120]})
            return
        await send_error(send, status, message, shape)

    # ------------------------------------------------------------------ HTTP

    async def _http(self, scope: Scope, receive: Receive, send: Send, url: httpx.URL, port: int,
                    sandbox_id: str, headers: list[tuple[str, str]]) -> None:
        """Relay one request, and its response until the guest ends it or the client hangs up.

        uvicorn's ``send`` to a client that is gone returns without a word, so a relay that only
        sent would read an endless response for ever (and hold the sandbox awake, and the
        daemon's shutdown): what the client sends after its request (only ever its hang-up) is
        watched beside the relay, and ends it."""
        too_large = False
        has_body = _has_body(scope)
        body_read = asyncio.Event()  # after it, the client's next message is its hang-up

        async def body() -> AsyncIterator[bytes]:
            nonlocal too_large
            seen = 0
            try:
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise _ClientGone  # not a shorter body: the guest must not take it as whole
                    chunk = message.get("body", b"")
                    seen += len(chunk)
                    if seen > self._max_body_bytes:
                        too_large = True
                        raise _BodyTooLarge
                    if chunk:
                        yield chunk
                    if not message.get("more_body", False):
                        return
            finally:
                body_read.set()

        async def hang_up() -> None:
            if has_body:
                await body_read.wait()
            while (await receive())["type"] != "http.disconnect":
                pass

        async def relay() -> None:
            client = self._clients.http()
            request = client.build_request(scope["method"], url, headers=headers,
                                           content=body() if has_body else None)
            try:
                response = await client.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                await send_error(send, 502, f"The sandbox {sandbox_id} is running but port {port} is not "
                                 "open (nothing accepts connections there)")
                return
            except _ClientGone:
                return
            except (httpx.TransportError, _BodyTooLarge) as exc:
                if too_large:
                    await send_error(send, 413, f"request body exceeds the daemon's {self._max_body_bytes}-"
                                     "byte limit for relayed traffic")
                else:
                    await send_error(send, 502, f"port {port} of sandbox {sandbox_id} failed: "
                                     f"{type(exc).__name__}")
                return
            try:
                await send({"type": "http.response.start", "status": response.status_code,
                            "headers": [(k.encode("latin-1"), v.encode("latin-1"))
                                        for k, v in response.headers.multi_items()
                                        if k.lower() not in _HOP and k.lower() != "date"]})  # uvicorn's own
                try:
                    async for chunk in response.aiter_raw():
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                except httpx.TransportError as exc:
                    # Headers are gone already: the client sees the stream cut short.
                    log.info("relay from port %d of %s cut: %s", port, sandbox_id, type(exc).__name__)
                    return
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            finally:
                # Unread, the guest's connection cannot be kept: closing it tells the guest to stop.
                await response.aclose()

        relaying = asyncio.create_task(relay())
        watching = asyncio.create_task(hang_up())
        try:
            await asyncio.wait((relaying, watching), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (relaying, watching):
                task.cancel()
            await asyncio.gather(relaying, watching, return_exceptions=True)
        if not relaying.cancelled() and (failed := relaying.exception()) is not None:
            raise failed

    # ------------------------------------------------------------------ WebSocket

    async def _websocket(self, scope: Scope, receive: Receive, send: Send, url: httpx.URL,
                         headers: list[tuple[str, str]]) -> None:
        upstream_headers = [(k, v) for k, v in headers if k not in _WS_OWN]
        await relay_websocket(scope, receive, send, str(url), upstream_headers)


class _BodyTooLarge(Exception):
    pass


class _ClientGone(Exception):
    """The client hung up before its request body was whole."""


def _has_body(scope: Scope) -> bool:
    return scope["method"] not in ("GET", "HEAD", "OPTIONS", "DELETE") or any(
        name in (b"content-length", b"transfer-encoding") for name, _ in scope.get("headers", ()))


__all__ = ["HOST_RE", "PortClients", "PortProxy", "target"]
