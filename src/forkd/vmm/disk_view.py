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
from pathlib import Path

from forkd.errors import VMError
from forkd.host import prereqs

MAP_TIMEOUT_SECS = 30.0
MAP_MAX_OUTPUT = 64 << 20
EXPORT_TIMEOUT_SECS = 15.0


async def _run(args: list[str], *, timeout: float, max_output: int) -> str:
    proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        async with asyncio.timeout(timeout):
            out = bytearray()
            while chunk := await proc.stdout.read(1 << 16):
                out += chunk
                if len(out) > max_output:
                    raise VMError(f"{Path(args[0]).name} {args[1]} wrote more than {max_output} bytes")
            err = await proc.stderr.read(1 << 16)
            await proc.wait()
    except TimeoutError:
        raise VMError(f"{Path(args[0]).name} {args[1]} ran past {timeout:.0f}s") from None
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
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


@contextlib.asynccontextmanager
async def exported(images: list[tuple[Path, str]]) -> AsyncIterator[list[Path]]:
    """Each image (path, format) as a raw read-only file, for the time of the ``with``.

    A raw image is handed back as it is; a qcow2 one (and its backing chain) is exported by one
    qemu-storage-daemon over FUSE, read-only and without taking QEMU's image locks (the
    sandbox's QEMU holds its top layer for writing). The daemon is stopped and the mount points
    removed on the way out, whatever happens.
    """
    views: list[Path | None] = [path if fmt == "raw" else None for path, fmt in images]
    wanted = [(i, path) for i, (path, fmt) in enumerate(images) if fmt != "raw"]
    if not wanted:
        yield [v for v in views if v is not None]
        return
    workdir = Path(tempfile.mkdtemp(prefix="forkd-diff-"))
    args = [storage_daemon_tool()]
    for i, path in wanted:
        mount = workdir / f"disk{i}.raw"
        mount.touch()
        views[i] = mount
        args += ["--blockdev", f"driver=file,node-name=f{i},filename={_opt(path)},read-only=on,locking=off",
                 "--blockdev", f"driver=qcow2,node-name=q{i},file=f{i},read-only=on",
                 "--export", f"type=fuse,id=e{i},node-name=q{i},mountpoint={_opt(mount)},writable=off"]
    proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        await _mounted(proc, [views[i] for i, _ in wanted])
        yield [v for v in views if v is not None]
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()  # qemu-storage-daemon unmounts its exports on SIGTERM
            try:
                await asyncio.wait_for(proc.wait(), timeout=10)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        for i, _ in wanted:
            view = views[i]
            assert view is not None
            if view.stat().st_size:  # still mounted (the daemon was killed): lazy unmount
                umount = shutil.which("umount")
                if umount is not None:
                    done = await asyncio.create_subprocess_exec(umount, "-l", str(view))
                    await done.wait()
        shutil.rmtree(workdir, ignore_errors=True)


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
