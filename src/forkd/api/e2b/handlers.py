"""The exception handlers every app of the E2B layer installs, each answering in its API's shape.

Its own module because the control plane and the volume content API fail alike (a forkd error's
status and message, a route forkd does not serve as 501, anything unexpected as 500) and differ
only in the shape of the body (``answer``) and in how they name what is not served.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from forkd.api.e2b.errors import E2BError
from forkd.api.e2b.inputs import UNSUPPORTED
from forkd.errors import ForkdError, NoCapacity

Answer = Callable[[int, str], JSONResponse]


def install(app: FastAPI, answer: Answer, unserved: str,
            status_errors: tuple[type[Exception], ...] = (E2BError,)) -> None:
    """``status_errors``: exceptions that carry their own ``status`` (E2B's, answered as they say);
    ``unserved``: what a path no route matches is not ("supported by forkd")."""

    async def status_error(_request: Request, exc: Exception) -> JSONResponse:
        return answer(int(getattr(exc, "status", 500)), str(exc))

    async def forkd_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ForkdError)
        response = answer(exc.status if 400 <= exc.status <= 599 else 500, str(exc) or type(exc).__name__)
        if isinstance(exc, NoCapacity):  # E2B's bodies have no room for a code: the status and header say it
            response.headers["Retry-After"] = str(exc.retry_after_secs)
        return response

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code in (404, 405):
            return answer(501, f"{request.method} {request.url.path[:200]} is not {unserved}; {UNSUPPORTED}")
        return answer(exc.status_code, str(exc.detail))

    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        return answer(500, f"internal error: {type(exc).__name__}: {exc}")

    for kind in status_errors:
        app.add_exception_handler(kind, status_error)
    app.add_exception_handler(ForkdError, forkd_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)


__all__ = ["Answer", "install"]
