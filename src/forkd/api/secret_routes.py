"""REST routes for secrets (``/v1/secrets``): create, list, get, update, delete; never read.

Semantics live in ``forkd.controller.secrets``; a secret reaches a request only at egress, through
a header rule's ``${secrets.NAME}`` (docs/API.md, "Header transforms and secrets").
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Response, status

from forkd.api.routes import BAD_REQUEST, COMMON_ERRORS, STARTING, Runtime
from forkd.api.schemas import ErrorBody
from forkd.api.schemas.secrets import CreateSecretRequest, SecretInfo, UpdateSecretRequest
from forkd.bounds import SECRET_NAME_PATTERN
from forkd.config import API_VERSION

router = APIRouter(prefix=f"/{API_VERSION}", tags=["secrets"],
                   responses={**COMMON_ERRORS, **BAD_REQUEST, **STARTING})

NamePath = Annotated[str, Path(pattern=SECRET_NAME_PATTERN, description="Secret name.")]
NO_SECRET: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No secret of that name."}}


@router.post("/secrets", status_code=status.HTTP_201_CREATED, response_model=SecretInfo,
             summary="Store a secret (write-only: its value is never returned)",
             responses={409: {"model": ErrorBody, "description": "The name is taken."}})
async def create_secret(req: CreateSecretRequest, rt: Runtime) -> dict[str, Any]:
    return rt.secrets.create(req.name, req.value, req.metadata).info()


@router.get("/secrets", response_model=list[SecretInfo], summary="List secrets (names and metadata only)")
async def list_secrets(rt: Runtime) -> list[dict[str, Any]]:
    return [s.info() for s in rt.secrets.all()]


@router.get("/secrets/{name}", response_model=SecretInfo, summary="One secret (never its value)",
            responses=NO_SECRET)
async def get_secret(name: NamePath, rt: Runtime) -> dict[str, Any]:
    return rt.secrets.get(name).info()


@router.put("/secrets/{name}", response_model=SecretInfo, summary="Give a secret a new value or labels",
            responses=NO_SECRET)
async def update_secret(name: NamePath, req: UpdateSecretRequest, rt: Runtime) -> dict[str, Any]:
    return rt.secrets.update(name, req.value, req.metadata).info()


@router.delete("/secrets/{name}", status_code=status.HTTP_204_NO_CONTENT, response_class=Response,
               summary="Delete a secret", responses=NO_SECRET)
async def delete_secret(name: NamePath, rt: Runtime) -> Response:
    rt.secrets.delete(name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
