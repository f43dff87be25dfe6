"""E2B's secrets (``Secret.create/list/get_info/update/destroy``) on forkd's (controller/secrets.py):
a secret's ``secretID`` is its name (the SDK takes either), its value is write-only, and
``${e2b.secrets.NAME}`` in a request to a host with a header rule is its value at egress.

* ``POST /secrets {name, value, metadata?}``: ``201`` → ``Secret``; ``409`` the name is taken.
* ``GET /secrets``: every secret, one page (forkd keeps at most 1024).
* ``GET /secrets/{id}``, ``POST /secrets/{id} {value, metadata?}`` (a new version),
  ``DELETE /secrets/{id}``: ``404`` for no such secret.
"""

from __future__ import annotations

import datetime
from typing import Any

from e2b.api.client.models import NewSecret, Secret, SecretMetadata, SecretUpdate
from fastapi import APIRouter, Request, Response

from forkd.api.e2b import inputs
from forkd.api.e2b.deps import RuntimeDep
from forkd.api.e2b.errors import E2BError

router = APIRouter()


def _when(unix: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(unix, datetime.UTC)


def _shape(info: Any) -> dict[str, Any]:
    body: dict[str, Any] = Secret(
        secret_id=info.name, name=info.name, current_version=info.version,
        metadata=SecretMetadata.from_dict(dict(info.metadata)),
        created_at=_when(info.created_at_unix), updated_at=_when(info.updated_at_unix)).to_dict()
    return body


def _parse(model: Any, raw: dict[str, Any]) -> Any:
    try:
        parsed = model.from_dict(raw)
    except (KeyError, TypeError, ValueError) as exc:
        raise E2BError(400, f"the request body is not E2B's {model.__name__}: {str(exc)[:200]}") from None
    inputs.no_unknown(parsed)
    return parsed


def _metadata(parsed: Any) -> dict[str, str] | None:
    meta = getattr(parsed, "metadata", None)
    if meta is None or not inputs.given(meta):
        return None
    return inputs.strings(meta.additional_properties, "metadata")


def _text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise E2BError(400, f"{name} must be a string")
    return value


@router.post("/secrets", status_code=201)
async def create_secret(request: Request, rt: RuntimeDep) -> dict[str, Any]:
    req = _parse(NewSecret, await inputs.body(request))
    return _shape(rt.secrets.create(_text(req.name, "name"), _text(req.value, "value"), _metadata(req)))


@router.get("/secrets")
async def list_secrets(rt: RuntimeDep) -> list[dict[str, Any]]:
    return [_shape(s) for s in rt.secrets.all()]


@router.get("/secrets/{secret_id}")
async def get_secret(secret_id: str, rt: RuntimeDep) -> dict[str, Any]:
    return _shape(rt.secrets.get(secret_id))


@router.post("/secrets/{secret_id}")
async def update_secret(secret_id: str, request: Request, rt: RuntimeDep) -> dict[str, Any]:
    req = _parse(SecretUpdate, await inputs.body(request))
    return _shape(rt.secrets.update(secret_id, _text(req.value, "value"), _metadata(req)))


@router.delete("/secrets/{secret_id}", status_code=204)
async def delete_secret(secret_id: str, rt: RuntimeDep) -> Response:
    rt.secrets.delete(secret_id)
    return Response(status_code=204)


__all__ = ["router"]
