"""REST routes for workspaces (forkd 0.5's ``/v1/workspaces``): create, list, get, delete,
suspend and resume.

Semantics live in ``forkd.controller.workspaces``; suspend/resume are the
pause/resume of ``forkd.controller.suspend``, the same mechanism as E2B's.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Response, status

from forkd.api.deps import get_branch_gate
from forkd.api.limits import BranchGate
from forkd.api.routes import (
    BAD_REQUEST,
    COMMON_ERRORS,
    GUEST_ERRORS,
    STARTING,
    TOO_LARGE,
    Runtime,
)
from forkd.api.schemas import (
    TAG_PATTERN,
    CreateWorkspaceRequest,
    ErrorBody,
    SuspendWorkspaceRequest,
    WorkspaceInfo,
)
from forkd.config import API_VERSION
from forkd.controller.results import WorkspaceReport

router = APIRouter(prefix=f"/{API_VERSION}", tags=["workspaces"],
                   responses={**COMMON_ERRORS, **BAD_REQUEST, **STARTING})

NamePath = Annotated[str, Path(pattern=TAG_PATTERN, description="Workspace name.")]
NO_WORKSPACE: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No workspace of that name."}}
_AS_GIVEN: dict[str, Any] = {"response_model_exclude_unset": True}


@router.post(
    "/workspaces",
    status_code=status.HTTP_201_CREATED,
    response_model=WorkspaceInfo,
    summary="Fork a sandbox and give it a name that lives through suspend/resume",
    responses={**TOO_LARGE, **GUEST_ERRORS,
               404: {"model": ErrorBody, "description": "snapshot_tag is not registered."},
               409: {"model": ErrorBody, "description": "The name is taken, or the snapshot is not "
                     "ready."}},
    **_AS_GIVEN,
)
async def create_workspace(req: CreateWorkspaceRequest, rt: Runtime) -> WorkspaceReport:
    ws = await rt.workspaces.create(req.name, req.snapshot_tag, per_child_netns=req.per_child_netns,
                                    memory_limit_mib=req.memory_limit_mib)
    return rt.workspaces.info(ws)


@router.get("/workspaces", response_model=list[WorkspaceInfo], summary="List workspaces", **_AS_GIVEN)
async def list_workspaces(rt: Runtime) -> list[WorkspaceReport]:
    return [rt.workspaces.info(ws) for ws in rt.workspaces.all()]


@router.get("/workspaces/{name}", response_model=WorkspaceInfo, summary="One workspace",
            responses=NO_WORKSPACE, **_AS_GIVEN)
async def get_workspace(name: NamePath, rt: Runtime) -> WorkspaceReport:
    return rt.workspaces.info(rt.workspaces.get(name))


@router.delete(
    "/workspaces/{name}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    summary="Kill its sandbox (or drop its suspended state) and forget the name",
    responses=NO_WORKSPACE,
)
async def delete_workspace(name: NamePath, rt: Runtime) -> Response:
    await rt.workspaces.delete(name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    "/workspaces/{name}/suspend",
    response_model=WorkspaceInfo,
    summary="Branch its running sandbox to a state snapshot, then stop it",
    responses={**NO_WORKSPACE, **TOO_LARGE, **GUEST_ERRORS,
               409: {"model": ErrorBody, "description": "It is not running."},
               503: {"model": ErrorBody, "description": "The daemon is at its branch concurrency cap."}},
    **_AS_GIVEN,
)
async def suspend_workspace(
    name: NamePath, rt: Runtime, gate: Annotated[BranchGate, Depends(get_branch_gate)],
    req: Annotated[SuspendWorkspaceRequest | None, Body()] = None,
) -> WorkspaceReport:
    mode = "diff" if req is not None and req.diff else "full"
    with gate.enter(None, rt.tags.in_flight):  # a suspend is a branch: it counts against the cap
        return rt.workspaces.info(await rt.workspaces.suspend(name, mode=mode))


@router.post(
    "/workspaces/{name}/resume",
    response_model=WorkspaceInfo,
    summary="Start its sandbox again, under the same id, from its state (or, if stale, its source)",
    responses={**NO_WORKSPACE, **GUEST_ERRORS, 409: {"model": ErrorBody, "description": "It is running."}},
    **_AS_GIVEN,
)
async def resume_workspace(name: NamePath, rt: Runtime) -> WorkspaceReport:
    return rt.workspaces.info(await rt.workspaces.resume(name))
