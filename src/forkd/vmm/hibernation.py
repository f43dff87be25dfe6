"""Hibernation mechanics: a child's changed RAM and device state to files, and back into a new QEMU.

Capture (the VM stopped): the device state alone (``VM.save_devices``: no RAM,
tens of KB), then the guest pages the child changed since its restore, found in
its pagemap and compressed (host/memdiff.py). Its RAM is a private mapping of
its snapshot's ``mem`` file, so everything else *is* that file.

Wake: a new QEMU with the child's own command line (RAM private over the same
``mem`` file, ``-incoming defer``), exactly as a spawn starts one. Before it
loads any state, the saved pages are written into its RAM through
``/proc/<pid>/mem`` (copy-on-write, as the guest's writes were). Then it loads
the device state through ``migrate-incoming``, and runs.

``migrate-incoming`` wants a migration stream, which begins with a
*configuration* section (the machine type) that ``xen-save-devices-state`` does
not write. The stream is the saved file with that section put back: taken from
the snapshot's own ``state`` file (same machine), without the capability list
that follows it there, so the new QEMU loads it with ``x-ignore-shared`` off.

Integrity: each file's BLAKE2b digest is taken right after it is written and
recorded in the sandbox's row (``Hibernation.digests``); a wake checks both
before any QEMU starts, and refuses (500, naming the file) one that changed on
disk, so a flipped byte never becomes silently wrong guest memory.

A disk-only hibernation keeps no memory at all: ``flush`` has the guest write
its page cache out (``sync``) and stops the VM (QMP ``stop`` flushes QEMU's
disk caches too), so its disk overlay holds everything once its QEMU is killed.
``cold_boot`` then boots the template's kernel and initramfs afresh on that
overlay, in a QEMU with the child's own device configuration and its RAM a
private mapping of its snapshot's ``mem`` file as always (the new kernel
overwrites what it uses; a later memory hibernation diffs against that file as
for any child), and waits for the guest agent as a template boot does.
"""


from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from forkd.errors import CorruptState, VMError
from forkd.host import memdiff
from forkd.host.accel import VMConfig
from forkd.vmm.branching import stopped_helper, stream_uri
from forkd.vmm.cmdline import LaunchSpec, VolumeDrive
from forkd.vmm.machine import VM
from forkd.vmm.process import AgentSockets
from forkd.vmm.qmp import UNTHROTTLED, restore_phases

DEVICES = "devices.state"  # xen-save-devices-state's file
MEMORY = "memory.diff"  # host/memdiff.py's file
INCOMING = "incoming.state"  # the stream a wake loads (rebuilt each wake)
ACTIVE_NODE = "disk0"  # the block node a woken QEMU's active disk layer has (vmm/cmdline.py)
_QEVM = b"QEVM"
_SECTION_CONFIGURATION = 0x07
MAX_MACHINE_NAME = 255
# A woken guest answers its clock step in well under a second; this only catches a wedged one.
WAKE_TIMEOUT_SECS = 30.0


DIGEST = "blake2b"  # what Captured.digests holds: hashlib's name, hex digests of 32 bytes
_DIGEST_BYTES = 32


@dataclass(frozen=True)
class Captured:
    pages: int  # guest pages saved
    memory_bytes: int  # the compressed diff on disk
    devices_bytes: int
    stopped_ms: float  # from the stop to everything on disk
    digests: dict[str, str]  # each file's name -> its BLAKE2b (``digest``), to check at the wake


def digest(path: Path) -> str:
    """The hex BLAKE2b-256 of the file at ``path``, read in 1 MiB pieces."""
    h = hashlib.blake2b(digest_size=_DIGEST_BYTES)
    with open(path, "rb") as f:
        while piece := f.read(1 << 20):
            h.update(piece)
    return h.hexdigest()


def verify(saved: Path, digests: dict[str, str]) -> None:
    """Refuse (``CorruptState``, naming the file) saved state that is not what was written: each of
    DEVICES and MEMORY must be there with the digest recorded at its capture."""
    for name in (DEVICES, MEMORY):
        expected = digests.get(name)
        if not isinstance(expected, str):
            raise CorruptState(f"{saved / name}: no digest was recorded for it, so it cannot be trusted")
        try:
            actual = digest(saved / name)
        except OSError as exc:
            raise CorruptState(f"{saved / name}: cannot be read ({exc.strerror or exc})") from None
        if not hmac.compare_digest(actual, expected):
            raise CorruptState(f"{saved / name} does not match the {DIGEST} digest recorded when it was "
                               "written: the file changed on disk, and waking from it would give the guest "
                               "wrong memory; the sandbox stays hibernated (kill it, or restore the file)")


async def capture(vm: VM, mem_path: Path, into: Path) -> Captured:
    """Stop ``vm`` and write its device state and changed pages under ``into`` (it stays stopped)."""
    started = time.monotonic()
    await vm.save_devices(into / DEVICES)
    ram = memdiff.RamMapping.find(vm.pid, mem_path, vm.config.mem_mib << 20)
    runs = ram.changed()
    size = await asyncio.to_thread(memdiff.save, ram, runs, into / MEMORY)
    devices = into / DEVICES
    with open(devices, "rb+") as f:
        os.fsync(f.fileno())
    stopped_ms = (time.monotonic() - started) * 1000
    # Right after the writes, from the page cache: what the wake must find again.
    digests = {name: await asyncio.to_thread(digest, into / name) for name in (DEVICES, MEMORY)}
    return Captured(memdiff.pages_in(runs), size, devices.stat().st_size, stopped_ms, digests)


def incoming_stream(snapshot_state: Path, devices: Path, out: Path) -> None:
    """``devices`` as a stream ``migrate-incoming`` loads: the snapshot's configuration section
    (its machine type) inserted after the header."""
    with open(snapshot_state, "rb") as f:
        head = f.read(8 + 1 + 4 + MAX_MACHINE_NAME)
    if len(head) < 13 or head[:4] != _QEVM or head[8] != _SECTION_CONFIGURATION:
        raise VMError(f"{snapshot_state} does not start like a QEMU migration stream")
    (name_len,) = struct.unpack(">I", head[9:13])
    if not 0 < name_len <= MAX_MACHINE_NAME or len(head) < 13 + name_len:
        raise VMError(f"{snapshot_state} names no machine type")
    with open(devices, "rb") as src, open(out, "wb") as dst:
        header = src.read(8)
        if len(header) != 8 or header[:4] != _QEVM:
            raise VMError(f"{devices} is not a QEMU device state")
        dst.write(header + head[8:13 + name_len])
        while piece := src.read(1 << 20):
            dst.write(piece)


async def wake(run_dir: Path, config: VMConfig, *, mem_path: Path, snapshot_state: Path, disk: Path,
               saved: Path, tap: str | None = None, launcher: Sequence[str] = (),
               timeout: float = 60, volumes: Sequence[VolumeDrive] = ()) -> VM:
    """A new QEMU in ``run_dir`` running the child hibernated in ``saved``; killed if it fails."""
    started, started_wall = time.monotonic(), time.time()
    await asyncio.to_thread(incoming_stream, snapshot_state, saved / DEVICES, saved / INCOMING)
    sockets = AgentSockets.bind(run_dir)
    spec = LaunchSpec(config=config, mem_path=mem_path, share_ram=False, disk=disk,
                      qmp_fd=sockets.qmp_fd, agent_fd=sockets.agent_fd,
                      console_log=run_dir / "console.log", incoming=True, tap=tap,
                      volumes=list(volumes))
    vm, incoming = await VM.launch_incoming(run_dir, spec, sockets, saved / INCOMING, launcher)
    try:
        vm.timings["qemu_up_s"] = time.monotonic() - started
        await _load_pages(vm, config, mem_path, saved)
        vm.timings["memory_s"] = time.monotonic() - started
        with vm.qmp.recording("MIGRATION", "RESUME") as events:
            await vm.qmp.start_incoming(incoming, x_ignore_shared=False)
            running = await vm.await_or_exit(vm.qmp.wait_incoming(events, timeout), timeout,
                                             "the hibernated device state")
            if not running:
                await vm.resume()
            vm.timings.update(restore_phases(events, started_wall))
        # The guest's clock stood still while it was on disk (nothing was cloned: no reseed).
        await _clock_set(vm, started, "the woken guest agent (clock step)")
    except BaseException:
        await vm.destroy()
        raise
    finally:
        (saved / INCOMING).unlink(missing_ok=True)
    return vm


async def _load_pages(vm: VM, config: VMConfig, mem_path: Path, saved: Path) -> None:
    """Write the saved pages into the RAM of ``vm``, a QEMU waiting for its incoming state."""
    ram = memdiff.RamMapping.find(vm.pid, mem_path, config.mem_mib << 20)
    # A QEMU waiting for its incoming state writes nothing into guest RAM; should one ever,
    # those pages go back to the file's content unless the diff has them.
    stray = ram.changed()
    runs = await asyncio.to_thread(memdiff.load, saved / MEMORY, ram)
    stray = memdiff.subtract(stray, runs)
    if stray:
        await asyncio.to_thread(memdiff.restore_file_pages, ram, stray, mem_path)


async def saved_to_stream(run_dir: Path, config: VMConfig, *, mem_path: Path, snapshot_state: Path,
                          disk_size: int, saved: Path, stream: Path, tap: str | None,
                          timeout: float = 600) -> None:
    """The child hibernated in ``saved`` as the stream a BRANCH of it would have captured, without
    waking it: a helper QEMU with its device configuration (a placeholder NIC, a blank disk of its
    size: the guest never runs, so the disk's content is never read) loads its pages and device
    state as a wake does, stays stopped (``-S``), and migrates everything out to ``stream``. Its
    files, disk and row are only read. ``stream`` then becomes a snapshot like any branch's
    (``branching.stream_to_snapshot``)."""
    await asyncio.to_thread(incoming_stream, snapshot_state, saved / DEVICES, run_dir / INCOMING)
    try:
        async with stopped_helper(run_dir, config, mem_path=mem_path, share_ram=False, tap=tap,
                                  source=run_dir / INCOMING, disk_size=disk_size) as (vm, incoming):
            await _load_pages(vm, config, mem_path, saved)
            await vm.qmp.set_capabilities(x_ignore_shared=False)
            await vm.await_or_exit(vm.qmp.run_migration("migrate-incoming", timeout, uri=incoming),
                                   timeout, "the hibernated state to load")
            # RAM is a private copy of the snapshot's file plus the saved pages: a full stream, as
            # a full BRANCH of the running child writes.
            await vm.qmp.set_parameters(max_bandwidth=UNTHROTTLED)
            await vm.qmp.run_migration("migrate", timeout, uri=stream_uri(stream))
    finally:
        (run_dir / INCOMING).unlink(missing_ok=True)


async def _clock_set(vm: VM, started: float, what: str) -> None:
    """Step the guest's clock to the host's; the VM is ready then (``ready_s``)."""
    await vm.await_or_exit(vm.step_clock(WAKE_TIMEOUT_SECS), WAKE_TIMEOUT_SECS + 5, what)
    vm.timings["ready_s"] = time.monotonic() - started


async def flush(vm: VM, timeout: float = 60) -> float:
    """Have the guest write its dirty pages to its disk, then stop the VM (QEMU flushes its own
    caches on ``stop``): its disk overlay is complete. The ms it took."""
    started = time.monotonic()
    await vm.await_or_exit(vm.call(lambda agent: agent.sync(timeout)), timeout + 5, "the guest's sync")
    await vm.pause()
    return (time.monotonic() - started) * 1000


async def cold_boot(run_dir: Path, config: VMConfig, *, mem_path: Path, disk: Path, kernel: Path,
                    initrd: Path, append: str, tap: str | None = None, launcher: Sequence[str] = (),
                    timeout: float = 120, volumes: Sequence[VolumeDrive] = ()) -> VM:
    """A new QEMU in ``run_dir`` booting ``kernel`` on ``disk``; returned once its agent answers
    (warm imports done) and its clock is the host's. Killed if it fails."""
    started = time.monotonic()
    sockets = AgentSockets.bind(run_dir)
    spec = LaunchSpec(config=config, mem_path=mem_path, share_ram=False, disk=disk,
                      qmp_fd=sockets.qmp_fd, agent_fd=sockets.agent_fd,
                      console_log=run_dir / "console.log", kernel=kernel, initrd=initrd,
                      append=append, tap=tap, volumes=list(volumes))
    vm = await VM.launch(run_dir, spec, sockets, launcher)
    try:
        vm.timings["qemu_up_s"] = time.monotonic() - started
        ping = await vm.await_or_exit(vm.agent.ping(timeout=None), timeout,
                                      "the guest agent to boot and warm up")
        if ping.get("warm_errors"):
            raise VMError(f"the cold-booted guest's warm imports failed: {ping['warm_errors']}")
        vm.timings["boot_s"] = time.monotonic() - started
        # Its clock comes from no RTC worth the name under TCG: the host's, as after a restore.
        await _clock_set(vm, started, "the cold-booted guest agent (clock step)")
    except BaseException:
        await vm.destroy()
        raise
    return vm


__all__ = ["ACTIVE_NODE", "DEVICES", "DIGEST", "INCOMING", "MEMORY", "Captured", "capture", "cold_boot",
           "digest", "flush", "incoming_stream", "saved_to_stream", "verify", "wake"]
