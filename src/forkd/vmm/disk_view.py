"""What a sandbox's disk layers know of its changes, and its disks as raw files the host can read.

A child's disk is a qcow2 overlay chain over its snapshot's disk, so the clusters
a child wrote since it was forked are the clusters allocated in the layers above
that snapshot's disk: ``qemu-img map`` lists them (``depth`` counts the layers
down from the top) without reading any data. ``exported`` shows a disk, chain
and all, as a raw read-only file (qemu-storage-daemon's FUSE export) that
debugfs can open, while the sandbox's QEMU keeps writing its own overlay (the
caller has the guest freeze its filesystem first, so what is read is whole).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from forkd.errors import VMError
from forkd.host import prereqs
from forkd.host.bounded_output import bounded_stdout
from forkd.vmm.disk import qcow2_virtual_size

MAP_TIMEOUT_SECS = 30.0
MAP_MAX_OUTPUT = 64 << 20
EXPORT_TIMEOUT_SECS = 15.0


async def _run(args: list[str], *, timeout: float, max_output: int) -> str:
    proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    out = await bounded_stdout(proc, timeout=timeout, max_output=max_output, refuse=VMError,
                               what=f"{Path(args[0]).name} {args[1]}")
    err = await proc.stderr.read(1 << 16)
    if proc.returncode != 0:
        raise VMError(f"{Path(args[0]).name} {args[1]} failed: {err.decode(errors='replace').strip()}")
    return out.decode()


async def chain(top: Path) -> list[tuple[Path, str]]:
    """``top`` and every image below it, top first, each resolved, with its format."""
    tool = prereqs.require(prereqs.QEMU_IMG)["qemu-img"]
    out = await _run([tool, "info", "-U", "--backing-chain", "--output=json", str(top)],
                     timeout=MAP_TIMEOUT_SECS, max_output=1 << 20)
    return [(Path(link["filename"]).resolve(), str(link["format"])) for link in json.loads(out)]


async def changed_ranges(top: Path, above: int) -> list[tuple[int, int]]:
    """The byte ranges (start, length) of the disk held by the ``above`` topmost layers of ``top``'s
    chain: what changed since the image ``above`` layers down. Merged, in order."""
    if above <= 0:
        return []
    tool = prereqs.require(prereqs.QEMU_IMG)["qemu-img"]
    out = await _run([tool, "map", "-U", "--output=json", str(top)],
                     timeout=MAP_TIMEOUT_SECS, max_output=MAP_MAX_OUTPUT)
    ranges: list[tuple[int, int]] = []
    for entry in json.loads(out):
        # depth: the layer the range is read from (0 = top); a range no layer holds reads as zeroes
        # from below the bottom (depth = chain length), never "changed".
        present = entry.get("present", entry.get("data", False) or entry.get("zero"))
        if int(entry["depth"]) >= above or not present:
            continue
        start, length = int(entry["start"]), int(entry["length"])
        if ranges and ranges[-1][0] + ranges[-1][1] == start:
            ranges[-1] = (ranges[-1][0], ranges[-1][1] + length)
        else:
            ranges.append((start, length))
    return ranges


def storage_daemon_tool() -> str:
    tool = shutil.which("qemu-storage-daemon")
    if tool is None:
        raise VMError("qemu-storage-daemon is not installed (apt-get install qemu-system-common): "
                      "the diff reads a sandbox's disk through it")
    return tool


@dataclass(frozen=True)
class DiskView:
    """A disk as a raw file, and the byte ranges making it consistent wrote (its journal replayed)."""

    path: Path
    replayed: list[tuple[int, int]]


@contextlib.asynccontextmanager
async def exported(images: list[tuple[Path, str]], under: Path) -> AsyncIterator[list[DiskView]]:
    """Each image (path, format) as a raw file, with its ext4 journal replayed, for the ``with``.

    A snapshot's disk was cut while its guest ran, so what its guest had only journaled is not at
    its home yet: debugfs does not replay a journal. So each image gets a throwaway qcow2 overlay
    (in a temporary directory under ``under``, the data dir's tmp), exported by one
    qemu-storage-daemon over FUSE, where e2fsck
    replays the journal (``-E journal_only``); the image itself is opened read-only and without
    QEMU's image locks (a sandbox's QEMU holds its top layer for writing). The daemon is stopped,
    the mounts gone and the overlays removed on the way out, whatever happens.
    """
    under.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="forkd-diff-", dir=under))
    args = [storage_daemon_tool()]
    mounts: list[Path] = []
    overlays: list[Path] = []
    proc: asyncio.subprocess.Process | None = None
    try:
        for i, (path, fmt) in enumerate(images):
            size = qcow2_virtual_size(path) if fmt == "qcow2" else path.stat().st_size
            overlay, mount = workdir / f"view{i}.qcow2", workdir / f"disk{i}.raw"
            await _run([prereqs.require(prereqs.QEMU_IMG)["qemu-img"], "create", "-q", "-f", "qcow2", "-u",
                        "-b", str(path), "-F", fmt, str(overlay), str(size)],
                       timeout=MAP_TIMEOUT_SECS, max_output=1 << 16)
            mount.touch()
            mounts.append(mount)
            overlays.append(overlay)
            args += ["--blockdev",
                     f"driver=file,node-name=f{i},filename={_opt(path)},read-only=on,locking=off",
                     "--blockdev", f"driver={fmt},node-name=q{i},file=f{i},read-only=on",
                     "--blockdev", f"driver=file,node-name=o{i},filename={_opt(overlay)}",
                     "--blockdev", f"driver=qcow2,node-name=t{i},file=o{i},backing=q{i}",
                     "--export", f"type=fuse,id=e{i},node-name=t{i},mountpoint={_opt(mount)},writable=on"]
        proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.DEVNULL,
                                                    stderr=asyncio.subprocess.PIPE)
        await _mounted(proc, list(mounts))
        views = []
        for mount, overlay in zip(mounts, overlays, strict=True):
            await _replay_journal(mount)
            views.append(DiskView(mount, await changed_ranges(overlay, 1)))
        yield views
    finally:
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()  # qemu-storage-daemon unmounts its exports on SIGTERM
            try:
                await asyncio.wait_for(proc.wait(), timeout=10)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        for mount in mounts:
            with contextlib.suppress(OSError):
                if mount.stat().st_size:  # still mounted (the daemon was killed): lazy unmount
                    umount = shutil.which("umount")
                    if umount is not None:
                        done = await asyncio.create_subprocess_exec(umount, "-l", str(mount))
                        await done.wait()
        shutil.rmtree(workdir, ignore_errors=True)


async def _replay_journal(view: Path) -> None:
    """Replay the ext4 journal into the view's throwaway overlay (nothing else is checked or fixed:
    whatever e2fsck says of a guest's filesystem, debugfs reads what is there)."""
    tool = shutil.which("e2fsck") or "/usr/sbin/e2fsck"
    proc = await asyncio.create_subprocess_exec(tool, "-y", "-E", "journal_only", str(view),
                                                stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.DEVNULL)
    try:
        await asyncio.wait_for(proc.wait(), timeout=MAP_TIMEOUT_SECS)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise VMError(f"e2fsck did not replay the guest's journal within {MAP_TIMEOUT_SECS:.0f}s") from None


def _opt(path: Path) -> str:
    """A path as a QEMU option value (a comma is written twice)."""
    return str(path).replace(",", ",,")


async def _mounted(proc: asyncio.subprocess.Process, mounts: list[Path | None]) -> None:
    """Wait until every export is mounted: its mount point (an empty file) shows the disk's size."""
    deadline = time.monotonic() + EXPORT_TIMEOUT_SECS
    while True:
        if proc.returncode is not None:
            assert proc.stderr is not None
            err = (await proc.stderr.read(1 << 16)).decode(errors="replace").strip()
            raise VMError(f"qemu-storage-daemon could not export the disk: {err}")
        if all(m is not None and m.stat().st_size > 0 for m in mounts):
            return
        if time.monotonic() > deadline:
            raise VMError(f"qemu-storage-daemon did not export the disk within {EXPORT_TIMEOUT_SECS:.0f}s")
        await asyncio.sleep(0.005)
