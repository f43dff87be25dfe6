"""REST route for cells on a sandbox's Jupyter kernels: ``POST /v1/sandboxes/{id}/code``.

The answer is NDJSON (``application/x-ndjson``), one event a line, written as
the kernel produces it: ``stdout``/``stderr`` (``text``), ``result`` (``data``:
the MIME bundle, ``is_main_result``), ``error`` (``name``, ``value``,
``traceback``), and last ``end`` (``execution_count``, ``timed_out``,
``restarted``; ``error`` if the stream itself broke). A client that goes away
before the end interrupts the cell. Semantics live in
``forkd.controller.kernel_cells`` (reached only through the Runtime facade).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter
from fastapi.responses import StreamingResponse
from pydantic import Field

from forkd.api.routes import (
    BAD_REQUEST,
    COMMON_ERRORS,
    GUEST_ERRORS,
    NO_SANDBOX,
    STARTING,
    Runtime,
    SandboxIdPath,
)
from forkd.api.schemas import GUEST_PATH_PATTERN, ErrorBody, ProcessEnv, RequestModel
from forkd.config import API_VERSION
from forkd.errors import ForkdError

NDJSON = "application/x-ndjson"

router = APIRouter(prefix=f"/{API_VERSION}", tags=["code"],
                   responses={**COMMON_ERRORS, **BAD_REQUEST, **STARTING, **NO_SANDBOX, **GUEST_ERRORS})


CONTEXT_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
DEFAULT_TIMEOUT_SECS = 300.0  # as KernelCells.run's (Runtime.kernels)
# The kernel languages by every name the guest takes: guest.code_messages.KERNEL_LANGUAGES and aliases,
# spelt out for the schema (tests/unit/test_kernel_languages.py holds the two together).
KernelLanguage = Literal["python", "bash", "javascript", "js", "r"]


class CodeRequest(RequestModel):
    code: str = Field(max_length=16 << 20, description="The cell, in its kernel's language: Python run by "
                      "IPython (magics, `!shell`, top-level await, display()), bash, JavaScript (node; "
                      "top-level await), or R (IRkernel).")
    context: str | None = Field(None, pattern=CONTEXT_PATTERN,
                                description="The kernel to run on; one kernel per context, started on "
                                "its first cell (default: the language's default context: `default` "
                                "for python, `default-bash`, `default-javascript`, `default-r`).")
    language: KernelLanguage | None = Field(None, description="The kernel's language (`js` is "
                                            "`javascript`); default: the context's, python for a new "
                                            "one. Another language than the context's is a 400.")
    timeout: float = Field(DEFAULT_TIMEOUT_SECS, gt=0, le=86400,
                           description="Seconds the cell may run; then the kernel is interrupted.")
    env: ProcessEnv = None
    cwd: str | None = Field(None, pattern=GUEST_PATH_PATTERN, max_length=4096,
                            description="Working directory of the context's kernel when it starts.")


def line(body: dict[str, Any]) -> bytes:
    return (json.dumps(body, separators=(",", ":")) + "\n").encode()


async def ndjson(events: Any) -> AsyncIterator[bytes]:
    """Each event as it comes; closing the body (a client that left) interrupts the cell."""
    try:
        async for event in events:
            yield line(event)
    except ForkdError as exc:  # after the 200 has gone: say so in the stream itself
        yield line({"type": "end", "execution_count": None, "timed_out": False, "restarted": False,
                    "error": str(exc)})
    finally:
        await events.aclose()


STREAM_DOC: dict[int | str, dict[str, Any]] = {
    200: {"content": {NDJSON: {"schema": {"type": "string"}}},
          "description": "NDJSON, one event a line: stdout/stderr (text), result (data, is_main_result), "
                         "error (name, value, traceback), then end (see docs/API.md)."},
    409: {"model": ErrorBody, "description": "The sandbox's image has no Jupyter kernel."},
    503: {"model": ErrorBody, "description": "The sandbox already runs 8 cells (or the daemon is starting)."},
}


@router.post(
    "/sandboxes/{id}/code",
    response_class=StreamingResponse,
    summary="Run a cell on one of the sandbox's Jupyter kernels and stream its output (NDJSON)",
    responses=STREAM_DOC,
)
async def run_code(sandbox_id: SandboxIdPath, req: CodeRequest, rt: Runtime) -> StreamingResponse:
    events = await rt.kernels.run(sandbox_id, req.code, context=req.context, timeout_secs=req.timeout,
                                  env=req.env, cwd=req.cwd, language=req.language)
    # no-transform / X-Accel-Buffering: proxies must pass each line on as it comes.
    return StreamingResponse(ndjson(events), media_type=NDJSON,
                             headers={"Cache-Control": "no-cache, no-transform", "X-Accel-Buffering": "no"})
