"""The REST v1 routes. Each handler validates, calls one Runtime method, shapes the answer.

Runtime methods that touch VMs are coroutines and are awaited; the few sync
ones (list/get/lineage) are SQLite lookups of a millisecond, fine on the loop.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Path, Query, Response, status
from pydantic import StringConstraints

from forkd import bounds
from forkd.api.deps import RuntimeDep, get_branch_gate, get_metrics
from forkd.api.limits import BranchGate
from forkd.api.metrics import CONTENT_TYPE_LATEST, Metrics
from forkd.api.schemas import (
    SANDBOX_ID_PATTERN,
    TAG_PATTERN,
    BranchRequest,
    CompactRequest,
    CreateSnapshotRequest,
    ErrorBody,
    EvalRequest,
    EvalResponse,
    ExecRequest,
    ExecResponse,
    Health,
    HibernateRequest,
    NetworkLog,
    NetworkUpdateRequest,
    PingResponse,
    SandboxInfo,
    SandboxMemory,
    SnapshotDetail,
    SnapshotInfo,
    SpawnRequest,
    TimeoutRequest,
    Version,
)
from forkd.config import API_VERSION, VERSION
from forkd.controller.options import request_fields
from forkd.controller.results import EvalResult, ExecResult, PingResult, SandboxCost
from forkd.errors import InvalidRequest


def _err(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


# Documented on every operation; the OpenAPI post-processing in app.py adds 401.
Responses = dict[int | str, dict[str, Any]]
COMMON_ERRORS: Responses = {500: _err("Internal error (see daemon logs).")}
BAD_REQUEST: Responses = {400: _err("Malformed request: invalid field, unknown field or bad path parameter.")}
TOO_LARGE: Responses = {413: _err("Request body larger than the daemon's limit (default 1 MiB).")}
NO_SANDBOX: Responses = {404: _err("No sandbox with that id is alive.")}
GUEST_ERRORS: Responses = {
    502: _err("The guest agent could not be reached or failed."),
    504: _err("The guest did not answer in time."),
}

Runtime = RuntimeDep  # the real controller.runtime.Runtime, injected (api/deps.py)
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
TagPath = Annotated[str, Path(pattern=TAG_PATTERN, description="Snapshot tag.")]
SandboxIdPath = Annotated[
    str,
    Path(alias="id", pattern=SANDBOX_ID_PATTERN, description="Sandbox id, e.g. sb-67a1b3-0000."),
]

status_router = APIRouter(tags=["status"], responses=COMMON_ERRORS)
STARTING: Responses = {503: _err("The daemon is still starting (or at capacity); retry shortly.")}
v1 = APIRouter(prefix=f"/{API_VERSION}", responses={**COMMON_ERRORS, **BAD_REQUEST, **STARTING})

# Keep optional fields the runtime left out absent in the JSON, as the seeds
# specify (e.g. branched_from only on BRANCH snapshots), but keep explicit
# nulls such as SandboxInfo.netns.
_AS_GIVEN: dict[str, Any] = {"response_model_exclude_unset": True}


# ------------------------------------------------------------------ status


@status_router.get("/healthz", response_model=Health, summary="Liveness probe (no auth)")
async def healthz() -> dict[str, bool]:
    return {"ok": True}


@status_router.get("/version", response_model=Version, summary="Daemon and API version")
async def version() -> dict[str, str]:
    return {"version": VERSION, "api": API_VERSION}


@status_router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={
        200: {
            "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
            "description": "Prometheus text exposition format.",
        }
    },
)
async def metrics(m: MetricsDep) -> Response:
    return Response(m.render(), media_type=CONTENT_TYPE_LATEST)


# --------------------------------------------------------------- snapshots


def _snapshot_spec(req: CreateSnapshotRequest) -> Any:
    # Imported here, not at module load: the controller pulls in the VMM stack,
    # and the API's modules must import without it.
    from forkd.controller.runtime import SnapshotSpec

    # Unset fields take SnapshotSpec's own defaults, so there is one source of truth.
    return SnapshotSpec(**request_fields(SnapshotSpec, req.model_dump(exclude_unset=True), "snapshot"))


@v1.post(
    "/snapshots",
    status_code=status.HTTP_201_CREATED,
    response_model=SnapshotInfo,
    tags=["snapshots"],
    summary="Boot a template VM, warm it up and register its snapshot",
    responses={
        **TOO_LARGE,
        404: _err("The guest image is not built (forkd image build)."),
        409: _err("A snapshot with this tag already exists."),
        504: _err("The guest agent did not come up within boot_wait_secs."),
    },
    **_AS_GIVEN,
)
async def create_snapshot(req: CreateSnapshotRequest, rt: Runtime) -> dict[str, Any]:
    record = await rt.create_snapshot(_snapshot_spec(req))
    return record.info()


@v1.get(
    "/snapshots",
    response_model=list[SnapshotInfo],
    tags=["snapshots"],
    summary="List registered snapshots",
    **_AS_GIVEN,
)
async def list_snapshots(rt: Runtime) -> list[dict[str, Any]]:
    return [s.info() for s in rt.list_snapshots()]


# Only documented lineage keys are passed on; SnapshotInfo fields come from info().
_LINEAGE_KEYS = ("ancestors", "dependents", "parent_tag", "sandboxes")


@v1.get(
    "/snapshots/{tag}",
    response_model=SnapshotDetail,
    tags=["snapshots"],
    summary="One snapshot, with its lineage",
    responses={404: _err("No such snapshot.")},
    **_AS_GIVEN,
)
async def get_snapshot(tag: TagPath, rt: Runtime) -> dict[str, Any]:
    info = rt.get_snapshot(tag).info()
    lineage = rt.snapshot_lineage(tag)
    info.update({k: lineage[k] for k in _LINEAGE_KEYS if k in lineage})
    info.setdefault("ancestors", [])
    info.setdefault("dependents", [])
    return info


@v1.delete(
    "/snapshots/{tag}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    tags=["snapshots"],
    summary="Delete a snapshot and its files",
    responses={
        404: _err("No such snapshot."),
        409: _err("Sandboxes or other snapshots still depend on it (see cascade/force)."),
    },
)
async def delete_snapshot(
    tag: TagPath,
    rt: Runtime,
    cascade: Annotated[bool, Query(description="Also delete snapshots that depend on it.")] = False,
    force: Annotated[bool, Query(description="Kill sandboxes still running from it.")] = False,
) -> Response:
    await rt.delete_snapshot(tag, cascade=cascade, force=force)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@v1.post(
    "/snapshots/{tag}/compact",
    status_code=status.HTTP_201_CREATED,
    response_model=SnapshotInfo,
    tags=["snapshots"],
    summary="Copy a snapshot into a standalone one: its disk chain flattened, no parent",
    responses={
        **TOO_LARGE,
        404: _err("No such snapshot."),
        409: _err("'to' exists or is being written, or the snapshot is not ready."),
    },
    **_AS_GIVEN,
)
async def compact_snapshot(tag: TagPath, req: CompactRequest, rt: Runtime) -> dict[str, Any]:
    return (await rt.compact_snapshot(tag, req.to)).info()


# --------------------------------------------------------------- sandboxes


@v1.post(
    "/sandboxes",
    status_code=status.HTTP_201_CREATED,
    response_model=list[SandboxInfo],
    tags=["sandboxes"],
    summary="Fork n sandboxes from a snapshot",
    responses={
        **TOO_LARGE,
        404: _err("snapshot_tag is not registered."),
        409: _err("The snapshot is not ready or was made on an incompatible host."),
        503: _err("Not enough capacity right now."),
        **GUEST_ERRORS,
    },
    **_AS_GIVEN,
)
async def spawn(req: SpawnRequest, rt: Runtime, m: MetricsDep) -> list[dict[str, Any]]:
    started = time.perf_counter()
    records = await rt.spawn(req.snapshot_tag, req.n, req.options())
    m.spawn_seconds.observe(time.perf_counter() - started)
    m.observe_restores(records)
    return [r.info() for r in records]


@v1.get(
    "/sandboxes",
    response_model=list[SandboxInfo],
    tags=["sandboxes"],
    summary="List alive sandboxes",
    responses=NO_SANDBOX,  # a page cursor (after) that is not alive
    **_AS_GIVEN,
)
async def list_sandboxes(
    rt: Runtime,
    snapshot_tag: Annotated[str | None, Query(pattern=TAG_PATTERN,
                                              description="Only children of this snapshot.")] = None,
    metadata: Annotated[list[Annotated[str, StringConstraints(pattern=r"^[^=]+=")]] | None, Query(
        description="Only sandboxes whose metadata has this key=value (repeatable: all must match).",
        examples=["fork_tree_id=ft-0123456789ab"])] = None,
    state: Annotated[Literal["running", "paused", "hibernated"] | None, Query(
        description="Only sandboxes in this state.")] = None,
    limit: Annotated[int | None, Query(ge=1, le=bounds.LIST_LIMIT_MAX, description=(
        "At most this many sandboxes (a page); the next page starts after the last one's id."))] = None,
    after: Annotated[str | None, Query(pattern=SANDBOX_ID_PATTERN, description=(
        "Only sandboxes listed after this one (the last id of the previous page). A page cursor "
        "that is no longer alive is 404: list again from the start."))] = None,
) -> list[dict[str, Any]]:
    wanted: dict[str, str] = {}
    for item in metadata or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidRequest(f"metadata filter {item!r} must be key=value")
        wanted[key] = value

    def keep(s: Any) -> bool:
        return ((snapshot_tag is None or s.snapshot_tag == snapshot_tag)
                and (state is None or s.state == state)
                and all(s.metadata.get(k) == v for k, v in wanted.items()))

    # Only the page is read from the registry and serialised (info() measures each sandbox's disk).
    return [s.info() for s in rt.list_sandboxes(after=after, limit=limit, where=keep)]


@v1.get(
    "/sandboxes/{id}",
    response_model=SandboxInfo,
    tags=["sandboxes"],
    summary="One sandbox",
    responses=NO_SANDBOX,
    **_AS_GIVEN,
)
async def get_sandbox(sandbox_id: SandboxIdPath, rt: Runtime) -> dict[str, Any]:
    return rt.get_sandbox(sandbox_id).info()


@v1.get(
    "/sandboxes/{id}/memory",
    response_model=SandboxMemory,
    tags=["sandboxes"],
    summary="What a sandbox costs the host: RAM shared with its snapshot and siblings, RAM of its own, disk",
    responses={**NO_SANDBOX, 409: _err("Hibernated: it holds no RAM on the host now.")},
    **_AS_GIVEN,
)
async def sandbox_memory(sandbox_id: SandboxIdPath, rt: Runtime) -> SandboxCost:
    return await rt.costs.of(sandbox_id)


@v1.delete(
    "/sandboxes/{id}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    tags=["sandboxes"],
    summary="Terminate a sandbox",
    responses=NO_SANDBOX,
)
async def kill_sandbox(sandbox_id: SandboxIdPath, rt: Runtime) -> Response:
    await rt.kill(sandbox_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@v1.post(
    "/sandboxes/{id}/timeout",
    response_model=SandboxInfo,
    tags=["sandboxes"],
    summary="Kill the sandbox timeout_secs from now (sets, extends or shortens its deadline)",
    responses={**NO_SANDBOX, **TOO_LARGE},
    **_AS_GIVEN,
)
async def set_timeout(sandbox_id: SandboxIdPath, req: TimeoutRequest, rt: Runtime) -> dict[str, Any]:
    return rt.set_timeout(sandbox_id, req.timeout_secs).info()


@v1.put(
    "/sandboxes/{id}/network",
    response_model=SandboxInfo,
    tags=["sandboxes"],
    summary="Replace the sandbox's network policy (egress rules, port proxy settings) while it runs; a "
    "hibernated sandbox gets it at its wake",
    responses={**NO_SANDBOX, **TOO_LARGE,
               400: _err("A bad entry, a sandbox without a NIC, or egress beyond the host with IP "
                         "forwarding off; the old policy stays."),
               409: _err("The sandbox is paused (resume it first).")},
    **_AS_GIVEN,
)
async def update_network(sandbox_id: SandboxIdPath, req: NetworkUpdateRequest, rt: Runtime) -> dict[str, Any]:
    return (await rt.update_network(sandbox_id, req.egress())).info()


@v1.get(
    "/sandboxes/{id}/network/log",
    response_model=NetworkLog,
    tags=["sandboxes"],
    summary="The latest names the sandbox's guest asked its resolver for, each allowed or refused, and why",
    responses=NO_SANDBOX,
    **_AS_GIVEN,
)
async def network_log(sandbox_id: SandboxIdPath, rt: Runtime) -> dict[str, Any]:
    return {"sandbox_id": sandbox_id, "entries": rt.network_log(sandbox_id)}


@v1.post(
    "/sandboxes/{id}/hibernate",
    response_model=SandboxInfo,
    tags=["sandboxes"],
    summary="Hibernate the sandbox: its changed memory and device state (or, with memory false, its "
    "disk alone) to disk, its QEMU released; its next request of any kind wakes it (memory false: "
    "cold-boots it)",
    responses={**NO_SANDBOX, **GUEST_ERRORS,
               409: _err("Hibernated already, requests under way, a live_fork or per_child_netns "
                         "sandbox (which cannot be hibernated), or (memory false) a template whose "
                         "kernel and initramfs are gone.")},
    **_AS_GIVEN,
)
async def hibernate_sandbox(sandbox_id: SandboxIdPath, rt: Runtime,
                            req: Annotated[HibernateRequest | None, Body()] = None) -> dict[str, Any]:
    req = req or HibernateRequest()
    return (await rt.hibernation.hibernate(sandbox_id, memory=req.memory)).info()


@v1.post(
    "/sandboxes/{id}/ping",
    response_model=PingResponse,
    tags=["sandboxes"],
    summary="Round trip to the guest agent",
    responses={**NO_SANDBOX, **GUEST_ERRORS},
)
async def ping(sandbox_id: SandboxIdPath, rt: Runtime) -> PingResult:
    return await rt.ping(sandbox_id)


@v1.post(
    "/sandboxes/{id}/exec",
    response_model=ExecResponse,
    tags=["sandboxes"],
    summary="Run a subprocess in the sandbox",
    responses={**NO_SANDBOX, **GUEST_ERRORS, **TOO_LARGE},
    **_AS_GIVEN,
)
async def exec_in_sandbox(
    sandbox_id: SandboxIdPath, req: ExecRequest, rt: Runtime, m: MetricsDep
) -> ExecResult:
    started = time.perf_counter()
    try:
        return await rt.exec(
            sandbox_id,
            req.args,
            timeout_secs=req.timeout_secs,
            env=req.env,
            cwd=req.cwd,
            stdin=req.stdin,
            user=req.user,
        )
    finally:
        m.exec_seconds.observe(time.perf_counter() - started)


@v1.post(
    "/sandboxes/{id}/eval",
    response_model=EvalResponse,
    tags=["sandboxes"],
    summary="Evaluate a Python expression in the warm PID 1 interpreter",
    responses={**NO_SANDBOX, **GUEST_ERRORS, **TOO_LARGE},
)
async def eval_in_sandbox(sandbox_id: SandboxIdPath, req: EvalRequest, rt: Runtime) -> EvalResult:
    return await rt.eval(sandbox_id, req.code, timeout_secs=req.timeout_secs)


@v1.post(
    "/sandboxes/{id}/branch",
    status_code=status.HTTP_201_CREATED,
    response_model=SnapshotInfo,
    tags=["sandboxes"],
    summary="Pause, snapshot and resume a running sandbox into a new snapshot tag",
    responses={
        **NO_SANDBOX,
        **TOO_LARGE,
        409: _err(
            "The tag already exists, a branch to it is in flight, the source "
            "cannot take this mode (live needs live_fork), or parent_tag is not the branch's parent."
        ),
        503: _err("The daemon is at its branch concurrency cap; retry shortly."),
        **GUEST_ERRORS,
    },
    **_AS_GIVEN,
)
async def branch(
    sandbox_id: SandboxIdPath,
    rt: Runtime,
    m: MetricsDep,
    gate: Annotated[BranchGate, Depends(get_branch_gate)],
    req: Annotated[BranchRequest | None, Body()] = None,
) -> dict[str, Any]:
    req = req or BranchRequest()
    with gate.enter(req.tag, rt.tags.in_flight):
        record = await rt.branch(sandbox_id, tag=req.tag, mode=req.effective_mode, wait=req.wait,
                                 measure_diff=req.measure_diff, parent_tag=req.parent_tag)
    info = record.info()
    if isinstance(info.get("pause_ms"), int | float):
        m.branch_pause_ms.observe(info["pause_ms"])
    return info
