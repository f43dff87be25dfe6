"""The gateway's dispatch and forkd's own /v1 routes: placed by snapshot and load, routed by
sandbox id, merged across hosts (see the package's docstring for the rules)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from forkd.api.e2b.paths import addressed_sandbox, is_e2b_request
from forkd.api.file_routes import streams_body
from forkd.bounds import SANDBOX_ID_RE
from forkd.config import API_VERSION, VERSION
from forkd.errors import NO_CAPACITY
from forkd.fleet.hosts import HostRecord
from forkd.fleet.membership import Membership
from forkd.fleet.placement import by_load, holders, spawn_candidates
from forkd.gateway.answers import e2b_error, error, error_text, json_field, no_capacity
from forkd.gateway.e2b import E2BRoutes
from forkd.gateway.proxy import PIN_HEADER, UNREACHABLE_HEADER, HostFailed, HostProxy
from forkd.gateway.settings import GatewaySettings
from forkd.gateway.spread import SpreadForks
from forkd.gateway.volumes import VolumeRoutes
from forkd.store.layout import host_of

log = logging.getLogger("forkd.gateway")

_SANDBOX_PATH = re.compile(rf"^/{API_VERSION}/sandboxes/(?P<id>[^/]+)(?P<rest>/.*)?$")
_SNAPSHOT_PATH = re.compile(rf"^/{API_VERSION}/snapshots/(?P<tag>[^/]+)(?P<rest>/.*)?$")
_VOLUME_PATH = re.compile(rf"^/{API_VERSION}/volumes/(?P<name>[^/]+)(?:/.*)?$")
_FORKS = frozenset({"/fork", "/fork-tree"})


class Gateway:
    def __init__(self, settings: GatewaySettings, membership: Membership, host_token: str | None) -> None:
        self.settings = settings
        self.membership = membership
        self.metrics = CollectorRegistry()
        self.proxy = HostProxy(settings, membership, host_token, self.metrics)
        hosts = Gauge("forkd_gateway_hosts", "Hosts holding a live lease.", registry=self.metrics)
        hosts.set_function(lambda: len(self.membership.hosts()))
        self.e2b = E2BRoutes(self)
        self.spread = SpreadForks(self)
        self.volumes = VolumeRoutes(self)

    async def close(self) -> None:
        await self.proxy.close()

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
            return await self.e2b.to_owner(request, sandbox_id, stream=True)
        if is_e2b_request(request.scope):
            return await self.e2b.control(request)
        if path == f"/{API_VERSION}/fleet" and method == "GET":
            return JSONResponse([h.info() for h in by_load(self.membership.hosts().values())])
        if path == f"/{API_VERSION}/sandboxes":
            return await (self._spawn(request) if method == "POST" else self.merged(request, "id"))
        if m := _SANDBOX_PATH.match(path):
            return await self._to_owner(request, m.group("id"), m.group("rest") or "")
        if path == f"/{API_VERSION}/snapshots":
            if method == "POST":
                return await self._create_snapshot(request)
            return await self.merged(request, "tag")
        if m := _SNAPSHOT_PATH.match(path):
            return await self._to_snapshot(request, m.group("tag"), m.group("rest") or "")
        if path == f"/{API_VERSION}/pools" and method == "GET":
            return await self.merged(request, "tag")
        if path == f"/{API_VERSION}/volumes":
            return await (self.volumes.create(request) if method == "POST" else self.merged(request, "name"))
        if m := _VOLUME_PATH.match(path):
            return await self.volumes.to_holder(request, m.group("name"))
        return await self._to_any(request)

    # ------------------------------------------------------------ routes

    def alive(self) -> list[HostRecord]:
        """The hosts holding a lease, least loaded first."""
        return by_load(self.membership.hosts().values())

    def pinned(self, request: Request) -> tuple[str | None, Response | None]:
        pinned = request.headers.get(PIN_HEADER)
        if pinned is None:
            return None, None
        if self.membership.get(pinned) is None:
            known = ", ".join(sorted(self.membership.hosts())) or "none"
            return pinned, error(404, f"host {pinned!r} ({PIN_HEADER}) is not in the fleet; hosts: {known}")
        return pinned, None

    async def _spawn(self, request: Request) -> Response:
        body = await request.body()
        pinned, refusal = self.pinned(request)
        if refusal is not None:
            return refusal
        candidates = await self.spawn_hosts(body, json_field(body, "snapshot_tag"), "volumes", pinned)
        return await self.first_reachable(request, candidates, body, past_full=True)

    async def spawn_hosts(self, body: bytes, tag: str | None, volumes_field: str,
                          pinned: str | None = None) -> list[HostRecord]:
        """The hosts to try, best first, for a spawn (or E2B's create) of ``tag`` whose ``body``
        may mount volumes (under ``volumes_field``): among the hosts holding them all, if any do
        (a pin overrides: that host answers), by the snapshot and load (fleet.placement)."""
        holding = None if pinned else await self.volumes.placed(body, volumes_field)
        pool = list(self.membership.hosts().values()) if holding is None else holding
        candidates = spawn_candidates(pool, tag, pinned) if tag else []
        # Nobody holds the snapshot and nobody can pull it: let a host say 404.
        return candidates or (self.alive() if holding is None else holding)[:1]

    async def _create_snapshot(self, request: Request) -> Response:
        body = await request.body()
        pinned, refusal = self.pinned(request)
        if refusal is not None:
            return refusal
        holding = None if pinned else await self.volumes.placed(body, "volumes")
        candidates = ([h for h in self.alive() if pinned is None or h.host_id == pinned] if holding is None
                      else holding[:1])
        response = await self.first_reachable(request, candidates, body)
        return await self.publish(response)

    async def _to_owner(self, request: Request, sandbox_id: str, rest: str) -> Response:
        if not SANDBOX_ID_RE.match(sandbox_id):
            return await self._to_any(request)  # let a host answer its usual 400
        host_id = host_of(sandbox_id)
        if host_id is None:
            return error(404, f"sandbox {sandbox_id} is not in this fleet: its id names no host "
                              "(fleet hosts make ids sb-<host>-<hex>-<n>; start them with --host-id)")
        host = self.membership.get(host_id)
        if host is None:
            return error(404, f"sandbox {sandbox_id} is gone: its host {host_id!r} left the fleet "
                              "(its lease in etcd expired or was revoked)")
        if request.method == "POST" and rest in _FORKS:
            fork = await request.body()
            if self.spread.wanted(fork):
                return await self.spread.fork(host, sandbox_id, fork, tree=rest == "/fork-tree")
        elif request.method == "POST" and rest == "/promote":
            return await self.spread.promote(host, sandbox_id, request, await request.body())
        body = None if streams_body(request.scope) else await request.body()
        stream_out = request.method == "GET" and rest == "/files"
        try:
            response = await self.proxy.forward(host, request, body, stream_response=stream_out)
        except HostFailed as exc:
            return error(exc.status, str(exc))
        if request.method == "POST" and rest == "/branch":
            response = await self.publish(response)
        return response

    async def _to_snapshot(self, request: Request, tag: str, rest: str) -> Response:
        hosts = self.membership.hosts().values()
        if request.method == "POST" and rest == "/pull":
            pinned, refusal = self.pinned(request)
            if refusal is not None:
                return refusal
            targets = [h for h in self.alive() if (h.host_id == pinned if pinned else h.store)]
            return await self.first_reachable(request, targets or self.alive()[:1], await request.body())
        having = holders(hosts, tag)
        if request.method == "DELETE" and not rest and having:
            return await self._delete_everywhere(request, having)
        return await self.first_reachable(request, having or self.alive()[:1], await request.body())

    async def _to_any(self, request: Request) -> Response:
        body = None if streams_body(request.scope) else await request.body()
        return await self.first_reachable(request, self.alive(), body)

    async def _delete_everywhere(self, request: Request, hosts: list[HostRecord]) -> Response:
        last: Response | None = None
        for host in hosts:
            try:
                last = await self.proxy.forward(host, request, await request.body())
            except HostFailed as exc:
                return error(exc.status, f"{exc} (deleted on none of {[h.host_id for h in hosts]} after it)")
            if last.status_code >= 400:
                return last
        assert last is not None
        return last

    async def first_reachable(self, request: Request, hosts: list[HostRecord],
                              body: bytes | None, *, past_full: bool = False, e2b: bool = False) -> Response:
        """The first answer of ``hosts`` in order, past those that cannot be reached and, with
        ``past_full`` (a spawn: nothing started on a host that refused it), those at capacity."""
        fail = e2b_error if e2b else error
        if not hosts:
            return fail(503, "no forkd host is in the fleet (none holds a lease in etcd); start a host "
                             "daemon with --etcd and --host-id")
        failures: list[str] = []
        full: list[tuple[HostRecord, Response]] = []
        for host in hosts:
            try:
                response = await self.proxy.forward(host, request, body, e2b=e2b)
            except HostFailed as exc:
                if exc.sent:
                    return fail(exc.status, str(exc))
                failures.append(str(exc))
                continue
            if past_full and no_capacity(response):
                full.append((host, response))
                continue
            return response
        if full and not failures:
            waits = [int(w) for _, r in full if (w := r.headers.get("retry-after", "")).isdigit()]
            message = ("every host of the fleet that could take this spawn is at capacity: "
                       + "; ".join(f"{h.host_id}: {error_text(r)}" for h, r in full))
            retry = {"Retry-After": str(min(waits))} if waits else None
            if e2b:
                return e2b_error(503, message, retry)
            return JSONResponse({"error": message, "code": NO_CAPACITY}, status_code=503, headers=retry)
        return fail(502, "; ".join(failures + [f"{h.host_id}: {error_text(r)}" for h, r in full]))

    async def merged(self, request: Request, key: str, *, e2b: bool = False) -> Response:
        """Every host's list, merged (by ``key``, first host wins); unreachable hosts are named."""
        hosts = self.alive()
        body = await request.body()  # read once: every host gets the same
        limit = self.settings.list_timeout
        results = await asyncio.gather(*(self.proxy.forward(h, request, body, timeout=limit, e2b=e2b)
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

    async def publish(self, response: Response) -> Response:
        """After a snapshot was made through the gateway: have its host push it to the store."""
        host_id = response.headers.get("x-forkd-host")
        if not self.settings.publish or response.status_code != 201 or host_id is None:
            return response
        info = json.loads(bytes(response.body))
        host = self.membership.get(host_id)
        if info.get("status") != "ready" or host is None or not host.store:
            return response
        problem = await self.push(host, info["tag"])
        if problem:
            info["warning"] = f"created on host {host_id} but not published to the object store: {problem}"
            return JSONResponse(info, status_code=201, headers={"x-forkd-host": host_id})
        return response

    async def push(self, host: HostRecord, tag: str) -> str | None:
        """Have ``host`` push ``tag`` to the object store: None, or why it did not."""
        try:
            pushed = await self.proxy.call(host, "POST", f"/{API_VERSION}/snapshots/{tag}/push")
        except HostFailed as exc:
            return str(exc)
        if pushed.status_code == 200:
            return None
        try:
            return str(pushed.json().get("error", pushed.text))
        except ValueError:
            return f"HTTP {pushed.status_code}"


__all__ = ["Gateway"]
