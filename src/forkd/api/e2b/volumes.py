"""E2B's volumes (``Volume.create/list/get_info/destroy``, ``volume_mounts`` on create) on forkd's
named volumes of the ``hostdir`` filesystem: a directory on the daemon's host that every sandbox
mounting it sees live (``fork: "shared"``), and that E2B's volume content API reads and writes
(``volume_content.py``). A volume's ``volumeID`` is its name.

* ``POST /volumes {name}``: ``201`` → ``VolumeAndToken`` (E2B gives no size: forkd's default,
  ``bounds.DEFAULT_VOLUME_SIZE_MIB``, is its quota); ``409`` the name is taken.
* ``GET /volumes``: every ``hostdir`` volume (forkd's ``ext4`` ones are not E2B's to see).
* ``GET /volumes/{id}``: ``VolumeAndToken``; ``DELETE /volumes/{id}``: ``204``, ``409`` while a
  sandbox or snapshot uses it (naming them); ``404`` for no such E2B volume.

The token (``tokens.AccessTokens.volume``) is the bearer of the content calls; no ``domain`` is
answered, so the SDK sends them to ``E2B_VOLUME_API_URL`` (or ``https://api.<E2B_DOMAIN>``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from e2b.api.client.models import NewVolume, SandboxVolumeMount, Volume, VolumeAndToken
from fastapi import APIRouter, Request, Response

from forkd import bounds
from forkd.api.e2b import inputs
from forkd.api.e2b.deps import RuntimeDep, TokensDep
from forkd.api.e2b.errors import E2BError
from forkd.api.e2b.tokens import AccessTokens
from forkd.errors import InvalidRequest, NotFound
from forkd.guest.volume_messages import MAX_SLOTS
from forkd.store.volume_spec import NAME_RE, check_mount

if TYPE_CHECKING:
    from forkd.controller.runtime import Runtime
    from forkd.store.records import VolumeRecord

FS = "hostdir"  # the filesystem of E2B's volumes: files the daemon serves live, to several sandboxes

router = APIRouter()


def check_name(name: object, what: str = "volume name") -> str:
    """A volume's name (E2B's ``name`` and ``volumeID``), bounded before any lookup."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise E2BError(400, f"{what} must be 1 to 64 letters, digits, '.', '_' or '-' (not starting "
                       f"with '.' or '-'), not {str(name)[:80]!r}")
    return name


def served(rt: Runtime, volume_id: str) -> VolumeRecord:
    """The ``hostdir`` volume named ``volume_id``; 404 for none (an ``ext4`` one included)."""
    check_name(volume_id, "volumeID")
    try:
        record = rt.volumes.get(volume_id)
    except NotFound:
        raise E2BError(404, f"volume {volume_id} not found") from None
    if record.fs != FS:
        raise E2BError(404, f"volume {volume_id} not found: it is a forkd {record.fs} volume "
                       "(/v1/volumes), which E2B's volumes do not include")
    return record


def _with_token(record: VolumeRecord, tokens: AccessTokens) -> dict[str, Any]:
    body: dict[str, Any] = VolumeAndToken(
        volume_id=record.name, name=record.name,
        token=tokens.volume(record.name, record.created_at_unix)).to_dict()
    return body


@router.post("/volumes", status_code=201)
async def create_volume(request: Request, rt: RuntimeDep, tokens: TokensDep) -> dict[str, Any]:
    raw = await inputs.body(request)
    if not isinstance(raw.get("name"), str):
        raise E2BError(400, "name (the volume's name) is required")
    req = NewVolume.from_dict(raw)
    inputs.no_unknown(req)
    record = await rt.volumes.create(check_name(req.name), size_mib=bounds.DEFAULT_VOLUME_SIZE_MIB, fs=FS)
    return _with_token(record, tokens)


@router.get("/volumes")
async def list_volumes(rt: RuntimeDep) -> list[dict[str, Any]]:
    return [Volume(volume_id=v.name, name=v.name).to_dict() for v in rt.volumes.all() if v.fs == FS]


@router.get("/volumes/{volume_id}")
async def get_volume(volume_id: str, rt: RuntimeDep, tokens: TokensDep) -> dict[str, Any]:
    return _with_token(served(rt, volume_id), tokens)


@router.delete("/volumes/{volume_id}", status_code=204)
async def delete_volume(volume_id: str, rt: RuntimeDep) -> Response:
    rt.volumes.delete(served(rt, volume_id).name)  # 409 naming its users, in E2B's shape
    return Response(status_code=204)


# ------------------------------------------------------------------ volume_mounts on create


def spawn_volumes(raw: object) -> list[dict[str, Any]]:
    """E2B's ``volumeMounts`` ([{name, path}]) as forkd's spawn ``volumes``: each a shared
    attachment of the named volume, writable, at ``path``. 400 naming the entry at fault; read
    before the SDK's model parses the body (its ``from_dict`` raises on a malformed entry)."""
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_SLOTS:
        raise E2BError(400, f"volumeMounts must be a list of at most {MAX_SLOTS} {{name, path}} objects")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        what = f"volumeMounts[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) \
                or not isinstance(item.get("path"), str):
            raise E2BError(400, f"{what} must be an object with name and path strings")
        mount = SandboxVolumeMount.from_dict(item)
        if mount.additional_properties:
            extra = sorted(mount.additional_properties)[0][:64]
            raise E2BError(400, f"{what} has an unknown field {extra!r} (name and path are)")
        check_name(mount.name, f"{what}.name")
        try:
            path = check_mount(mount.path, f"{what}.path")
        except InvalidRequest as exc:
            raise E2BError(400, str(exc)) from None
        if any(path == o["mount"] for o in out):
            raise E2BError(400, f"{what}.path {path!r} is given twice: one volume per path")
        out.append({"name": mount.name, "mount": path, "fork": "shared"})
    return out


def require_served(rt: Runtime, volumes: list[dict[str, Any]]) -> None:
    """Every volume a create mounts exists and is E2B's (``hostdir``): 400 naming the first that is not."""
    for i, v in enumerate(volumes):
        try:
            served(rt, v["name"])
        except E2BError as exc:
            raise E2BError(400, f"volumeMounts[{i}]: {exc}") from None


__all__ = ["FS", "check_name", "require_served", "router", "served", "spawn_volumes"]
