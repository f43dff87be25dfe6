"""`ChangeApplier`: a child's changes written into another sandbox (its parent, most often).

The source's changes are its diff against the snapshot it was forked from; the
target's own changes since that same snapshot are diffed too. A path both
changed, and changed differently, is a conflict: every conflict is named and
nothing is written. Otherwise everything is first staged beside its place in the
target (new content under a temporary name), and only once every piece is
staged are the names swapped in and the deletions made, so a failure while
staging (a full disk, a guest that went away) leaves the target as it was.
"""

from __future__ import annotations

import contextlib
import functools
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass

from forkd.controller.agent_gateway import AgentGateway
from forkd.controller.diffs import Change, OpenDiff, SandboxDiffs
from forkd.controller.files import SandboxFiles
from forkd.controller.results import ApplyResult
from forkd.errors import Conflict, ForkdError, GuestError
from forkd.guest.client import AgentClient
from forkd.guest.messages import ExecRequest

# Conflicting paths named in the error (the rest counted).
MAX_NAMED = 50
EXEC_TIMEOUT_SECS = 60


class ApplyConflict(Conflict):
    code = "apply_conflict"


@dataclass
class Planned:
    change: Change
    content: bytes | None  # a regular file's new content


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


class ChangeApplier:
    def __init__(self, diffs: SandboxDiffs, files: SandboxFiles, agents: AgentGateway) -> None:
        self._diffs = diffs
        self._files = files
        self._agents = agents

    async def apply(self, target: str, source: str, paths: list[str] | None = None) -> ApplyResult:
        """Apply ``source``'s changes since its snapshot (those under ``paths``, default all that a
        diff shows) onto ``target``; 409 naming every conflicting path, with nothing written."""
        target = self._agents.resolve(target)
        source = self._agents.resolve(source)
        if target == source:
            raise Conflict("a sandbox's changes are already its own: apply them to another sandbox")
        against = f"snapshot:{self._diffs.base_tag(source)}"
        async with self._diffs.opened(source, against, include=paths) as src:
            plan = [Planned(c, await _new_content(src, c)) for c in src.changes]
        result: ApplyResult = {"sandbox_id": target, "source": source, "against": against,
                               "written": [], "deleted": [], "unchanged": []}
        if not plan:
            return result
        conflicts: list[str] = []
        todo: list[Planned] = []
        async with self._diffs.opened(target, against, include=[p.change.path for p in plan]) as tgt:
            theirs = {c.path: c for c in tgt.changes}
            for item in plan:
                mine = theirs.get(item.change.path)
                if mine is None:
                    todo.append(item)
                elif await _same_outcome(tgt, mine, item):
                    result["unchanged"].append(item.change.path)
                else:
                    conflicts.append(item.change.path)
        if conflicts:
            named = ", ".join(conflicts[:MAX_NAMED])
            more = f" and {len(conflicts) - MAX_NAMED} more" if len(conflicts) > MAX_NAMED else ""
            raise ApplyConflict(f"nothing applied: {target} changed {named}{more} since {against} too, "
                                f"differently from {source}")
        await self._write(target, todo, result)
        return result

    async def _write(self, target: str, todo: list[Planned], result: ApplyResult) -> None:
        """Stage every new file and link, then swap them in, make directories and remove deletions."""
        suffix = f".forkd-apply-{secrets.token_hex(4)}"
        dirs = sorted((p for p in todo if p.change.new is not None and p.change.new.kind == "directory"),
                      key=lambda p: p.change.path)
        staged: list[tuple[str, str, Planned]] = []
        try:
            for item in dirs:
                if item.change.old is None:
                    await self._files.mkdir(target, item.change.path, parents=True)
            for item in todo:
                new = item.change.new
                if new is None or new.kind == "directory" or not item.change.content_changed:
                    continue
                temp = _temp_name(item.change.path, suffix)
                if new.kind == "regular":
                    assert item.content is not None
                    await self._files.write(target, temp, _one(item.content), max_bytes=len(item.content),
                                            mode=new.mode)
                elif new.kind == "symlink" and item.change.new_target is not None:
                    await self._run(target, ["ln", "-s", "--", item.change.new_target, temp])
                else:
                    continue  # a device or fifo: the diff lists it, apply does not make one
                staged.append((temp, item.change.path, item))
        except BaseException:
            for temp, _, _ in staged:
                with contextlib.suppress(ForkdError):
                    await self._files.remove(target, temp)
            raise
        for temp, path, _ in staged:
            await self._files.move(target, temp, path)
            result["written"].append(path)
        for item in todo:  # modes and owners (the agent writes as root)
            new = item.change.new
            if new is None or new.kind == "symlink":
                continue
            old = item.change.old
            if old is None or item.change.content_changed or old.mode != new.mode:
                await self._run(target, ["chmod", f"{new.mode:o}", "--", item.change.path])
            if new.uid or new.gid or (old is not None and (old.uid, old.gid) != (new.uid, new.gid)):
                await self._run(target, ["chown", "-h", f"{new.uid}:{new.gid}", "--", item.change.path])
            if not item.change.content_changed and item.change.path not in result["written"]:
                result["written"].append(item.change.path)
        for item in sorted(todo, key=lambda p: p.change.path, reverse=True):  # children before parents
            if item.change.new is None:
                await self._files.remove(target, item.change.path)
                result["deleted"].append(item.change.path)
        result["written"].sort()

    async def _run(self, target: str, args: list[str]) -> None:
        req: ExecRequest = {"args": args, "timeout_secs": EXEC_TIMEOUT_SECS}
        reply = await self._agents.call(target, functools.partial(AgentClient.exec, req=req,
                                                                  timeout=EXEC_TIMEOUT_SECS + 30))
        if reply.get("exit_code") != 0:
            raise GuestError(f"{args[0]} in the target failed: {str(reply.get('stderr', ''))[:500]}")


def _temp_name(path: str, suffix: str) -> str:
    parent, _, name = path.rpartition("/")
    return f"{parent}/.{name[:200]}{suffix}"


async def _new_content(opened: OpenDiff, change: Change) -> bytes | None:
    new = change.new
    if new is None or new.kind != "regular" or not change.content_changed:
        return None
    return await opened.content(new, new=True)


async def _same_outcome(target: OpenDiff, theirs: Change, mine: Planned) -> bool:
    """Whether the target already holds the path as the source would leave it."""
    a, b = theirs.new, mine.change.new
    if a is None or b is None:
        return a is None and b is None
    if (a.kind, a.mode, a.uid, a.gid) != (b.kind, b.mode, b.uid, b.gid):
        return False
    if a.kind == "symlink":
        return theirs.new_target == mine.change.new_target
    if a.kind == "regular":
        if a.size != b.size:
            return False
        current = await target.content(a, new=True)
        return current == (mine.content if mine.content is not None else current)
    return True
