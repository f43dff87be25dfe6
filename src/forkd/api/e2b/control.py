"""E2B's control plane: the app that serves it, made of routers as forkd's ``/v1`` is.

* ``sandbox_routes``: sandboxes created, connected (and so resumed), killed, listed,
  described, given a new timeout, paused, re-networked, measured and forked;
* ``templates``: ``Template.build`` (``/v3/templates``, uploads, builds, aliases);
* ``template_tags``: ``Template.assign_tags``, ``remove_tags``, ``get_tags``;
* ``snapshots``: snapshots of sandboxes (create, list, delete);
* ``secrets``: ``Secret.create/list/get_info/update/destroy`` on forkd's secrets;
* ``volumes``: ``Volume.create/list/get_info/destroy`` on forkd's ``hostdir`` volumes (their
  files are the volume content API's, a separate app: ``volume_content.py``).

The routes take what they need by ``Depends`` (``e2b/deps.py``) from this app's ``state``.
Every error is ``{"code": <status>, "message"}``. Routes the SDK has but forkd does not serve
(logs, teams, ...) answer ``501`` in that shape, naming docs/E2B.md.

Authentication: ``X-API-KEY`` (what the SDK sends) or ``Authorization: Bearer``
must be the daemon's token; a daemon without a token takes any non-empty key.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from forkd.api.e2b import handlers, sandbox_routes, secrets, snapshots, template_tags, templates, volumes
from forkd.api.e2b.deps import LiveRuntime
from forkd.api.e2b.errors import E2BError, rest_body
from forkd.api.e2b.snapshots import SnapshotError
from forkd.api.e2b.template_steps import TemplateError
from forkd.api.e2b.templates import E2BTemplates
from forkd.api.e2b.tokens import AccessTokens
from forkd.api.limits import BranchGate

if TYPE_CHECKING:
    from forkd.controller.runtime import Runtime

RuntimeSource = Callable[[], "Runtime | None"]


def _json_error(status: int, message: str) -> JSONResponse:
    return JSONResponse(json.loads(rest_body(status, message)), status_code=status)


def create_control_app(runtime: RuntimeSource, tokens: AccessTokens, api_key: str | None,
                       gate: BranchGate, uploads: Path) -> FastAPI:
    """``gate``: the daemon's BRANCH concurrency gate, which a pause, a fork and a snapshot enter
    as forkd's own branch and fork routes do (503 at the cap). ``uploads``: where template builds'
    file uploads are kept (in the data dir)."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None,
                  telemetry={"tracing": False, "metrics": False, "logs": False})  # as the daemon's app
    live = LiveRuntime(runtime)
    app.state.e2b_runtime = live
    app.state.e2b_tokens = tokens
    app.state.e2b_gate = gate
    app.state.e2b_templates = E2BTemplates(live, uploads)
    app.state.e2b_api_key = api_key
    app.middleware("http")(_authenticate)
    handlers.install(app, _json_error, "supported by forkd", (E2BError, SnapshotError, TemplateError))
    # In this order, which is the order the routes are matched in (DELETE /templates/tags is a
    # tag removal before DELETE /templates/{id} is a snapshot's delete).
    app.include_router(templates.router)  # Template.build: /v3/templates, uploads, builds
    app.include_router(template_tags.router)  # Template.assign_tags, remove_tags, get_tags
    app.include_router(sandbox_routes.router)
    app.include_router(snapshots.router)  # create_snapshot, list_snapshots, delete_snapshot
    app.include_router(secrets.router)  # Secret.create, list, get_info, update, destroy
    app.include_router(volumes.router)  # Volume.create, list, get_info, destroy
    # Everything else the SDK can call: 501 in its shape (see _http_error).
    return app


async def _authenticate(request: Request, call_next: Callable[[Request], Any]) -> Response:
    builds: E2BTemplates = request.app.state.e2b_templates
    if builds.signed_upload(request.scope):  # E2B's upload URLs carry no API key
        signed: Response = await call_next(request)
        return signed
    api_key: str | None = request.app.state.e2b_api_key
    presented = request.headers.get("x-api-key") or ""
    scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        presented = presented or bearer.strip()
    if not presented or (api_key is not None
                         and not hmac.compare_digest(presented.encode(), api_key.encode())):
        return _json_error(401, "missing or invalid API key: set E2B_API_KEY to the forkd daemon's token")
    response: Response = await call_next(request)
    return response


__all__ = ["create_control_app"]
