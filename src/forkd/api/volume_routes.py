"""REST routes for volumes (``/v1/volumes``): create, list, get, delete.

Semantics live in ``forkd.controller.volumes``; a volume is attached by ``volumes`` on
POST /v1/snapshots.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Response, status

from forkd.api.routes import BAD_REQUEST, COMMON_ERRORS, STARTING, Runtime
from forkd.api.schemas import (
    TAG_PATTERN,
    CreateVolumeRequest,
    ErrorBody,
    ExportVolumeRequest,
    VolumeExport,
    VolumeInfo,
)
from forkd.config import API_VERSION
from forkd.controller.results import VolumeExportReport, VolumeReport

router = APIRouter(prefix=f"/{API_VERSION}", tags=["volumes"],
                   responses={**COMMON_ERRORS, **BAD_REQUEST, **STARTING})

NamePath = Annotated[str, Path(pattern=TAG_PATTERN, description="Volume name.")]
NO_VOLUME: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No volume of that name."}}


@router.post(
    "/volumes",
    status_code=status.HTTP_201_CREATED,
    response_model=VolumeInfo,
    summary="Create a named volume (ext4), empty or filled from a host directory or tarball",
    responses={409: {"model": ErrorBody, "description": "The name is taken."}},
)
async def create_volume(req: CreateVolumeRequest, rt: Runtime) -> VolumeReport:
    vol = await rt.volumes.create(req.name, size_mib=req.size_mib, fs=req.fs, source=req.source)
    return rt.volumes.info(vol)


@router.get("/volumes", response_model=list[VolumeInfo], summary="List volumes")
async def list_volumes(rt: Runtime) -> list[VolumeReport]:
    return [rt.volumes.info(v) for v in rt.volumes.all()]


@router.get("/volumes/{name}", response_model=VolumeInfo, summary="One volume", responses=NO_VOLUME)
async def get_volume(name: NamePath, rt: Runtime) -> VolumeReport:
    return rt.volumes.info(rt.volumes.get(name))


@router.post(
    "/volumes/{name}/export",
    response_model=VolumeExport,
    response_model_exclude_none=True,
    summary="Copy a volume's files into a new host directory (as made, or as a snapshot holds it)",
    responses={**NO_VOLUME, 409: {"model": ErrorBody, "description": "The directory exists."}},
)
async def export_volume(name: NamePath, req: ExportVolumeRequest, rt: Runtime) -> VolumeExportReport:
    return await rt.volumes.export(name, req.to, snapshot=req.snapshot)


@router.delete(
    "/volumes/{name}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    summary="Delete a volume no snapshot attaches",
    responses={**NO_VOLUME, 409: {"model": ErrorBody, "description": "Snapshots attach it (named)."}},
)
async def delete_volume(name: NamePath, rt: Runtime) -> Response:
    rt.volumes.delete(name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
