"""E2B's sandbox routes: created, connected (and so resumed), killed, listed, described, given a
new timeout, paused, re-networked, measured and forked. A template is a forkd snapshot tag.

Each route checks the request (``inputs``), calls the Runtime (``RuntimeDep``), and answers in
the SDK's own models (``shapes``); an ``E2BError`` or forkd's error is answered by the control
app's handlers as ``{"code": <status>, "message"}`` (control.py).
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from e2b.api.client.models import (
    ConnectSandbox,
    ConnectSandboxV2,
    NewSandbox,
    NewSandboxV2,
    SandboxForkRequest,
    SandboxPauseRequest,
)
from fastapi import APIRouter, Request, Response

from forkd import bounds
from forkd.api.e2b import inputs, shapes, template_names
from forkd.api.e2b import volumes as e2b_volumes
from forkd.api.e2b.deps import GateDep, RuntimeDep, TokensDep
from forkd.api.e2b.errors import E2BError
from forkd.api.e2b.guest_metrics import METRICS_SCRIPT, guest_metrics
from forkd.api.e2b.inputs import UNSUPPORTED, given
from forkd.api.e2b.tokens import AccessTokens
from forkd.controller.options import ForkOptions, SpawnOptions
from forkd.errors import NotFound
from forkd.host.egress import EgressPolicy

if TYPE_CHECKING:
    from forkd.controller.runtime import Runtime

# The SDK's defaults (the models' documented ones): a new or resumed sandbox lives
# 300 s, a fork 15 s; at most 20 forks per call.
CREATE_TIMEOUT_SECS = 300
FORK_TIMEOUT_SECS = 15
MAX_FORKS = 20
LIST_LIMIT = bounds.E2B_LIST_LIMIT
_TIMEOUT_HIGH = int(bounds.SANDBOX_TIMEOUT_SECS.high)

router = APIRouter()

# ------------------------------------------------------------------ create / connect

# The SDK before 2.46 creates through /sandboxes and connects through /sandboxes/{id}/connect:
# the same bodies but for NewSandbox's ``secure``, which E2B's own API ignores (every sandbox
# is secured; forkd hands out an envd token for each) and so does forkd.


@router.post("/v2/sandboxes", status_code=201)
async def create(request: Request, rt: RuntimeDep, tokens: TokensDep) -> dict[str, Any]:
    return await _create(await inputs.body(request), NewSandboxV2, rt, tokens)


@router.post("/sandboxes", status_code=201)
async def create_v1(request: Request, rt: RuntimeDep, tokens: TokensDep) -> dict[str, Any]:
    return await _create(await inputs.body(request), NewSandbox, rt, tokens)


def _spawn_request(body: dict[str, Any], req: NewSandbox | NewSandboxV2) -> dict[str, Any]:
    """The create body as forkd's spawn request, but for its network (read after the template);
    400 for what forkd does not serve."""
    timeout = inputs.integer(req.timeout, "timeout", 1, _TIMEOUT_HIGH) if given(req.timeout) \
        else CREATE_TIMEOUT_SECS
    metadata = inputs.strings(req.metadata, "metadata") if given(req.metadata) else {}
    env = inputs.strings(req.env_vars, "envVars") if given(req.env_vars) else {}
    # autoPause: at its timeout the sandbox is hibernated rather than killed (listed as paused;
    # connect wakes it, and with autoResume any envd request too: controller/hibernation.py).
    # autoPauseMemory false: that hibernation keeps the disk alone, and connect cold-boots it.
    auto_pause = bool(given(req.auto_pause) and req.auto_pause)
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
    if body.get("iam") not in (None, [], {}):
        raise E2BError(400, f"iam is not supported by forkd ({UNSUPPORTED})")
    # mcp: the SDK itself starts E2B's `mcp-gateway` in the new sandbox with this config (and
    # kills the sandbox if that fails); the API has nothing to do with it but accept it.
    if body.get("mcp") is not None and not isinstance(body.get("mcp"), dict):
        raise E2BError(400, "mcp must be an object (the MCP gateway's configuration)")
    allow = body.get("allow_internet_access")
    if allow is not None and not isinstance(allow, bool):
        raise E2BError(400, "allow_internet_access must be true or false")
    return {"env": env or None, "metadata": metadata or None, "timeout_secs": timeout,
            "allow_internet_access": allow, "hibernate_on_timeout": auto_pause,
            "hibernate_on_timeout_memory": keep_memory is not False, "auto_resume": auto_resume}


async def _create(body: dict[str, Any], model: type[NewSandbox] | type[NewSandboxV2], rt: Runtime,
                  tokens: AccessTokens) -> dict[str, Any]:
    if not isinstance(body.get("templateID"), str):
        raise E2BError(400, "templateID (a forkd snapshot tag) is required")
    mounts = e2b_volumes.spawn_volumes(body.get("volumeMounts"))  # before the model's parse
    req = model.from_dict(body)
    inputs.no_unknown(req)
    spawn = _spawn_request(body, req)
    if mounts:
        # volumeMounts: each a shared attachment of the named (hostdir) volume, so every sandbox
        # mounting it sees the same files, live.
        e2b_volumes.require_served(rt, mounts)
        spawn["volumes"] = mounts
    # alias:tag is the snapshot alias.tag, or the one an assigned tag of that name stands for.
    template = rt.resolve_snapshot(template_names.snapshot_tag(req.template_id))
    try:
        options = SpawnOptions.from_request({**spawn, "network": inputs.network(body.get("network"))})
        [record] = await rt.spawn(template, 1, options)
    except NotFound:
        try:
            rt.get_snapshot(template)
        except NotFound as missing:  # the template itself (not something the spawn needed)
            raise E2BError(404, f"template {req.template_id!r} is not a snapshot on this daemon: make "
                           f"one with `forkd snapshot --tag {template}` (a template is a forkd "
                           "snapshot tag, alias:tag the tag alias.tag; see docs/E2B.md)") from missing
        raise
    return shapes.created(record.id, template, tokens)


@router.post("/v2/sandboxes/{sandbox_id}/connect")
async def connect(sandbox_id: str, request: Request, response: Response, rt: RuntimeDep,
                  tokens: TokensDep) -> dict[str, Any]:
    req = ConnectSandboxV2.from_dict(await inputs.body(request))
    return await _connect(sandbox_id, req, response, rt, tokens)


@router.post("/sandboxes/{sandbox_id}/connect")
async def connect_v1(sandbox_id: str, request: Request, response: Response, rt: RuntimeDep,
                     tokens: TokensDep) -> dict[str, Any]:
    body = await inputs.body(request)
    if not isinstance(body.get("timeout"), int):
        raise E2BError(400, "timeout (seconds) is required")
    return await _connect(sandbox_id, ConnectSandbox.from_dict(body), response, rt, tokens)


async def _connect(sandbox_id: str, req: ConnectSandbox | ConnectSandboxV2, response: Response,
                   rt: Runtime, tokens: AccessTokens) -> dict[str, Any]:
    inputs.no_unknown(req)
    timeout = inputs.integer(req.timeout, "timeout", 1, _TIMEOUT_HIGH) if given(req.timeout) \
        else CREATE_TIMEOUT_SECS
    if given(req.memory) and req.memory is False:
        raise E2BError(400, 'on_resume="reboot" (a cold boot from the disk) is not supported by forkd; '
                       "a paused sandbox resumes from its memory state")
    view = rt.describe_sandbox(sandbox_id)
    if view["state"] == "paused":
        await rt.resume(sandbox_id, timeout_secs=timeout)
        response.status_code = 201
    else:
        # E2B: a running sandbox's timeout only ever grows through connect.
        deadline = dt.datetime.now(dt.UTC).timestamp() + timeout
        if view["ends"] is not None and view["ends"] < deadline:
            rt.set_timeout(sandbox_id, timeout)
    return shapes.created(view["id"], view["template"], tokens)


# ------------------------------------------------------------------ one sandbox


@router.delete("/sandboxes/{sandbox_id}", status_code=204)
async def kill(sandbox_id: str, rt: RuntimeDep) -> Response:
    await rt.kill(sandbox_id)
    return Response(status_code=204)


@router.get("/sandboxes/{sandbox_id}")
async def get_info(sandbox_id: str, rt: RuntimeDep, tokens: TokensDep) -> dict[str, Any]:
    return shapes.detail(rt.describe_sandbox(sandbox_id), tokens)


@router.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
async def set_timeout(sandbox_id: str, request: Request, rt: RuntimeDep) -> Response:
    body = await inputs.body(request)
    # 0 is E2B's "now": the sandbox's timeout action (kill, or pause) comes at once.
    timeout = inputs.integer(body.get("timeout"), "timeout", 0, _TIMEOUT_HIGH)
    if set(body) - {"timeout"}:
        raise E2BError(400, f"unknown field {sorted(set(body) - {'timeout'})[0]!r}")
    if rt.describe_sandbox(sandbox_id)["state"] == "paused":
        raise E2BError(409, f"sandbox {sandbox_id} is paused: connect to resume it, then set its timeout")
    rt.set_timeout(sandbox_id, timeout)
    return Response(status_code=204)


@router.get("/sandboxes/{sandbox_id}/metrics")
async def metrics(sandbox_id: str, request: Request, rt: RuntimeDep) -> list[dict[str, Any]]:
    """One sample, taken now in the guest, if now is in the asked range (E2B keeps a history
    in 5 s buckets; forkd keeps none). Nothing for a range the sandbox did not run in."""
    query = request.query_params
    if set(query) - {"start", "end"}:
        raise E2BError(400, f"unknown query parameter {sorted(set(query) - {'start', 'end'})[0]!r}")
    view = rt.describe_sandbox(sandbox_id)
    if view["state"] != "running":
        return []
    now = dt.datetime.now(dt.UTC).timestamp()
    start = inputs.as_int(query["start"]) if query.get("start") else None
    end = inputs.as_int(query["end"]) if query.get("end") else None
    # Second-precision bounds (the SDK's), so "now" counts until the end of the second asked for.
    if (start is not None and start > now) or (end is not None and end + 1 < now) \
            or (end is not None and end < view["started"]):
        return []
    result = await rt.exec(sandbox_id, ["/bin/sh", "-c", METRICS_SCRIPT], timeout_secs=10)
    if result.get("exit_code") != 0:
        raise E2BError(502, f"could not read the sandbox's metrics: {str(result.get('stderr'))[:200]}")
    try:
        figures = guest_metrics(str(result.get("stdout", "")))
    except ValueError:
        raise E2BError(502, "the sandbox's metrics could not be read") from None
    return [shapes.metric(now, figures)]


@router.post("/sandboxes/{sandbox_id}/pause", status_code=204)
async def pause(sandbox_id: str, request: Request, rt: RuntimeDep, gate: GateDep) -> Response:
    """``gate``: the daemon's BRANCH concurrency gate, which a pause enters as forkd's own branch
    routes do (503 at the cap)."""
    req = SandboxPauseRequest.from_dict(await inputs.body(request))
    inputs.no_unknown(req)
    if given(req.memory) and not isinstance(req.memory, bool):
        raise E2BError(400, "memory must be true or false")
    if rt.describe_sandbox(sandbox_id)["state"] == "paused":
        raise E2BError(409, f"sandbox {sandbox_id} is already paused")
    if req.memory is False:
        # Filesystem only (the SDK's keep_memory=False): a disk-only hibernation. Listed as
        # paused; connect cold-boots it from its disk, and its envd traffic does not (E2B's
        # auto-resume refuses such a sandbox): controller/hibernation.py, docs/E2B.md.
        await rt.hibernation.hibernate(sandbox_id, memory=False)
        return Response(status_code=204)
    with gate.enter(None, rt.tags.in_flight):
        await rt.pause(sandbox_id)
    return Response(status_code=204)


@router.put("/sandboxes/{sandbox_id}/network", status_code=204)
async def update_network(sandbox_id: str, request: Request, rt: RuntimeDep) -> Response:
    """``update_network``: the new allowOut and denyOut replace the old (omitted: cleared);
    ``allow_internet_access`` omitted keeps the sandbox's; its inbound settings
    (allowPublicTraffic, maskRequestHost) stay. A hibernated sandbox gets it at its wake."""
    body = await inputs.body(request)
    allow = body.pop("allow_internet_access", None)
    if allow is not None and not isinstance(allow, bool):
        raise E2BError(400, "allow_internet_access must be true or false")
    if body.get("egressProxy") not in (None, {}):
        raise E2BError(400, f"egressProxy is not supported by forkd ({UNSUPPORTED})")
    body.pop("egressProxy", None)
    current = rt.describe_sandbox(sandbox_id)["egress"]
    network = inputs.network(body)
    network.update({k: current[k] for k in ("allow_public_traffic", "mask_request_host")})
    egress = EgressPolicy.from_request(current["allow_internet_access"] if allow is None else allow,
                                       network)
    await rt.update_network(sandbox_id, egress)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/fork", status_code=201)
async def fork(sandbox_id: str, request: Request, rt: RuntimeDep, tokens: TokensDep,
               gate: GateDep) -> list[dict[str, Any]]:
    """The forks enter the BRANCH gate as forkd's own fork route does (503 at the cap)."""
    req = SandboxForkRequest.from_dict(await inputs.body(request))
    inputs.no_unknown(req)
    count = inputs.integer(req.count, "count", 1, MAX_FORKS) if given(req.count) else 1
    timeout = inputs.integer(req.timeout, "timeout", 1, _TIMEOUT_HIGH) if given(req.timeout) \
        else FORK_TIMEOUT_SECS
    view = rt.describe_sandbox(sandbox_id)
    if view["state"] == "paused":
        raise E2BError(409, f"sandbox {sandbox_id} is paused: connect to resume it before forking")
    # The forks carry the source's labels, but not a fork-tree's, which only fork-tree sets.
    labels = {k: v for k, v in view["metadata"].items() if k not in bounds.FORK_LABELS}
    egress = view["egress"]  # the forks get the source's, as copies of it
    with gate.enter(None, rt.tags.in_flight):
        options = ForkOptions.from_request({
            "metadata": labels or None, "timeout_secs": timeout,
            "allow_internet_access": egress["allow_internet_access"],
            "network": {k: egress[k] for k in ("allow_out", "deny_out")}})
        result = await rt.fork(sandbox_id, count, options)
    entries: list[dict[str, Any] | None] = [None] * count
    for child, index in zip(result.children, _indices(count, result.errors), strict=True):
        entries[index] = {"sandbox": shapes.created(child.id, view["template"], tokens)}
    for err in result.errors:
        entries[err["index"]] = {"error": {"code": 500, "message": str(err["error"])}}
    return [e if e is not None else {"error": {"code": 500, "message": "the fork did not start"}}
            for e in entries]


def _indices(count: int, errors: list[dict[str, Any]]) -> list[int]:
    """The child indices that succeeded, in order (a fork lists children without their index)."""
    failed = {int(e["index"]) for e in errors}
    return [i for i in range(count) if i not in failed]


# ------------------------------------------------------------------ list


@router.get("/v2/sandboxes")
async def list_sandboxes(request: Request, response: Response, rt: RuntimeDep) -> list[dict[str, Any]]:
    query = request.query_params
    known = {"metadata", "state", "limit", "nextToken", "template", "startedAfter", "order"}
    if set(query) - known:
        raise E2BError(400, f"unknown query parameter {sorted(set(query) - known)[0]!r}")
    wanted = inputs.metadata_filter(query.get("metadata"))
    states = set(query["state"].split(",")) if query.get("state") else {"running", "paused"}
    if states - {"running", "paused"}:
        raise E2BError(400, "state must be running and/or paused")
    limit = LIST_LIMIT
    if query.get("limit"):
        limit = inputs.integer(inputs.as_int(query.get("limit")), "limit", 1, LIST_LIMIT)
    after = inputs.started_after(query.get("startedAfter"))
    views = [v for v in rt.describe_sandboxes()
             if v["state"] in states and all(v["metadata"].get(k) == x for k, x in wanted.items())
             and (not query.get("template") or v["template"] == query["template"])
             and (after is None or v["started"] >= after)]
    # By start time, newest first unless asked otherwise (E2B's default).
    if query.get("order") not in (None, "", "asc", "desc"):
        raise E2BError(400, "order must be asc or desc")
    if query.get("order") != "asc":
        views.reverse()
    start = inputs.as_int(query.get("nextToken")) if query.get("nextToken") else 0
    page = views[start:start + limit]
    if start + limit < len(views):
        response.headers["x-next-token"] = str(start + limit)
    return [shapes.listed(v) for v in page]


__all__ = ["router"]
