"""One call to one host of the fleet: the client's request passed on, or one of the gateway's own.

Nothing hangs: every call has a connect timeout and an overall one, and is cut
short when its host leaves the fleet. Proxied answers carry ``X-Forkd-Host``
naming the host that served them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Counter
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from forkd.fleet.hosts import HostRecord
from forkd.fleet.membership import Membership
from forkd.gateway.settings import GatewaySettings

PIN_HEADER = "x-forkd-host"
UNREACHABLE_HEADER = "x-forkd-unreachable"
# Not passed on: connection-level headers, and the client's token (hosts get their own).
_DROP_REQUEST = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                           "trailer", "transfer-encoding", "upgrade", "host", "content-length",
                           "authorization", PIN_HEADER})
_DROP_RESPONSE = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "server",
                            "date"})
# E2B's calls keep their own credentials (see HostProxy.headers) and their Host, which names the
# sandbox and port in E2B's {port}-{id}.{domain} form.
_DROP_E2B_REQUEST = _DROP_REQUEST - {"authorization", "host"}


class HostFailed(Exception):
    """A proxied call that never reached its host (``sent`` False: safe to try another)."""

    def __init__(self, status: int, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.status = status
        self.sent = sent


class HostProxy:
    def __init__(self, settings: GatewaySettings, membership: Membership, host_token: str | None,
                 metrics: CollectorRegistry) -> None:
        self.settings = settings
        self.membership = membership
        self._host_token = host_token
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.request_timeout, connect=settings.connect_timeout),
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=64))
        self._proxied = Counter("forkd_gateway_proxied", "Requests proxied to a host.",
                                ["host", "status"], registry=metrics)

    async def close(self) -> None:
        await self.client.aclose()

    def headers(self, request: Request, *, e2b: bool = False) -> dict[str, str]:
        """The client's headers for a host. forkd's own calls present the hosts' token; E2B's keep
        the client's credentials as they are (its API key, envd's access token, and the guest user
        in envd's Authorization): the host checks them, and the gateway's token must never stand
        in for a client that presented none."""
        if e2b:
            return {k: v for k, v in request.headers.items() if k.lower() not in _DROP_E2B_REQUEST}
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST}
        if self._host_token:
            headers["authorization"] = f"Bearer {self._host_token}"
        return headers

    async def call(self, host: HostRecord, method: str, path: str, *, body: Any = None,
                   timeout: float | None = None) -> httpx.Response:
        """A call of the gateway's own to a host (no client request behind it); ``body`` is JSON."""
        headers = {"authorization": f"Bearer {self._host_token}"} if self._host_token else {}
        request = self.client.build_request(method, host.url + path, headers=headers,
                                            json=body if body is not None else None)
        return await self.send(host, request, stream=False, timeout=timeout or self.settings.request_timeout)

    async def forward(self, host: HostRecord, request: Request, body: bytes | None, *,
                      stream_response: bool = False, timeout: float | None = None,
                      e2b: bool = False, query: str | None = None) -> Response:
        """The client's request, passed on to ``host`` (with ``query`` instead of its own, if given)."""
        query = request.url.query if query is None else query
        url = host.url + request.url.path + (f"?{query}" if query else "")
        content: bytes | AsyncIterator[bytes] = body if body is not None else request.stream()
        outgoing = self.client.build_request(request.method, url, headers=self.headers(request, e2b=e2b),
                                             content=content)
        upstream = await self.send(host, outgoing, stream=stream_response,
                                   timeout=timeout or self.settings.request_timeout)
        self._proxied.labels(host.host_id, str(upstream.status_code)).inc()
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP_RESPONSE}
        headers["x-forkd-host"] = host.host_id
        if stream_response:
            return StreamingResponse(upstream.aiter_raw(), status_code=upstream.status_code, headers=headers,
                                     background=BackgroundTask(upstream.aclose))
        return Response(upstream.content, status_code=upstream.status_code, headers=headers)

    async def send(self, host: HostRecord, request: httpx.Request, *, stream: bool,
                   timeout: float) -> httpx.Response:
        """Send, racing the host's departure from the fleet and ``timeout``: nothing hangs."""
        async def go() -> httpx.Response:
            response = await self.client.send(request, stream=True)
            if not stream:
                try:
                    await response.aread()
                finally:
                    await response.aclose()
            return response

        call = asyncio.create_task(go())
        left = asyncio.create_task(self.membership.gone(host.host_id).wait())
        try:
            done, _ = await asyncio.wait({call, left}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            left.cancel()
        if call not in done:
            call.cancel()
            await asyncio.gather(call, return_exceptions=True)
            if left in done:
                raise HostFailed(502, f"host {host.host_id} left the fleet while serving the request (its "
                                      "lease expired); the request's outcome there is unknown", sent=True)
            raise HostFailed(504, f"host {host.host_id} did not answer within {timeout:.0f}s", sent=True)
        try:
            return call.result()
        except httpx.ConnectError as exc:
            raise HostFailed(502, f"host {host.host_id} at {host.url} cannot be reached: {exc}",
                             sent=False) from None
        except httpx.TimeoutException as exc:
            raise HostFailed(504, f"host {host.host_id} timed out: {type(exc).__name__}", sent=True) from None
        except httpx.HTTPError as exc:
            raise HostFailed(502, f"host {host.host_id} failed: {type(exc).__name__}: {exc}",
                             sent=True) from None


__all__ = ["PIN_HEADER", "UNREACHABLE_HEADER", "HostFailed", "HostProxy"]
