"""A lean path for the daemon's plain JSON routes: FastAPI's own routes, dependencies, models and
exception handlers, without its per-request routing and dependency machinery.

Why: under many concurrent clients the daemon's CPU per request is what a 2-core host cannot
spare for its guests, and most of it was FastAPI's, not forkd's: matching a path walks every
included router's routes (twice for the router that serves it), and each request builds a
Request, an exit stack and a dependency solve. For ``POST /v1/sandboxes/{id}/eval`` that was
over half of the app's CPU (``bench/control_plane.py`` measures it).

What it serves: a route qualifies when it is a plain coroutine endpoint whose parameters are
path parameters (a string or a number each), at most one JSON body model, and dependencies
that each take only the connection (``get_runtime``); that answers with its ``response_model``.
Nothing is declared twice: the route, its validation, its serialization (``serialize_response``)
and the app's exception handlers are FastAPI's own, called directly. A path parameter and the
body model are validated by their own fields, as FastAPI's ``request_params_to_args`` and
``request_body_to_args`` do for them.

What it leaves to FastAPI, unchanged: any request with a query string, a body that is empty or
not ``application/json``, a path or body that does not validate (so every 400 is FastAPI's
own message), WebSockets, dependency overrides (tests), and every route that does not qualify.
A route is served here only if no other route could match the same method and path, so the
route chosen is the one FastAPI would choose, whatever order it tries them in.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, params
from fastapi._compat import ModelField
from fastapi.datastructures import DefaultPlaceholder
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, serialize_response
from fastapi.utils import is_body_allowed_for_status_code
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from forkd.api.limits import replaying

log = logging.getLogger(__name__)

_PARAM = re.compile(r"\{[^}]*\}")
_WILD = "*"  # a segment that matches any one segment
_TAIL = "**"  # a {name:path} parameter or a mount: any rest of the path

Handler = Callable[[Request, Any], Response | Awaitable[Response]]  # Starlette's: sync or async


def _segments(path: str, *, prefix: bool = False) -> tuple[str, ...]:
    """A route's path template as segments: literals, ``_WILD`` for a parameter (or a segment
    with one inside), ``_TAIL`` for whatever a path parameter or a mount's prefix takes."""
    out: list[str] = []
    for segment in path.split("/")[1:]:
        if ":path}" in segment:
            out.append(_TAIL)
            break
        out.append(_WILD if _PARAM.search(segment) else segment)
    if prefix:
        out.append(_TAIL)
    return tuple(out)


def _overlap(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Could some path match both templates? (Conservative: yes unless a literal differs.)"""
    for x, y in zip(a, b, strict=False):
        if _TAIL in (x, y):
            return True
        if x != y and _WILD not in (x, y):
            return False
    return len(a) == len(b) or (len(a) > len(b) and a[len(b)] == _TAIL) or (
        len(b) > len(a) and b[len(a)] == _TAIL)


def _connection_param(dependant: Dependant) -> str | None:
    """The one parameter a dependency takes, if it takes only the connection; else None."""
    if (dependant.path_params or dependant.query_params or dependant.header_params
            or dependant.cookie_params or dependant.body_params or dependant.dependencies
            or dependant.response_param_name or dependant.background_tasks_param_name
            or dependant.security_scopes_param_name or dependant.websocket_param_name
            or not inspect.iscoroutinefunction(dependant.call)):
        return None
    return dependant.request_param_name or dependant.http_connection_param_name


@dataclass(frozen=True)
class _Plain:
    """A route this path serves, with what it needs per request worked out once."""

    route: APIRoute
    path_fields: tuple[tuple[str, str, ModelField], ...]  # (name, alias, field) of each path parameter
    body_field: ModelField | None  # the one JSON body model, validated whole (not embedded)
    dependencies: tuple[tuple[str | None, Callable[..., Awaitable[Any]], str], ...]  # (name, call, its param)
    status: int

    @staticmethod
    def of(route: APIRoute) -> _Plain | None:
        d = route.dependant
        if (d.query_params or d.header_params or d.cookie_params or len(d.body_params) > 1
                or d.request_param_name or d.websocket_param_name or d.http_connection_param_name
                or d.response_param_name or d.background_tasks_param_name or d.security_scopes_param_name
                or not inspect.iscoroutinefunction(d.call) or inspect.isasyncgenfunction(d.call)
                or route.response_field is None or not isinstance(route.response_class, DefaultPlaceholder)
                or getattr(route, "_embed_body_fields", True)
                or not is_body_allowed_for_status_code(route.status_code)
                # A path parameter is one string (or number) from the path: FastAPI's validation of it
                # is the field's own. Form bodies are FastAPI's to read.
                or any(f.field_info.annotation not in (str, int) for f in d.path_params)
                or any(isinstance(f.field_info, params.Form) for f in d.body_params)):
            return None
        dependencies = []
        for dep in d.dependencies:
            param = _connection_param(dep)
            if param is None or dep.call is None:
                return None
            dependencies.append((dep.name, dep.call, param))
        return _Plain(route, tuple((f.name, f.alias, f) for f in d.path_params),
                      d.body_params[0] if d.body_params else None, tuple(dependencies),
                      route.status_code or 200)


def _flatten(entries: Sequence[BaseRoute], allowed: bool, app_calls: set[Any],
             out: list[tuple[BaseRoute, bool]]) -> None:
    """The routes under ``entries``, included routers opened (FastAPI 0.165 keeps them nested).
    An inclusion with a prefix of its own, a body limit or dependencies beyond the app's marks its
    routes as not to be served here (their paths or checks are the inclusion's, not the route's)."""
    for entry in entries:
        included = getattr(entry, "original_router", None)
        if included is None:
            out.append((entry, allowed))
            continue
        context = entry.include_context  # type: ignore[attr-defined]
        ok = (allowed and not context.prefix and context.max_body_size is None
              and {d.dependency for d in context.dependencies} <= app_calls)
        _flatten(included.routes, ok, app_calls, out)


def _handler_for(handlers: Mapping[Any, Handler], exc: Exception) -> Handler | None:
    """The app's handler for ``exc``, as Starlette's ExceptionMiddleware would pick it; None for
    what only ``Exception``'s handler takes (ServerErrorMiddleware answers those)."""
    if isinstance(exc, HTTPException) and exc.status_code in handlers:
        return handlers[exc.status_code]
    for cls in type(exc).__mro__:
        if cls is Exception:
            return None
        if cls in handlers:
            return handlers[cls]
    return None


class FastPath:
    """Innermost middleware: serves the owner's plain routes (see the module docstring) and
    passes everything else to FastAPI."""

    def __init__(self, app: ASGIApp, owner: FastAPI) -> None:
        self.app = app
        self._owner = owner
        self._index: dict[tuple[str, int], list[tuple[re.Pattern[str], _Plain]]] = {}
        self._app_dependencies: tuple[tuple[Callable[..., Awaitable[Any]], str], ...] = ()
        try:
            self._build()
        except Exception:  # a FastAPI whose internals moved: serve everything the slow way
            log.warning("the fast path is off: this FastAPI's routes could not be read", exc_info=True)
            self._index = {}

    def _build(self) -> None:
        app_dependencies = []
        for depends in self._owner.router.dependencies:
            call = depends.dependency
            parameters = list(inspect.signature(call).parameters) if call is not None else []
            if call is None or len(parameters) != 1 or not inspect.iscoroutinefunction(call):
                return  # an app-wide dependency that needs more than the connection: none served here
            app_dependencies.append((call, parameters[0]))
        self._app_dependencies = tuple(app_dependencies)
        app_calls = {call for call, _ in app_dependencies}
        routes: list[tuple[BaseRoute, bool]] = []  # every route, and whether its inclusion allows serving it
        _flatten(self._owner.router.routes, True, app_calls, routes)
        templates = [(_segments(r.path, prefix=isinstance(r, Mount)),
                      set(r.methods or ()) if isinstance(r, Route) else None)  # None: a mount takes any
                     for r, _ in routes if isinstance(r, Route | Mount)]
        for route, allowed in routes:
            if not allowed or not isinstance(route, APIRoute):
                continue
            plain = _Plain.of(route)
            template, methods = _segments(route.path), set(route.methods or ())
            # Served here only if no other route could take the same request, whatever order
            # FastAPI tries them in.
            overlaps = sum(1 for other, other_methods in templates if _overlap(template, other)
                           and (other_methods is None or methods & other_methods))
            if plain is None or overlaps != 1 or _TAIL in template:
                continue
            for method in methods:
                self._index.setdefault((method, len(template)), []).append((route.path_regex, plain))

    def served(self) -> list[tuple[str, str]]:
        """(method, path) of every route served here (the tests check the hot ones are)."""
        return sorted((method, plain.route.path) for (method, _), entries in self._index.items()
                      for _, plain in entries)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("query_string") or scope.get("root_path") \
                or self._owner.dependency_overrides:
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        for regex, plain in self._index.get((scope["method"], path.count("/")), ()):
            match = regex.match(path)
            if match is not None:
                await self._serve(plain, match.groupdict(), scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _serve(self, plain: _Plain, params: dict[str, str], scope: Scope, receive: Receive,
                     send: Send) -> None:
        route = plain.route
        path = {k: route.param_convertors[k].convert(v) for k, v in params.items()}
        values: dict[str, Any] = {}
        errors: list[Any] = []
        for name, alias, field in plain.path_fields:  # what request_params_to_args does for a path
            value, errors = field.validate(path[alias], values, loc=("path", alias))
            if errors:
                break
            values[name] = value
        if plain.body_field is not None and not errors:
            body = await _read_body(receive)
            receive = replaying(body, receive)  # for FastAPI, should it have to answer after all
            if not body or not _is_json(scope):
                errors = ["no JSON body"]
            else:
                try:
                    parsed = json.loads(body)
                except ValueError:
                    errors = ["not JSON"]
                else:  # what request_body_to_args does for one model, not embedded
                    value, errors = plain.body_field.validate(parsed, values, loc=("body",))
                    values[plain.body_field.name] = value
        if errors:  # FastAPI says what is wrong, in its own words
            await self.app(scope, receive, send)
            return
        scope["route"] = route
        scope["endpoint"] = route.endpoint
        scope["path_params"] = path
        connection = Request(scope, receive)
        try:
            for call, param in self._app_dependencies:
                await call(**{param: connection})
            for dep_name, call, param in plain.dependencies:
                value = await call(**{param: connection})
                if dep_name is not None:
                    values[dep_name] = value
            result = await route.endpoint(**values)
            if isinstance(result, Response):  # the endpoint answered for itself, as FastAPI allows
                await result(scope, receive, send)
                return
            content = await serialize_response(
                field=route.response_field, response_content=result,
                include=route.response_model_include, exclude=route.response_model_exclude,
                by_alias=route.response_model_by_alias, exclude_unset=route.response_model_exclude_unset,
                exclude_defaults=route.response_model_exclude_defaults,
                exclude_none=route.response_model_exclude_none, dump_json=True)
        except Exception as exc:
            handler = _handler_for(self._owner.exception_handlers, exc)
            if handler is None:
                raise  # ServerErrorMiddleware: a 500 with {"error"}, and the traceback logged
            response = handler(connection, exc)
            if inspect.isawaitable(response):
                response = await response
            await response(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": plain.status,
                    "headers": [(b"content-length", str(len(content)).encode()),
                                (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": content})


def _is_json(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return bool(value.split(b";", 1)[0].strip().lower() == b"application/json")
    return False


async def _read_body(receive: Receive) -> bytes:
    """The request's body (already bounded by BodySizeLimitMiddleware, which runs first)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)  # a disconnect: FastAPI would see the same
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)
