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
  (n-1)-th's, so ``parent_tag`` records it and deleting a layer others need is 409.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from forkd.errors import Conflict, ForkdError, InvalidRequest, VMError
from forkd.store import layout
from forkd.store.layout import SnapshotDir, check_sandbox_id
from forkd.store.registry import SandboxRecord, SnapshotRecord, now_unix
from forkd.vmm import branching
from forkd.vmm import disk as disk_mod
from forkd.vmm.cmdline import LaunchSpec, VMConfig

if TYPE_CHECKING:
    from forkd.controller.runtime import Runtime
    from forkd.vmm.machine import VM

log = logging.getLogger("forkd.branch")

MODES = ("full", "diff", "live")


@dataclass
class _Source:
    record: SandboxRecord
    vm: VM
    config: VMConfig
    run_dir: Path
    active_node: str
    active_file: Path
    parent_tag: str  # the newest published snapshot its disk chain sits on
    pending_layers: list[Path]  # frozen overlays since then that no published snapshot holds


class Brancher:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._locks: dict[str, asyncio.Lock] = {}
        self._background: set[asyncio.Task] = set()

    def _source(self, sandbox_id: str) -> _Source:
        vm = self.rt._vm(sandbox_id)  # 404 / dead checks
        record = self.rt.registry.get_sandbox(sandbox_id)
        run_dir = Path(record.dir)
        return _Source(
            record=record, vm=vm, config=VMConfig.from_json(record.meta["config"]), run_dir=run_dir,
            active_node=record.meta.get("disk_node", "disk0"),
            active_file=Path(record.meta.get("disk_file", run_dir / "disk.qcow2")),
            parent_tag=record.meta.get("disk_parent_tag", record.snapshot_tag),
            pending_layers=[Path(p) for p in record.meta.get("pending_layers", [])],
        )

    async def branch(self, sandbox_id: str, tag: str | None = None, mode: str = "full",
                     wait: bool = True) -> SnapshotRecord:
        check_sandbox_id(sandbox_id)
        if mode not in MODES:
            raise InvalidRequest(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if not wait and mode != "live":
            raise InvalidRequest("wait: false is only meaningful with mode: \"live\"")
        src = self._source(sandbox_id)
        if mode == "live" and not src.record.live_fork:
            raise Conflict(
                f"sandbox {sandbox_id} was not spawned with live_fork: true, which mode \"live\" needs "
                "(its RAM must be on shared memory); use mode \"diff\" or \"full\", or spawn with "
                "live_fork: true"
            )
        seq = self.rt.registry.next_branch_seq(sandbox_id)
        tag = tag or f"branch-{sandbox_id}-{seq}"
        self.rt._reserve_tag(tag)
        reserved = True
        staging: SnapshotDir | None = None
        try:
            lock = self._locks.setdefault(sandbox_id, asyncio.Lock())
            async with lock:
                src = self._source(sandbox_id)  # re-read: a previous branch moved its disk
                staging = layout.staging_dir(self.rt.data.snapshots, tag)
                new_node = f"disk{seq}"
                new_disk = src.run_dir / f"disk-{seq}.qcow2"
                try:
                    cap = await branching.capture(
                        src.vm, mode, active_node=src.active_node, frozen_disk=src.active_file,
                        new_disk=new_disk, new_node=new_node, stream=staging.path / "stream",
                    )
                except BaseException as exc:
                    raise await self._capture_failed(src, staging, exc) from exc
                if cap.resume_error:
                    log.warning("branch of %s captured, but the source did not resume: %s",
                                sandbox_id, cap.resume_error)
                # The source now writes new_disk and the frozen overlay joins its
                # unpublished layers; record that before anything else can fail.
                layers = [*src.pending_layers, src.active_file]
                self.rt.registry.update_sandbox(sandbox_id, meta={
                    **src.record.meta, "disk_node": new_node, "disk_file": str(new_disk),
                    "disk_parent_tag": src.parent_tag, "pending_layers": [str(p) for p in layers]})
                try:
                    base = SnapshotDir(self.rt.data.snapshots / src.parent_tag).disk
                    await asyncio.to_thread(disk_mod.copy_layers, layers, base, staging.disk,
                                            self.rt.data.snapshots / tag)
                except BaseException as exc:
                    if cap.background is not None:  # live: stop streaming RAM too
                        cap.background.cancel()
                        with contextlib.suppress(Exception):
                            await src.vm.qmp.cmd("migrate_cancel")
                    raise VMError(f"branch of {sandbox_id} failed copying its disk: "
                                  f"{branching.stream_error(cap.stream) or exc}") from exc

            final_dir = self.rt.data.snapshots / tag
            record = SnapshotRecord(
                tag=tag, dir=str(final_dir), created_at_unix=now_unix(), status="writing",
                branched_from=sandbox_id, parent_tag=src.parent_tag, pause_ms=round(cap.pause_ms, 3),
                meta={"config": src.config.to_json(), "mode": mode, "tap": src.record.meta.get("tap"),
                      # The source's own copies of this branch's disk layers: if the
                      # branch is deleted while the source lives, they are its base again.
                      "source_layers": [str(p) for p in layers]},
            )
            if cap.resume_error:
                record.meta["source_error"] = (
                    f"the snapshot is valid, but source sandbox {sandbox_id} could not be resumed "
                    f"and was removed: {cap.resume_error}"
                )
            self.rt.registry.insert_snapshot(record)
            finish = self._finish(src, record, staging, cap, mode, layers, keep_failed=not wait)
            staging = None  # owned by _finish from here on
            if wait:
                return await finish
            task = asyncio.create_task(finish, name=f"branch:{tag}")
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            reserved = False  # the background task releases the tag
            return record
        finally:
            if staging is not None:
                shutil.rmtree(staging.path, ignore_errors=True)
            if reserved:
                self.rt._tags_in_flight.discard(tag)

    async def _capture_failed(self, src: _Source, staging: SnapshotDir, exc: BaseException) -> ForkdError:
        """Turn a failed capture into the error the user sees; never leave the source paused."""
        cause = branching.stream_error(staging.path / "stream")
        shutil.rmtree(staging.path, ignore_errors=True)
        if not src.vm.process.alive():
            await self.rt.kill(src.record.id)
            return VMError(f"sandbox {src.record.id} died during the branch (its QEMU exited); "
                           "nothing was registered and the sandbox was removed")
        try:
            await branching.resume(src.vm)
        except Exception as resume_exc:
            return VMError(f"branch failed ({exc}) and the source could not be resumed: {resume_exc}")
        detail = cause or (str(exc) if isinstance(exc, ForkdError) else f"{type(exc).__name__}: {exc}")
        return VMError(f"branch of {src.record.id} failed: {detail}; the source was resumed "
                       "and nothing was registered")

    async def _finish(self, src: _Source, record: SnapshotRecord, staging: SnapshotDir,
                      cap: branching.Capture, mode: str, layers: list[Path], *,
                      keep_failed: bool) -> SnapshotRecord:
        tag = record.tag
        try:
            if cap.background is not None:
                try:
                    await cap.background
                except ForkdError as exc:
                    raise VMError(branching.stream_error(cap.stream) or str(exc)) from exc
            helper_dir = staging.path / "helper"
            helper_dir.mkdir()
            convert_s = await branching.stream_to_snapshot(
                helper_dir, src.config, stream=cap.stream, mem_path=staging.mem,
                state_path=staging.state, disk=staging.disk,
                spec_factory=lambda mem, disk, run: _helper_spec(src.config, mem, disk, run,
                                                                 src.record.meta.get("tap")),
            )
            cap.stream.unlink(missing_ok=True)
            branching.clear_stream_error(cap.stream)
            shutil.rmtree(helper_dir, ignore_errors=True)
            parent = SnapshotDir(self.rt.data.snapshots / src.parent_tag)
            parent_meta = parent.read_meta() if parent.meta_path.exists() else {}
            staging.write_meta({
                "tag": tag, "created_at_unix": record.created_at_unix,
                "config": src.config.to_json(), "image": parent_meta.get("image"),
                "warm_imports": parent_meta.get("warm_imports"),
                "numpy_version": parent_meta.get("numpy_version"),
                "parent_tag": src.parent_tag, "branched_from": src.record.id,
                "mode": mode, "pause_ms": record.pause_ms, "convert_secs": round(convert_s, 3),
                # Same device config as the source: a NIC on this tap, if it had one.
                "tap": src.record.meta.get("tap"),
            })
            layout.publish(staging, self.rt.data.snapshots, tag)
            self.rt.registry.update_snapshot(tag, status="ready")
            record.status = "ready"
            if cap.resume_error:
                await self.rt.kill(src.record.id)  # reported dead: nothing usable is left
            else:
                await self._published(src.record.id, src.parent_tag, tag, layers)
            return record
        except asyncio.CancelledError:
            shutil.rmtree(staging.path, ignore_errors=True)
            branching.clear_stream_error(cap.stream)
            if record.status == "writing":
                self.rt.registry.delete_snapshot(tag)
            raise
        except BaseException as exc:
            shutil.rmtree(staging.path, ignore_errors=True)
            branching.clear_stream_error(cap.stream)
            message = exc if isinstance(exc, ForkdError) else f"{type(exc).__name__}: {exc}"
            if record.status == "writing":
                if keep_failed:
                    # wait: false — whoever polls must see it fail; it holds no files.
                    self.rt.registry.update_snapshot(tag, status="failed", error=str(message))
                else:
                    self.rt.registry.delete_snapshot(tag)  # the caller gets the error itself
            log.warning("branch %s failed: %s", tag, message)
            raise VMError(f"branch {tag} failed after the source resumed: {message}") from exc
        finally:
            self.rt._tags_in_flight.discard(tag)

    async def _published(self, sandbox_id: str, old_parent: str, tag: str, layers: list[Path]) -> None:
        """The source's disk now sits on ``tag``: later branches copy only newer layers."""
        async with self._locks.setdefault(sandbox_id, asyncio.Lock()):
            try:
                meta = self.rt.registry.get_sandbox(sandbox_id).meta
            except ForkdError:
                return  # the source is gone; nothing to update
            pending = meta.get("pending_layers", [])
            done = [str(p) for p in layers]
            if meta.get("disk_parent_tag", old_parent) == old_parent and pending[: len(done)] == done:
                self.rt.registry.update_sandbox(sandbox_id, meta={
                    **meta, "disk_parent_tag": tag, "pending_layers": pending[len(done):]})

    def unpublish(self, tag: str) -> None:
        """``tag`` is being deleted: sources layered on it fall back to its parent.

        Their own frozen overlays (kept in their run directories) become
        unpublished layers again, so their next branch copies them instead.
        """
        try:
            snap = self.rt.registry.get_snapshot(tag)
        except ForkdError:
            return
        for sb in self.rt.registry.list_sandboxes():
            if sb.meta.get("disk_parent_tag") == tag:
                self.rt.registry.update_sandbox(sb.id, meta={
                    **sb.meta, "disk_parent_tag": snap.parent_tag,
                    "pending_layers": [*snap.meta.get("source_layers", []),
                                       *sb.meta.get("pending_layers", [])]})

    async def wait_background(self, timeout: float = 600) -> None:
        """Let in-flight live branches finish (daemon shutdown, tests)."""
        if self._background:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait(set(self._background), timeout=timeout)


def _helper_spec(config: VMConfig, mem: Path, disk: Path, run_dir: Path,
                 tap: str | None) -> branching.SpecFactory:
    def spec(qmp_fd: int, agent_fd: int) -> LaunchSpec:
        return LaunchSpec(config=config, mem_path=mem, share_ram=True, disk=disk, qmp_fd=qmp_fd,
                          agent_fd=agent_fd, console_log=run_dir / "console.log", incoming=True,
                          tap=tap, nic_placeholder=True,
                          extra=["-S"])  # load the state, never run it
    return spec


__all__ = ["MODES", "Brancher"]
