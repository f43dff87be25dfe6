"""Result types of the SDK.

The controllers hand back the daemon's JSON unchanged (``dict`` / ``list``), as
the seed examples index it (``parent["id"]``, ``branch["tag"]``). The aliases
below only name those dicts; :class:`CommandResult` and :class:`EvalResult`
are the typed views :class:`~forkd.sdk.sandbox.Sandbox` returns, and
:class:`SnapshotView` the read-only mapping that ``Snapshot`` objects are.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
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


class SnapshotView(Mapping[str, Any]):
    """Read-only ``Mapping`` over a SnapshotInfo dict, with typed accessors.

    ``snap["tag"]``, ``snap.get("pause_ms")`` and ``dict(snap)`` work as on the
    dict the REST API returns.
    """

    def __init__(self, info: SnapshotInfo) -> None:
        self._info: SnapshotInfo = dict(info)

    def __getitem__(self, key: str) -> Any:
        return self._info[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._info)

    def __len__(self) -> int:
        return len(self._info)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(tag={self.tag!r}, status={self.status!r})"

    @property
    def info(self) -> SnapshotInfo:
        """The SnapshotInfo dict as last seen from the daemon."""
        return self._info

    @property
    def tag(self) -> str:
        return str(self._info["tag"])

    @property
    def status(self) -> str:
        """``"ready"``, ``"writing"`` or ``"failed"``; absent on the wire means ready."""
        return str(self._info.get("status", "ready"))

    @property
    def branched_from(self) -> str | None:
        return self._info.get("branched_from")

    @property
    def pause_ms(self) -> float | None:
        return self._info.get("pause_ms")


__all__ = ["CommandResult", "EvalResult", "JSONDict", "SandboxInfo", "SnapshotInfo", "SnapshotView"]
