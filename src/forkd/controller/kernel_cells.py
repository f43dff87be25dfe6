"""`KernelCells`: cells on the Jupyter kernels inside a sandbox (``forkd.guest.agent.kernels``).

A cell is a stream: its output (``stdout``/``stderr`` text, each ``result``
with its MIME bundle, the ``error``) comes while it runs, then its ``end``.
The stream is flow-controlled end to end like a process stream (a caller that
stops reading stops the kernel's output, never grows the daemon), and closing
it before the end (a client that went away) interrupts the kernel in the guest,
so the next cell runs at once. A cell past its ``timeout_secs`` is interrupted
by the guest, which then answers its end with ``timed_out``.

Kernels run only on images that have one (``forkd image build --name
code-interpreter``); ``available`` tells. A cell's ``language`` (python, bash,
javascript or r, ``code_messages.KERNEL_LANGUAGES``) picks its context's kernel; a guest
agent too old to know it would run bash as Python, so it is refused first
(``require_agent``). Everything the guest sends is checked for shape and size
here before anyone sees it: the guest is not trusted.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from forkd import bounds
from forkd.controller.agent_gateway import AgentGateway
from forkd.controller.guest_streams import GuestEvents, StreamSlots
from forkd.controller.sandbox_events import SandboxEvents
from forkd.errors import Conflict, GuestError, InvalidRequest
from forkd.guest import capabilities, code_messages, protocol
from forkd.guest.client import AgentStream
from forkd.vmm.machine import VM

MAX_STREAMS_PER_SANDBOX = 8
MAX_TEXT_CHARS = protocol.MAX_REPLY_LINE  # no string in one event can be longer than its line
# A first cell starts the kernel (seconds under TCG); the guest interrupts at the cell's
# timeout and restarts a kernel that ignores that. Past this much more, the guest is wedged.
KERNEL_START_GRACE_SECS = 300.0
DEFAULT_TIMEOUT_SECS = 300.0


# What a template of an image with a kernel runs before its snapshot (silently: no output,
# no execution count), so that every child's first cell finds the kernel started, the data
# libraries imported and matplotlib's font cache built: a figure and a DataFrame go through
# every display formatter, as a shown one does (the PNG, the chart data, the HTML and the
# table data: kernel_client's SETUP_CELL). Nothing is left in the namespace.
WARM_CELL = """\
def __forkd_warm():
    import numpy, pandas, matplotlib.pyplot as plt
    from IPython import get_ipython
    shown = get_ipython().display_formatter
    figure, (line, bars) = plt.subplots(1, 2); line.plot([0, 1]); bars.bar(["a"], [1])
    shown.format(figure); plt.close("all")
    shown.format(pandas.DataFrame({"a": [1]}))
__forkd_warm(); del __forkd_warm
"""


def _older_agent(exc: GuestError) -> bool:
    """An agent from before kernels (an image built by an older forkd) has none."""
    return "unknown action" in str(exc)


async def warm_template(vm: VM, timeout_secs: float) -> bool:
    """Start and warm the default kernel of a template whose image has one; False if it has none."""
    try:
        available = await vm.call(lambda agent: agent.kernel_available(30))
    except GuestError as exc:
        if _older_agent(exc):
            return False
        raise
    if not available["available"]:
        return False
    # A plain call: the warm cell sends no events, only its end.
    end = await vm.call(lambda agent: agent.kernel_run(
        {"op": "run", "code": WARM_CELL, "silent": True, "timeout_secs": timeout_secs},
        timeout_secs + KERNEL_START_GRACE_SECS))
    if end.get("failed") or end.get("timed_out"):
        raise GuestError(f"warming the template's Jupyter kernel failed: {end}")
    return True


def _str(value: object, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT_CHARS:
        raise GuestError(f"guest agent sent a malformed {what}")
    return value


def cell_event(raw: dict[str, Any]) -> dict[str, Any]:
    """One event of a kernel stream, with only its documented keys of their documented types."""
    kind = raw.get("type")
    if kind in ("stdout", "stderr"):
        return {"type": kind, "text": _str(raw.get("text"), "cell output")}
    if kind == "result":
        data = raw.get("data")
        if not isinstance(data, dict) or not all(isinstance(k, str) and len(k) <= 256 for k in data):
            raise GuestError("guest agent sent a malformed cell result")
        return {"type": "result", "data": data, "is_main_result": raw.get("is_main_result") is True}
    if kind == "error":
        fields = {k: _str(raw.get(k), f"cell error {k}") for k in ("name", "value", "traceback")}
        return {"type": "error", **fields}
    if kind == "end":  # the reply is checked against code_messages.KernelEnd; an event is not
        count = raw.get("execution_count")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise GuestError("guest agent sent a malformed execution count")
        return {"type": "end", "execution_count": count, "timed_out": raw.get("timed_out") is True,
                "restarted": raw.get("restarted") is True}
    raise GuestError(f"guest agent sent an unknown cell event {str(kind)[:40]!r}")


class CellEvents(GuestEvents[dict[str, Any]]):
    """A running cell: ``async for event in cell``; ``aclose()`` before its end interrupts it."""

    def __init__(self, slots: StreamSlots, sandbox_id: str, stream: AgentStream, wait_secs: float) -> None:
        super().__init__(slots, sandbox_id, stream)
        self._deadline = time.monotonic() + wait_secs
        self.started = time.monotonic()

    async def _next_raw(self) -> dict[str, Any]:
        try:
            async with asyncio.timeout(max(0.0, self._deadline - time.monotonic())):
                return await super()._next_raw()
        except TimeoutError:
            self.close()
            raise GuestError("the guest did not end the cell in time; it was interrupted") from None

    def _event(self, raw: dict[str, Any]) -> dict[str, Any]:
        return cell_event(raw)

    def _is_last(self, event: dict[str, Any]) -> bool:
        return bool(event["type"] == "end")

    def _broken(self) -> None:
        self.close()  # the guest interrupts a cell whose stream is closed: the kernel is free again


class KernelCells:
    def __init__(self, agents: AgentGateway, events: SandboxEvents) -> None:
        self._agents = agents
        self._events = events  # told of every cell started (a turn of work)
        self._slots = StreamSlots(agents, MAX_STREAMS_PER_SANDBOX, "cells running", "wait for one to end")

    async def available(self, sandbox_id: str) -> bool:
        """Whether the sandbox's image has a Jupyter kernel (an older agent: no)."""
        try:
            result = await self._agents.call(sandbox_id, lambda agent: agent.kernel_available(30))
        except GuestError as exc:
            if _older_agent(exc):
                return False
            raise
        return result["available"]

    async def run(self, sandbox_id: str, code: str, *, context: str | None = None,
                  timeout_secs: float = DEFAULT_TIMEOUT_SECS, env: dict[str, str] | None = None,
                  cwd: str | None = None, language: str | None = None) -> CellEvents:
        """Start a cell on the context's kernel (started on its first cell) and stream it.

        ``language`` None: the context's own (python for a new one); a context omitted: the
        language's default context."""
        if not isinstance(code, str):
            raise InvalidRequest("code must be a string")
        bounds.EXEC_TIMEOUT_SECS.check(timeout_secs)
        try:
            env = protocol.check_env(env)
            language = None if language is None else code_messages.kernel_language(language)
        except protocol.RequestError as exc:
            raise InvalidRequest(str(exc)) from None
        sandbox_id = self._agents.resolve(sandbox_id)
        if not await self.available(sandbox_id):
            raise Conflict(f"sandbox {sandbox_id!r} has no Jupyter kernel: start it from a snapshot of "
                           "the code-interpreter image (forkd image build --name code-interpreter)")
        req: code_messages.KernelRunRequest = {"op": "run", "code": code, "timeout_secs": timeout_secs,
                                               "env": env}
        if language is not None:
            if language != "python":
                await self._agents.require_agent(sandbox_id, capabilities.CAP_KERNEL_LANGUAGE)
            req["language"] = language
        if context is not None:
            req["context"] = context
        if cwd is not None:
            req["cwd"] = cwd
        stream = await self._slots.open(sandbox_id, lambda: self._agents.stream(
            sandbox_id, lambda agent: agent.kernel_run_stream(req)))
        events = CellEvents(self._slots, sandbox_id, stream, timeout_secs + KERNEL_START_GRACE_SECS)
        await self._events.turn_done(sandbox_id)
        return events

    async def interrupt(self, sandbox_id: str, context: str | None = None) -> bool:
        result = await self._agents.call(sandbox_id, lambda agent: agent.kernel_interrupt(
            {"op": "interrupt", "context": context or "default"}, 30))
        return result["interrupted"]

    async def remove(self, sandbox_id: str, context: str, *, restart: bool = False) -> None:
        """Shut the context's kernel down (or restart it); nothing if it never started."""
        await self._agents.call(sandbox_id, lambda agent: agent.kernel_stop(
            {"op": "restart" if restart else "shutdown", "context": context}, 120))


__all__ = ["WARM_CELL", "CellEvents", "KernelCells", "cell_event", "warm_template"]
