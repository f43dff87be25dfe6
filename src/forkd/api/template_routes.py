"""Templates as code: ``PUT /v1/templates/contexts`` (a build context, a tar) and
``POST /v1/templates`` (a Dockerfile built into a snapshot, its progress streamed as NDJSON).

The build runs in a task of its own, its events bounded (api/progress_stream.py): a client
that goes away does not stop it (its layers and snapshot are still made), it only stops
watching; a log line that finds the queue full is dropped and counted.
Semantics live in ``forkd.controller.template_build``.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.types import Scope

from forkd import bounds
from forkd.api.file_routes import streamed_body
from forkd.api.progress_stream import NDJSON, stream_progress
from forkd.api.routes import BAD_REQUEST, COMMON_ERRORS, TOO_LARGE, Runtime
from forkd.api.schemas import BuildContextInfo, ErrorBody, TemplateBuildRequest
from forkd.config import API_VERSION
from forkd.controller.results import ContextReport
from forkd.errors import InvalidRequest, TooLarge

_CONTEXT_PATH = re.compile(rf"^/{API_VERSION}/templates/contexts/?$")


def _err(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


router = APIRouter(prefix=f"/{API_VERSION}", tags=["templates"], responses={**COMMON_ERRORS, **BAD_REQUEST})


def streams_body(scope: Scope) -> bool:
    """Whether a request is a context upload, which the JSON body limit must not buffer."""
    return scope.get("method") == "PUT" and bool(_CONTEXT_PATH.match(str(scope.get("path", ""))))


@router.put(
    "/templates/contexts",
    response_model=BuildContextInfo,
    summary="Upload a build context (a tar of the files COPY may name), streamed",
    responses={413: _err("The tar is over 512 MiB.")},
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}},
)
async def put_context(request: Request, rt: Runtime) -> ContextReport:
    if "content-type" not in request.headers:  # no body was sent (an empty one is an empty context)
        raise InvalidRequest("send the build context as the body (Content-Type: application/x-tar)")
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise InvalidRequest("invalid Content-Length header")
        if int(declared) > bounds.MAX_BUILD_CONTEXT_BYTES:
            raise TooLarge(f"a build context is at most {bounds.MAX_BUILD_CONTEXT_BYTES} bytes")
    return await rt.builds.put_context(streamed_body(request))


def _build_request(req: TemplateBuildRequest) -> Any:
    # Imported here: the controller pulls in the VMM stack, and the API must import without it.
    from forkd.controller.runtime import BuildRequest
    from forkd.host.egress import EgressPolicy

    return BuildRequest(
        tag=req.tag, dockerfile=req.dockerfile, build_args=dict(req.build_args), context=req.context,
        mem_mib=req.mem_mib, vcpus=req.vcpus, nic=req.nic,
        egress=EgressPolicy.from_request(req.allow_internet_access,
                                         req.network.model_dump() if req.network else None),
        replace=req.replace, step_timeout_secs=req.step_timeout_secs, boot_wait_secs=req.boot_wait_secs,
        registry_credentials=req.registry_auth.credentials() if req.registry_auth else None)


@router.post(
    "/templates",
    response_class=StreamingResponse,
    summary="Build a Dockerfile into a snapshot, layer by cached layer; progress as NDJSON",
    responses={
        200: {"content": {NDJSON: {"schema": {"type": "string"}}},
              "description": "NDJSON, one event a line: plan, step (cached or not), log, then done or "
                             "error (see docs/TEMPLATES.md)."},
        404: _err("The FROM image is not built, or the context was not uploaded."),
        409: _err("The tag exists (and replace is false)."),
        **TOO_LARGE,
    },
)
async def build_template(req: TemplateBuildRequest, rt: Runtime) -> StreamingResponse:
    # A log line that finds the queue full is dropped and counted; the stream says how many.
    return await stream_progress(lambda put: rt.builds.build(_build_request(req), put), what="build",
                                 sheddable="log", report_dropped=True)
