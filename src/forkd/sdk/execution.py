"""What a cell on a Jupyter kernel gives back (``run_code``): :class:`Execution` and its parts.

Shared by both flavours of :meth:`Sandbox.run_code <forkd.sdk.Sandbox.run_code>`: the
events of ``POST /v1/sandboxes/{id}/code`` are folded into an :class:`Execution` one at a time by
:meth:`Execution.add` (no IO here), which also calls the caller's callbacks as each event arrives.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from forkd.sdk.errors import ServerError

# The MIME types a Result has a field for; any other is in its ``extra``.
MIME_FIELDS: Mapping[str, str] = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}


@dataclass(frozen=True)
class Result:
    """One ``result`` event: the cell's value (``is_main_result``) or a ``display()``/figure.

    Each field is the MIME bundle's value for its type (``png``, ``jpeg`` and ``pdf`` as base64
    text, as the kernel sends them; ``json``, ``data`` and ``chart`` as decoded JSON), None where
    the bundle has none; ``extra`` holds the other types by MIME name.
    """

    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    svg: str | None = None
    png: str | None = None
    jpeg: str | None = None
    pdf: str | None = None
    latex: str | None = None
    json: Any = None
    javascript: str | None = None
    data: Any = None
    chart: Any = None
    is_main_result: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_event(cls, event: Mapping[str, Any]) -> Result:
        bundle = event.get("data") or {}
        known = {MIME_FIELDS[mime]: value for mime, value in bundle.items() if mime in MIME_FIELDS}
        extra = {mime: value for mime, value in bundle.items() if mime not in MIME_FIELDS}
        return cls(**known, is_main_result=bool(event.get("is_main_result")), extra=extra)

    def formats(self) -> list[str]:
        """The names of the fields this result has (``"text"``, ``"png"``, ...), then its extra MIME types."""
        return [name for name in MIME_FIELDS.values() if getattr(self, name) is not None] + list(self.extra)


@dataclass(frozen=True)
class ExecutionError:
    """The cell's exception: ``name`` (``ZeroDivisionError``; ``""`` for a bash exit status),
    ``value`` (its message), ``traceback`` (as the kernel formats it, with ANSI colours)."""

    name: str
    value: str
    traceback: str

    @classmethod
    def from_event(cls, event: Mapping[str, Any]) -> ExecutionError:
        traceback = event.get("traceback") or ""
        if isinstance(traceback, list):
            traceback = "\n".join(str(line) for line in traceback)
        return cls(name=str(event.get("name") or ""), value=str(event.get("value") or ""),
                   traceback=str(traceback))


@dataclass
class Logs:
    """What the cell wrote, a piece per ``stdout``/``stderr`` event."""

    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


OnText = Callable[[str], object]
OnResult = Callable[[Result], object]
OnError = Callable[[ExecutionError], object]


@dataclass
class Callbacks:
    """The caller's callbacks, each called with its event as it arrives (None: not called)."""

    on_stdout: OnText | None = None
    on_stderr: OnText | None = None
    on_result: OnResult | None = None
    on_error: OnError | None = None


@dataclass
class Execution:
    """A cell's outcome: its ``results``, ``logs``, ``error`` (None if it ran through), and from
    the ``end`` event ``execution_count``, ``timed_out`` (interrupted after its timeout; the
    ``KeyboardInterrupt`` is the ``error``) and ``restarted`` (its kernel was restarted)."""

    results: list[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: ExecutionError | None = None
    execution_count: int | None = None
    timed_out: bool = False
    restarted: bool = False

    @property
    def text(self) -> str | None:
        """The main result's text (the cell's value as ``text/plain``); None if it has none."""
        for result in self.results:
            if result.is_main_result:
                return result.text
        return None

    def add(self, event: Mapping[str, Any], callbacks: Callbacks | None = None) -> None:
        """Fold one event in, calling its callback. An ``end`` with an ``error`` (the stream broke,
        or the guest refused the cell: a language other than the context's) raises
        :class:`~forkd.sdk.errors.ServerError`."""
        callbacks = callbacks or Callbacks()
        kind = event.get("type")
        if kind in ("stdout", "stderr"):
            text = str(event.get("text", ""))
            (self.logs.stdout if kind == "stdout" else self.logs.stderr).append(text)
            callback = callbacks.on_stdout if kind == "stdout" else callbacks.on_stderr
            if callback is not None:
                callback(text)
        elif kind == "result":
            result = Result.from_event(event)
            self.results.append(result)
            if callbacks.on_result is not None:
                callbacks.on_result(result)
        elif kind == "error":
            self.error = ExecutionError.from_event(event)
            if callbacks.on_error is not None:
                callbacks.on_error(self.error)
        elif kind == "end":
            if event.get("error"):
                raise ServerError(502, f"the cell's stream ended: {event['error']}")
            count = event.get("execution_count")
            self.execution_count = int(count) if count is not None else None
            self.timed_out = bool(event.get("timed_out"))
            self.restarted = bool(event.get("restarted"))
        # Other event types (from a newer daemon) are skipped.
