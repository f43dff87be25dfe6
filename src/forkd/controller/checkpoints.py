"""Auto-checkpoints: branch a sandbox after every N exec/eval calls, keep the newest K.

Seed 000's conversation checkpointing: an agent that calls its sandbox once per
turn gets a snapshot every N turns and can fork any of the last K. Each
checkpoint is a *standalone* branch (its disk is one layer on the source's
published base, see ``Brancher.checkpoint``), so dropping the oldest never
breaks a newer one. The capture (the source's pause) happens before the N-th
call answers, so the checkpoint holds exactly the state that call left; the
copy into a snapshot finishes in the background (status ``writing``, then
``ready``), and old checkpoints are pruned once it has.

A checkpoint that falls out of the window while sandboxes run from it, or
snapshots depend on it, leaves the list and becomes ``auto_delete``: it is
dropped when the last of those is gone, like an intermediate fork snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from forkd import bounds
from forkd.controller.branch import Brancher
from forkd.controller.forks import Forker
from forkd.controller.results import CheckpointReport
from forkd.controller.sandbox_events import SandboxEvents
from forkd.controller.sandboxes import SandboxTable
from forkd.controller.snapshots import SnapshotStore
from forkd.errors import Conflict, ForkdError, InvalidRequest
from forkd.store.records import AutoCheckpoint, SandboxRecord, SnapshotRecord
from forkd.store.rows.sandboxes import CheckpointPolicyRows

log = logging.getLogger("forkd.checkpoints")

MODES = ("diff", "live")


class Checkpointer:
    def __init__(self, sandboxes: CheckpointPolicyRows, table: SandboxTable, events: SandboxEvents,
                 brancher: Brancher, store: SnapshotStore, forker: Forker) -> None:
        self._sandboxes = sandboxes  # read, plus the checkpoint policy column and branch sequence
        self._table = table
        self._brancher = brancher
        self._store = store
        self._forker = forker
        # sandbox id -> exec/eval calls counted since its policy began; only sandboxes with a policy
        self._calls: dict[str, int] = {}
        self._errors: dict[str, str] = {}  # sandbox id -> why its last checkpoint failed
        self._prune_locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        events.after_turn(self.after_call)
        events.on_removed(self.after_removed)

    # ------------------------------------------------------------------ policy

    def start(self) -> None:
        """After a restart: count calls again for the sandboxes whose policy survived."""
        for sb in self._sandboxes.all():
            if sb.checkpoints is not None:
                self._calls.setdefault(sb.id, 0)

    def set(self, sandbox_id: str, every: int, keep: int, mode: str = "diff") -> CheckpointReport:
        sandbox_id = self._table.resolve(sandbox_id)
        self._table.get(sandbox_id)
        bounds.CHECKPOINT_EVERY.check(every)
        bounds.CHECKPOINT_KEEP.check(keep)
        if mode not in MODES:
            raise InvalidRequest(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if mode == "live" and not self._sandboxes.get(sandbox_id).live_fork:
            raise Conflict(f"sandbox {sandbox_id} was not spawned with live_fork: true, which "
                           "mode \"live\" needs; use mode \"diff\"")
        self._sandboxes.set_checkpoint_policy(sandbox_id, AutoCheckpoint(every=every, keep=keep, mode=mode))
        self._calls[sandbox_id] = 0
        self._errors.pop(sandbox_id, None)
        return self.get(sandbox_id)

    def get(self, sandbox_id: str) -> CheckpointReport:
        sandbox_id = self._table.resolve(sandbox_id)
        record = self._sandboxes.get(sandbox_id)
        out: CheckpointReport = {
            "sandbox_id": sandbox_id,
            "policy": record.checkpoints.info() if record.checkpoints else None,
            "calls": self._calls.get(sandbox_id, 0),
            "checkpoints": [s.info() for s in self._kept(sandbox_id)],
        }
        if sandbox_id in self._errors:
            out["last_error"] = self._errors[sandbox_id]
        return out

    def delete(self, sandbox_id: str) -> CheckpointReport:
        """Stop the policy; the checkpoints already taken stay."""
        sandbox_id = self._table.resolve(sandbox_id)
        self._sandboxes.get(sandbox_id)
        self._sandboxes.set_checkpoint_policy(sandbox_id, None)
        self._calls.pop(sandbox_id, None)
        return self.get(sandbox_id)

    def _kept(self, sandbox_id: str) -> list[SnapshotRecord]:
        """This sandbox's checkpoints, oldest first (tags carry a zero-padded, ever-growing sequence)."""
        return sorted((s for s in self._store.all() if s.checkpoint_of == sandbox_id), key=lambda s: s.tag)

    # ------------------------------------------------------------------ calls

    async def after_call(self, sandbox_id: str) -> None:
        """Count one exec/eval; on every N-th, capture a checkpoint before the call answers."""
        sandbox_id = self._table.resolve(sandbox_id)
        if sandbox_id not in self._calls:
            return  # no policy: every exec/eval passes here, so no registry read
        try:
            record = self._sandboxes.get(sandbox_id)
        except ForkdError:
            return  # killed meanwhile
        policy = record.checkpoints
        if policy is None:
            return
        calls = self._calls.get(sandbox_id, 0) + 1
        self._calls[sandbox_id] = calls
        if calls % policy.every:
            return
        tag = self._tag(record)
        try:
            snap = await self._brancher.checkpoint(sandbox_id, tag, policy.mode)
        except ForkdError as exc:
            # The call itself succeeded: report the failure in GET …/checkpoints, not here.
            self._errors[sandbox_id] = f"checkpoint after call {calls} failed: {exc}"
            log.warning("sandbox %s: %s", sandbox_id, self._errors[sandbox_id])
            return
        self._errors.pop(sandbox_id, None)
        task = asyncio.create_task(self._prune(sandbox_id, snap.tag, policy.keep), name=f"prune:{tag}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _tag(self, record: SandboxRecord) -> str:
        # The sandbox's branch sequence, kept in the registry: it only grows, across policy
        # resets and daemon restarts, so tag order is age order (the call count restarts).
        return f"ckpt-{record.id}-{self._sandboxes.next_branch_seq(record.id):06d}"

    async def _prune(self, sandbox_id: str, newest: str, keep: int) -> None:
        await self._brancher.finished(newest)
        with contextlib.suppress(ForkdError):
            done = self._store.get(newest)
            if done.status == "failed":
                self._errors[sandbox_id] = f"checkpoint {newest} failed while it was written: {done.error}"
                log.warning("sandbox %s: %s", sandbox_id, self._errors[sandbox_id])
        async with self._prune_locks.setdefault(sandbox_id, asyncio.Lock()):
            kept = [s for s in self._kept(sandbox_id) if s.status != "failed"]
            for snap in [s for s in self._kept(sandbox_id) if s.status == "failed"]:
                self._drop(snap.tag)  # a failed checkpoint holds no files; its error is in last_error
            for snap in kept[: max(0, len(kept) - keep)]:
                await self._brancher.finished(snap.tag)
                self._drop(snap.tag)
        await self._forker.collect()

    def _drop(self, tag: str) -> None:
        users = [sb.id for sb in self._sandboxes.all() if sb.snapshot_tag == tag]
        if users or self._store.dependents(tag):
            # Someone forked it: it leaves the list now and goes with its last user.
            self._store.retire_checkpoint(tag)
            return
        self._brancher.unpublish(tag)
        self._store.remove(tag)

    async def after_removed(self, record: SandboxRecord) -> None:
        """``SandboxEvents.removed`` hook: forget the call count of a sandbox that is gone."""
        self._calls.pop(record.id, None)
        self._errors.pop(record.id, None)
        self._prune_locks.pop(record.id, None)

    async def wait_background(self, timeout: float = 600) -> None:
        if self._tasks:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait(set(self._tasks), timeout=timeout)


__all__ = ["MODES", "Checkpointer"]
