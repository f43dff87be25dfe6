"""E2B's API through the gateway: its control plane placed and merged as /v1's is, and envd's
traffic (the ``E2b-Sandbox-Id`` header or the ``{port}-{id}.{domain}`` Host) relayed to the
sandbox's host as it comes, both ways. E2B's calls keep their own credentials: the host checks
them (``HostProxy.headers``)."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.parse
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from forkd.api.e2b.paths import is_volume_upload
from forkd.api.file_routes import streams_body
from forkd.bounds import E2B_LIST_LIMIT, SANDBOX_ID_RE
from forkd.gateway.answers import e2b_error, json_field
from forkd.gateway.e2b_pages import DONE, BadToken, Cursor, HostPage, merge
from forkd.gateway.proxy import UNREACHABLE_HEADER, HostFailed
from forkd.store.layout import host_of

if TYPE_CHECKING:
    from forkd.gateway.core import Gateway

# E2B's control plane: where sandboxes are created and listed, and the paths that name one.
_E2B_CREATE = frozenset({"/sandboxes", "/v2/sandboxes", "/v3/sandboxes"})
_E2B_LISTS = frozenset({"/sandboxes", "/v2/sandboxes"})
_E2B_SANDBOX_PATH = re.compile(r"^(?:/v[23])?/sandboxes/(?P<id>[^/]+)(?:/.*)?$")
# E2B's volumes: one by id (its name), and its content API (E2B_VOLUME_API_URL at the gateway).
_E2B_VOLUME_PATH = re.compile(r"^/volumes/(?P<id>[^/]+)$")
_E2B_VOLUME_CONTENT = re.compile(r"^/volumecontent/(?P<id>[^/]+)/")


class E2BRoutes:
    def __init__(self, gateway: Gateway) -> None:
        self._gw = gateway

    async def control(self, request: Request) -> Response:
        """E2B's control plane: a create is placed as a spawn is (where its volumes are, if it
        mounts any), lists merge every host's, a call that names a sandbox or a volume goes to
        its host, the rest (templates, ...) to the first host."""
        gw = self._gw
        path, method = request.url.path, request.method
        if path in _E2B_CREATE and method == "POST":
            body = await request.body()
            candidates = await gw.spawn_hosts(body, json_field(body, "templateID"), "volumeMounts")
            return await gw.first_reachable(request, candidates, body, past_full=True, e2b=True)
        if path in _E2B_LISTS and method == "GET":
            return await self.merged(request)
        if m := _E2B_SANDBOX_PATH.match(path):
            return await self.to_owner(request, m.group("id"), stream=False)
        if path == "/volumes":
            return await (gw.volumes.create(request, e2b=True) if method == "POST"
                          else gw.merged(request, "name", e2b=True))
        if m := _E2B_VOLUME_PATH.match(path) or _E2B_VOLUME_CONTENT.match(path):
            return await gw.volumes.to_holder(request, m.group("id"), e2b=True,
                                              stream_in=is_volume_upload(request.scope))
        rest = None if streams_body(request.scope) else await request.body()
        return await gw.first_reachable(request, gw.alive(), rest, e2b=True)

    async def to_owner(self, request: Request, sandbox_id: str, *, stream: bool) -> Response:
        """A call to one sandbox, on its host; envd's (``stream``) relayed as it comes, both ways."""
        gw = self._gw
        host_id = host_of(sandbox_id) if SANDBOX_ID_RE.match(sandbox_id) else None
        host = gw.membership.get(host_id) if host_id is not None else None
        if host is None:
            why = ("its id names no host of this fleet" if host_id is None
                   else f"its host {host_id!r} left the fleet (its lease in etcd expired)")
            return e2b_error(404, f"sandbox {sandbox_id} not found: {why}")
        body = None if stream or streams_body(request.scope) else await request.body()
        try:
            return await gw.proxy.forward(host, request, body, stream_response=stream, e2b=True)
        except HostFailed as exc:
            return e2b_error(exc.status, str(exc))

    async def merged(self, request: Request) -> Response:
        """E2B's sandbox list from every host, one list in E2B's order, paged across the hosts
        (gateway/e2b_pages.py): ``limit`` per page, an ``x-next-token`` while any host has more."""
        gw = self._gw
        params = list(request.query_params.multi_items())
        given = dict(params)
        limit_text = given.get("limit", "")
        if limit_text and not (limit_text.isdigit() and 1 <= int(limit_text) <= E2B_LIST_LIMIT):
            # Each host refuses it in its own words: pass the request on as it is.
            return await gw.first_reachable(request, gw.alive(), b"", e2b=True)
        limit = int(limit_text) if limit_text else E2B_LIST_LIMIT
        try:
            cursor = Cursor.decode(given.get("nextToken"))
        except BadToken as exc:
            return e2b_error(400, str(exc))
        hosts = [h for h in gw.alive() if cursor.offset(h.host_id) != DONE]
        rest = [(k, v) for k, v in params if k not in ("nextToken", "limit")]

        def query(host_id: str) -> str:
            offset = cursor.offset(host_id)
            return urllib.parse.urlencode([*rest, ("limit", str(limit)),
                                           *([("nextToken", str(offset))] if offset else [])])

        results = await asyncio.gather(*(gw.proxy.forward(h, request, b"", timeout=gw.settings.list_timeout,
                                                          e2b=True, query=query(h.host_id)) for h in hosts),
                                       return_exceptions=True)
        pages: dict[str, HostPage] = {}
        unreachable = []
        for host, result in zip(hosts, results, strict=True):
            if isinstance(result, BaseException):
                unreachable.append(host.host_id)
                continue
            if result.status_code != 200:
                return result  # a bad query or key is bad on every host: its answer says why
            listed = json.loads(bytes(result.body))
            items = [item for item in listed if isinstance(item, dict)] if isinstance(listed, list) else []
            pages[host.host_id] = HostPage(items[:limit], more=bool(result.headers.get("x-next-token"))
                                           or len(items) > limit)
        page, following = merge(pages, cursor, limit, ascending=given.get("order") == "asc",
                                unreachable=unreachable)
        headers = {UNREACHABLE_HEADER: ",".join(unreachable)} if unreachable else {}
        if following is not None:
            headers["x-next-token"] = following.encode()
        return JSONResponse(page, headers=headers or None)


__all__ = ["E2BRoutes"]
