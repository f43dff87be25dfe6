"""Result types of the SDK.

The controllers hand back the daemon's JSON unchanged (``dict`` / ``list``), as
the seed examples index it (``parent["id"]``, ``branch["tag"]``). The aliases
below only name those dicts; :class:`CommandResult` and :class:`EvalResult`
are the typed views :class:`~forkd.sdk.sandbox.Sandbox` returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

JSONDict = dict[str, Any]
SnapshotInfo = dict[str, Any]
"""``{"tag", "dir", "created_at_unix", "branched_from"?, "pause_ms"?, "status"?, ...}``"""
SandboxInfo = dict[str, Any]
"""``{"id", "snapshot_tag", "netns", "guest_addr", "created_at_unix", "pid"?, ...}``"""


@dataclass(frozen=True)
class CommandResult:
    """The outcome of :meth:`Sandbox.commands.run <forkd.sdk.sandbox.Commands.run>`.

    A non-zero ``exit_code`` is not an exception: check it (or :attr:`ok`).
    ``error`` is set when the command could not run or timed out.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    error: str | None = None
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    raw: JSONDict = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.error is None

    @classmethod
    def from_json(cls, body: JSONDict) -> CommandResult:
        return cls(
            stdout=body.get("stdout") or "",
            stderr=body.get("stderr") or "",
            exit_code=body.get("exit_code"),
            error=body.get("error"),
            timed_out=bool(body.get("timed_out", False)),
            stdout_truncated=bool(body.get("stdout_truncated", False)),
            stderr_truncated=bool(body.get("stderr_truncated", False)),
            raw=body,
        )


@dataclass(frozen=True)
class EvalResult:
    """The outcome of :meth:`Sandbox.eval <forkd.sdk.sandbox.Sandbox.eval>`.

    ``result`` is the ``repr`` of the value (``None`` if the code raised);
    ``error`` is the exception text.
    """

    result: str | None
    error: str | None
    exit_code: int
    raw: JSONDict = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.error is None

    @classmethod
    def from_json(cls, body: JSONDict) -> EvalResult:
        code = body.get("exit_code")
        error = body.get("error")
        return cls(
            result=body.get("result"),
            error=error,
            exit_code=int(code) if code is not None else (1 if error else 0),
            raw=body,
        )


__all__ = ["CommandResult", "EvalResult", "JSONDict", "SandboxInfo", "SnapshotInfo"]
