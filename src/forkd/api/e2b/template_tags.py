"""E2B's template tags (``Template.assign_tags``, ``remove_tags``, ``get_tags``) on snapshot names.

A tag is one more name of a build's snapshot (``Runtime.name_snapshot``, kept in the
registry): ``assign_tags("web:v1", ["prod"])`` makes the name ``web.prod`` stand for
the snapshot ``web.v1`` (``template_names`` maps E2B names to snapshot tags). A
snapshot stands for E2B's build of a template, with a UUID of its own (``build_id_of``).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeGuard

from fastapi import APIRouter, Request, Response

from forkd.api.e2b import template_names
from forkd.api.e2b.deps import RuntimeDep
from forkd.api.e2b.template_names import MAX_TAGS
from forkd.api.e2b.template_steps import TemplateError
from forkd.api.e2b.templates import json_body
from forkd.errors import InvalidRequest, NotFound

if TYPE_CHECKING:
    from forkd.store.records import SnapshotRecord


def build_id_of(record: SnapshotRecord) -> str:
    """A snapshot as E2B's build of a template: a UUID, the same for as long as the snapshot lives."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"forkd-snapshot:{record.tag}:{record.created_at_unix}"))



def _tag_list(value: object) -> TypeGuard[list[str]]:
    """Whether ``value`` is what an assign or a remove takes: 1 to ``MAX_TAGS`` strings."""
    return isinstance(value, list) and 0 < len(value) <= MAX_TAGS and all(isinstance(t, str) for t in value)


router = APIRouter()


@router.post("/templates/tags", status_code=201)
async def assign_tags(request: Request, rt: RuntimeDep) -> dict[str, Any]:
    body = await json_body(request)
    target, tags = body.get("target"), body.get("tags")
    if not isinstance(target, str) or not _tag_list(tags):
        raise TemplateError(400, f"target (alias:tag) and tags (1 to {MAX_TAGS} strings) are required")
    try:
        record = rt.get_snapshot(rt.resolve_snapshot(template_names.snapshot_tag(target)))
        alias = target.partition(":")[0]
        names = [template_names.tag_name(alias, tag) for tag in tags]
        for name, _ in names:
            rt.name_snapshot(name, record.tag)
    except NotFound:
        raise TemplateError(404, f"template {target[:80]!r} was not found") from None
    except InvalidRequest as exc:
        raise TemplateError(400, str(exc)) from None
    return {"tags": [tag for _, tag in names], "buildID": build_id_of(record)}


@router.delete("/templates/tags", status_code=204)
async def remove_tags(request: Request, rt: RuntimeDep) -> Response:
    body = await json_body(request)
    name, tags = body.get("name"), body.get("tags")
    if not isinstance(name, str) or not _tag_list(tags):
        raise TemplateError(400, f"name (the template's alias) and tags (1 to {MAX_TAGS} strings) "
                            "are required")
    try:
        names = [template_names.tag_name(name.partition(":")[0], tag)[0] for tag in tags]
    except InvalidRequest as exc:
        raise TemplateError(400, str(exc)) from None
    for tag_name, tag in zip(names, tags, strict=True):
        if rt.unname_snapshot(tag_name):
            continue
        if any(record.tag == tag_name for record in rt.list_snapshots()):
            raise TemplateError(400, f"tag {tag[:80]!r} of {name[:80]!r} is a build's own name, which "
                                f"goes with it: delete the snapshot {tag_name!r} instead")
        raise TemplateError(404, f"tag {tag[:80]!r} of {name[:80]!r} was not found")
    return Response(status_code=204)


@router.get("/templates/{template_id}/tags")
async def get_tags(template_id: str, rt: RuntimeDep) -> list[dict[str, Any]]:
    alias = template_id.partition(":")[0]
    out = []
    for record in rt.list_snapshots():
        if record.tag != alias and not record.tag.startswith(f"{alias}."):
            continue
        given = [(record.tag, record.created_at_unix), *rt.snapshot_names(record.tag)]
        for name, when in given:
            if name == alias or name.startswith(f"{alias}."):
                out.append({"tag": name[len(alias) + 1:] or template_names.DEFAULT_TAG,
                            "buildID": build_id_of(record),
                            "createdAt": datetime.fromtimestamp(when, UTC).isoformat()})
    if not out:
        raise TemplateError(404, f"template {template_id[:80]!r} was not found")
    return out

