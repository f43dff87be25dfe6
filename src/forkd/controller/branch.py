"""BRANCH: snapshot a running sandbox into a new tag, then let it carry on.

Orchestration only; the QEMU mechanics live in ``forkd.vmm.branching``. The
rules (seed 000's failure-mode table):

* unknown sandbox → 404, no side effect; existing or in-flight tag → 409;
* the capture fails → the source is resumed, partial files are removed, nothing
  is registered, the error names the cause (e.g. "No space left on device");
* QEMU dies mid-branch → 5xx, nothing registered, the dead sandbox is reaped;
* resume fails after a good capture → the snapshot is still finished and
  returned; the source is reported dead;
* branches of one source form a chain: the n-th branch's disk is layered on the
  (n-1)-th's, so ``parent_tag`` records it and deleting a layer others need is 409;
* the daemon killed mid-branch (or mid fork of a running sandbox) → the next start
  finishes or undoes what the branch had begun on the source (``recover``): its
  migration cancelled, its filesystem thawed, its VM run again, and the overlay its
  QEMU writes since the disk cut recorded. A marker file in its run directory,
  written before the capture and removed once the disk chain is recorded, says
  which sources need it (nothing is asked of the others at start).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from forkd.controller import volumes
from forkd.controller.branch_meta import branch_meta
from forkd.controller.sandbox_events import SandboxEvents
from forkd.controller.sandboxes import SandboxTable
from forkd.controller.snapshots import SnapshotStore
from forkd.controller.tags import TagReservations
from forkd.errors import Conflict, ForkdError, InvalidRequest, VMError
from forkd.host import procmem
from forkd.store import layout
from forkd.store.layout import SnapshotDir, check_sandbox_id
from forkd.store.records import DiskChain, SandboxRecord, SnapshotRecord, now_unix
from forkd.store.rows.sandboxes import DiskChainRows
from forkd.vmm import branching
from forkd.vmm import disk as disk_mod
from forkd.vmm.cmdline import VolumeDrive
from forkd.vmm.machine import MIGRATION_ACTIVE, VM

log = logging.getLogger("forkd.branch")

MODES = ("full", "diff", "live")

# How long a kill of a source waits for its live wait:false branches to finish
# copying RAM. The copy of a 512 MiB guest takes seconds even under TCG; past
# this bound the kill goes ahead and the branch is recorded failed, saying why.
KILL_WAITS_FOR_LIVE_BRANCH_SECS = 300.0
# In a source's run directory while a branch's capture and disk cut are under way (JSON: the mode,
# the new overlay and node, the overlay frozen): what a restart must finish or undo (``recover``).
CUT_MARKER = "branch-cut.json"
# How long a restart waits for QEMU to cancel a migration a dead daemon left under way.
CANCEL_SETTLE_SECS = 30.0


@dataclass
class _Source:
    record: SandboxRecord
    vm: VM

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def disk(self) -> DiskChain:
        return self.record.disk

    @property
    def run_dir(self) -> Path:
        return Path(self.record.dir)


class Brancher:
    def __init__(self, sandboxes: DiskChainRows, snapshots_dir: Path, table: SandboxTable,
                 events: SandboxEvents, store: SnapshotStore, tags: TagReservations, *,
                 after_disk_cut: Callable[[str], Awaitable[None]] | None = None) -> None:
        """``after_disk_cut``: awaited with the source's id once a branch has moved it onto a new
        overlay (the caller holds the source's lock; the disk quota arms the new overlay)."""
        self._sandboxes = sandboxes  # read, plus the disk chain and branch sequence columns
        self._snapshots = snapshots_dir
        self._table = table
        self._store = store
        self._tags = tags
        self._background: dict[str, asyncio.Task[SnapshotRecord]] = {}  # tag -> its finish
        self._background_source: dict[str, str] = {}  # tag -> the sandbox it copies from
        self._events = events
        self._after_disk_cut = after_disk_cut
        events.before_kill(self._let_branches_finish)

    def new_tag(self, sandbox_id: str) -> str:
        """A fresh ``branch-<id>-<seq>`` for a branch of ``sandbox_id`` taken elsewhere (of a
        hibernated one: controller/hibernated_branch.py); the sequence is this owner's column."""
        seq = self._sandboxes.next_branch_seq(sandbox_id)
        while self._store.exists(f"branch-{sandbox_id}-{seq}"):
            seq = self._sandboxes.next_branch_seq(sandbox_id)
        return f"branch-{sandbox_id}-{seq}"

    def _source(self, sandbox_id: str) -> _Source:
        vm = self._table.get(sandbox_id)  # 404 / dead checks
        return _Source(self._sandboxes.get(sandbox_id), vm)

    async def branch(self, sandbox_id: str, tag: str | None = None, mode: str = "full",
                     wait: bool = True, *, measure_diff: bool = False,
                     parent_tag: str | None = None) -> SnapshotRecord:
        """``measure_diff`` (full mode only): also report what a dirty-page diff would have
        cost; ``parent_tag``: the caller's idea of the branch's parent, checked (409 if the
        source's lineage says otherwise)."""
        check_sandbox_id(sandbox_id)
        if mode not in MODES:
            raise InvalidRequest(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if not wait and mode != "live":
            raise InvalidRequest("wait: false is only meaningful with mode: \"live\"")
        if measure_diff and mode != "full":
            raise InvalidRequest("measure_diff measures a full branch; it cannot be combined with "
                                 f"mode {mode!r}")
        if parent_tag is not None:
            self._check_parent(sandbox_id, parent_tag)
        return await self._branch(sandbox_id, tag, mode, wait, measure_diff=measure_diff)

    def _check_parent(self, sandbox_id: str, parent_tag: str) -> None:
        """forkd 0.5's chain edge: it named the snapshot the source was forked from. Here every
        branch is recorded on the snapshot its source's disk sits on (that one, or the source's
        latest branch), so either name is accepted and anything else is a mistake."""
        src = self._source(sandbox_id)
        allowed = {src.record.snapshot_tag, src.disk.parent_tag}
        if parent_tag not in allowed:
            raise Conflict(
                f"parent_tag {parent_tag!r} is not the parent of a branch of {sandbox_id}: it would be "
                f"recorded on {src.disk.parent_tag!r} (the sandbox was forked from "
                f"{src.record.snapshot_tag!r}); leave parent_tag out, or name one of those")

    async def checkpoint(self, sandbox_id: str, tag: str, mode: str) -> SnapshotRecord:
        """A standalone branch for an auto-checkpoint policy, finished in the background.

        Standalone: its disk is one layer on the source's published base, not on
        earlier branches, so the policy can delete old checkpoints in any order.
        The caller gets it back once the source runs again (status "writing").
        """
        return await self._branch(sandbox_id, tag, mode, wait=False, checkpoint=True)

    async def _branch(self, sandbox_id: str, tag: str | None, mode: str, wait: bool, *,
                      checkpoint: bool = False, measure_diff: bool = False) -> SnapshotRecord:
        src = self._source(sandbox_id)
        if mode == "live" and not src.record.live_fork:
            raise Conflict(
                f"sandbox {sandbox_id} was not spawned with live_fork: true, which mode \"live\" needs "
                "(its RAM must be on shared memory); use mode \"diff\" or \"full\", or spawn with "
                "live_fork: true"
            )
        if mode == "live":
            await volumes.require_live_cut(src.vm, src.record.volumes, sandbox_id)
        seq = self._sandboxes.next_branch_seq(sandbox_id)
        while (tag is None and self._store.exists(f"branch-{sandbox_id}-{seq}")) \
                or (src.run_dir / f"disk-{seq}.qcow2").exists():
            # A sandbox resumed under its old id (controller/suspend.py) counts from 1
            # again, while its earlier branches may still be there; and an overlay of this
            # number may be there already (a cut a restart recorded).
            seq = self._sandboxes.next_branch_seq(sandbox_id)
        tag = tag or f"branch-{sandbox_id}-{seq}"
        self._tags.reserve(tag)
        reserved = True
        staging: SnapshotDir | None = None
        try:
            async with self._table.lock(sandbox_id):
                # Re-read under the lock: a previous branch moved its disk, a kill removed it.
                src = self._source(sandbox_id)
                await self._events.wake_locked(sandbox_id)  # one paused for being idle runs again
                staging = layout.staging_dir(self._snapshots, tag)
                written = await self._written_ram(src) if measure_diff else None
                cap, layers = await self._capture(src, seq, mode, staging, tag, standalone=checkpoint)
                measured = self._diff_measure(src, cap, written) if written is not None else None

            record = SnapshotRecord(
                tag=tag, dir=str(self._snapshots / tag), created_at_unix=now_unix(), status="writing",
                branched_from=sandbox_id, parent_tag=src.disk.parent_tag, pause_ms=round(cap.pause_ms, 3),
                fs_freeze_ms=round(cap.fs_freeze_ms, 3) if cap.fs_freeze_ms is not None else None,
                mode=mode, source_layers=[] if checkpoint else [str(p) for p in layers],
                checkpoint_of=sandbox_id if checkpoint else None, diff_measure=measured,
                volumes=list(src.record.volumes),
            )
            if cap.resume_error:
                record.warning = (
                    f"the snapshot is valid, but source sandbox {sandbox_id} could not be resumed "
                    f"and was removed: {cap.resume_error}"
                )
            self._store.register(record)
            finish = self._finish(src, record, staging, cap, [] if checkpoint else layers,
                                  keep_failed=not wait)
            staging = None  # owned by _finish from here on
            if wait:
                return await finish
            task = asyncio.create_task(finish, name=f"branch:{tag}")
            self._background[tag] = task
            self._background_source[tag] = sandbox_id
            task.add_done_callback(functools.partial(self._background_done, tag))
            reserved = False  # the background task releases the tag
            return record
        finally:
            if staging is not None:
                shutil.rmtree(staging.path, ignore_errors=True)
            if reserved:
                self._tags.release(tag)

    async def _capture(self, src: _Source, seq: int, mode: str, staging: SnapshotDir,
                       tag: str, *, standalone: bool) -> tuple[branching.BranchCapture, list[Path]]:
        """The pause window and the disk cut; the caller holds the source's lock."""
        new_node = f"disk{seq}"
        new_disk = src.run_dir / f"disk-{seq}.qcow2"
        frozen = Path(src.disk.file)
        cut = {"mode": mode, "node": new_node, "file": str(new_disk), "frozen": str(frozen)}
        marker = src.run_dir / CUT_MARKER
        try:
            marker.write_text(json.dumps(cut))  # before QEMU is touched: a restart finds it
        except OSError as exc:
            raise VMError(f"branch of {src.id} could not start: {marker}: {exc.strerror or exc}") from exc
        try:
            try:
                # Its writable volumes are cut with the root disk, their files mirroring its own.
                also = tuple(branching.DiskCut(layout.volume_node(src.disk.node, i),
                                               layout.volume_file(new_disk, i),
                                               layout.volume_node(new_node, i),
                                               src.record.volumes[i]["mount"])
                             for i in volumes.writable(src.record.volumes))
                cap = await branching.capture(
                    src.vm, mode, active_node=src.disk.node, frozen_disk=frozen,
                    new_disk=new_disk, new_node=new_node, stream=staging.path / "stream", also=also,
                )
            except BaseException as exc:
                # The cut may have happened before the failure: the row follows QEMU.
                with contextlib.suppress(ForkdError, OSError):
                    await self._record_cut(src.id, src.vm, cut)
                raise await self._capture_failed(src, staging, exc) from exc
            if cap.resume_error:
                log.warning("branch of %s captured, but the source did not resume: %s",
                            src.id, cap.resume_error)
            # The source now writes new_disk and the frozen overlay joins its
            # unpublished layers; record that before anything else can fail.
            layers = [*(Path(p) for p in src.disk.pending_layers), frozen]
            self._sandboxes.set_disk_chain(src.id, DiskChain(
                node=new_node, file=str(new_disk), parent_tag=src.disk.parent_tag,
                pending_layers=[str(p) for p in layers]))
        finally:
            marker.unlink(missing_ok=True)
        if self._after_disk_cut is not None:
            try:
                await self._after_disk_cut(src.id)
            except (ForkdError, OSError) as exc:  # the branch itself is good
                log.warning("after the disk cut of %s: %s", src.id, exc)
        try:
            base = SnapshotDir(self._snapshots / src.disk.parent_tag).disk
            if standalone:
                await asyncio.to_thread(disk_mod.flatten_onto, frozen, base, staging.disk)
            else:
                await asyncio.to_thread(disk_mod.copy_layers, layers, base, staging.disk,
                                        self._snapshots / tag)
            await asyncio.to_thread(volumes.branch_layers, src.record.volumes,
                                    SnapshotDir(self._snapshots / src.disk.parent_tag), staging, layers,
                                    self._snapshots / tag, standalone=standalone)
        except BaseException as exc:
            if cap.background is not None:  # live: stop streaming RAM too
                cap.background.cancel()
                with contextlib.suppress(Exception):
                    await src.vm.cancel_migration()
            raise VMError(f"branch of {src.id} failed copying its disk: "
                          f"{branching.stream_error(cap.stream) or exc}") from exc
        return cap, layers

    async def _record_cut(self, sandbox_id: str, vm: VM, cut: dict[str, str]) -> None:
        """Make the row say what QEMU does: if the branch's new overlay node exists, the source
        writes it, and the overlay it froze joins its unpublished layers; if not, a file the cut
        may have left is removed."""
        disk = self._sandboxes.get(sandbox_id).disk
        if not await vm.has_block_node(cut["node"]):
            if disk.file != cut["file"]:
                Path(cut["file"]).unlink(missing_ok=True)
                for i in volumes.writable(self._sandboxes.get(sandbox_id).volumes):
                    layout.volume_file(Path(cut["file"]), i).unlink(missing_ok=True)
            return
        if disk.file == cut["frozen"]:
            self._sandboxes.set_disk_chain(sandbox_id, DiskChain(
                node=cut["node"], file=cut["file"], parent_tag=disk.parent_tag,
                pending_layers=[*disk.pending_layers, cut["frozen"]]))

    async def recover(self) -> None:
        """After a restart: finish or undo the branches a dead daemon left under way on sources
        that were re-adopted (those with a ``CUT_MARKER``). Their migration is cancelled, their
        guest filesystem thawed (live), their VM run again, and the disk cut recorded."""
        for record in self._sandboxes.all():
            sandbox_id, vm = record.id, self._table.vm(record.id)
            marker = Path(record.dir) / CUT_MARKER
            if vm is None or not marker.exists():
                continue
            try:
                cut = json.loads(marker.read_text())
                await self._undo_capture(vm, str(cut.get("mode")))
                await self._record_cut(sandbox_id, vm, cut)
                log.warning("sandbox %s was mid-branch when the daemon stopped: its capture was undone "
                            "and it runs again on %s", sandbox_id, self._sandboxes.get(sandbox_id).disk.file)
            except (ForkdError, OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("sandbox %s was mid-branch when the daemon stopped, and could not be settled: "
                            "%s", sandbox_id, exc)
            finally:
                marker.unlink(missing_ok=True)

    @staticmethod
    async def _undo_capture(vm: VM, mode: str) -> None:
        """A capture's effects on the source, undone: migration cancelled, filesystem thawed, running."""
        if await vm.migrating():
            await vm.cancel_migration()
            deadline = time.monotonic() + CANCEL_SETTLE_SECS
            while await vm.migration_status() in (*MIGRATION_ACTIVE, "cancelling"):
                if time.monotonic() > deadline:
                    raise VMError("its unfinished migration did not cancel")
                await asyncio.sleep(0.05)
        await branching.resume(vm)
        if mode == "live":  # the guest froze its root filesystem around the cut
            await vm.call(lambda agent: agent.fsthaw(60))

    @staticmethod
    async def _written_ram(src: _Source) -> int:
        """Bytes of RAM the source wrote since its restore (host/procmem.py), just before the pause."""
        if src.record.pid is None:
            raise VMError(f"sandbox {src.id} has no QEMU pid to measure")
        return await asyncio.to_thread(procmem.written_ram_bytes, src.record.pid,
                                       src.record.config.mem_mib << 20)

    @staticmethod
    def _diff_measure(src: _Source, cap: branching.BranchCapture, written: int) -> dict[str, float]:
        """forkd 0.5's measure_diff fields. The diff's size is measured; its time is an
        estimate: this full branch's pause, scaled to the share of the captured stream
        that the written pages make up (one capture, not two)."""
        stream = cap.stream.stat().st_size if cap.stream.exists() else 0
        share = min(1.0, written / stream) if stream else 1.0
        return {"diff_physical_bytes": written, "diff_logical_bytes": src.record.config.mem_mib << 20,
                "diff_ms": round(cap.pause_ms * share, 3)}

    async def _capture_failed(self, src: _Source, staging: SnapshotDir, exc: BaseException) -> ForkdError:
        """Turn a failed capture into the error the user sees; never leave the source paused."""
        cause = branching.stream_error(staging.path / "stream")
        shutil.rmtree(staging.path, ignore_errors=True)
        if not src.vm.process.alive():
            await self._table.kill_locked(src.id)
            return VMError(f"sandbox {src.id} died during the branch (its QEMU exited); "
                           "nothing was registered and the sandbox was removed")
        try:
            await branching.resume(src.vm)
        except Exception as resume_exc:
            return VMError(f"branch failed ({exc}) and the source could not be resumed: {resume_exc}")
        detail = cause or (str(exc) if isinstance(exc, ForkdError) else f"{type(exc).__name__}: {exc}")
        return VMError(f"branch of {src.id} failed: {detail}; the source was resumed "
                       "and nothing was registered")

    def _background_done(self, tag: str, task: asyncio.Task[SnapshotRecord]) -> None:
        """A wait:false branch ended; its failure is already recorded on the snapshot."""
        self._background.pop(tag, None)
        self._background_source.pop(tag, None)
        if not task.cancelled():
            task.exception()  # retrieved: asyncio must not report it as never retrieved

    async def _finish(self, src: _Source, record: SnapshotRecord, staging: SnapshotDir,
                      cap: branching.BranchCapture, layers: list[Path], *,
                      keep_failed: bool) -> SnapshotRecord:
        tag = record.tag
        try:
            if cap.background is not None:
                try:
                    await cap.background
                except ForkdError as exc:
                    detail = branching.stream_error(cap.stream) or str(exc)
                    if not src.vm.process.alive():
                        detail = (f"source sandbox {src.id} stopped (killed, or its QEMU exited) before "
                                  f"its RAM was copied ({detail})")
                    raise VMError(f"copying the RAM in the background failed: {detail}") from exc
            await self.publish_stream(record, src.record, staging, cap.stream, volumes.drives_for(
                src.record.volumes, staging.disk, volumes.ROOT_NODE, staging))
            if cap.resume_error:
                await self._table.kill(src.id)  # reported dead: nothing usable is left
            elif record.checkpoint_of is None:  # a standalone checkpoint is no one's base
                await self._published(src.id, src.disk.parent_tag, tag, layers)
            return record
        except asyncio.CancelledError:
            shutil.rmtree(staging.path, ignore_errors=True)
            branching.clear_stream_error(cap.stream)
            if record.status == "writing":
                self._store.unregister(tag)
            raise
        except BaseException as exc:
            shutil.rmtree(staging.path, ignore_errors=True)
            branching.clear_stream_error(cap.stream)
            if cap.resume_error:  # the source never ran again: nothing usable is left of it
                with contextlib.suppress(ForkdError):
                    await self._table.kill(src.id)
            message = exc if isinstance(exc, ForkdError) else f"{type(exc).__name__}: {exc}"
            if record.status == "writing":
                if keep_failed:
                    # wait: false — whoever polls must see it fail; it holds no files.
                    self._store.set_status(tag, "failed", error=str(message))
                else:
                    self._store.unregister(tag)  # the caller gets the error itself
            log.warning("branch %s failed: %s", tag, message)
            raise VMError(f"branch {tag} failed after the source resumed: {message}") from exc
        finally:
            self._tags.release(tag)

    async def publish_stream(self, record: SnapshotRecord, source: SandboxRecord, staging: SnapshotDir,
                             stream: Path, drives: list[VolumeDrive] | None = None) -> None:
        """The last steps of every branch (of a running sandbox, or of a hibernated one): its
        captured ``stream`` becomes the staged snapshot's ``mem`` and forkable ``state``, the
        metadata is written, and the snapshot is published and marked ``ready``."""
        helper_dir = staging.path / "helper"
        helper_dir.mkdir()
        try:
            convert_s = await branching.stream_to_snapshot(
                helper_dir, source.config, stream=stream, mem_path=staging.mem, state_path=staging.state,
                disk=staging.disk, tap=source.tap, volumes=drives)
        except ForkdError as exc:
            raise VMError(f"converting the stream into a snapshot failed: {exc}") from exc
        stream.unlink(missing_ok=True)
        branching.clear_stream_error(stream)
        shutil.rmtree(helper_dir, ignore_errors=True)
        staging.write_meta(branch_meta(record, source, self._store.dir(source.disk.parent_tag), convert_s))
        layout.publish(staging, self._snapshots, record.tag)
        self._store.set_status(record.tag, "ready")
        record.status = "ready"

    async def _published(self, sandbox_id: str, old_parent: str, tag: str, layers: list[Path]) -> None:
        """The source's disk now sits on ``tag``: later branches copy only newer layers."""
        async with self._table.lock(sandbox_id):
            try:
                disk = self._sandboxes.get(sandbox_id).disk
            except ForkdError:
                return  # the source is gone; nothing to update
            done = [str(p) for p in layers]
            if disk.parent_tag == old_parent and disk.pending_layers[: len(done)] == done:
                self._sandboxes.set_disk_chain(sandbox_id, DiskChain(
                    node=disk.node, file=disk.file, parent_tag=tag,
                    pending_layers=disk.pending_layers[len(done):]))

    def unpublish(self, tag: str) -> None:
        """``tag`` is being deleted: sources layered on it fall back to its parent.

        Their own frozen overlays (kept in their run directories) become
        unpublished layers again, so their next branch copies them instead.
        """
        try:
            snap = self._store.records.get(tag)
        except ForkdError:
            return
        for sb in self._sandboxes.all():
            if sb.disk.parent_tag == tag and snap.parent_tag:
                self._sandboxes.set_disk_chain(sb.id, DiskChain(
                    node=sb.disk.node, file=sb.disk.file, parent_tag=snap.parent_tag,
                    pending_layers=[*snap.source_layers, *sb.disk.pending_layers]))

    async def _let_branches_finish(self, sandbox_id: str,
                                   timeout: float = KILL_WAITS_FOR_LIVE_BRANCH_SECS) -> None:
        """A kill of ``sandbox_id`` first lets its background branches finish (bounded).

        A branch's own cleanup may kill its source (it never resumed); that kill must
        not wait for the branch it runs in.
        """
        current = asyncio.current_task()
        pending = {task for tag, task in self._background.items()
                   if self._background_source.get(tag) == sandbox_id and task is not current}
        if not pending:
            return
        log.info("kill of %s waits for its live branch(es) %s to finish copying RAM", sandbox_id,
                 ", ".join(sorted(t for t, task in self._background.items() if task in pending)))
        _, late = await asyncio.wait(pending, timeout=timeout)
        if late:
            log.warning("kill of %s goes ahead after %.0f s: %d live branch(es) still copying will fail",
                        sandbox_id, timeout, len(late))

    async def wait_background(self, timeout: float = 600) -> None:
        """Let in-flight live branches finish (daemon shutdown, tests)."""
        if self._background:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait(set(self._background.values()), timeout=timeout)

    async def finished(self, tag: str) -> None:
        """Return once a background branch of ``tag`` (if any) has ended, well or not."""
        task = self._background.get(tag)
        if task is not None:
            await asyncio.wait({task})


__all__ = ["CUT_MARKER", "MODES", "Brancher"]
