"""The routes of a sandbox's changes: ``GET /v1/sandboxes/{id}/diff`` (JSON, patch or tar) and
``POST /v1/sandboxes/{id}/apply``. Semantics live in ``forkd.controller.diffs`` and ``applies``."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response
from pydantic import StringConstraints

from forkd.api.routes import (
    BAD_REQUEST,
    COMMON_ERRORS,
    GUEST_ERRORS,
    NO_SANDBOX,
    STARTING,
    Runtime,
    SandboxIdPath,
)
from forkd.api.schemas import ApplyRequest, ApplyResponse, ErrorBody, SandboxDiff
from forkd.config import API_VERSION
from forkd.controller.results import ApplyResult, FsDiff
from forkd.guest.protocol import FILE_PATH_MAX

router = APIRouter(prefix=f"/{API_VERSION}", tags=["sandboxes"],
                   responses={**COMMON_ERRORS, **BAD_REQUEST, **STARTING, **NO_SANDBOX, **GUEST_ERRORS})

AGAINST_PATTERN = (r"^(parent|snapshot:[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
                   r"|sandbox:[A-Za-z0-9][A-Za-z0-9._-]{0,127})$")


# What check_filters takes, as the schema says it: a non-empty path or name without NUL.
FilterEntry = Annotated[str, StringConstraints(min_length=1, max_length=FILE_PATH_MAX, pattern=r"^[^\x00]+$")]


@router.get(
    "/sandboxes/{id}/diff",
    response_model=SandboxDiff,
    summary="What a sandbox's filesystem changed: since its snapshot, or against another snapshot or sandbox",
    responses={
        200: {"content": {"text/x-diff": {}, "application/x-tar": {}},
              "description": "format=json: the changes; patch: a unified diff (binary files flagged); "
                             "tar: the added and modified files."},
        409: {"model": ErrorBody, "description": "The two disks share no layer (different guest images)."},
        413: {"model": ErrorBody, "description": "A changed file, or all of them, too large to read."},
    },
)
async def sandbox_diff(
    sandbox_id: SandboxIdPath, rt: Runtime,
    against: Annotated[str, Query(pattern=AGAINST_PATTERN, description=(
        "parent (the snapshot it was forked from), snapshot:TAG or sandbox:ID."))] = "parent",
    include: Annotated[list[FilterEntry] | None, Query(max_length=64, description=(
        "Only paths under these (absolute prefixes) or with a part matching these names (globs)."))] = None,
    exclude: Annotated[list[FilterEntry] | None, Query(max_length=64, description=(
        "Leave these out (same forms); default: /proc, /sys, /dev, /run, /tmp, /var/tmp, /var/cache, "
        "/var/log, caches (__pycache__, .cache, .pytest_cache, .mypy_cache)."))] = None,
    format: Annotated[Literal["json", "patch", "tar"], Query(description="json | patch | tar")] = "json",
) -> FsDiff | Response:
    if format == "json":
        return await rt.diffs.diff(sandbox_id, against, include=include, exclude=exclude)
    body = await rt.diffs.render(sandbox_id, against, format, include=include, exclude=exclude)
    media = "text/x-diff; charset=utf-8" if format == "patch" else "application/x-tar"
    return Response(body, media_type=media)


@router.post(
    "/sandboxes/{id}/apply",
    response_model=ApplyResponse,
    summary="Apply another sandbox's changes (a child's, since its snapshot) onto this one",
    responses={409: {"model": ErrorBody, "description": (
        "A conflict: this sandbox changed a path the source changed too, differently, since the "
        "source's snapshot (every such path is named); nothing was written.")},
        413: {"model": ErrorBody, "description": "A changed file, or all of them, too large to read."}},
)
async def sandbox_apply(sandbox_id: SandboxIdPath, req: ApplyRequest, rt: Runtime) -> ApplyResult:
    return await rt.diffs.apply(sandbox_id, req.from_, req.paths)

