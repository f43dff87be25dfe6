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
from forkd.guest import capabilities, code_messages, protocol

# A cell's stdout/stderr, as the agent caps them, plus its note; anything longer is a lie.
MAX_STREAM_CHARS = (1 << 20) + 200
MAX_TEXT_CHARS = 16 << 20  # the repr of a cell's value
MAX_CONTEXTS = 64


def _string(value: str, what: str, limit: int) -> str:
    if len(value) > limit:
        raise GuestError(f"guest agent sent an overlong {what}")
    return value


def _context(raw: code_messages.ContextInfo) -> dict[str, str]:
    """A context as the guest described it (its types checked already), bounded."""
    return {"id": _string(raw["id"], "code context id", protocol.FILE_PATH_MAX),
            "language": _string(raw["language"], "code context language", protocol.FILE_PATH_MAX),
            "cwd": _string(raw["cwd"], "code context cwd", protocol.FILE_PATH_MAX)}


def _cell(raw: code_messages.ContextRunReply) -> dict[str, Any]:
    """A cell's answer (its types checked already), bounded."""
    text, error, count = raw["text"], raw["error"], raw["execution_count"]
    if text is not None:
        _string(text, "cell result", MAX_TEXT_CHARS)
    if error is not None:
        error = {"name": _string(error["name"], "cell error name", MAX_TEXT_CHARS),
                 "value": _string(error["value"], "cell error value", MAX_TEXT_CHARS),
                 "traceback": _string(error["traceback"], "cell error traceback", MAX_TEXT_CHARS)}
    if count < 0:
        raise GuestError("guest agent sent a malformed execution count")
    return {"text": text, "error": error, "execution_count": count,
            "stdout": _string(raw["stdout"], "cell stdout", MAX_STREAM_CHARS),
            "stderr": _string(raw["stderr"], "cell stderr", MAX_STREAM_CHARS)}


class CodeRunner:
    def __init__(self, agents: AgentGateway, kernels: KernelCells, events: SandboxEvents) -> None:
        self._agents = agents
        self._events = events  # told of every cell run (a turn of work)
        self._kernels = kernels  # a context's kernel, if it started one, goes with the context

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
        req: code_messages.ContextRunRequest = {"op": "run", "code": code, "timeout_secs": timeout_secs,
                                                "env": env}
        if context is not None:
            req["context"] = context
        cell = _cell(await self._agents.call(sandbox_id, lambda agent: agent.context_run(
            req, timeout_secs + protocol.REPLY_GRACE_SECS)))
        await self._events.turn_done(sandbox_id)
        return cell

    async def create(self, sandbox_id: str, *, language: str | None = None,
                     cwd: str | None = None) -> dict[str, str]:
        """A new context: python (PID 1's, or the kernel's), or bash or javascript on a kernel."""
        req: code_messages.ContextCreateRequest = {"op": "create"}
        if language is not None:
            try:
                req["language"] = language = code_messages.kernel_language(language)
            except protocol.RequestError as exc:
                raise InvalidRequest(str(exc)) from None
            if language != "python":  # an older agent refuses it, but says only python is served
                await self._agents.require_agent(sandbox_id, capabilities.CAP_KERNEL_LANGUAGE)
        if language in (None, "python"):
            await self._agents.require_agent(sandbox_id, capabilities.CAP_PYTHON)
        if cwd is not None:
            req["cwd"] = cwd
        return _context(await self._agents.call(sandbox_id, lambda agent: agent.context_create(req, 30)))

    async def list(self, sandbox_id: str) -> list[dict[str, str]]:
        raw = (await self._agents.call(sandbox_id, lambda agent: agent.context_list(30)))["contexts"]
        if len(raw) > MAX_CONTEXTS:
            raise GuestError("guest agent sent an overlong list of code contexts")
        return [_context(c) for c in raw]

    async def remove(self, sandbox_id: str, context: str, *, restart: bool = False) -> None:
        await self._agents.call(sandbox_id, lambda agent: agent.context_remove(
            {"op": "restart" if restart else "remove", "context": context}, 30))
        await self._kernels.remove(sandbox_id, context, restart=restart)


__all__ = ["CodeRunner"]
