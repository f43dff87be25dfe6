"""Guest images: ``GET /v1/images`` and ``POST /v1/images`` (pull an OCI/Docker image and convert
it, its progress streamed as NDJSON). Semantics live in ``forkd.controller.images``.

The pull runs in a task of its own, as a template build does (api/template_routes.py): a
client that goes away stops watching, not the pull.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from forkd.api.routes import BAD_REQUEST, COMMON_ERRORS, Runtime
from forkd.api.schemas import ErrorBody, ImagePullRequest
from forkd.api.schemas.requests import RegistryAuth
from forkd.api.template_routes import NDJSON, QUEUE_EVENTS
from forkd.config import API_VERSION
from forkd.errors import ForkdError
from forkd.image.oci import Credentials

_pulls: set[asyncio.Task[Any]] = set()  # running pulls, kept from the garbage collector

router = APIRouter(prefix=f"/{API_VERSION}", tags=["images"], responses={**COMMON_ERRORS, **BAD_REQUEST})


def credentials(auth: RegistryAuth | None) -> Credentials | None:
    """A request's registry credentials (used for its pull alone)."""
    return None if auth is None else Credentials(auth.username, auth.password)


@router.get("/images", summary="The guest images this daemon can boot (built or pulled)")
async def list_images(rt: Runtime) -> list[dict[str, Any]]:
    return await asyncio.to_thread(rt.images.list)


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

    pull = PullRequest(req.ref, req.name, credentials(req.registry_auth), req.force)
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(QUEUE_EVENTS)

    def put(event: dict[str, Any] | None) -> None:
        if queue.full():
            if event is not None and event["type"] == "progress":
                return  # progress is only news: a slow client misses some
            queue.get_nowait()
        queue.put_nowait(event)

    async def run() -> None:
        try:
            await rt.images.pull(pull, put)
        finally:
            put(None)

    task = asyncio.create_task(run())
    _pulls.add(task)
    task.add_done_callback(_pulls.discard)
    head = await queue.get()
    if head is None:  # it ended before its first event: a bad reference is an ordinary 400
        await asyncio.wait({task})
        task.result()

    async def lines() -> AsyncIterator[bytes]:
        event = head
        while event is not None:
            yield (json.dumps(event) + "\n").encode()
            event = await queue.get()
        await asyncio.wait({task})
        error = _failure(task)
        if error is not None:
            yield (json.dumps({"type": "error", "error": error}) + "\n").encode()

    return StreamingResponse(lines(), media_type=NDJSON)


def _failure(task: asyncio.Task[Any]) -> str | None:
    if task.cancelled():
        return "the pull was cancelled"
    exc = task.exception()
    if exc is None:
        return None
    return str(exc) if isinstance(exc, ForkdError) else f"{type(exc).__name__}: {exc}"
