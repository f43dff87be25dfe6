"""REST routes for files in a sandbox: upload, download, stat, list, mkdir, remove.

Uploads and downloads stream: ``PUT`` forwards the request body to the guest
piece by piece as it arrives (under its own size limit, ``max_file_bytes``,
not the JSON body limit), and ``GET`` answers with a stream read from the guest
a few pieces ahead. The daemon never holds a whole file. Semantics live in
``forkd.controller.files``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response, status
from fastapi.responses import StreamingResponse
from starlette.requests import ClientDisconnect
from starlette.types import Scope

from forkd.api.routes import (
    BAD_REQUEST,
    COMMON_ERRORS,
    GUEST_ERRORS,
    NO_SANDBOX,
    STARTING,
    TOO_LARGE,
    Runtime,
    SandboxIdPath,
)
from forkd.api.schemas import (
    GUEST_PATH_PATTERN,
    GUEST_USER_HELP,
    GUEST_USER_PATTERN,
    ErrorBody,
    FileInfo,
    FileList,
    MkdirRequest,
    MkdirResponse,
)
from forkd.api.settings import Settings
from forkd.config import API_VERSION
from forkd.controller.results import DirListing, FileEntry, MkdirResult
from forkd.errors import InvalidRequest, TooLarge
from forkd.guest import protocol
from forkd.guest.protocol import FILE_PATH_MAX


def _err(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


router = APIRouter(prefix=f"/{API_VERSION}", tags=["files"],
                   responses={**COMMON_ERRORS, **BAD_REQUEST, **STARTING, **NO_SANDBOX, **GUEST_ERRORS})

# The one route whose body is not a small JSON document: the body-size
# middleware lets it through, and the route applies max_file_bytes itself.
_UPLOAD_PATH = re.compile(rf"^/{API_VERSION}/sandboxes/[^/]+/files$")

MISSING: dict[int | str, dict[str, Any]] = {404: _err("No sandbox with that id is alive, or no such path.")}
NOT_A_FILE: dict[int | str, dict[str, Any]] = {
    409: _err("The path is a directory where a file is expected (or not a regular file), or a "
              "directory to remove is not empty without recursive=true."),
}

PathQuery = Annotated[str, Query(min_length=1, max_length=FILE_PATH_MAX, pattern=GUEST_PATH_PATTERN,
                                 description="Absolute path in the guest (no NUL, at most 4096 bytes).")]
# The request bodies' ``user`` (schemas.RunAs), as a query parameter.
UserQuery = Annotated[str | None, Query(pattern=GUEST_USER_PATTERN, description=GUEST_USER_HELP,
                                        examples=["user"])]


def streams_body(scope: Scope) -> bool:
    """Whether a request is a file upload, which the JSON body limit must not buffer."""
    return scope.get("method") == "PUT" and bool(_UPLOAD_PATH.match(str(scope.get("path", ""))))


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


@router.put(
    "/sandboxes/{id}/files",
    response_model=FileInfo,
    summary="Upload a file (the raw request body), streamed; it replaces path atomically",
    description=("Each `X-Metadata-<key>: <value>` header is a pair of the file's metadata (E2B's, "
                 "kept as the guest extended attribute `user.e2b.<key>`; the key lowercased): the "
                 "file lands with exactly these pairs, so an upload without any clears the old. "
                 "Printable US-ASCII, keys of at most 246 characters, at most 128 pairs and 4096 "
                 "bytes in all; else 400."),
    responses={**MISSING, **NOT_A_FILE,
               413: _err("The file is larger than the daemon's --max-file-bytes (default 1 GiB).")},
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}},
)
async def put_file(sandbox_id: SandboxIdPath, path: PathQuery, request: Request, rt: Runtime,
                   mode: Annotated[int | None, Query(ge=0, le=0o7777, description=(
                       "Permission bits of the file (default: keep an existing file's, else 0644)."))] = None,
                   user: UserQuery = None) -> FileEntry:
    limit = _settings(request).max_file_bytes
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise InvalidRequest("invalid Content-Length header")
        if int(declared) > limit:
            raise TooLarge(f"file exceeds the daemon's {limit}-byte limit")

    return await rt.files.write(sandbox_id, path, streamed_body(request), max_bytes=limit, mode=mode,
                               user=user, metadata=metadata_headers(request.headers.items()) or None)


# A file's metadata on upload (envd 0.6.2's way, here and in the E2B layer): X-Metadata-<key>.
METADATA_HEADER_PREFIX = "x-metadata-"


def metadata_headers(headers: list[tuple[str, str]]) -> dict[str, str]:
    """An upload's metadata from its ``X-Metadata-<key>`` headers, as envd reads them: the key is
    the rest of the header's name, lowercased; a key sent twice keeps its first value. Bounded
    and checked (``protocol.check_metadata``, a 400) before the guest is asked."""
    metadata: dict[str, str] = {}
    for name, value in headers:
        lowered = name.lower()
        if lowered.startswith(METADATA_HEADER_PREFIX):
            if len(metadata) > protocol.METADATA_MAX_KEYS:
                break  # too many already: check_metadata refuses it, without reading on
            metadata.setdefault(lowered[len(METADATA_HEADER_PREFIX):], value)
    try:
        return protocol.check_metadata(metadata)
    except protocol.RequestError as exc:
        raise InvalidRequest(str(exc)) from None


async def streamed_body(request: Request) -> AsyncIterator[bytes]:
    """A request body as it arrives; a client that leaves midway is a 400, not a half file."""
    try:
        async for chunk in request.stream():
            yield chunk
    except ClientDisconnect:
        raise InvalidRequest("the client went away before the whole file arrived") from None


@router.get(
    "/sandboxes/{id}/files",
    response_class=StreamingResponse,
    summary="Download a file, streamed",
    responses={
        200: {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
              "description": "The file's bytes (chunked; X-Forkd-File-Size gives its size when the "
                             "download started)."},
        **MISSING, **NOT_A_FILE,
    },
)
async def get_file(sandbox_id: SandboxIdPath, path: PathQuery, rt: Runtime,
                   user: UserQuery = None) -> StreamingResponse:
    info, pieces = await rt.files.open_read(sandbox_id, path, user=user)
    # No Content-Length: the file may change while it streams. A failure midway
    # aborts the chunked response, which clients see as an incomplete body.
    return StreamingResponse(pieces, media_type="application/octet-stream",
                             headers={"X-Forkd-File-Size": str(info["size"])})


@router.delete(
    "/sandboxes/{id}/files",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    summary="Remove a file, or a directory (recursive=true for a non-empty one)",
    responses={**MISSING, **NOT_A_FILE},
)
async def remove_file(
    sandbox_id: SandboxIdPath, path: PathQuery, rt: Runtime,
    recursive: Annotated[bool, Query(description="Remove a directory and everything in it.")] = False,
    user: UserQuery = None,
) -> Response:
    await rt.files.remove(sandbox_id, path, recursive=recursive, user=user)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get(
    "/sandboxes/{id}/files/stat",
    response_model=FileInfo,
    summary="Type, size, mode, mtime, owner and group of a path (following symlinks)",
    responses=MISSING,
)
async def stat_file(sandbox_id: SandboxIdPath, path: PathQuery, rt: Runtime,
                    user: UserQuery = None) -> FileEntry:
    return await rt.files.stat(sandbox_id, path, user=user)


@router.get(
    "/sandboxes/{id}/files/list",
    response_model=FileList,
    summary="The entries of a directory (at most 10000)",
    responses={**MISSING, 409: _err("The path is not a directory.")},
)
async def list_files(sandbox_id: SandboxIdPath, path: PathQuery, rt: Runtime,
                     user: UserQuery = None) -> DirListing:
    return await rt.files.list(sandbox_id, path, user=user)


@router.post(
    "/sandboxes/{id}/files/mkdir",
    response_model=MkdirResponse,
    summary="Create a directory",
    responses={**MISSING, **TOO_LARGE, 409: _err("The path exists (without parents=true), or a parent "
                                                  "is not a directory.")},
)
async def mkdir(sandbox_id: SandboxIdPath, req: MkdirRequest, rt: Runtime) -> MkdirResult:
    return await rt.files.mkdir(sandbox_id, req.path, parents=req.parents, user=req.user)
