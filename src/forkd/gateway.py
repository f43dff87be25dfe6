"""The fleet gateway: one endpoint that serves forkd's REST API in front of many hosts.

Clients and SDKs talk to it exactly as to one daemon. It keeps no state of its
own beyond the membership it reads from etcd:

* ``POST /v1/sandboxes`` goes to a host holding the snapshot, else to the
  least-loaded host (which pulls the snapshot from the object store first);
  ``X-Forkd-Host: <host-id>`` pins it to one host (time-travel fork: branch on
  host A, fork on host B). A host that cannot be reached is skipped.
* per-sandbox calls (``/v1/sandboxes/<id>/...``) go to the host the id names
  (``sb-<host>-…``); once that host has left the fleet they answer 404 "gone".
* lists (``GET /v1/sandboxes``, ``/v1/snapshots``, ``/v1/pools``) merge every
  host's answer; per-snapshot calls go to a host holding it; a snapshot
  delete goes to every host holding it.
* snapshots created or branched through the gateway are pushed to the object
  store by their host (``--publish``, on by default), so any host can fork them.

No request hangs: every proxied call has a connect timeout and an overall
timeout, and is cut short when its host leaves the fleet. Every answer the
gateway makes itself is ``{"error": ...}`` like the daemon's; proxied answers
carry ``X-Forkd-Host`` naming the host that served them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from forkd.api.auth import BearerAuthMiddleware, load_token
from forkd.api.e2b.paths import addressed_sandbox, is_e2b_request
from forkd.api.file_routes import streams_body
from forkd.api.limits import BodySizeLimitMiddleware
from forkd.api.settings import DEFAULT_MAX_BODY_BYTES
from forkd.bounds import SANDBOX_ID_RE
from forkd.config import API_VERSION, VERSION
from forkd.errors import NO_CAPACITY
from forkd.fleet.etcd import EtcdClient
from forkd.fleet.hosts import HostRecord
from forkd.fleet.membership import Membership
from forkd.fleet.placement import by_load, holders, spawn_candidates
from forkd.store.layout import host_of

log = logging.getLogger("forkd.gateway")

PIN_HEADER = "x-forkd-host"
UNREACHABLE_HEADER = "x-forkd-unreachable"
# Not passed on: connection-level headers, and the client's token (hosts get their own).
_DROP_REQUEST = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                           "trailer", "transfer-encoding", "upgrade", "host", "content-length",
                           "authorization", PIN_HEADER})
_DROP_RESPONSE = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "server",
                            "date"})
# E2B's calls keep their own credentials (see Gateway._headers) and their Host, which names the
# sandbox and port in E2B's {port}-{id}.{domain} form.
_DROP_E2B_REQUEST = _DROP_REQUEST - {"authorization", "host"}
# E2B's control plane: where sandboxes are created and listed, and the paths that name one.
_E2B_CREATE = frozenset({"/sandboxes", "/v2/sandboxes", "/v3/sandboxes"})
_E2B_LISTS = frozenset({"/sandboxes", "/v2/sandboxes"})
_E2B_SANDBOX_PATH = re.compile(r"^(?:/v[23])?/sandboxes/(?P<id>[^/]+)(?:/.*)?$")
_SANDBOX_PATH = re.compile(rf"^/{API_VERSION}/sandboxes/(?P<id>[^/]+)(?P<rest>/.*)?$")
_SNAPSHOT_PATH = re.compile(rf"^/{API_VERSION}/snapshots/(?P<tag>[^/]+)(?P<rest>/.*)?$")


@dataclass
class GatewaySettings:
    etcd: list[str]
    host: str = "127.0.0.1"
    port: int = 8890
    token_file: Path | None = None  # what clients must present (None: no auth, loopback only)
    host_token_file: Path | None = None  # what the hosts accept (default: token_file)
    request_timeout: float = 3600.0  # longest a proxied call may take (a long exec, a setup)
    connect_timeout: float = 3.0
    list_timeout: float = 15.0  # per host, for the merged lists
    poll_interval: float = 0.5  # how often membership is re-read from etcd
    publish: bool = True
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


class HostFailed(Exception):
    """A proxied call that never reached its host (``sent`` False: safe to try another)."""

    def __init__(self, status: int, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.status = status
        self.sent = sent


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class Gateway:
    def __init__(self, settings: GatewaySettings, membership: Membership, host_token: str | None) -> None:
        self.settings = settings
        self.membership = membership
        self._host_token = host_token
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.request_timeout, connect=settings.connect_timeout),
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=64))
        self.metrics = CollectorRegistry()
        self._proxied = Counter("forkd_gateway_proxied", "Requests proxied to a host.",
                                ["host", "status"], registry=self.metrics)
        hosts = Gauge("forkd_gateway_hosts", "Hosts holding a live lease.", registry=self.metrics)
        hosts.set_function(lambda: len(self.membership.hosts()))

    async def close(self) -> None:
        await self.client.aclose()

    # ------------------------------------------------------------ dispatch

    async def dispatch(self, request: Request) -> Response:
        path, method = request.url.path, request.method
        if path == "/healthz":
            return JSONResponse({"ok": True})
        if path == "/version":
            return JSONResponse({"version": VERSION, "api": API_VERSION})
        if path == "/metrics":
            return Response(generate_latest(self.metrics), media_type=CONTENT_TYPE_LATEST)
        if (sandbox_id := addressed_sandbox(request.scope)) is not None:
            return await self._e2b_to_owner(request, sandbox_id, stream=True)
        if is_e2b_request(request.scope):
            return await self._e2b_control(request)
        if path == f"/{API_VERSION}/fleet" and method == "GET":
            return JSONResponse([h.info() for h in by_load(self.membership.hosts().values())])
        if path == f"/{API_VERSION}/sandboxes":
            return await (self._spawn(request) if method == "POST" else self._merged(request, "id"))
        if m := _SANDBOX_PATH.match(path):
            return await self._to_owner(request, m.group("id"), m.group("rest") or "")
        if path == f"/{API_VERSION}/snapshots":
            if method == "POST":
                return await self._create_snapshot(request)
            return await self._merged(request, "tag")
        if m := _SNAPSHOT_PATH.match(path):
            return await self._to_snapshot(request, m.group("tag"), m.group("rest") or "")
        if path == f"/{API_VERSION}/pools" and method == "GET":
            return await self._merged(request, "tag")
        return await self._to_any(request)

    # ------------------------------------------------------------ E2B's API

    async def _e2b_control(self, request: Request) -> Response:
        """E2B's control plane: a create is placed as a spawn is, lists merge every host's, a
        call that names a sandbox goes to its host, the rest (templates, ...) to the first host."""
        path, method = request.url.path, request.method
        if path in _E2B_CREATE and method == "POST":
            body = await request.body()
            tag = _json_field(body, "templateID")
            candidates = spawn_candidates(self.membership.hosts().values(), tag) if tag else []
            return await self._first_reachable(request, candidates or self._alive()[:1], body,
                                               past_full=True, e2b=True)
        if path in _E2B_LISTS and method == "GET":
            return await self._e2b_merged(request)
        if m := _E2B_SANDBOX_PATH.match(path):
            return await self._e2b_to_owner(request, m.group("id"), stream=False)
        rest = None if streams_body(request.scope) else await request.body()
        return await self._first_reachable(request, self._alive(), rest, e2b=True)

    async def _e2b_to_owner(self, request: Request, sandbox_id: str, *, stream: bool) -> Response:
        """A call to one sandbox, on its host; envd's (``stream``) relayed as it comes, both ways."""
        host_id = host_of(sandbox_id) if SANDBOX_ID_RE.match(sandbox_id) else None
        host = self.membership.get(host_id) if host_id is not None else None
        if host is None:
            why = ("its id names no host of this fleet" if host_id is None
                   else f"its host {host_id!r} left the fleet (its lease in etcd expired)")
            return _e2b_error(404, f"sandbox {sandbox_id} not found: {why}")
        body = None if stream or streams_body(request.scope) else await request.body()
        try:
            return await self._forward(host, request, body, stream_response=stream, e2b=True)
        except HostFailed as exc:
            return _e2b_error(exc.status, str(exc))

    async def _e2b_merged(self, request: Request) -> Response:
        """E2B's sandbox lists from every host, one list (newest first, up to the asked ``limit``).
        Paging is not carried across hosts: the answer has every host's first page and no next token."""
        hosts = self._alive()
        results = await asyncio.gather(*(self._forward(h, request, b"", timeout=self.settings.list_timeout,
                                                       e2b=True) for h in hosts), return_exceptions=True)
        merged: list[dict[str, Any]] = []
        unreachable = []
        for host, result in zip(hosts, results, strict=True):
            if isinstance(result, BaseException):
                unreachable.append(host.host_id)
                continue
            if result.status_code != 200:
                return result  # a bad query or key is bad on every host: its answer says why
            listed = json.loads(bytes(result.body))
            merged += [item for item in listed if isinstance(item, dict)] if isinstance(listed, list) else []
        merged.sort(key=lambda item: str(item.get("startedAt", "")), reverse=True)
        limit = request.query_params.get("limit", "")
        if limit.isdigit():
            merged = merged[:int(limit)]
        headers = {UNREACHABLE_HEADER: ",".join(unreachable)} if unreachable else None
        return JSONResponse(merged, headers=headers)

    # ------------------------------------------------------------ routes

    def _alive(self) -> list[HostRecord]:
        return by_load(self.membership.hosts().values())

    def _pinned(self, request: Request) -> tuple[str | None, Response | None]:
        pinned = request.headers.get(PIN_HEADER)
        if pinned is None:
            return None, None
        if self.membership.get(pinned) is None:
            known = ", ".join(sorted(self.membership.hosts())) or "none"
            return pinned, _error(404, f"host {pinned!r} ({PIN_HEADER}) is not in the fleet; hosts: {known}")
        return pinned, None

    async def _spawn(self, request: Request) -> Response:
        body = await request.body()
        pinned, refusal = self._pinned(request)
        if refusal is not None:
            return refusal
        tag = _json_field(body, "snapshot_tag")
        candidates = (spawn_candidates(self.membership.hosts().values(), tag, pinned) if tag is not None
                      else self._alive()[:1])
        if not candidates:
            candidates = self._alive()[:1]  # nobody holds it and nobody can pull: let a host say 404
        return await self._first_reachable(request, candidates, body, past_full=True)

    async def _create_snapshot(self, request: Request) -> Response:
        body = await request.body()
        pinned, refusal = self._pinned(request)
        if refusal is not None:
            return refusal
        candidates = [h for h in self._alive() if pinned is None or h.host_id == pinned]
        response = await self._first_reachable(request, candidates, body)
        return await self._publish(response)

    async def _to_owner(self, request: Request, sandbox_id: str, rest: str) -> Response:
        if not SANDBOX_ID_RE.match(sandbox_id):
            return await self._to_any(request)  # let a host answer its usual 400
        host_id = host_of(sandbox_id)
        if host_id is None:
            return _error(404, f"sandbox {sandbox_id} is not in this fleet: its id names no host "
                               "(fleet hosts make ids sb-<host>-<hex>-<n>; start them with --host-id)")
        host = self.membership.get(host_id)
        if host is None:
            return _error(404, f"sandbox {sandbox_id} is gone: its host {host_id!r} left the fleet "
                               "(its lease in etcd expired or was revoked)")
        body = None if streams_body(request.scope) else await request.body()
        stream_out = request.method == "GET" and rest == "/files"
        try:
            response = await self._forward(host, request, body, stream_response=stream_out)
        except HostFailed as exc:
            return _error(exc.status, str(exc))
        if request.method == "POST" and rest == "/branch":
            response = await self._publish(response)
        return response

    async def _to_snapshot(self, request: Request, tag: str, rest: str) -> Response:
        hosts = self.membership.hosts().values()
        if request.method == "POST" and rest == "/pull":
            pinned, refusal = self._pinned(request)
            if refusal is not None:
                return refusal
            targets = [h for h in self._alive() if (h.host_id == pinned if pinned else h.store)]
            return await self._first_reachable(request, targets or self._alive()[:1], await request.body())
        having = holders(hosts, tag)
        if request.method == "DELETE" and not rest and having:
            return await self._delete_everywhere(request, having)
        return await self._first_reachable(request, having or self._alive()[:1], await request.body())

    async def _to_any(self, request: Request) -> Response:
        body = None if streams_body(request.scope) else await request.body()
        return await self._first_reachable(request, self._alive(), body)

    async def _delete_everywhere(self, request: Request, hosts: list[HostRecord]) -> Response:
        last: Response | None = None
        for host in hosts:
            try:
                last = await self._forward(host, request, await request.body())
            except HostFailed as exc:
                return _error(exc.status, f"{exc} (deleted on none of {[h.host_id for h in hosts]} after it)")
            if last.status_code >= 400:
                return last
        assert last is not None
        return last

    async def _first_reachable(self, request: Request, hosts: list[HostRecord],
                               body: bytes | None, *, past_full: bool = False, e2b: bool = False) -> Response:
        """The first answer of ``hosts`` in order, past those that cannot be reached and, with
        ``past_full`` (a spawn: nothing started on a host that refused it), those at capacity."""
        error = _e2b_error if e2b else _error
        if not hosts:
            return error(503, "no forkd host is in the fleet (none holds a lease in etcd); start a host "
                              "daemon with --etcd and --host-id")
        failures: list[str] = []
        full: list[tuple[HostRecord, Response]] = []
        for host in hosts:
            try:
                response = await self._forward(host, request, body, e2b=e2b)
            except HostFailed as exc:
                if exc.sent:
                    return error(exc.status, str(exc))
                failures.append(str(exc))
                continue
            if past_full and _no_capacity(response):
                full.append((host, response))
                continue
            return response
        if full and not failures:
            waits = [int(w) for _, r in full if (w := r.headers.get("retry-after", "")).isdigit()]
            message = ("every host of the fleet that could take this spawn is at capacity: "
                       + "; ".join(f"{h.host_id}: {_error_text(r)}" for h, r in full))
            retry = {"Retry-After": str(min(waits))} if waits else None
            if e2b:
                return _e2b_error(503, message, retry)
            return JSONResponse({"error": message, "code": NO_CAPACITY}, status_code=503, headers=retry)
        return error(502, "; ".join(failures + [f"{h.host_id}: {_error_text(r)}" for h, r in full]))

    async def _merged(self, request: Request, key: str) -> Response:
        """Every host's list, merged (by ``key``, first host wins); unreachable hosts are named."""
        hosts = self._alive()
        body = await request.body()  # read once: every host gets the same
        results = await asyncio.gather(*(self._forward(h, request, body, timeout=self.settings.list_timeout)
                                         for h in hosts), return_exceptions=True)
        merged: dict[str, Any] = {}
        unreachable = []
        for host, result in zip(hosts, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("gateway: %s left out of %s: %s", host.host_id, request.url.path, result)
                unreachable.append(host.host_id)
                continue
            if result.status_code != 200:
                return result  # a bad query is bad on every host: its answer says why
            for item in json.loads(bytes(result.body)):
                merged.setdefault(str(item.get(key)), item)
        items = sorted(merged.values(), key=lambda i: (i.get("created_at_unix", 0), str(i.get(key))))
        headers = {UNREACHABLE_HEADER: ",".join(unreachable)} if unreachable else None
        return JSONResponse(items, headers=headers)

    async def _publish(self, response: Response) -> Response:
        """After a snapshot was made through the gateway: have its host push it to the store."""
        host_id = response.headers.get("x-forkd-host")
        if not self.settings.publish or response.status_code != 201 or host_id is None:
            return response
        info = json.loads(bytes(response.body))
        host = self.membership.get(host_id)
        if info.get("status") != "ready" or host is None or not host.store:
            return response
        try:
            pushed = await self._call(host, "POST", f"/{API_VERSION}/snapshots/{info['tag']}/push")
            problem = None if pushed.status_code == 200 else pushed.json().get("error", pushed.text)
        except HostFailed as exc:
            problem = str(exc)
        if problem:
            info["warning"] = f"created on host {host_id} but not published to the object store: {problem}"
            return JSONResponse(info, status_code=201, headers={"x-forkd-host": host_id})
        return response

    # ------------------------------------------------------------ proxying

    def _headers(self, request: Request, *, e2b: bool = False) -> dict[str, str]:
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

    async def _call(self, host: HostRecord, method: str, path: str) -> httpx.Response:
        """A call of the gateway's own to a host (no client request behind it)."""
        headers = {"authorization": f"Bearer {self._host_token}"} if self._host_token else {}
        request = self.client.build_request(method, host.url + path, headers=headers)
        return await self._send(host, request, stream=False, timeout=self.settings.request_timeout)

    async def _forward(self, host: HostRecord, request: Request, body: bytes | None, *,
                       stream_response: bool = False, timeout: float | None = None,
                       e2b: bool = False) -> Response:
        url = host.url + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        content: bytes | AsyncIterator[bytes] = body if body is not None else request.stream()
        outgoing = self.client.build_request(request.method, url, headers=self._headers(request, e2b=e2b),
                                             content=content)
        upstream = await self._send(host, outgoing, stream=stream_response,
                                    timeout=timeout or self.settings.request_timeout)
        self._proxied.labels(host.host_id, str(upstream.status_code)).inc()
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP_RESPONSE}
        headers["x-forkd-host"] = host.host_id
        if stream_response:
            return StreamingResponse(upstream.aiter_raw(), status_code=upstream.status_code, headers=headers,
                                     background=BackgroundTask(upstream.aclose))
        return Response(upstream.content, status_code=upstream.status_code, headers=headers)

    async def _send(self, host: HostRecord, request: httpx.Request, *, stream: bool,
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


def _e2b_error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """An error in the shape E2B's SDKs read: {"code", "message"}."""
    return JSONResponse({"code": status, "message": message}, status_code=status, headers=headers)


def _no_capacity(response: Response) -> bool:
    """Whether a host answered 503 ``no_capacity`` (it is full; another host may not be)."""
    if response.status_code != 503:
        return False
    try:
        return bool(json.loads(bytes(response.body)).get("code") == NO_CAPACITY)
    except (ValueError, AttributeError):
        return False


def _error_text(response: Response) -> str:
    try:
        return str(json.loads(bytes(response.body))["error"])[:300]
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}"


def _json_field(body: bytes, name: str) -> str | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    value = data.get(name) if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


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
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_body_bytes, exempt=streams_body)
    if token is not None:
        app.add_middleware(_BearerUnlessE2B, token=token)
    return app


class _BearerUnlessE2B:
    """The gateway's token on forkd's own API. E2B's requests carry E2B's credentials instead (an
    API key, a sandbox's access token), which the host they go to checks: the gateway passes them
    on unchanged and adds none of its own (Gateway._headers)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self._app = app
        self._checked = BearerAuthMiddleware(app, token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (is_e2b_request(scope) or addressed_sandbox(scope) is not None):
            await self._app(scope, receive, send)
            return
        await self._checked(scope, receive, send)


__all__ = ["Gateway", "GatewaySettings", "HostFailed", "create_gateway_app"]
