"""Exception handlers: every 4xx/5xx body is exactly ``{"error": "<message>"}``."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError, ResponseValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from forkd.api.schemas import ENV_NAME_PATTERN, NO_NUL_PATTERN, NON_EMPTY_NO_NUL_PATTERN, TAG_PATTERN
from forkd.bounds import SANDBOX_ID_RULE
from forkd.errors import ForkdError, NoCapacity

log = logging.getLogger(__name__)

_VALUE_ERROR_PREFIXES = ("Value error, ", "Assertion failed, ")
_NUL_PATTERNS = (NO_NUL_PATTERN, NON_EMPTY_NO_NUL_PATTERN)


def error_response(status: int, message: str, headers: dict[str, str] | None = None,
                   code: str | None = None) -> JSONResponse:
    body = {"error": message} if code is None else {"error": message, "code": code}
    return JSONResponse(body, status_code=status, headers=headers)


def _where(loc: Sequence[Any]) -> str:
    """("body", "setup", 0, 1) -> "setup[0][1]"; ("path", "sandbox_id") -> "sandbox_id"."""
    parts = list(loc)
    if parts and parts[0] in {"body", "query", "path", "header", "cookie"}:
        parts = parts[1:]
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _describe(error: dict[str, Any]) -> str:
    kind = error.get("type", "")
    loc = tuple(error.get("loc", ()))
    where = _where(loc)
    msg = str(error.get("msg", "invalid"))
    for prefix in _VALUE_ERROR_PREFIXES:
        msg = msg.removeprefix(prefix)
    if kind == "extra_forbidden":
        return f"unknown field {where!r}"
    if kind == "json_invalid":
        detail = (error.get("ctx") or {}).get("error", "")
        return f"request body is not valid JSON ({detail})" if detail else "request body is not valid JSON"
    if kind == "missing" and not where and loc and loc[0] == "body":
        return "a JSON request body is required"
    if kind in {"model_attributes_type", "model_type", "dict_type"} and not where:
        if isinstance(error.get("input"), bytes | str):
            return "request body must be a JSON object sent with Content-Type: application/json"
        return "request body must be a JSON object"
    pattern = (error.get("ctx") or {}).get("pattern")
    if kind == "string_pattern_mismatch" and pattern in _NUL_PATTERNS:
        return f"{where}: must not contain NUL characters" + (
            "" if pattern == NO_NUL_PATTERN else " or be empty"
        )
    if kind == "string_pattern_mismatch" and pattern == ENV_NAME_PATTERN:
        return f"{where}: environment variable names must be non-empty, without '=' or NUL"
    if kind == "string_pattern_mismatch" and pattern == TAG_PATTERN:
        return f"{where}: must match {TAG_PATTERN}"
    if kind == "string_pattern_mismatch" and loc[:1] == ("path",) and where == "id":
        return f"invalid sandbox id: {SANDBOX_ID_RULE}"
    return f"{where}: {msg}" if where else msg


def format_validation_error(exc: RequestValidationError) -> str:
    messages = [_describe(dict(e)) for e in exc.errors()]
    # One problem per distinct message, in order; pydantic can report a union twice.
    unique = list(dict.fromkeys(messages))
    return "invalid request: " + "; ".join(unique)


async def _forkd_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ForkdError)
    status = exc.status if 400 <= exc.status <= 599 else 500
    if status >= 500:
        log.warning("%s %s -> %d: %s", request.method, request.url.path, status, exc)
    headers = None
    if isinstance(exc, NoCapacity):
        headers = {"Retry-After": str(exc.retry_after_secs)}
    return error_response(status, str(exc) or type(exc).__name__, headers=headers, code=exc.code)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(400, format_validation_error(exc))


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path.

    Starlette's own Allow header names only the first route that matched the
    path, but FastAPI registers one route per method (GET and POST
    /v1/snapshots are two routes), so it under-reports. Asking the router,
    through the public ``matches`` API, which methods fully match is exact and
    does not depend on how FastAPI nests included routers.
    """
    allowed = []
    for method in _METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] is Match.FULL for route in request.app.router.routes):
            allowed.append(method)
    return allowed


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    # Keep the raiser's headers (e.g. WWW-Authenticate) and fix up Allow below.
    headers = dict(exc.headers or {})
    if exc.status_code == 404 and exc.detail == "Not Found":
        message = f"no such route: {request.method} {request.url.path}"
    elif exc.status_code == 405:
        allowed = _allowed_methods(request)
        headers["Allow"] = ", ".join(allowed)
        message = f"method {request.method} is not allowed on {request.url.path}; use {', '.join(allowed)}"
    else:
        message = str(exc.detail)
    return error_response(exc.status_code, message, headers=headers)


async def _response_invalid(request: Request, exc: Exception) -> JSONResponse:
    """A response model refused what a route returned. What routes return about a sandbox comes from
    its guest agent, which the tenant (root in its VM) can replace and make answer anything: that is
    the guest failing, a 502 as for any bad answer of its agent, never a daemon error."""
    assert isinstance(exc, ResponseValidationError)
    problems = "; ".join(dict.fromkeys(_describe(dict(e)).replace("invalid request: ", "")
                                       for e in exc.errors()[:5]))
    log.warning("%s %s -> 502: the answer does not fit its schema: %s", request.method, request.url.path,
                problems)
    return error_response(502, "the sandbox answered with a reply that does not fit its schema (its guest "
                               f"agent may have been replaced or broken): {problems}")


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    # Starlette's ServerErrorMiddleware sends this and then re-raises, so the
    # server still logs the full traceback.
    return error_response(500, f"internal error: {type(exc).__name__}: {exc}")


def install_exception_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ForkdError, _forkd_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(ResponseValidationError, _response_invalid)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
