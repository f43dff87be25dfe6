"""Guest images: ``GET /v1/images``, ``POST /v1/images`` (pull an OCI/Docker image and convert
it, its progress streamed as NDJSON) and ``DELETE /v1/images/{name}``. Semantics live in
``forkd.controller.images``.

The pull runs in a task of its own (api/progress_stream.py): a client that goes away stops
watching, not the pull.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Path
from fastapi.responses import StreamingResponse

from forkd.api.progress_stream import NDJSON, stream_progress
from forkd.api.routes import BAD_REQUEST, COMMON_ERRORS, Runtime
from forkd.api.schemas import TAG_PATTERN, ErrorBody, ImagePullRequest
from forkd.config import API_VERSION

router = APIRouter(prefix=f"/{API_VERSION}", tags=["images"], responses={**COMMON_ERRORS, **BAD_REQUEST})


@router.get("/images", summary="The guest images this daemon can boot (built or pulled)")
async def list_images(rt: Runtime) -> list[dict[str, Any]]:
    return await asyncio.to_thread(rt.images.list)


@router.delete("/images/{name}", status_code=204, summary="Delete a guest image no snapshot stands on",
               responses={404: {"model": ErrorBody, "description": "No such image."},
                          409: {"model": ErrorBody,
                                "description": "Snapshots stand on it; the error names them."}})
async def delete_image(name: Annotated[str, Path(pattern=TAG_PATTERN, max_length=64)], rt: Runtime) -> None:
    await rt.images.remove(name)


@router.post(
    "/images",
    response_class=StreamingResponse,
    summary="Pull an OCI/Docker image from a registry and convert it to a guest image; progress as NDJSON",
    responses={200: {"content": {NDJSON: {"schema": {"type": "string"}}},
                     "description": "NDJSON, one event a line: progress, then done or error "
                                    "(docs/API.md)."},
               404: {"model": ErrorBody, "description": "No such image or tag in the registry."}},
)
async def pull_image(req: ImagePullRequest, rt: Runtime) -> StreamingResponse:
    # Imported here: the controller pulls in the VMM stack, and the API must import without it.
    from forkd.controller.runtime import PullRequest

    auth = req.registry_auth
    pull = PullRequest(req.ref, req.name, auth.credentials() if auth else None, req.force)
    # Progress is only news: a slow client misses some, silently.
    return await stream_progress(lambda put: rt.images.pull(pull, put), what="pull", sheddable="progress")
