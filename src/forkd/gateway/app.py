"""The gateway's ASGI app: one catch-all route into ``Gateway.dispatch``, the body bound, and the
gateway's token on forkd's own API."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from forkd.api.auth import BearerAuthMiddleware, load_token
from forkd.api.e2b.paths import addressed_sandbox, is_e2b_request, is_volume_upload
from forkd.api.file_routes import streams_body
from forkd.api.limits import BodySizeLimitMiddleware
from forkd.fleet.etcd import EtcdClient
from forkd.fleet.membership import Membership
from forkd.gateway.core import Gateway
from forkd.gateway.settings import GatewaySettings
from forkd.gateway.websockets import WebSocketRelay


def create_gateway_app(settings: GatewaySettings) -> Starlette:
    """The gateway's ASGI app; its lifespan starts and stops the membership reader."""
    token = load_token(settings.token_file) if settings.token_file is not None else None
    host_token_file = settings.host_token_file or settings.token_file
    host_token = load_token(host_token_file) if host_token_file is not None else None
    membership = Membership(EtcdClient(settings.etcd), interval=settings.poll_interval)
    gateway = Gateway(settings, membership, host_token)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        await membership.start()
        try:
            yield
        finally:
            await membership.stop()
            await gateway.close()

    async def endpoint(request: Request) -> Response:
        return await gateway.dispatch(request)

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
    app = Starlette(routes=[Route("/{path:path}", endpoint, methods=methods)], lifespan=lifespan)
    app.state.gateway = gateway
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_body_bytes, exempt=_streams_through)
    if token is not None:
        app.add_middleware(_BearerUnlessE2B, token=token)
    app.add_middleware(WebSocketRelay, membership=membership)  # outermost: before the bearer check
    return app


def _streams_through(scope: Scope) -> bool:
    """Bodies the gateway relays as they come, unread, for the host to bound: forkd's and E2B's
    volume uploads (by its --max-file-bytes) and all of envd's traffic (its uploads and Connect
    calls, by the host's own limits). The rest are small JSON, which the gateway reads."""
    return streams_body(scope) or is_volume_upload(scope) or addressed_sandbox(scope) is not None


class _BearerUnlessE2B:
    """The gateway's token on forkd's own API. E2B's requests carry E2B's credentials instead (an
    API key, a sandbox's access token), which the host they go to checks: the gateway passes them
    on unchanged and adds none of its own (HostProxy.headers)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self._app = app
        self._checked = BearerAuthMiddleware(app, token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (is_e2b_request(scope) or addressed_sandbox(scope) is not None):
            await self._app(scope, receive, send)
            return
        await self._checked(scope, receive, send)


__all__ = ["create_gateway_app"]
