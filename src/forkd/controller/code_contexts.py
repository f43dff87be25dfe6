"""`CodeRunner`: the host side of the agent's named code contexts (``forkd.guest.agent.contexts``).

The code interpreter (E2B's ``run_code``) runs cells in PID 1's warm
interpreter where the image has no Jupyter kernel: the ``default`` context is
the namespace ``eval`` uses, others are made with ``create``. Where it has one,
the contexts are those of the kernels (``KernelCells``), each with its
language; the guest lists a default context for each language it runs.
Everything the guest answers is checked and bounded here before it is passed
on: the guest is not trusted.
"""

from __future__ import annotations

from typing import Any

from forkd import bounds
from forkd.controller.agent_gateway import AgentGateway
from forkd.controller.kernel_cells import KernelCells
from forkd.controller.sandbox_events import SandboxEvents
from forkd.errors import GuestError, InvalidRequest
from forkd.guest import protocol

# A cell's stdout/stderr, as the agent caps them, plus its note; anything longer is a lie.
MAX_STREAM_CHARS = (1 << 20) + 200
MAX_TEXT_CHARS = 16 << 20  # the repr of a cell's value
MAX_CONTEXTS = 64
_CONTEXT_KEYS = ("id", "language", "cwd")


def _string(value: object, what: str, limit: int) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise GuestError(f"guest agent sent a malformed {what}")
    return value


def _context(raw: object) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise GuestError("guest agent sent a malformed code context")
    return {k: _string(raw.get(k), f"code context {k}", protocol.FILE_PATH_MAX) for k in _CONTEXT_KEYS}


def _cell(raw: dict[str, Any]) -> dict[str, Any]:
    text = raw.get("text")
    error = raw.get("error")
    count = raw.get("execution_count")
    if text is not None:
        _string(text, "cell result", MAX_TEXT_CHARS)
    if error is not None:
        if not isinstance(error, dict):
            raise GuestError("guest agent sent a malformed cell error")
        error = {k: _string(error.get(k), f"cell error {k}", MAX_TEXT_CHARS)
                 for k in ("name", "value", "traceback")}
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise GuestError("guest agent sent a malformed execution count")
    return {"text": text, "error": error, "execution_count": count,
            "stdout": _string(raw.get("stdout"), "cell stdout", MAX_STREAM_CHARS),
            "stderr": _string(raw.get("stderr"), "cell stderr", MAX_STREAM_CHARS)}


class CodeRunner:
    def __init__(self, agents: AgentGateway, kernels: KernelCells, events: SandboxEvents) -> None:
        self._agents = agents
        self._events = events  # told of every cell run (a turn of work)
        self._kernels = kernels  # a context's kernel, if it started one, goes with the context

    async def _call(self, sandbox_id: str, timeout: float, **args: object) -> dict[str, Any]:
        return await self._agents.call(sandbox_id, protocol.CONTEXT, timeout, **args)

    async def run(self, sandbox_id: str, code: str, *, context: str | None = None,
                  timeout_secs: float = bounds.EVAL_TIMEOUT_SECS,
                  env: dict[str, str] | None = None) -> dict[str, Any]:
        """One cell: ``{"text", "stdout", "stderr", "error", "execution_count"}``."""
        if not isinstance(code, str):
            raise InvalidRequest("code must be a string")
        bounds.EXEC_TIMEOUT_SECS.check(timeout_secs)
        try:
            env = protocol.check_env(env)
        except protocol.RequestError as exc:
            raise InvalidRequest(str(exc)) from None
        args: dict[str, object] = {"op": "run", "code": code, "timeout_secs": timeout_secs, "env": env}
        if context is not None:
            args["context"] = context
        cell = _cell(await self._call(sandbox_id, timeout_secs + protocol.REPLY_GRACE_SECS, **args))
        await self._events.turn_done(sandbox_id)
        return cell

    async def create(self, sandbox_id: str, *, language: str | None = None,
                     cwd: str | None = None) -> dict[str, str]:
        """A new context: python (PID 1's, or the kernel's), or bash or javascript on a kernel."""
        args: dict[str, object] = {"op": "create"}
        if language is not None:
            try:
                args["language"] = language = protocol.kernel_language(language)
            except protocol.RequestError as exc:
                raise InvalidRequest(str(exc)) from None
            if language != "python":  # an older agent refuses it, but says only python is served
                await self._agents.require_agent(sandbox_id, protocol.CAP_KERNEL_LANGUAGE)
        if cwd is not None:
            args["cwd"] = cwd
        return _context(await self._call(sandbox_id, 30, **args))

    async def list(self, sandbox_id: str) -> list[dict[str, str]]:
        raw = (await self._call(sandbox_id, 30, op="list")).get("contexts")
        if not isinstance(raw, list) or len(raw) > MAX_CONTEXTS:
            raise GuestError("guest agent sent a malformed list of code contexts")
        return [_context(c) for c in raw]

    async def remove(self, sandbox_id: str, context: str, *, restart: bool = False) -> None:
        await self._call(sandbox_id, 30, op="restart" if restart else "remove", context=context)
        await self._kernels.remove(sandbox_id, context, restart=restart)


__all__ = ["CodeRunner"]
