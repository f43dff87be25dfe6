"""Capture a *running* child's memory, device and disk state (BRANCH), docs/FIELD-NOTES.md §6-7.

A child's RAM is a private (copy-on-write) mapping, so unlike a template it
cannot skip RAM with ``x-ignore-shared``: the capture is a migration stream that
carries the child's RAM (zero pages as flags only). Three ways to take it:

* ``full``  — ``stop``, stream everything, ``cont``: the state as of the request;
  the pause grows with the memory the guest has touched.
* ``diff``  — precopy live migration with ``pause-before-switchover``: RAM is
  copied while the guest runs; the pause covers only what it dirtied meanwhile.
  The state is the one at the end of the copy.
* ``live``  — ``background-snapshot`` (userfaultfd write-protect): the guest is
  paused only while the device state is saved; RAM pages are copied afterwards,
  each before the guest first writes it. The state is as of the request. Needs
  RAM on shared memory (a sandbox spawned with ``live_fork``).

In every mode the disk is cut at the instant of the memory state
(``blockdev-snapshot-sync``): the frozen overlay, copied, becomes the branch's
disk and the source carries on, on a new overlay.

A stream is then turned into a forkable snapshot by a helper QEMU that loads it
into RAM backed by the branch's new ``mem`` file (``share=on``) and writes the
small device-state file with ``x-ignore-shared`` — no stream parsing of our own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from qemu.qmp import EventListener, Message

from forkd.errors import VMError
from forkd.host.accel import VMConfig
from forkd.vmm import disk as disk_mod
from forkd.vmm.cmdline import LaunchSpec, VolumeDrive
from forkd.vmm.machine import VM, exec_uri
from forkd.vmm.process import AgentSockets
from forkd.vmm.qmp import QMP, UNTHROTTLED

# diff mode: the final stop-and-copy may take at most this long.
PRECOPY_DOWNTIME_MS = 20


@dataclass
class BranchCapture:
    """What the source's pause produced."""

    pause_ms: float
    frozen_disk: Path  # the overlay the source was writing until the pause
    new_disk: Path  # the overlay it writes from now on
    new_node: str
    stream: Path
    background: asyncio.Task[dict[str, Any]] | None = None  # live mode: RAM still being streamed
    resume_error: str | None = None  # the state was captured but the source did not run again
    # live mode: how long the guest's root filesystem was frozen (FIFREEZE to FITHAW):
    # its CPU work went on, but its disk writes waited that long.
    fs_freeze_ms: float | None = None


def _err_path(stream: Path) -> Path:
    # Beside the stream, in its staging directory under the data dir: a crash leaves it where the
    # next start's stale-staging sweep removes it (never in the host's /tmp). When that
    # filesystem is full, the message may be lost with it; ``stream_error`` then says so itself.
    return stream.with_name(f"{stream.name}.err")


def stream_uri(stream: Path) -> str:
    """Where QEMU's ``migrate`` writes a stream to ``stream``: through cat."""
    # cat's stderr is kept so that a failure (e.g. ENOSPC) can be named to the user.
    return f"exec:cat > {shlex.quote(str(stream))} 2> {shlex.quote(str(_err_path(stream)))}"


def clear_stream_error(stream: Path) -> None:
    _err_path(stream).unlink(missing_ok=True)


def stream_error(stream: Path) -> str | None:
    """Why writing the stream failed, in the writer's words (e.g. 'No space left on device')."""
    err = _err_path(stream)
    try:
        text = err.read_text().strip()
    except OSError:
        text = ""
    finally:
        err.unlink(missing_ok=True)
    if text:
        return f"writing {stream.parent}: {text.splitlines()[-1]}"
    with contextlib.suppress(OSError):
        st = os.statvfs(stream.parent)
        if st.f_bavail * st.f_frsize < (16 << 20):
            return f"No space left on device for {stream.parent} ({st.f_bavail * st.f_frsize >> 20} MiB free)"
    return None


@dataclass(frozen=True)
class DiskCut:
    """One more disk to cut with the root disk (an attached volume): its node goes on in
    ``new_disk`` (node ``new_node``) and what it wrote until now is frozen. ``mount``: where the
    guest mounts its filesystem, which a live cut has the guest freeze with the root's."""

    node: str
    new_disk: Path
    new_node: str
    mount: str


async def _freeze_disk(vm: VM, active_node: str, new_disk: Path, new_node: str,
                       also: tuple[DiskCut, ...] = ()) -> None:
    # One transaction: every disk is cut at the same instant, or none is.
    actions = [{"type": "blockdev-snapshot-sync",
                "data": {"node-name": node, "snapshot-file": str(file), "snapshot-node-name": new,
                         "format": "qcow2", "mode": "absolute-paths"}}
               for node, file, new in ((active_node, new_disk, new_node),
                                       *((c.node, c.new_disk, c.new_node) for c in also))]
    if len(actions) == 1:
        await vm.qmp.cmd("blockdev-snapshot-sync", **actions[0]["data"])  # type: ignore[arg-type]
    else:
        await vm.qmp.cmd("transaction", actions=actions)


async def _prepare_migration(vm: VM, *, background: bool = False, precopy: bool = False) -> None:
    # The child's RAM is private, so x-ignore-shared would skip nothing; keep it
    # off explicitly (a template-style capture would set it) for a full stream.
    await vm.qmp.set_capabilities(x_ignore_shared=False, background_snapshot=background,
                                  pause_before_switchover=precopy)
    params: dict[str, Any] = {"max_bandwidth": UNTHROTTLED}
    if precopy:
        params["downtime_limit"] = PRECOPY_DOWNTIME_MS
    await vm.qmp.set_parameters(**params)


async def capture(
    vm: VM, mode: str, *, active_node: str, frozen_disk: Path, new_disk: Path, new_node: str,
    stream: Path, timeout: float = 600, also: tuple[DiskCut, ...] = (),
) -> BranchCapture:
    """Pause the source as briefly as ``mode`` allows; freeze its disk; stream its state.

    ``also``: the other disks (volumes) cut at the same instant as the root disk.

    On return the source runs again (unless this raised before resuming, in
    which case the caller must try ``resume``). For ``live`` the RAM copy may
    still be under way in ``BranchCapture.background``.
    """
    if mode == "full":
        await _prepare_migration(vm)
        t0 = time.monotonic()
        await vm.qmp.cmd("stop")
        try:
            await _freeze_disk(vm, active_node, new_disk, new_node, also)
            await vm.qmp.run_migration("migrate", timeout, uri=stream_uri(stream))
        except BaseException:
            await resume(vm)
            raise
        resume_error = await _try_resume(vm)
        return BranchCapture((time.monotonic() - t0) * 1000, frozen_disk, new_disk, new_node, stream,
                       resume_error=resume_error)

    if mode == "diff":
        await _prepare_migration(vm, precopy=True)
        # Runs while the guest runs; QEMU stops the vCPUs for the final pass and
        # waits for us: that is the instant the disk must be frozen.
        await vm.qmp.run_migration("migrate", timeout, until=("pre-switchover",), uri=stream_uri(stream))
        t0 = time.monotonic()
        try:
            await _freeze_disk(vm, active_node, new_disk, new_node, also)
            info = await vm.qmp.run_migration("migrate-continue", timeout, state="pre-switchover")
        except BaseException:
            with contextlib.suppress(Exception):
                await vm.qmp.cmd("migrate_cancel")
            await resume(vm)
            raise
        resume_error = await _try_resume(vm)
        # QEMU's downtime counts from its own stop, which came just before we
        # noticed pre-switchover; take the larger of the two measurements.
        ours = (time.monotonic() - t0) * 1000
        pause = max(ours, float(info.get("downtime", 0)))
        return BranchCapture(pause, frozen_disk, new_disk, new_node, stream, resume_error=resume_error)

    if mode == "live":
        return await _capture_live(vm, active_node=active_node, frozen_disk=frozen_disk,
                                   new_disk=new_disk, new_node=new_node, stream=stream,
                                   timeout=timeout, also=also)

    raise VMError(f"unknown branch mode {mode!r}")


async def _capture_live(
    vm: VM, *, active_node: str, frozen_disk: Path, new_disk: Path, new_node: str, stream: Path,
    timeout: float, also: tuple[DiskCut, ...] = (),
) -> BranchCapture:
    """background-snapshot with the guest's filesystems frozen around the disk cut.

    QEMU's background snapshot stops the vCPUs only to save the device state and
    arm userfaultfd write-protection, then restarts them itself; RAM pages are
    copied afterwards, each before its first write. But it first spends a long
    setup (populating all of RAM: ~0.4-2 s under TCG) with the guest running, so
    the disk cannot be cut by pausing around it without paying that whole setup
    as pause. Instead the guest agent freezes the root filesystem, and the
    volumes in ``also`` (FIFREEZE: flushed, new writes held) while the overlays
    are switched and the state saved, so disks and memory agree; CPU work goes on
    meanwhile. Children restored from the branch thaw their copy when told they
    were restored. (An agent older than CAP_FREEZE_MOUNTS is refused by the caller.)
    """
    await _prepare_migration(vm, background=True)
    listener = EventListener(("STOP", "RESUME", "MIGRATION"))
    fs_frozen_at: float | None = None
    fs_freeze_ms: float | None = None
    try:
        with vm.qmp.client.listen(listener):
            await vm.agent.fsfreeze(timeout=120, mounts=[cut.mount for cut in also])
            fs_frozen_at = time.monotonic()
            await _freeze_disk(vm, active_node, new_disk, new_node, also)
            await vm.qmp.cmd("migrate", uri=stream_uri(stream))
            pause_ms = await await_live_pause(vm.qmp, listener, timeout)
    except BaseException:
        with contextlib.suppress(Exception):
            await vm.qmp.cmd("migrate_cancel")
        with contextlib.suppress(Exception):
            await resume(vm)
        raise
    finally:
        if fs_frozen_at is not None:
            with contextlib.suppress(Exception):
                await vm.call(lambda agent: agent.fsthaw(60))
            fs_freeze_ms = (time.monotonic() - fs_frozen_at) * 1000
    task = asyncio.create_task(vm.qmp.wait_migration(timeout))
    return BranchCapture(pause_ms, frozen_disk, new_disk, new_node, stream, background=task,
                   fs_freeze_ms=fs_freeze_ms)


def _event_time(event: Message) -> float:
    ts = cast(dict[str, int], event["timestamp"])
    return ts["seconds"] + ts["microseconds"] / 1e6


def _event_data(event: Message) -> dict[str, Any]:
    return cast(dict[str, Any], event.get("data") or {})


async def await_live_pause(qmp: QMP, listener: EventListener, timeout: float) -> float:
    """Wait for the background snapshot's STOP and RESUME events; the pause between them, in ms.

    QEMU may answer ``query-status`` with "running" before its RESUME event has
    reached us, so the events themselves are awaited (with a deadline) rather
    than whatever happens to have arrived.
    """
    deadline = time.monotonic() + timeout
    stopped: float | None = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise VMError(f"the live branch did not get past setup within {timeout:.0f}s")
        try:
            event = await asyncio.wait_for(listener.get(), remaining)
        except TimeoutError:
            continue
        name = event["event"]
        if name == "STOP" and stopped is None:
            stopped = _event_time(event)
        elif name == "RESUME" and stopped is not None:
            return (_event_time(event) - stopped) * 1000
        elif name == "MIGRATION" and _event_data(event).get("status") in ("failed", "cancelled"):
            info = await qmp.cmd("query-migrate")
            raise VMError(f"live branch failed: {info.get('error-desc', 'no detail from QEMU')}")


async def _try_resume(vm: VM) -> str | None:
    """Resume after a good capture; a failure here must not lose the snapshot."""
    try:
        await resume(vm)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


async def resume(vm: VM, settle: float = 10.0) -> None:
    """Run the source again whatever state the migration left it in.

    QEMU reports a migration "completed" (and emits its event) before its
    clean-up has moved the VM out of "finish-migrate", and ``cont`` is refused
    until then ("Migration is not finalized yet"). No event marks that step,
    so wait for it here, briefly and bounded.
    """
    deadline = time.monotonic() + settle
    status = await vm.qmp.status()
    while status == "finish-migrate" and time.monotonic() < deadline:
        await asyncio.sleep(0.001)
        status = await vm.qmp.status()
    if status != "running":
        await vm.qmp.cmd("cont")


@contextlib.asynccontextmanager
async def stopped_helper(run_dir: Path, config: VMConfig, *, mem_path: Path, share_ram: bool, tap: str | None,
                         source: Path, disk_size: int, volumes: Sequence[VolumeDrive] = (),
                         ) -> AsyncIterator[tuple[VM, str]]:
    """A helper QEMU with a source's device configuration that never runs the guest (``-S``): it
    loads a state from ``source`` (the URI it yields, for ``migrate-incoming``) and migrates it on.

    The guest never runs, so its disk and volumes are device configuration only, not content:
    blank scratch disks of their sizes, with no backing chain (a branch's chain names paths that
    exist only once published). A NIC, if the source had one on ``tap``, is a placeholder. The
    helper is shut down and its scratch disks removed on the way out.
    """
    scratch = run_dir / "scratch.qcow2"
    drives: list[VolumeDrive] = []
    try:
        disk_mod.create_blank(scratch, disk_size)
        for i, drive in enumerate(volumes):
            blank = run_dir / f"scratch.vol{i}.qcow2"
            disk_mod.create_blank(blank, disk_mod.qcow2_virtual_size(drive.path))
            drives.append(VolumeDrive(blank, drive.node, drive.serial, drive.read_only))
        sockets = AgentSockets.bind(run_dir)
        spec = LaunchSpec(config=config, mem_path=mem_path, share_ram=share_ram, disk=scratch,
                          qmp_fd=sockets.qmp_fd, agent_fd=sockets.agent_fd,
                          console_log=run_dir / "console.log", incoming=True,
                          tap=tap, nic_placeholder=True, extra=["-S"],  # load the state, never run it
                          volumes=drives)
        vm, incoming = await VM.launch_incoming(run_dir, spec, sockets, source)
        try:
            yield vm, incoming
        finally:
            await vm.shutdown()
    finally:
        scratch.unlink(missing_ok=True)
        for drive in drives:
            drive.path.unlink(missing_ok=True)


async def stream_to_snapshot(
    run_dir: Path, config: VMConfig, *, stream: Path, mem_path: Path, state_path: Path,
    disk: Path, tap: str | None, timeout: float = 600, volumes: list[VolumeDrive] | None = None,
) -> float:
    """Load ``stream`` into a fresh ``mem_path`` and save a forkable (RAM-less) state.

    The helper QEMU has the source's device configuration (``config``, a NIC if
    the source had one on ``tap``), RAM ``share=on`` on the new ``mem_path``,
    and never runs the guest (``-S``). Returns the seconds it took.
    """
    started = time.monotonic()
    with open(mem_path, "wb") as f:
        f.truncate(config.mem_mib << 20)
    helper = stopped_helper(run_dir, config, mem_path=mem_path, share_ram=True, tap=tap, source=stream,
                            disk_size=disk_mod.qcow2_virtual_size(disk), volumes=volumes or [])
    async with helper as (vm, incoming):
        await vm.qmp.set_capabilities(x_ignore_shared=False)
        await vm.await_or_exit(
            vm.qmp.run_migration("migrate-incoming", timeout, uri=incoming),
            timeout, "the branch stream to load")
        # Now RAM lives in mem_path; write the state without it, as for a template.
        await vm.qmp.set_capabilities(x_ignore_shared=True)
        await vm.qmp.set_parameters(max_bandwidth=UNTHROTTLED)
        await vm.qmp.run_migration("migrate", timeout, uri=exec_uri("cat >", state_path))
    return time.monotonic() - started
