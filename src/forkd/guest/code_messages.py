"""The guest protocol's typed messages for code: named contexts (``context``,
``forkd.guest.agent.contexts``) and cells on Jupyter kernels (``kernel``, ``forkd.guest.agent.kernels``),
with the names of the languages they run.

Both actions take an ``op``; each op has its own request and reply type here, and ``request_type``
picks a request's by its op. See ``messages`` for how both ends use them (``schema.check`` reads
them at run time). Stdlib only: the guest image carries it.

A context's language (context create, kernel run) is one of ``KERNEL_LANGUAGES``, by any of its
names (``kernel_language``). A run without a context runs on its language's default context
(``default_context``); one without a language on its context's, python for a new one. Agents older
than ``protocol.LANGUAGE_AGENT_VERSION`` ignore "language" (every kernel is IPython's): the host
asks first. A kernel stream is acknowledged and detached with proc_ack and proc_detach, like a
process stream; each event costs ``protocol.line_cost``.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from forkd.guest.protocol import INVALID, RequestError
from forkd.guest.schema import Seconds

KERNEL_LANGUAGES = ("python", "bash", "javascript", "r")
# E2B's SDK sends "js" and "javascript" ("r" and "R" are r: names are taken case aside).
KERNEL_LANGUAGE_ALIASES = {"js": "javascript"}
# Where the default bash, JavaScript and R contexts, and the contexts E2B's interpreter makes without a
# cwd, start: the home of the sandbox's user, as in E2B's sandboxes.
KERNEL_HOME = "/home/user"
# The events of a kernel stream: {"type": "stdout"|"stderr", "text"}, {"type": "result",
# "data": {mime: value}, "is_main_result"}, {"type": "error", "name", "value", "traceback"}.
KERNEL_EVENTS = ("stdout", "stderr", "result", "error")


def kernel_language(name: object) -> str:
    """A context's language by any of its names, case aside (None or "": python)."""
    if name is None or name == "":
        return "python"
    key = name.strip().lower() if isinstance(name, str) else None
    language = KERNEL_LANGUAGE_ALIASES.get(key or "", key)
    if language not in KERNEL_LANGUAGES:
        raise RequestError(f"language must be one of {', '.join(KERNEL_LANGUAGES)} (or "
                           f"{', '.join(KERNEL_LANGUAGE_ALIASES)}), not {str(name)[:40]!r}", INVALID)
    return language


def default_context(language: str) -> str:
    """The context a cell of ``language`` runs on when it names none."""
    return "default" if language == "python" else f"default-{language}"


class CellError(TypedDict):
    name: str
    value: str
    traceback: str


# ------------------------------------------------------------------ context


class ContextRunRequest(TypedDict):
    op: Literal["run"]
    code: str
    timeout_secs: NotRequired[Seconds]
    env: NotRequired[dict[str, str]]
    context: NotRequired[str]  # absent: "default"


class ContextRunReply(TypedDict):
    text: str | None  # the repr of the cell's value
    stdout: str
    stderr: str
    error: CellError | None
    execution_count: int


class ContextCreateRequest(TypedDict):
    op: Literal["create"]
    language: NotRequired[str]  # CAP_KERNEL_LANGUAGE beyond python
    cwd: NotRequired[str]


class ContextInfo(TypedDict):
    """A context (context create's answer, and remove's and restart's)."""

    id: str
    language: str
    cwd: str


class ContextListRequest(TypedDict):
    op: Literal["list"]


class ContextListReply(TypedDict):
    contexts: list[ContextInfo]


class ContextRemoveRequest(TypedDict):
    op: Literal["remove", "restart"]
    context: str


# ------------------------------------------------------------------- kernel


class KernelAvailableRequest(TypedDict):
    op: Literal["available"]


class KernelAvailableReply(TypedDict):
    available: bool
    running: NotRequired[bool]
    languages: NotRequired[list[str]]


class KernelRunRequest(TypedDict):
    op: Literal["run"]
    code: str
    timeout_secs: NotRequired[Seconds]
    env: NotRequired[dict[str, str]]
    context: NotRequired[str]  # absent: the language's default context
    language: NotRequired[str]  # CAP_KERNEL_LANGUAGE
    cwd: NotRequired[str]
    silent: NotRequired[bool]  # no events, no execution count (a template's warm cell)


class KernelEnd(TypedDict):
    """The reply that ends a kernel stream (a run), and shutdown's and restart's answer."""

    type: Literal["end"]
    execution_count: int
    timed_out: NotRequired[bool]
    restarted: NotRequired[bool]
    failed: NotRequired[bool]  # the runner could not run the request (its error event went first)


class KernelInterruptRequest(TypedDict):
    op: Literal["interrupt"]
    context: NotRequired[str]


class KernelInterruptReply(TypedDict):
    interrupted: bool


class KernelStopRequest(TypedDict):
    op: Literal["shutdown", "restart"]
    context: NotRequired[str]


_CONTEXT_OPS: dict[object, type] = {"run": ContextRunRequest, "create": ContextCreateRequest,
                                    "list": ContextListRequest, "remove": ContextRemoveRequest,
                                    "restart": ContextRemoveRequest}
_KERNEL_OPS: dict[object, type] = {"available": KernelAvailableRequest, "run": KernelRunRequest,
                                   "interrupt": KernelInterruptRequest, "shutdown": KernelStopRequest,
                                   "restart": KernelStopRequest}


def request_type(action: str, req: dict[str, Any]) -> type | None:
    """The request type of a ``context`` or ``kernel`` request, by its op (None: an op that is
    not one, which the agent refuses with the list of those that are)."""
    ops = _CONTEXT_OPS if action == "context" else _KERNEL_OPS
    op = req.get("op")
    return ops.get(op) if isinstance(op, str) else None
