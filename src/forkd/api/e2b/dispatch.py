"""Which requests are E2B's, and the middleware that hands them to the E2B apps.

A request carrying ``E2b-Sandbox-Id`` is in-sandbox traffic (``envd``); one for
an E2B control-plane path (``paths.PREFIXES``, none of which forkd's own API
uses: it lives under ``/v1``) goes to the control plane, one for the volume
content API (``/volumecontent/``) to its own app; everything else goes on to
forkd's API and its bearer-token check. Each E2B app authenticates on its
own (the API key, the sandbox's access token, or the volume's token) and answers in the SDK's error
shapes, request bodies bounded as forkd's are (size and JSON nesting; Connect
messages by ``connect_bounds``). ``error_shape`` says which shape a request is
answered in, for the checks that run before the dispatch (repeated headers).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from connectrpc.code import Code
from starlette.types import ASGIApp, Receive, Scope, Send

from forkd.api.e2b.control import create_control_app
from forkd.api.e2b.envd import CONNECT_SERVICES, SandboxTraffic
from forkd.api.e2b.errors import CONNECT_CODE, rest_body, send_json
from forkd.api.e2b.paths import (
    SANDBOX_HEADER,
    is_control_path,
    is_e2b_request,
    is_sandbox_request,
    is_volume_content_path,
    is_volume_upload,
)
from forkd.api.e2b.signed import SignedFileRequest, SignerSearch, signed_file_request
from forkd.api.e2b.templates import streams_body as template_uploads
from forkd.api.e2b.tokens import AccessTokens
from forkd.api.e2b.volume_content import content_error, create_volume_content_app
from forkd.api.limits import BodySizeLimitMiddleware, BranchGate, ErrorShape, forkd_error
from forkd.errors import ForkdError

if TYPE_CHECKING:
    from forkd.controller.runtime import Runtime


def _rest_shape(status: int, message: str) -> dict[str, object]:
    return {"code": status, "message": message}


def _connect_shape(status: int, message: str) -> dict[str, object]:
    return {"code": CONNECT_CODE.get(status, Code.INTERNAL).value, "message": message}


def error_shape(scope: Scope) -> ErrorShape:
    """The error body a request is answered in: Connect's, E2B's REST one, or forkd's ``{"error"}``."""
    if is_sandbox_request(scope) and str(scope.get("path", "")).startswith(CONNECT_SERVICES):
        return _connect_shape
    return _rest_shape if is_e2b_request(scope) else forkd_error


def _streams_body(scope: Scope) -> bool:
    """Requests whose bodies are not small JSON: file uploads (under max_file_bytes) and
    Connect calls (under the Connect app's own read limit)."""
    path = str(scope.get("path", ""))
    return (scope.get("method") == "POST" and path == "/files") or path.startswith(CONNECT_SERVICES)


class E2BDispatch:
    """ASGI middleware: E2B's requests to the E2B apps, the rest to ``app``."""

    def __init__(self, app: ASGIApp, runtime: Callable[[], Runtime | None], tokens: AccessTokens,
                 api_key: str | None, gate: BranchGate, max_body_bytes: int, max_file_bytes: int,
                 uploads: Path) -> None:
        self.app = app
        self._runtime = runtime
        self._tokens = tokens
        self._signers = SignerSearch()
        self.control = BodySizeLimitMiddleware(create_control_app(runtime, tokens, api_key, gate, uploads),
                                               max_body_bytes, exempt=template_uploads, shape=_rest_shape)
        # Its uploads stream under max_file_bytes (the route bounds them); the rest are small JSON.
        self.volume_content = BodySizeLimitMiddleware(
            create_volume_content_app(runtime, tokens, max_file_bytes), max_body_bytes,
            exempt=is_volume_upload, shape=content_error)
        self.sandbox = BodySizeLimitMiddleware(
            SandboxTraffic(runtime, tokens, max_body_bytes=max_body_bytes, max_file_bytes=max_file_bytes),
            max_body_bytes, exempt=_streams_body, shape=_rest_shape)

    def _signer(self, signed: SignedFileRequest) -> str | None:
        """The sandbox whose token made ``signed``'s signature, if one of the running ones did
        (bounded in cost: e2b/signed.py); ScanBudgetSpent past the budget."""
        runtime = self._runtime()
        if runtime is None:
            return None

        def accepts(sandbox_id: str) -> bool:
            return self._tokens.accepts_signature(sandbox_id, signed.signature, signed.path,
                                                  signed.operation, signed.user, signed.expiration)

        return self._signers.find(signed.signature, (r.id for r in runtime.list_sandboxes()), accepts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not is_sandbox_request(scope):
            # A signed file URL names its sandbox by its signature alone (e2b/signed.py).
            try:
                signed = signed_file_request(scope)
                sandbox_id = None if signed is None else self._signer(signed)
            except ForkdError as exc:
                await send_json(send, exc.status, rest_body(exc.status, str(exc)))
                return
            if signed is not None:
                if sandbox_id is None:
                    await send_json(send, 401, rest_body(401, "invalid signature: no running sandbox "
                                                              "signed this URL"))
                    return
                scope = {**scope, "headers": [*scope.get("headers", ()),
                                              (SANDBOX_HEADER, sandbox_id.encode())]}
        if is_sandbox_request(scope):
            await self.sandbox(scope, receive, send)
        elif scope["type"] == "http" and is_control_path(scope["path"]):
            await self.control(scope, receive, send)
        elif scope["type"] == "http" and is_volume_content_path(scope["path"]):
            await self.volume_content(scope, receive, send)
        else:
            await self.app(scope, receive, send)
