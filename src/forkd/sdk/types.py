"""Result types of the SDK.

The controllers hand back the daemon's JSON unchanged (``dict`` / ``list``), as
the seed examples index it (``parent["id"]``, ``branch["tag"]``). The aliases
below only name those dicts; :class:`CommandResult` and :class:`EvalResult`
are the typed views :class:`~forkd.sdk.Sandbox` returns, and
:class:`SnapshotView` the read-only mapping that ``Snapshot`` objects are.

The results of forking a running sandbox (:class:`ForkResult`,
:class:`PromoteResult`, :class:`Checkpoints`, :class:`ExploreResult`) hold
``Sandbox`` / ``Snapshot`` objects. Both SDK flavours share these classes, so
they are generic in the object type: ``ForkResult[Sandbox]`` from the blocking
SDK, ``ForkResult[AsyncSandbox]`` from the asyncio one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar, cast

from forkd.sdk import models

JSONDict = dict[str, Any]
# The REST answers, typed by the models scripts/gen_sdk_models.py generates from the
# daemon's OpenAPI document (forkd.sdk.models); the names below are the SDK's own.
SnapshotInfo = models.SnapshotInfo
"""``{"tag", "dir", "created_at_unix", "branched_from"?, "pause_ms"?, "status"?, ...}``"""
SandboxInfo = models.SandboxInfo
"""``{"id", "snapshot_tag", "netns", "guest_addr", "created_at_unix", "pid"?, "ip"?, "network"?,
"metadata"?, ...}``"""
ForkInfo = models.ForkResponse
"""``{"parent_id", "snapshot_tag", "children": [SandboxInfo], "errors": [{"index", "error"}],
"pause_ms"?, "tree_id"?}``"""
PromoteInfo = models.PromoteResponse
"""``{"winner": SandboxInfo, "tree_id", "deleted": [{"id", "deleted", "error"?}], "replaced_parent"}``"""
CheckpointInfo = models.CheckpointList
"""``{"sandbox_id", "policy": {"every", "keep", "mode"} | None, "calls", "checkpoints": [SnapshotInfo],
"last_error"?}``"""
ProcessInfo = models.ProcessInfo
"""A process in a sandbox: ``{"pid", "tag", "args", "env", "cwd", "running", "exit_code", "signal",
"timed_out", "stdin_open", "started_at", "ended_at"}``"""
WorkspaceInfo = models.WorkspaceInfo
"""``{"id", "name", "source_snapshot_tag", "status": "running" | "suspended" | "stale",
"live_sandbox_id"?, "current_state_tag"?, "created_at_unix", "last_active_unix"}``"""

SandboxT = TypeVar("SandboxT")
"""``Sandbox`` or ``AsyncSandbox``: the object type a result holds."""
SnapshotT = TypeVar("SnapshotT")
"""``Snapshot`` or ``AsyncSnapshot``."""
CandidateT = TypeVar("CandidateT")
"""Whatever :meth:`Sandbox.explore <forkd.sdk.Sandbox.explore>` is given to try."""


@dataclass(frozen=True)
class CommandResult:
    """The outcome of :meth:`Sandbox.commands.run <forkd.sdk.Commands.run>`.

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
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.error is None

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> CommandResult:
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


class OutputChunk(NamedTuple):
    """One piece of a command's output, as iterating a command handle yields it.

    Exactly one of ``stdout`` and ``stderr`` is set; it unpacks like the E2B
    SDK's ``(stdout, stderr, pty)`` (``pty`` is always ``None`` here)."""

    stdout: str | None = None
    stderr: str | None = None
    pty: bytes | None = None


@dataclass(frozen=True)
class EvalResult:
    """The outcome of :meth:`Sandbox.eval <forkd.sdk.Sandbox.eval>`.

    ``result`` is the ``repr`` of the value (``None`` if the code raised);
    ``error`` is the exception text.
    """

    result: str | None
    error: str | None
    exit_code: int
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.error is None

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> EvalResult:
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
        self._info: SnapshotInfo = info.copy()

    def __getitem__(self, key: str) -> Any:
        return cast("Mapping[str, Any]", self._info)[key]

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


# ------------------------------------------------------- forking a running sandbox

# The fork-tree labels the daemon puts in each child's metadata.
TREE_ID_KEY = "fork_tree_id"
PARENT_ID_KEY = "fork_parent_id"
INDEX_KEY = "fork_index"


@dataclass(frozen=True)
class ForkFailure:
    """One child of a fork that did not come up (it left nothing behind)."""

    index: int
    """Which child (0-based, the position in ``count`` / ``child_env``)."""
    error: str


@dataclass(frozen=True)
class ForkResult(Generic[SandboxT]):
    """The outcome of :meth:`Sandbox.fork <forkd.sdk.Sandbox.fork>` and ``fork_tree``.

    Each child succeeds or fails on its own: ``children`` are the ones that
    came up (in index order), ``errors`` say why the others did not. The
    children are owned by the caller: each is killed by its ``close()`` /
    ``kill()`` or when used as a context manager; the source keeps running.
    """

    parent_id: str
    snapshot_tag: str
    """The intermediate snapshot; deleted with its last child unless ``keep_snapshot``."""
    children: list[SandboxT]
    errors: list[ForkFailure]
    tree_id: str | None = None
    """fork-tree only: the id stamped on every child (``metadata["fork_tree_id"]``)."""
    pause_ms: float | None = None
    """How long the source was paused for the branch."""
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """True when every child came up."""
        return not self.errors

    @property
    def memory(self) -> dict[str, models.SandboxMemory]:
        """What each child cost the host right after its restore, by sandbox id (most of its RAM
        shared with its siblings at first); empty from a daemon that does not report it."""
        entries = cast(list[models.SandboxMemory], self.raw.get("memory") or [])
        return {str(entry["sandbox_id"]): entry for entry in entries if "sandbox_id" in entry}

    def by_index(self) -> dict[int, SandboxT]:
        """The children by their index in the request (failed indexes are absent)."""
        failed = {e.index for e in self.errors}
        # The daemon lists children in index order, skipping the failed ones; a
        # fork-tree child also says its index in its metadata, which wins.
        positional = [i for i in range(len(self.children) + len(self.errors)) if i not in failed]
        infos = self.raw.get("children") or []
        out: dict[int, SandboxT] = {}
        for k, child in enumerate(self.children):
            stamped = (infos[k].get("metadata") or {}).get(INDEX_KEY) if k < len(infos) else None
            out[int(stamped) if stamped is not None else positional[k]] = child
        return out

    @classmethod
    def from_json(cls, body: ForkInfo, child: Callable[[SandboxInfo], SandboxT]) -> ForkResult[SandboxT]:
        """Read a ``ForkResponse``; ``child`` turns each SandboxInfo into a sandbox object."""
        return cls(
            parent_id=str(body["parent_id"]),
            snapshot_tag=str(body["snapshot_tag"]),
            children=[child(info) for info in body.get("children") or []],
            errors=[ForkFailure(int(e["index"]), str(e["error"])) for e in body.get("errors") or []],
            tree_id=body.get("tree_id"),
            pause_ms=body.get("pause_ms"),
            raw=body,
        )


@dataclass(frozen=True)
class Deletion:
    """A sandbox that ``promote`` killed (a sibling, or the parent with ``replace_parent``)."""

    id: str
    deleted: bool
    error: str | None = None


@dataclass(frozen=True)
class PromoteResult(Generic[SandboxT]):
    """The outcome of :meth:`Sandbox.promote <forkd.sdk.Sandbox.promote>`."""

    winner: SandboxT
    tree_id: str
    deleted: list[Deletion]
    """One entry per sandbox promote tried to kill; ``deleted`` False (with ``error``) if it could not."""
    replaced_parent: str | None = None
    """With ``replace_parent``: the source's id, which now names the winner."""
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """True when every sandbox promote meant to kill is gone."""
        return all(d.deleted for d in self.deleted)

    @classmethod
    def from_json(cls, body: PromoteInfo, winner: SandboxT) -> PromoteResult[SandboxT]:
        return cls(
            winner=winner,
            tree_id=str(body["tree_id"]),
            deleted=[Deletion(str(d["id"]), bool(d["deleted"]), d.get("error"))
                     for d in body.get("deleted") or []],
            replaced_parent=body.get("replaced_parent"),
            raw=body,
        )


@dataclass(frozen=True)
class CheckpointPolicy:
    """Branch after every ``every`` exec/eval calls, keep the newest ``keep`` checkpoints."""

    every: int
    keep: int
    mode: str


@dataclass(frozen=True)
class Checkpoints(Generic[SnapshotT]):
    """A sandbox's auto-checkpoint policy and the checkpoints it keeps."""

    sandbox_id: str
    policy: CheckpointPolicy | None
    """None once the policy was deleted (or if it was never set)."""
    calls: int
    """exec/eval calls counted since the policy was set."""
    snapshots: list[SnapshotT]
    """The kept checkpoints, oldest first (fork from one to go back there)."""
    last_error: str | None = None
    """Why the latest checkpoint attempt failed, if it did."""
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(
        cls, body: CheckpointInfo, snapshot: Callable[[SnapshotInfo], SnapshotT]
    ) -> Checkpoints[SnapshotT]:
        """Read a ``CheckpointList``; ``snapshot`` turns each SnapshotInfo into a snapshot object."""
        policy = body.get("policy")
        return cls(
            sandbox_id=str(body["sandbox_id"]),
            policy=CheckpointPolicy(int(policy["every"]), int(policy["keep"]), str(policy["mode"]))
            if policy else None,
            calls=int(body.get("calls") or 0),
            snapshots=[snapshot(info) for info in body.get("checkpoints") or []],
            last_error=body.get("last_error"),
            raw=body,
        )


@dataclass(frozen=True)
class Outcome(Generic[SandboxT, CandidateT]):
    """How one candidate of :meth:`Sandbox.explore <forkd.sdk.Sandbox.explore>` did.

    ``error`` is set when its child failed to spawn (``sandbox`` is None), or
    when ``run`` or ``score`` raised (``exception`` is what they raised).
    """

    index: int
    candidate: CandidateT
    sandbox: SandboxT | None
    sandbox_id: str | None
    result: Any = None
    """What ``run`` returned."""
    score: float | None = None
    error: str | None = None
    """``"spawn: ..."``, ``"run: ValueError: ..."`` or ``"score: ..."``."""
    exception: BaseException | None = field(default=None, repr=False, compare=False)
    memory: models.SandboxMemory | None = None
    """What its child cost the host once ``run`` and ``score`` were done (``sb.memory()``): RAM
    shared with its siblings, RAM of its own, its own disk. None if it could not be read."""

    @property
    def ok(self) -> bool:
        """True when the candidate ran and was scored."""
        return self.error is None


def best_outcome(outcomes: list[Outcome[SandboxT, CandidateT]]) -> Outcome[SandboxT, CandidateT] | None:
    """The scored outcome with the highest score (the lowest index among equals), if any."""
    best: Outcome[SandboxT, CandidateT] | None = None
    best_score = -math.inf
    for outcome in sorted(outcomes, key=lambda o: o.index):
        # Strictly greater: among equal scores the lowest index stays the best.
        if outcome.ok and outcome.score is not None and (best is None or outcome.score > best_score):
            best, best_score = outcome, outcome.score
    return best


@dataclass(frozen=True)
class ExploreResult(Generic[SandboxT, CandidateT]):
    """The outcome of :meth:`Sandbox.explore <forkd.sdk.Sandbox.explore>`.

    ``winner`` is the best child, promoted: still running and owned by the
    caller (``winner.close()`` kills it). The other children were killed by the
    promote; ``outcomes`` has one entry per candidate, in order.
    """

    winner: SandboxT
    best: Outcome[SandboxT, CandidateT]
    outcomes: list[Outcome[SandboxT, CandidateT]]
    fork: ForkResult[SandboxT]
    promotion: PromoteResult[SandboxT]
    # explore(..., apply_winner=True): what the winner's changes wrote into the parent.
    applied: Mapping[str, Any] | None = None

    @property
    def tree_id(self) -> str:
        return self.promotion.tree_id

    @property
    def failures(self) -> list[Outcome[SandboxT, CandidateT]]:
        """The candidates that failed to spawn, run or be scored."""
        return [o for o in self.outcomes if not o.ok]


__all__ = [
    "INDEX_KEY",
    "PARENT_ID_KEY",
    "TREE_ID_KEY",
    "CandidateT",
    "CheckpointInfo",
    "CheckpointPolicy",
    "Checkpoints",
    "CommandResult",
    "Deletion",
    "EvalResult",
    "ExploreResult",
    "ForkFailure",
    "ForkInfo",
    "ForkResult",
    "JSONDict",
    "Outcome",
    "PromoteInfo",
    "PromoteResult",
    "SandboxInfo",
    "SandboxT",
    "SnapshotInfo",
    "SnapshotT",
    "SnapshotView",
    "WorkspaceInfo",
    "best_outcome",
]
