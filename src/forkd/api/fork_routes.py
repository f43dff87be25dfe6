"""REST routes for forking a running sandbox: fork, fork-tree, promote, checkpoints.

Semantics live in ``forkd.controller.forks`` and ``forkd.controller.checkpoints``;
these handlers validate, call one runtime method and shape the answer.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, status

from forkd.api.deps import get_branch_gate
from forkd.api.limits import BranchGate
from forkd.api.routes import (
    BAD_REQUEST,
    COMMON_ERRORS,
    GUEST_ERRORS,
    NO_SANDBOX,
    STARTING,
    TOO_LARGE,
    MetricsDep,
    Runtime,
    SandboxIdPath,
)
from forkd.api.schemas import (
    CheckpointList,
    CheckpointPolicyRequest,
    ErrorBody,
    ForkRequest,
    ForkResponse,
    PromoteRequest,
    PromoteResponse,
)
from forkd.config import API_VERSION
from forkd.controller.results import CheckpointReport, PromoteResult

router = APIRouter(prefix=f"/{API_VERSION}", tags=["fork"],
                   responses={**COMMON_ERRORS, **BAD_REQUEST, **STARTING})

FORK_ERRORS: dict[int | str, dict[str, Any]] = {
    **NO_SANDBOX, **TOO_LARGE, **GUEST_ERRORS,
    409: {"model": ErrorBody, "description": "The source cannot be branched right now."},
    503: {"model": ErrorBody, "description": "The daemon is at its branch concurrency cap; retry shortly."},
}
# Only a sandbox whose QEMU died: these routes make no guest call that could time out.
DEAD_GUEST: dict[int | str, dict[str, Any]] = {502: GUEST_ERRORS[502]}
CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorBody, "description": "The request does not fit the sandbox's state."},
}


async def _fork(sandbox_id: str, req: ForkRequest, rt: Runtime, m: MetricsDep, gate: BranchGate,
                *, tree: bool) -> dict[str, Any]:
    started = time.perf_counter()
    with gate.enter(None, rt.tags.in_flight):
        result = await rt.fork(sandbox_id, req.count, req.options(), tree=tree)
    m.fork_seconds.observe(time.perf_counter() - started)
    if result.pause_ms is not None:
        m.branch_pause_ms.observe(result.pause_ms)
    m.observe_restores(result.children)
    info: dict[str, Any] = result.info()
    return info


@router.post(
    "/sandboxes/{id}/fork",
    status_code=status.HTTP_201_CREATED,
    response_model=ForkResponse,
    summary="Fork a running sandbox into count children (the source keeps running)",
    responses=FORK_ERRORS,
    response_model_exclude_unset=True,
)
async def fork(
    sandbox_id: SandboxIdPath, rt: Runtime, m: MetricsDep,
    gate: Annotated[BranchGate, Depends(get_branch_gate)],
    req: Annotated[ForkRequest | None, Body()] = None,
) -> dict[str, Any]:
    return await _fork(sandbox_id, req or ForkRequest(), rt, m, gate, tree=False)


@router.post(
    "/sandboxes/{id}/fork-tree",
    status_code=status.HTTP_201_CREATED,
    response_model=ForkResponse,
    summary="Fork a running sandbox and stamp the children as one fork-tree",
    responses=FORK_ERRORS,
    response_model_exclude_unset=True,
)
async def fork_tree(
    sandbox_id: SandboxIdPath, rt: Runtime, m: MetricsDep,
    gate: Annotated[BranchGate, Depends(get_branch_gate)],
    req: Annotated[ForkRequest | None, Body()] = None,
) -> dict[str, Any]:
    return await _fork(sandbox_id, req or ForkRequest(), rt, m, gate, tree=True)


@router.post(
    "/sandboxes/{id}/promote",
    response_model=PromoteResponse,
    summary="Keep this fork-tree child: kill its siblings, optionally take the source's place",
    responses={**NO_SANDBOX, **TOO_LARGE, **CONFLICT, **DEAD_GUEST},
    response_model_exclude_unset=True,
)
async def promote(
    sandbox_id: SandboxIdPath, rt: Runtime, req: Annotated[PromoteRequest | None, Body()] = None,
) -> PromoteResult:
    req = req or PromoteRequest()
    return await rt.promote(sandbox_id, tree_id=req.tree_id, cleanup_siblings=req.cleanup_siblings,
                            replace_parent=req.replace_parent)


@router.post(
    "/sandboxes/{id}/checkpoints",
    response_model=CheckpointList,
    summary="Set the auto-checkpoint policy: branch after every N exec/eval calls, keep K",
    responses={**NO_SANDBOX, **TOO_LARGE, **CONFLICT, **DEAD_GUEST},
)
async def set_checkpoints(
    sandbox_id: SandboxIdPath, req: CheckpointPolicyRequest, rt: Runtime,
) -> CheckpointReport:
    return rt.checkpoints.set(sandbox_id, req.every, req.keep, req.mode)


@router.get(
    "/sandboxes/{id}/checkpoints",
    response_model=CheckpointList,
    summary="The auto-checkpoint policy and the kept checkpoints (oldest first)",
    responses=NO_SANDBOX,
)
async def get_checkpoints(sandbox_id: SandboxIdPath, rt: Runtime) -> CheckpointReport:
    return rt.checkpoints.get(sandbox_id)


@router.delete(
    "/sandboxes/{id}/checkpoints",
    response_model=CheckpointList,
    summary="Stop the auto-checkpoint policy (the checkpoints taken stay)",
    responses=NO_SANDBOX,
)
async def delete_checkpoints(sandbox_id: SandboxIdPath, rt: Runtime) -> CheckpointReport:
    return rt.checkpoints.delete(sandbox_id)
