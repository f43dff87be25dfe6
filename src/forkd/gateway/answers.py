"""The answers the gateway makes itself, and what it reads from its hosts' answers."""

from __future__ import annotations

import json

from starlette.responses import JSONResponse, Response

from forkd.errors import NO_CAPACITY


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """An error in the daemon's shape: {"error"}."""
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def e2b_error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """An error in the shape E2B's SDKs read: {"code", "message"}."""
    return JSONResponse({"code": status, "message": message}, status_code=status, headers=headers)


def no_capacity(response: Response) -> bool:
    """Whether a host answered 503 ``no_capacity`` (it is full; another host may not be)."""
    if response.status_code != 503:
        return False
    try:
        return bool(json.loads(bytes(response.body)).get("code") == NO_CAPACITY)
    except (ValueError, AttributeError):
        return False


def error_text(response: Response) -> str:
    """A host's answer's ``error`` (what the gateway passes on), or its status."""
    return error_of(response.status_code, bytes(response.body))


def error_of(status: int, content: bytes) -> str:
    """The ``error`` of an answer's body, at most 300 characters, or ``HTTP <status>``."""
    try:
        return str(json.loads(content)["error"])[:300]
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}"


def json_field(body: bytes, name: str) -> str | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    value = data.get(name) if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


__all__ = ["e2b_error", "error", "error_of", "error_text", "json_field", "no_capacity"]
