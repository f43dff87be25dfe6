"""The code interpreter's protocol (port 49999): ``/execute`` and ``/contexts``.

``POST /execute {code, context_id?, language?, env_vars?}`` runs one cell in
PID 1's warm interpreter (``Runtime.run_code``: the ``default`` context is the
namespace ``eval`` uses) and answers NDJSON, one object a line: ``stdout`` and
``stderr`` (``{text, timestamp}``, nanoseconds), the cell's value as a
``result`` with ``is_main_result``, an ``error`` with ``name``, ``value`` and
``traceback``, and ``number_of_executions``. Output is sent when the cell
ends, not while it runs (the agent captures it). A cell may run
``CELL_TIMEOUT_SECS`` (the SDK's own default timeout), then it is interrupted.

``/contexts``: create (python only), list, remove, restart.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from forkd.errors import InvalidRequest, NotFound

if TYPE_CHECKING:
    from forkd.controller.runtime import Runtime

CELL_TIMEOUT_SECS = 300.0
LANGUAGES = (None, "python")


def _language(value: object) -> None:
    if value not in LANGUAGES:
        raise InvalidRequest(f"only python code runs here, not {value!r} (see docs/E2B.md)")


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError as exc:
        raise InvalidRequest(f"request body is not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    return body


def lines(cell: dict[str, Any]) -> list[dict[str, Any]]:
    """A cell's result as the code interpreter's NDJSON objects, in its order."""
    now = time.time_ns()
    out: list[dict[str, Any]] = []
    for kind in ("stdout", "stderr"):
        if cell[kind]:
            out.append({"type": kind, "text": cell[kind], "timestamp": now})
    if cell["text"] is not None:
        out.append({"type": "result", "text": cell["text"], "is_main_result": True})
    if cell["error"] is not None:
        out.append({"type": "error", **cell["error"]})
    out.append({"type": "number_of_executions", "execution_count": cell["execution_count"]})
    return out


class Interpreter:
    def __init__(self, runtime: Callable[[], Runtime]) -> None:
        self._runtime = runtime

    async def handle(self, request: Request, sandbox_id: str) -> Response:
        path, method = request.url.path.rstrip("/"), request.method
        rt = self._runtime()
        if path == "/execute" and method == "POST":
            body = await _json(request)
            _language(body.get("language"))
            code = body.get("code")
            if not isinstance(code, str):
                raise InvalidRequest("code must be a string")
            env = body.get("env_vars") or None
            cell = await rt.run_code(sandbox_id, code, context=body.get("context_id") or None,
                                     timeout_secs=CELL_TIMEOUT_SECS, env=env)

            async def stream() -> AsyncIterator[bytes]:
                for line in lines(cell):
                    yield (json.dumps(line) + "\n").encode()

            return StreamingResponse(stream(), media_type="application/x-ndjson")
        if path == "/contexts" and method == "POST":
            body = await _json(request)
            _language(body.get("language"))
            return JSONResponse(await rt.create_code_context(sandbox_id, language=body.get("language"),
                                                             cwd=body.get("cwd")))
        if path == "/contexts" and method == "GET":
            return JSONResponse(await rt.list_code_contexts(sandbox_id))
        parts = path.split("/")
        if len(parts) in (3, 4) and parts[1] == "contexts":
            restart = len(parts) == 4 and parts[3] == "restart" and method == "POST"
            if restart or (len(parts) == 3 and method == "DELETE"):
                await rt.remove_code_context(sandbox_id, parts[2], restart=restart)
                return Response(status_code=204)
        raise NotFound(f"{method} {path} is not served by the code interpreter (see docs/E2B.md)")
