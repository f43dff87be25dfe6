"""REST routes for warm pools: ``PUT``/``GET /v1/snapshots/{tag}/pool`` and ``GET /v1/pools``.

Semantics live in ``forkd.controller.pools``; these handlers validate, call
one runtime method and shape the answer.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from forkd.api.routes import BAD_REQUEST, COMMON_ERRORS, STARTING, TOO_LARGE, Runtime, TagPath
from forkd.api.schemas import ErrorBody, PoolInfo, PoolRequest
from forkd.config import API_VERSION
from forkd.controller.results import PoolReport

router = APIRouter(prefix=f"/{API_VERSION}", tags=["pools"],
                   responses={**COMMON_ERRORS, **BAD_REQUEST, **STARTING})

NO_SNAPSHOT: dict[int | str, dict[str, Any]] = {404: {"model": ErrorBody, "description": "No such snapshot."}}


@router.put(
    "/snapshots/{tag}/pool",
    response_model=PoolInfo,
    summary="Keep N children of this snapshot restored and paused, ready for spawns (0 drains)",
    responses={
        **NO_SNAPSHOT, **TOO_LARGE,
        409: {"model": ErrorBody, "description": "The snapshot is not ready or was made on an "
              "incompatible host."},
    },
)
async def set_pool(tag: TagPath, req: PoolRequest, rt: Runtime) -> PoolReport:
    return await rt.pools.configure(tag, req.size, memory_limit_mib=req.memory_limit_mib,
                                    per_child_netns=req.per_child_netns, live_fork=req.live_fork,
                                    allow_internet_access=req.allow_internet_access,
                                    network=req.network.model_dump() if req.network else None)


@router.get(
    "/snapshots/{tag}/pool",
    response_model=PoolInfo,
    summary="The snapshot's warm pool: target, ready members, options, claims and misses",
    responses=NO_SNAPSHOT,
)
async def get_pool(tag: TagPath, rt: Runtime) -> PoolReport:
    return rt.pools.get(tag)


@router.get(
    "/pools",
    response_model=list[PoolInfo],
    summary="Every warm pool (drained ones too, until their snapshot is deleted)",
)
async def list_pools(rt: Runtime) -> list[PoolReport]:
    return rt.pools.all()
