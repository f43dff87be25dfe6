"""The SDK's error shapes, so that every failure reaches E2B code as the exception it expects.

* REST (control plane, ``/files``, ``/health``, ``/execute``): ``{"code": <status>,
  "message": "..."}``; the SDK reads ``code`` and ``message``.
* Connect RPC (filesystem, process): ``{"code": "not_found", "message": "..."}``
  with the matching HTTP status, raised as ``ConnectError`` inside a service.

A sandbox that is not running answers like E2B's proxy: ``502`` (Connect:
``unavailable``) with a message containing "was not found", which the SDK
turns into ``SandboxNotRunningException`` (and ``is_running()`` into False).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from starlette.types import Send

from forkd.errors import ForkdError

# forkd's statuses as Connect codes (the SDK maps these to its exceptions).
CONNECT_CODE = {
    400: Code.INVALID_ARGUMENT, 401: Code.UNAUTHENTICATED, 403: Code.PERMISSION_DENIED,
    404: Code.NOT_FOUND, 409: Code.ALREADY_EXISTS, 413: Code.RESOURCE_EXHAUSTED,
    501: Code.UNIMPLEMENTED, 502: Code.UNAVAILABLE, 503: Code.UNAVAILABLE, 504: Code.DEADLINE_EXCEEDED,
}
# The Connect protocol's HTTP status for each code.
HTTP_STATUS = {
    Code.INVALID_ARGUMENT: 400, Code.UNAUTHENTICATED: 401, Code.PERMISSION_DENIED: 403,
    Code.NOT_FOUND: 404, Code.ALREADY_EXISTS: 409, Code.RESOURCE_EXHAUSTED: 429,
    Code.UNIMPLEMENTED: 501, Code.UNAVAILABLE: 503, Code.DEADLINE_EXCEEDED: 504, Code.INTERNAL: 500,
}


class E2BError(Exception):
    """An answer in the SDK's REST error shape (the control app's handler turns it into one)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def not_running(sandbox_id: str) -> str:
    """E2B's proxy wording (the SDK looks for "was not found")."""
    return f"The sandbox {sandbox_id} was not found: it is not running here (killed, paused or expired)"


def rest_body(status: int, message: str) -> bytes:
    return json.dumps({"code": status, "message": message}).encode()


def connect_body(code: Code, message: str) -> bytes:
    return json.dumps({"code": code.value, "message": message}).encode()


def as_connect(exc: ForkdError) -> ConnectError:
    status = exc.status if 400 <= exc.status <= 599 else 500
    return ConnectError(CONNECT_CODE.get(status, Code.INTERNAL), str(exc) or type(exc).__name__)


@contextlib.contextmanager
def connect_errors() -> Iterator[None]:
    """Inside a Connect service: forkd's errors (404, 409, ...) as the codes the SDK maps."""
    try:
        yield
    except ForkdError as exc:
        raise as_connect(exc) from None


async def send_json(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None,
                    ) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


def not_running_body(sandbox_id: str) -> dict[str, object]:
    """What E2B's proxy answers (502) for a sandbox that is not running: ``code`` and ``message``,
    as every REST error, and the ``sandboxId``. The port proxy answers it (api/port_proxy.py)."""
    return {"code": 502, "message": not_running(sandbox_id), "sandboxId": sandbox_id}
