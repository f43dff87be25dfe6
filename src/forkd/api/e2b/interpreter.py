"""The code interpreter's protocol (port 49999): ``/execute`` and ``/contexts``.

``POST /execute {code, context_id?, language?, env_vars?}`` answers NDJSON,
one object a line: ``stdout`` and ``stderr`` (``{text, timestamp}``,
nanoseconds), each ``result`` with E2B's fields (``text``, ``html``,
``markdown``, ``svg``, ``png``, ``jpeg``, ``pdf``, ``latex``, ``json``,
``javascript``, ``data``, ``chart``, ``extra``) and ``is_main_result``, an
``error`` with ``name``, ``value`` and ``traceback``, and
``number_of_executions``.

On a sandbox whose image has a Jupyter kernel (the ``code-interpreter``
image) the cell runs on the context's kernel (``Runtime.kernels.run``): python
(IPython), bash, javascript or r (IRkernel) (``language``, E2B's names: ``js``
is ``javascript``, ``R`` is ``r``; a cell that names a language and no context runs on that
language's default context, as E2B's does), and its output streams while it
runs; a client that leaves interrupts it. Elsewhere it runs in PID 1's warm
interpreter (``Runtime.code.run``: the ``default`` context is the namespace
``eval`` uses; Python only) and its output is sent when the cell ends. A cell
may run ``CELL_TIMEOUT_SECS`` (the SDK's own default timeout), then it is
interrupted.

``/contexts``: create (a language, and a cwd: ``/home/user`` by default where the
kernels run, as in E2B), list (with the default context of each language), remove, restart.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from forkd.errors import ForkdError, InvalidRequest, NotFound, SandboxGone
from forkd.guest import code_messages, protocol

if TYPE_CHECKING:
    from forkd.controller.runtime import Runtime

CELL_TIMEOUT_SECS = 300.0


def _language(value: object) -> str | None:
    """E2B's name of a language as forkd's (None: not given); a 400 names the languages served."""
    if value is None or value == "":
        return None
    try:
        return code_messages.kernel_language(value)
    except protocol.RequestError as exc:
        raise InvalidRequest(f"{exc} (see docs/E2B.md)") from None


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


# IPython's MIME types, as E2B's result fields name them; anything else goes to ``extra``.
RESULT_FIELDS = {
    "text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg",
    "image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex",
    "application/json": "json", "application/javascript": "javascript", "e2b/data": "data",
    "e2b/chart": "chart",
}


def kernel_line(event: dict[str, Any]) -> list[dict[str, Any]]:
    """One kernel event (``Runtime.kernels.run``) as the code interpreter's NDJSON objects."""
    kind = event["type"]
    if kind in ("stdout", "stderr"):
        return [{"type": kind, "text": event["text"], "timestamp": time.time_ns()}]
    if kind == "result":
        data = dict(event["data"])
        line: dict[str, Any] = {"type": "result", "is_main_result": event["is_main_result"]}
        for mime, name in RESULT_FIELDS.items():
            if mime in data:
                line[name] = data.pop(mime)
        text = line.get("text")
        if isinstance(text, str) and len(text) > 1 and text[0] == text[-1] == "'":
            line["text"] = text[1:-1]  # a string result without its quotes, as E2B sends it
        if data:
            line["extra"] = data
        return [line]
    if kind == "error":
        return [{"type": "error", "name": event["name"], "value": event["value"],
                 "traceback": event["traceback"]}]
    out: list[dict[str, Any]] = []
    if event.get("error"):  # the stream broke after the 200
        out.append({"type": "error", "name": "SandboxError", "value": event["error"], "traceback": ""})
    if event.get("execution_count") is not None:
        out.append({"type": "number_of_executions", "execution_count": event["execution_count"]})
    return out


async def kernel_stream(events: Any, alive: Callable[[], bool]) -> AsyncIterator[bytes]:
    """A kernel cell's events as they come; closing the body (a client that left) interrupts it.

    A sandbox killed mid-cell cuts the response off unfinished, as E2B's does: the SDK then
    sees the sandbox gone and raises its "sandbox was killed" error."""
    try:
        async for event in events:
            for line in kernel_line(event):
                yield (json.dumps(line) + "\n").encode()
    except ForkdError as exc:
        if isinstance(exc, SandboxGone) or not alive():
            raise
        for line in kernel_line({"type": "end", "error": str(exc)}):
            yield (json.dumps(line) + "\n").encode()
    finally:
        await events.aclose()


def _alive(rt: Runtime, sandbox_id: str) -> bool:
    try:
        rt.get_sandbox(sandbox_id)
    except ForkdError:
        return False
    return True


class Interpreter:
    def __init__(self, runtime: Callable[[], Runtime]) -> None:
        self._runtime = runtime

    async def handle(self, request: Request, sandbox_id: str) -> Response:
        path, method = request.url.path.rstrip("/"), request.method
        rt = self._runtime()
        if path == "/execute" and method == "POST":
            body = await _json(request)
            code = body.get("code")
            if not isinstance(code, str):
                raise InvalidRequest("code must be a string")
            env = body.get("env_vars") or None
            context = body.get("context_id") or None
            if context is not None and body.get("language"):  # E2B's rule, and its words
                raise InvalidRequest("Only one of context_id or language can be provided")
            language = _language(body.get("language"))
            if await rt.kernels.available(sandbox_id):
                cwd = None
                if context is not None and context != "default":  # a context's kernel starts in its cwd
                    known = {c["id"]: c["cwd"] for c in await rt.code.list(sandbox_id)}
                    if context not in known:
                        raise NotFound(f"no code context {context!r}")
                    cwd = known[context]
                events = await rt.kernels.run(sandbox_id, code, context=context, language=language,
                                              timeout_secs=CELL_TIMEOUT_SECS, env=env, cwd=cwd)
                return StreamingResponse(kernel_stream(events, lambda: _alive(rt, sandbox_id)),
                                         media_type="application/x-ndjson",
                                         headers={"Cache-Control": "no-cache, no-transform"})
            if language not in (None, "python"):
                raise InvalidRequest(f"{language} cells run on a Jupyter kernel, which this sandbox's image "
                                     "has not: start it from the code-interpreter image (see docs/E2B.md)")
            cell = await rt.code.run(sandbox_id, code, context=context, timeout_secs=CELL_TIMEOUT_SECS,
                                     env=env)

            async def stream() -> AsyncIterator[bytes]:
                for line in lines(cell):
                    yield (json.dumps(line) + "\n").encode()

            return StreamingResponse(stream(), media_type="application/x-ndjson")
        if path == "/contexts" and method == "POST":
            body = await _json(request)
            language = _language(body.get("language"))
            kernels = await rt.kernels.available(sandbox_id)
            cwd = body.get("cwd") or (code_messages.KERNEL_HOME if kernels else None)
            return JSONResponse(await rt.code.create(sandbox_id, language=language, cwd=cwd))
        if path == "/contexts" and method == "GET":
            return JSONResponse(await rt.code.list(sandbox_id))
        parts = path.split("/")
        if len(parts) in (3, 4) and parts[1] == "contexts":
            restart = len(parts) == 4 and parts[3] == "restart" and method == "POST"
            if restart or (len(parts) == 3 and method == "DELETE"):
                await rt.code.remove(sandbox_id, parts[2], restart=restart)
                return Response(status_code=204)
        raise NotFound(f"{method} {path} is not served by the code interpreter (see docs/E2B.md)")
