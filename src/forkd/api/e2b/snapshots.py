"""E2B's snapshot API on forkd's BRANCH: a snapshot of a running sandbox is a forkd snapshot
that new sandboxes are created from (``Sandbox.create(snapshot_id)``, the create route's
template), and its ``snapshotID`` is that snapshot's tag.

* ``POST /sandboxes/{id}/snapshots {name?, memory?}``: a full BRANCH of the sandbox, which
  carries on. The tag is ``name`` when one is given, else the branch's own
  ``branch-<id>-<n>``. A forkd tag names one snapshot for good, so a name that is taken is
  ``409`` (E2B would add a build to the template of that name). ``memory: false``
  (``mode="filesystem"``) is served as a full snapshot, as a filesystem-only pause is: the
  filesystem is kept as E2B keeps it, and the memory state with it.
* ``GET /snapshots?sandboxID&name&limit&nextToken``: the snapshots made by branching a
  sandbox (here or through forkd's own ``/v1/sandboxes/{id}/branch``), newest first, without
  the ones forkd makes for itself (a paused sandbox's state, a fork's snapshot).
* ``DELETE /templates/{id}`` for such a snapshot (the SDK's ``delete_snapshot``): forkd's
  snapshot delete; ``404`` if there is none. forkd refuses (``409``) to delete one that a
  running sandbox was created from, or that a later snapshot builds on, with its reason.
  Other templates are not deleted through E2B's API (see docs/E2B.md).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from e2b.api.client.models import SandboxSnapshotRequest, SnapshotInfo
from fastapi import APIRouter, Request, Response

from forkd.api.e2b.deps import GateDep, RuntimeDep
from forkd.bounds import TAG_RE, TEMPLATE_LAYER_PREFIX
from forkd.errors import NotFound

if TYPE_CHECKING:
    from forkd.controller.runtime import Runtime
    from forkd.store.records import SnapshotRecord

LIST_LIMIT = 100
NAME_RULE = "letters, digits, '.', '_' and '-', at most 64, not starting with '.' or '-'"


class SnapshotError(Exception):
    """An answer in the SDK's REST error shape (the control app's handler turns it into one)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def info(record: SnapshotRecord) -> dict[str, Any]:
    """E2B's ``SnapshotInfo``: the id is the tag, and so is its one name."""
    body: dict[str, Any] = SnapshotInfo(snapshot_id=record.tag, names=[record.tag]).to_dict()
    return body


def is_user_snapshot(record: SnapshotRecord, held: set[str]) -> bool:
    """A snapshot someone made of a sandbox: a BRANCH, not one forkd keeps for itself (a paused
    sandbox's state, ``held``; a fork's or a resumed sandbox's, ``auto_delete``)."""
    return (record.branched_from is not None and not record.auto_delete and record.tag not in held
            and not record.tag.startswith(TEMPLATE_LAYER_PREFIX))  # a template build's cached layer


def select(records: list[SnapshotRecord], held: set[str], *, sandbox_id: str | None,
           name: str | None) -> list[SnapshotRecord]:
    """The user snapshots matching the filters, newest first (ties by tag, for stable pages)."""
    chosen = [r for r in records if is_user_snapshot(r, held)
              and (sandbox_id is None or r.branched_from == sandbox_id)
              and (name is None or r.tag == name)]
    return sorted(chosen, key=lambda r: (-r.created_at_unix, r.tag))


def parse_request(raw: bytes) -> str | None:
    """The snapshot's tag from the request body (``None``: the branch names it); 400s say why."""
    try:
        body = json.loads(raw) if raw else {}
    except ValueError as exc:
        raise SnapshotError(400, f"request body is not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise SnapshotError(400, "request body must be a JSON object")
    req = SandboxSnapshotRequest.from_dict(body)
    extra = sorted(req.additional_properties)
    if extra:
        raise SnapshotError(400, f"unknown field {extra[0]!r}")
    if body.get("memory") not in (None, True, False):
        raise SnapshotError(400, "memory must be true or false")
    name = body.get("name")
    if name in (None, ""):
        return None
    if not isinstance(name, str) or not TAG_RE.match(name):
        raise SnapshotError(400, f"snapshot name {name!r} is not a forkd snapshot tag ({NAME_RULE})")
    return name


router = APIRouter()


def _held(rt: Runtime) -> set[str]:
    return {p.state_tag for p in rt.suspender.all()}


@router.post("/sandboxes/{sandbox_id}/snapshots", status_code=201)
async def create_snapshot(sandbox_id: str, request: Request, rt: RuntimeDep, gate: GateDep) -> dict[str, Any]:
    """A BRANCH, which enters the daemon's BRANCH gate as forkd's own branch route does."""
    tag = parse_request(await request.body())
    view = rt.describe_sandbox(sandbox_id)  # 404 for no such sandbox
    if view["state"] == "paused":
        raise SnapshotError(409, f"sandbox {sandbox_id} is paused: connect to resume it, then snapshot "
                            "it")
    if tag is not None and (rt.tags.in_flight(tag) or _exists(rt, tag)):
        raise SnapshotError(409, f"a snapshot named {tag!r} exists already; forkd snapshots are "
                            "immutable tags: delete it first or choose another name")
    with gate.enter(tag, rt.tags.in_flight):
        record = await rt.branch(sandbox_id, tag, "full")
    return info(record)


@router.get("/snapshots")
async def list_snapshots(request: Request, response: Response, rt: RuntimeDep) -> list[dict[str, Any]]:
    query = request.query_params
    known = {"sandboxID", "name", "limit", "nextToken"}
    if set(query) - known:
        raise SnapshotError(400, f"unknown query parameter {sorted(set(query) - known)[0]!r}")
    limit = _int(query.get("limit"), "limit", 1, LIST_LIMIT) if query.get("limit") else LIST_LIMIT
    start = _int(query.get("nextToken"), "nextToken", 0, 1 << 31) if query.get("nextToken") else 0
    chosen = select(rt.list_snapshots(), _held(rt), sandbox_id=query.get("sandboxID") or None,
                    name=query.get("name") or None)
    if start + limit < len(chosen):
        response.headers["x-next-token"] = str(start + limit)
    return [info(r) for r in chosen[start:start + limit]]


@router.delete("/templates/{template_id}", status_code=204)
async def delete_snapshot(template_id: str, rt: RuntimeDep) -> Response:
    try:
        record = rt.get_snapshot(template_id) if TAG_RE.match(template_id) else None
    except NotFound:
        record = None
    if record is None:
        raise SnapshotError(404, f"snapshot {template_id!r} was not found")
    if not is_user_snapshot(record, _held(rt)):
        raise SnapshotError(400, f"{template_id!r} is not a snapshot of a sandbox: forkd deletes "
                            f"templates with DELETE /v1/snapshots/{template_id} (see docs/E2B.md)")
    await rt.delete_snapshot(template_id)
    return Response(status_code=204)


def _exists(runtime: Runtime, tag: str) -> bool:
    try:
        runtime.get_snapshot(tag)
    except NotFound:
        return False
    return True


def _int(value: str | None, name: str, low: int, high: int) -> int:
    try:
        number = int(value or "")
    except ValueError:
        raise SnapshotError(400, f"{name} must be an integer between {low} and {high}") from None
    if not low <= number <= high:
        raise SnapshotError(400, f"{name} must be an integer between {low} and {high}")
    return number


__all__ = ["info", "is_user_snapshot", "parse_request", "router", "select"]
