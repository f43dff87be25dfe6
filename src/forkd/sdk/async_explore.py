"""``explore``: best of N candidates, each tried in a child of a fork tree; the best is promoted.

Its own module because it is a workflow on top of the sandbox's calls (fork a
tree, run and score every child at once, promote the winner, clean up on any
failure), not one of them: :meth:`AsyncSandbox.explore` documents it and calls it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from forkd.errors import ForkdError
from forkd.sdk import _twins
from forkd.sdk.errors import ExploreError
from forkd.sdk.models import SandboxMemory
from forkd.sdk.types import CandidateT, ExploreResult, Outcome, best_outcome

if TYPE_CHECKING:
    from forkd.sdk.async_sandbox import AsyncSandbox


async def explore_tree(
    sandbox: AsyncSandbox,
    candidates: Iterable[CandidateT],
    run: Callable[[AsyncSandbox, CandidateT], Any],
    score: Callable[[AsyncSandbox, CandidateT, Any], Any] | None,
    *,
    replace_parent: bool,
    concurrency: int | None,
    env: Mapping[str, str] | None,
    child_env: Sequence[Mapping[str, str]] | None,
    metadata: Mapping[str, str] | None,
    memory_limit_mib: int | None,
    child_memory_limit_mib: Sequence[int | None] | None,
    per_child_netns: bool,
    live_fork: bool,
    keep_snapshot: bool,
    apply_winner: bool = False,
) -> ExploreResult[AsyncSandbox, CandidateT]:
    """:meth:`AsyncSandbox.explore` (see there) from ``sandbox``."""
    tried = list(candidates)
    if not tried:
        raise ValueError("explore needs at least one candidate")
    if concurrency is not None and concurrency < 1:  # checked before any child exists
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    tree = await sandbox.fork_tree(
        len(tried),
        env=env,
        child_env=child_env,
        metadata=metadata,
        memory_limit_mib=memory_limit_mib,
        child_memory_limit_mib=child_memory_limit_mib,
        per_child_netns=per_child_netns,
        live_fork=live_fork,
        keep_snapshot=keep_snapshot,
    )
    children = tree.by_index()

    async def attempt(index: int) -> Outcome[AsyncSandbox, CandidateT]:
        child, candidate = children[index], tried[index]
        stage, result = "run", None
        try:
            result = await run(child, candidate)
            stage = "score"
            value = result if score is None else await score(child, candidate, result)
            points = float(value)
            if math.isnan(points):
                raise ValueError("the score is NaN")
        except Exception as exc:  # one candidate's failure is its outcome, not explore's
            return Outcome(index, candidate, child, child.id, result=result,
                           error=f"{stage}: {type(exc).__name__}: {exc}", exception=exc,
                           memory=await _memory(child))
        return Outcome(index, candidate, child, child.id, result=result, score=points,
                       memory=await _memory(child))

    try:
        ran = await _twins.concurrently(attempt, sorted(children), limit=concurrency)
    except BaseException:  # interrupted: no child may outlive explore unowned
        await _close_all(tree.children)
        raise
    spawn_failures: list[Outcome[AsyncSandbox, CandidateT]] = [Outcome(
        f.index, tried[f.index], None, None, error=f"spawn: {f.error}") for f in tree.errors]
    outcomes = sorted([*ran, *spawn_failures], key=lambda o: o.index)
    best = best_outcome(outcomes)
    if best is None or best.sandbox is None:
        leftovers = await _close_all(tree.children)
        raise ExploreError(_all_failed(outcomes, leftovers), outcomes, tree)
    try:
        applied = await sandbox.apply(best.sandbox.id) if apply_winner else None
        promotion = await best.sandbox.promote(
            tree_id=tree.tree_id, cleanup_siblings=True, replace_parent=replace_parent
        )
    except BaseException:
        await _close_all(tree.children)
        raise
    # The daemon killed the losers: their objects must not try again on close().
    gone = {d.id for d in promotion.deleted if d.deleted}
    for child in tree.children:
        if child.id in gone:
            child.owned = False
    return ExploreResult(best.sandbox, best, outcomes, tree, promotion, applied)


async def _close_all(sandboxes: Sequence[AsyncSandbox]) -> list[str]:
    """Close every sandbox (killing the owned ones); what could not be killed, as messages.

    Used while explore is already failing, so a failure here is reported, not raised.
    """

    async def close(sb: AsyncSandbox) -> str | None:
        try:
            await sb.close()
        except (ForkdError, OSError) as exc:
            return f"{sb.id}: {exc}"
        return None

    closed = await _twins.concurrently(close, list(sandboxes))
    return [problem for problem in closed if problem is not None]


async def _memory(child: AsyncSandbox) -> SandboxMemory | None:
    """What the child costs the host now, before the promote kills the losers (None: unreadable,
    e.g. a daemon older than GET /v1/sandboxes/{id}/memory, or a child that died)."""
    try:
        return await child.memory()
    except ForkdError:
        return None


def _all_failed(outcomes: Sequence[Outcome[Any, Any]], leftovers: Sequence[str]) -> str:
    lines = [f"every candidate of explore failed ({len(outcomes)}):"]
    lines += [f"  #{o.index} {o.sandbox_id or '(not spawned)'}: {o.error}" for o in outcomes]
    if leftovers:
        lines.append("and these children could not be killed: " + "; ".join(leftovers))
    else:
        lines.append("every child was killed")
    return "\n".join(lines)
