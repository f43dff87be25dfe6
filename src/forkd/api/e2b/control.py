"""E2B's control plane: sandboxes created, connected (and so resumed), killed, listed,
described, given a new timeout, paused and forked. A template is a forkd snapshot tag;
``Template.build`` is served by ``templates.py``, snapshots of sandboxes by ``snapshots.py``.

Each route checks the request, calls the Runtime, and answers in the SDK's own
models (``shapes``); every error is ``{"code": <status>, "message"}``. Routes
the SDK has but forkd does not serve (logs, volumes, secrets, ...) answer ``501`` in that shape, naming
docs/E2B.md.

Authentication: ``X-API-KEY`` (what the SDK sends) or ``Authorization: Bearer``
must be the daemon's token; a daemon without a token takes any non-empty key.
"""

from __future__ import annotations

import datetime as dt
import hmac
import json
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from e2b.api.client.models import (
    ConnectSandbox,
    ConnectSandboxV2,
    NewSandbox,
    NewSandboxV2,
    SandboxForkRequest,
    SandboxPauseRequest,
)
from e2b.api.client.types import Unset
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from forkd import bounds
from forkd.api.e2b import shapes, template_names
from forkd.api.e2b.errors import rest_body
from forkd.api.e2b.guest_metrics import METRICS_SCRIPT, guest_metrics
from forkd.api.e2b.snapshots import SnapshotError, add_snapshot_routes
from forkd.api.e2b.template_tags import add_tag_routes
from forkd.api.e2b.templates import TemplateError, add_template_routes
from forkd.api.e2b.tokens import AccessTokens
from forkd.api.limits import BranchGate
from forkd.controller.options import ForkOptions, SpawnOptions
from forkd.errors import Busy, ForkdError, NotFound
from forkd.host.egress import EgressPolicy

if TYPE_CHECKING:
    from forkd.controller.runtime import Runtime

RuntimeSource = Callable[[], "Runtime | None"]

# The SDK's defaults (the models' documented ones): a new or resumed sandbox lives
# 300 s, a fork 15 s; at most 20 forks per call.
CREATE_TIMEOUT_SECS = 300
FORK_TIMEOUT_SECS = 15
MAX_FORKS = 20
LIST_LIMIT = 100
UNSUPPORTED = "see docs/E2B.md for what forkd serves"


class E2BError(Exception):
    """An answer in the SDK's error shape."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _json_error(status: int, message: str) -> JSONResponse:
    return JSONResponse(json.loads(rest_body(status, message)), status_code=status)


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise E2BError(400, f"request body is not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise E2BError(400, "request body must be a JSON object")
    return body


def _int(value: object, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise E2BError(400, f"{name} must be an integer between {low} and {high}")
    return value


def _strings(value: object, name: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in value.items()):
        raise E2BError(400, f"{name} must map strings to strings")
    return value


def _unknown(model: Any) -> None:
    extra = sorted(model.additional_properties)
    if extra:
        raise E2BError(400, f"unknown field {extra[0]!r}")


def _set(value: object) -> bool:
    return not isinstance(value, Unset) and value is not None


def create_control_app(runtime: RuntimeSource, tokens: AccessTokens, api_key: str | None,
                       gate: BranchGate, uploads: Path) -> FastAPI:
    """``gate``: the daemon's BRANCH concurrency gate, which a pause and a fork enter as forkd's
    own branch and fork routes do (503 at the cap). ``uploads``: where template builds' file
    uploads are kept (in the data dir)."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None,
                  telemetry={"tracing": False, "metrics": False, "logs": False})  # as the daemon's app

    def rt() -> Runtime:
        current = runtime()
        if current is None:
            raise Busy("the daemon is still starting; retry shortly")
        return current

    templates = add_template_routes(app, rt, uploads)  # Template.build: /v3/templates, uploads, builds
    add_tag_routes(app, rt)  # Template.assign_tags, remove_tags, get_tags

    @app.middleware("http")
    async def authenticate(request: Request, call_next: Callable[[Request], Any]) -> Response:
        if templates.signed_upload(request.scope):  # E2B's upload URLs carry no API key
            signed: Response = await call_next(request)
            return signed
        presented = request.headers.get("x-api-key") or ""
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            presented = presented or bearer.strip()
        if not presented or (api_key is not None
                             and not hmac.compare_digest(presented.encode(), api_key.encode())):
            return _json_error(401, "missing or invalid API key: set E2B_API_KEY to the forkd daemon's token")
        response: Response = await call_next(request)
        return response

    @app.exception_handler(E2BError)
    async def e2b_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, E2BError)
        return _json_error(exc.status, str(exc))

    @app.exception_handler(SnapshotError)
    async def snapshot_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, SnapshotError)
        return _json_error(exc.status, str(exc))

    @app.exception_handler(TemplateError)
    async def template_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, TemplateError)
        return _json_error(exc.status, str(exc))

    @app.exception_handler(ForkdError)
    async def forkd_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ForkdError)
        return _json_error(exc.status if 400 <= exc.status <= 599 else 500, str(exc) or type(exc).__name__)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code in (404, 405):
            return _json_error(501, f"{request.method} {request.url.path} is not supported by forkd; "
                               f"{UNSUPPORTED}")
        return _json_error(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        return _json_error(500, f"internal error: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ create / connect

    # The SDK before 2.46 creates through /sandboxes and connects through /sandboxes/{id}/connect:
    # the same bodies but for NewSandbox's ``secure``, which E2B's own API ignores (every sandbox
    # is secured; forkd hands out an envd token for each) and so does forkd.
    @app.post("/v2/sandboxes", status_code=201)
    async def create(request: Request) -> dict[str, Any]:
        return await _create(await _body(request), NewSandboxV2)

    @app.post("/sandboxes", status_code=201)
    async def create_v1(request: Request) -> dict[str, Any]:
        return await _create(await _body(request), NewSandbox)

    async def _create(body: dict[str, Any], model: type[NewSandbox] | type[NewSandboxV2]) -> dict[str, Any]:
        if not isinstance(body.get("templateID"), str):
            raise E2BError(400, "templateID (a forkd snapshot tag) is required")
        req = model.from_dict(body)
        _unknown(req)
        timeout = _int(req.timeout, "timeout", 1, int(bounds.SANDBOX_TIMEOUT_SECS.high)) \
            if _set(req.timeout) else CREATE_TIMEOUT_SECS
        metadata = _strings(req.metadata, "metadata") if _set(req.metadata) else {}
        env = _strings(req.env_vars, "envVars") if _set(req.env_vars) else {}
        # autoPause: at its timeout the sandbox is hibernated rather than killed (listed as paused;
        # connect wakes it, and with autoResume any envd request too: controller/hibernation.py).
        # autoPauseMemory false: that hibernation keeps the disk alone, and connect cold-boots it.
        auto_pause = bool(_set(req.auto_pause) and req.auto_pause)
        keep_memory = body.get("autoPauseMemory")
        if keep_memory is not None and (not isinstance(keep_memory, bool) or not auto_pause):
            raise E2BError(400, "autoPauseMemory is true or false, with autoPause: whether the pause at "
                           "the timeout keeps the memory (false: the filesystem only)")
        resume = body.get("autoResume")
        if keep_memory is False and resume == {"enabled": True}:
            raise E2BError(400, "autoResume cannot be enabled with autoPauseMemory false: a filesystem-only "
                           "pause is resumed by connect alone")
        if resume not in (None, {}) and not (auto_pause and resume in ({"enabled": True},
                                                                       {"enabled": False})):
            raise E2BError(400, "autoResume is {\"enabled\": true} or {\"enabled\": false}, with autoPause: "
                           "whether traffic to the sandbox, once paused at its timeout, resumes it")
        # autoResume on: once paused (hibernated), any envd or interpreter request wakes it. Off,
        # as E2B's API takes an omitted one (its SDK's is_running() must then say False): that
        # traffic answers 502 "not running" until connect resumes it.
        auto_resume = resume == {"enabled": True}
        for name in ("iam", "volumeMounts"):
            if body.get(name) not in (None, [], {}):
                raise E2BError(400, f"{name} is not supported by forkd ({UNSUPPORTED})")
        # mcp: the SDK itself starts E2B's `mcp-gateway` in the new sandbox with this config (and
        # kills the sandbox if that fails); the API has nothing to do with it but accept it.
        if body.get("mcp") is not None and not isinstance(body.get("mcp"), dict):
            raise E2BError(400, "mcp must be an object (the MCP gateway's configuration)")
        allow = body.get("allow_internet_access")
        if allow is not None and not isinstance(allow, bool):
            raise E2BError(400, "allow_internet_access must be true or false")
        # alias:tag is the snapshot alias.tag, or the one an assigned tag of that name stands for.
        template = rt().resolve_snapshot(template_names.snapshot_tag(req.template_id))
        try:
            options = SpawnOptions.from_request({"env": env or None, "metadata": metadata or None,
                                                 "timeout_secs": timeout, "allow_internet_access": allow,
                                                 "network": _network(body.get("network")),
                                                 "hibernate_on_timeout": auto_pause,
                                                 "hibernate_on_timeout_memory": keep_memory is not False,
                                                 "auto_resume": auto_resume})
            [record] = await rt().spawn(template, 1, options)
        except NotFound:
            try:
                rt().get_snapshot(template)
            except NotFound as missing:  # the template itself (not something the spawn needed)
                raise E2BError(404, f"template {req.template_id!r} is not a snapshot on this daemon: make "
                               f"one with `forkd snapshot --tag {template}` (a template is a forkd "
                               "snapshot tag, alias:tag the tag alias.tag; see docs/E2B.md)") from missing
            raise
        return shapes.created(record.id, template, tokens)

    @app.post("/v2/sandboxes/{sandbox_id}/connect")
    async def connect(sandbox_id: str, request: Request, response: Response) -> dict[str, Any]:
        return await _connect(sandbox_id, ConnectSandboxV2.from_dict(await _body(request)), response)

    @app.post("/sandboxes/{sandbox_id}/connect")
    async def connect_v1(sandbox_id: str, request: Request, response: Response) -> dict[str, Any]:
        body = await _body(request)
        if not isinstance(body.get("timeout"), int):
            raise E2BError(400, "timeout (seconds) is required")
        return await _connect(sandbox_id, ConnectSandbox.from_dict(body), response)

    async def _connect(sandbox_id: str, req: ConnectSandbox | ConnectSandboxV2,
                       response: Response) -> dict[str, Any]:
        _unknown(req)
        timeout = _int(req.timeout, "timeout", 1, int(bounds.SANDBOX_TIMEOUT_SECS.high)) \
            if _set(req.timeout) else CREATE_TIMEOUT_SECS
        if _set(req.memory) and req.memory is False:
            raise E2BError(400, 'on_resume="reboot" (a cold boot from the disk) is not supported by forkd; '
                           "a paused sandbox resumes from its memory state")
        view = rt().describe_sandbox(sandbox_id)
        if view["state"] == "paused":
            await rt().resume(sandbox_id, timeout_secs=timeout)
            response.status_code = 201
        else:
            # E2B: a running sandbox's timeout only ever grows through connect.
            deadline = dt.datetime.now(dt.UTC).timestamp() + timeout
            if view["ends"] is not None and view["ends"] < deadline:
                rt().set_timeout(sandbox_id, timeout)
        return shapes.created(view["id"], view["template"], tokens)

    # ------------------------------------------------------------------ one sandbox

    @app.delete("/sandboxes/{sandbox_id}", status_code=204)
    async def kill(sandbox_id: str) -> Response:
        await rt().kill(sandbox_id)
        return Response(status_code=204)

    @app.get("/sandboxes/{sandbox_id}")
    async def get_info(sandbox_id: str) -> dict[str, Any]:
        return shapes.detail(rt().describe_sandbox(sandbox_id), tokens)

    @app.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
    async def set_timeout(sandbox_id: str, request: Request) -> Response:
        body = await _body(request)
        # 0 is E2B's "now": the sandbox's timeout action (kill, or pause) comes at once.
        timeout = _int(body.get("timeout"), "timeout", 0, int(bounds.SANDBOX_TIMEOUT_SECS.high))
        if set(body) - {"timeout"}:
            raise E2BError(400, f"unknown field {sorted(set(body) - {'timeout'})[0]!r}")
        if rt().describe_sandbox(sandbox_id)["state"] == "paused":
            raise E2BError(409, f"sandbox {sandbox_id} is paused: connect to resume it, then set its timeout")
        rt().set_timeout(sandbox_id, timeout)
        return Response(status_code=204)

    @app.get("/sandboxes/{sandbox_id}/metrics")
    async def metrics(sandbox_id: str, request: Request) -> list[dict[str, Any]]:
        """One sample, taken now in the guest, if now is in the asked range (E2B keeps a history
        in 5 s buckets; forkd keeps none). Nothing for a range the sandbox did not run in."""
        query = request.query_params
        if set(query) - {"start", "end"}:
            raise E2BError(400, f"unknown query parameter {sorted(set(query) - {'start', 'end'})[0]!r}")
        view = rt().describe_sandbox(sandbox_id)
        if view["state"] != "running":
            return []
        now = dt.datetime.now(dt.UTC).timestamp()
        start = _as_int(query["start"]) if query.get("start") else None
        end = _as_int(query["end"]) if query.get("end") else None
        # Second-precision bounds (the SDK's), so "now" counts until the end of the second asked for.
        if (start is not None and start > now) or (end is not None and end + 1 < now) \
                or (end is not None and end < view["started"]):
            return []
        result = await rt().exec(sandbox_id, ["/bin/sh", "-c", METRICS_SCRIPT], timeout_secs=10)
        if result.get("exit_code") != 0:
            raise E2BError(502, f"could not read the sandbox's metrics: {str(result.get('stderr'))[:200]}")
        try:
            figures = guest_metrics(str(result.get("stdout", "")))
        except ValueError:
            raise E2BError(502, "the sandbox's metrics could not be read") from None
        return [shapes.metric(now, figures)]

    @app.post("/sandboxes/{sandbox_id}/pause", status_code=204)
    async def pause(sandbox_id: str, request: Request) -> Response:
        req = SandboxPauseRequest.from_dict(await _body(request))
        _unknown(req)
        if _set(req.memory) and not isinstance(req.memory, bool):
            raise E2BError(400, "memory must be true or false")
        if rt().describe_sandbox(sandbox_id)["state"] == "paused":
            raise E2BError(409, f"sandbox {sandbox_id} is already paused")
        if req.memory is False:
            # Filesystem only (the SDK's keep_memory=False): a disk-only hibernation. Listed as
            # paused; connect cold-boots it from its disk, and its envd traffic does not (E2B's
            # auto-resume refuses such a sandbox): controller/hibernation.py, docs/E2B.md.
            await rt().hibernation.hibernate(sandbox_id, memory=False)
            return Response(status_code=204)
        with gate.enter(None, rt().tags.in_flight):
            await rt().pause(sandbox_id)
        return Response(status_code=204)

    @app.put("/sandboxes/{sandbox_id}/network", status_code=204)
    async def update_network(sandbox_id: str, request: Request) -> Response:
        """``update_network``: the new allowOut and denyOut replace the old (omitted: cleared);
        ``allow_internet_access`` omitted keeps the sandbox's; its inbound settings
        (allowPublicTraffic, maskRequestHost) stay. A hibernated sandbox gets it at its wake."""
        body = await _body(request)
        allow = body.pop("allow_internet_access", None)
        if allow is not None and not isinstance(allow, bool):
            raise E2BError(400, "allow_internet_access must be true or false")
        for name in ("egressProxy", "rules"):
            if body.get(name) not in (None, {}):
                raise E2BError(400, f"{name} is not supported by forkd ({UNSUPPORTED})")
            body.pop(name, None)
        current = rt().describe_sandbox(sandbox_id)["egress"]
        network = _network(body)
        network.update({k: current[k] for k in ("allow_public_traffic", "mask_request_host")})
        egress = EgressPolicy.from_request(current["allow_internet_access"] if allow is None else allow,
                                           network)
        await rt().update_network(sandbox_id, egress)
        return Response(status_code=204)

    @app.post("/sandboxes/{sandbox_id}/fork", status_code=201)
    async def fork(sandbox_id: str, request: Request) -> list[dict[str, Any]]:
        req = SandboxForkRequest.from_dict(await _body(request))
        _unknown(req)
        count = _int(req.count, "count", 1, MAX_FORKS) if _set(req.count) else 1
        timeout = _int(req.timeout, "timeout", 1, int(bounds.SANDBOX_TIMEOUT_SECS.high)) \
            if _set(req.timeout) else FORK_TIMEOUT_SECS
        view = rt().describe_sandbox(sandbox_id)
        if view["state"] == "paused":
            raise E2BError(409, f"sandbox {sandbox_id} is paused: connect to resume it before forking")
        # The forks carry the source's labels, but not a fork-tree's, which only fork-tree sets.
        labels = {k: v for k, v in view["metadata"].items() if k not in bounds.FORK_LABELS}
        egress = view["egress"]  # the forks get the source's, as copies of it
        with gate.enter(None, rt().tags.in_flight):
            options = ForkOptions.from_request({
                "metadata": labels or None, "timeout_secs": timeout,
                "allow_internet_access": egress["allow_internet_access"],
                "network": {k: egress[k] for k in ("allow_out", "deny_out")}})
            result = await rt().fork(sandbox_id, count, options)
        entries: list[dict[str, Any] | None] = [None] * count
        for child, index in zip(result.children, _indices(count, result.errors), strict=True):
            entries[index] = {"sandbox": shapes.created(child.id, view["template"], tokens)}
        for err in result.errors:
            entries[err["index"]] = {"error": {"code": 500, "message": str(err["error"])}}
        return [e if e is not None else {"error": {"code": 500, "message": "the fork did not start"}}
                for e in entries]

    # ------------------------------------------------------------------ list

    @app.get("/v2/sandboxes")
    async def list_sandboxes(request: Request, response: Response) -> list[dict[str, Any]]:
        query = request.query_params
        known = {"metadata", "state", "limit", "nextToken", "template", "startedAfter", "order"}
        if set(query) - known:
            raise E2BError(400, f"unknown query parameter {sorted(set(query) - known)[0]!r}")
        wanted = _metadata_filter(query.get("metadata"))
        states = set(query["state"].split(",")) if query.get("state") else {"running", "paused"}
        if states - {"running", "paused"}:
            raise E2BError(400, "state must be running and/or paused")
        limit = LIST_LIMIT
        if query.get("limit"):
            limit = _int(_as_int(query.get("limit")), "limit", 1, LIST_LIMIT)
        after = _started_after(query.get("startedAfter"))
        views = [v for v in rt().describe_sandboxes()
                 if v["state"] in states and all(v["metadata"].get(k) == x for k, x in wanted.items())
                 and (not query.get("template") or v["template"] == query["template"])
                 and (after is None or v["started"] >= after)]
        # By start time, newest first unless asked otherwise (E2B's default).
        if query.get("order") not in (None, "", "asc", "desc"):
            raise E2BError(400, "order must be asc or desc")
        if query.get("order") != "asc":
            views.reverse()
        start = _as_int(query.get("nextToken")) if query.get("nextToken") else 0
        page = views[start:start + limit]
        if start + limit < len(views):
            response.headers["x-next-token"] = str(start + limit)
        return [shapes.listed(v) for v in page]

    add_snapshot_routes(app, rt, gate)  # create_snapshot, list_snapshots, delete_snapshot

    # Everything else the SDK can call: 501 in its shape (see http_error above).
    return app


# Fields of E2B's network config that forkd does not serve: accepted when empty (the SDK may
# send them so), refused otherwise.
_E2B_NETWORK_UNSERVED = frozenset({"dnsServers", "egressProxy", "httpsPorts", "rules"})


def _network(raw: object) -> dict[str, Any]:
    """E2B's ``network`` as forkd's network policy (host/egress.py); 400 for what forkd lacks.
    A sandbox's ports are public unless ``allowPublicTraffic`` is false, as in E2B (forkd's own
    default is the other way)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise E2BError(400, "network must be an object")
    served = {"allowOut": "allow_out", "denyOut": "deny_out", "allowPublicTraffic": "allow_public_traffic",
              "maskRequestHost": "mask_request_host"}
    # A key outside E2B's schema is refused rather than skipped: a misspelled restriction
    # (``allow_public_traffic: false``, snake_case, which neither SDK sends) must never leave
    # the sandbox with a looser policy than its creator asked for.
    unknown = sorted(k for k in raw if k not in served and k not in _E2B_NETWORK_UNSERVED)
    if unknown:
        name = unknown[0][:64]
        camel = "".join(w.capitalize() if i else w for i, w in enumerate(name.split("_")))
        hint = f" (E2B's API spells it {camel})" if camel in served else ""
        raise E2BError(400, f"network.{name} is not a field of E2B's network{hint}: forkd takes allowOut, "
                       "denyOut, allowPublicTraffic and maskRequestHost")
    other = sorted(k for k, v in raw.items() if k not in served and v not in (None, False, [], {}))
    if other:
        raise E2BError(400, f"network.{other[0]} is not supported by forkd (allowOut and denyOut, as "
                       "IPv4 networks with optional ports, allowPublicTraffic and maskRequestHost; "
                       f"{UNSUPPORTED})")
    ours = {ours: raw[theirs] for theirs, ours in served.items() if raw.get(theirs) is not None}
    ours.setdefault("allow_public_traffic", True)
    return ours


def _indices(count: int, errors: list[dict[str, Any]]) -> list[int]:
    """The child indices that succeeded, in order (a fork lists children without their index)."""
    failed = {int(e["index"]) for e in errors}
    return [i for i in range(count) if i not in failed]


def _as_int(value: str | None) -> int:
    try:
        return int(value or "")
    except ValueError:
        raise E2BError(400, f"{value!r} is not an integer") from None


def _metadata_filter(raw: str | None) -> dict[str, str]:
    """The SDK sends ``metadata=`` as a URL-encoded ``k=v&k2=v2`` whose keys and values are quoted."""
    if not raw:
        return {}
    return {urllib.parse.unquote(k): urllib.parse.unquote(v)
            for k, v in urllib.parse.parse_qsl(raw, keep_blank_values=True)}


def _started_after(raw: str | None) -> float | None:
    if not raw:
        return None
    try:
        return dt.datetime.fromisoformat(raw).timestamp()
    except ValueError:
        raise E2BError(400, f"startedAfter {raw!r} is not an ISO 8601 time") from None


__all__ = ["create_control_app"]
