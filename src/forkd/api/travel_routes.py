"""REST routes that move snapshots through the object store: push and pull.

Semantics live in ``forkd.controller.travel``; these handlers validate, call one
runtime method and shape the answer.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body

from forkd.api.routes import BAD_REQUEST, COMMON_ERRORS, STARTING, TOO_LARGE, Runtime, TagPath
from forkd.api.schemas import ErrorBody, PullResult, PushRequest, PushResult
from forkd.config import API_VERSION
from forkd.controller.results import PullReport, PushReport

router = APIRouter(prefix=f"/{API_VERSION}", tags=["snapshots"],
                   responses={**COMMON_ERRORS, **BAD_REQUEST, **STARTING})


def _err(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


@router.post(
    "/snapshots/{tag}/push",
    response_model=PushResult,
    summary="Publish the snapshot, with the chain its disk needs, to the object store",
    responses={
        **TOO_LARGE,
        404: _err("No such snapshot."),
        409: _err("No object store is configured (--store), the snapshot is not ready, or the store "
                  "holds a different snapshot of this tag."),
        502: _err("The object store failed or refused the request."),
    },
)
async def push(tag: TagPath, rt: Runtime,
               req: Annotated[PushRequest | None, Body()] = None) -> PushReport:
    return await rt.travel.push(tag, force=(req or PushRequest()).force)


@router.post(
    "/snapshots/{tag}/pull",
    response_model=PullResult,
    summary="Fetch the snapshot (and the ancestors this host lacks) from the object store",
    responses={
        404: _err("The store does not hold this tag."),
        409: _err("No object store is configured (--store), this host cannot restore it (accelerator, "
                  "CPU model or QEMU release differ), or it holds a different snapshot of a tag in its "
                  "chain."),
        502: _err("The object store failed, refused the request or served a corrupt blob."),
    },
)
async def pull(tag: TagPath, rt: Runtime) -> PullReport:
    return await rt.travel.pull(tag)
