"""A volume's disk image: an ext4 filesystem in a qcow2 file, empty or filled from a host
directory or a tarball.

The qcow2's virtual size is the volume's quota: a guest sees a disk of that size and can
write no more, and the file on the host grows to at most that much (plus qcow2 metadata),
whatever the guest does. The filesystem is made on the host (``mkfs.ext4 -d`` copies a
directory into it, no mount, no root), then converted to qcow2 (sparse: only written
clusters take space).

A tarball comes from whoever calls the API: it is unpacked into a private directory with
tarfile's ``data`` filter (no absolute paths, no ``..``, no links out, no devices, no
set-id bits), and its members are counted and their sizes summed before a byte is written,
so an archive larger than the volume, or with more members than ``MAX_TAR_MEMBERS``, is
refused rather than filling the host.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from forkd.errors import InvalidRequest, VMError
from forkd.vmm import disk as disk_mod

FILESYSTEMS = ("ext4",)
MAX_TAR_MEMBERS = 100_000
# ext4 needs room for its own metadata: a source must leave this share of the volume free.
FS_OVERHEAD = 0.10


def _mkfs() -> str:
    tool = shutil.which("mkfs.ext4") or shutil.which("mkfs.ext4", path="/usr/sbin:/sbin")
    if tool is None:
        raise VMError("mkfs.ext4 is not installed (Debian: e2fsprogs)")
    return tool


def tree_bytes(root: Path, limit: int) -> int:
    """The bytes of the regular files under ``root`` (links are not followed), counted until past
    ``limit``: a source as big as the host's root is refused at the limit, not walked whole. A file
    that goes while it is walked (a live tree, /proc) is not counted."""
    total, entries = 0, 0
    for dirpath, dirs, files in os.walk(root):
        entries += len(dirs) + len(files)
        if entries > MAX_TAR_MEMBERS:
            raise InvalidRequest(f"{root} has more than {MAX_TAR_MEMBERS} files and directories")
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
            if total > limit:
                return total
    return total


def check_tarball(path: Path, size: int) -> None:
    """Refuse an archive before unpacking it: too many members, or more bytes than fit."""
    total, count = 0, 0
    try:
        with tarfile.open(path) as tar:
            for member in tar:
                count += 1
                if count > MAX_TAR_MEMBERS:
                    raise InvalidRequest(f"{path} has more than {MAX_TAR_MEMBERS} members")
                if member.name.startswith("/") or ".." in member.name.split("/"):
                    # tarfile's data filter would strip a leading '/': refuse it outright instead.
                    raise InvalidRequest(f"{path} has a member that would leave the volume: "
                                         f"{member.name[:200]!r}")
                total += max(0, member.size)
                if total > size * (1 - FS_OVERHEAD):
                    raise InvalidRequest(f"{path} holds more than fits in a volume of {size >> 20} MiB")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise InvalidRequest(f"{path} is not a readable tar archive: {exc}") from None


def unpack(path: Path, into: Path, size: int) -> None:
    """``path`` (tar, optionally gzip/bzip2/xz) unpacked into ``into``, hostile members refused."""
    check_tarball(path, size)
    try:
        with tarfile.open(path) as tar:
            tar.extractall(into, filter="data")
    except tarfile.FilterError as exc:
        raise InvalidRequest(f"{path} has a member that would leave the volume: {exc}") from None
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise InvalidRequest(f"{path} could not be unpacked: {exc}") from None


def _debugfs() -> str:
    tool = shutil.which("debugfs") or shutil.which("debugfs", path="/usr/sbin:/sbin")
    if tool is None:
        raise VMError("debugfs is not installed (Debian: e2fsprogs)")
    return tool


def export(image: Path, to: Path, scratch: Path) -> None:
    """The files of the ext4 filesystem in ``image`` (a qcow2, its backing chain included) copied
    into the new directory ``to`` on the host, without mounting it: ``debugfs rdump`` reads the
    filesystem as a file. Symbolic links are written as links, never followed. Nothing is left at
    ``to`` on failure. ``scratch``: where the raw image is made for the while (the data dir's tmp)."""
    to.mkdir()
    try:
        scratch.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=scratch, prefix="volume-export-") as tmp:
            raw = Path(tmp) / "fs.raw"
            disk_mod.qemu_img("convert", "-q", "-U", "-O", "raw", str(image), str(raw))  # sparse
            proc = subprocess.run([_debugfs(), "-R", f"rdump / {to}", str(raw)], capture_output=True,
                                  text=True)
            errors = [line for line in proc.stderr.splitlines() if not line.startswith("debugfs ")]
            if proc.returncode != 0 or errors:
                raise VMError(f"reading the volume's filesystem failed: {' '.join(errors)[-500:]}")
    except BaseException:
        shutil.rmtree(to, ignore_errors=True)
        raise


def build(out: Path, size: int, source: Path | None, scratch: Path, fs: str = "ext4") -> None:
    """``out``: a qcow2 of ``size`` bytes holding a new ``fs`` filesystem, with ``source``'s
    content (a directory, or a tarball) if given. Nothing is left at ``out`` on failure.
    ``scratch``: where a tarball is unpacked and the raw filesystem made (the data dir's tmp,
    which a start clears of what a crash left)."""
    if fs not in FILESYSTEMS:
        raise InvalidRequest(f"filesystem {fs!r} is not supported (one of: {', '.join(FILESYSTEMS)})")
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch, prefix="volume-") as tmp:
        work = Path(tmp)
        content: Path | None = None
        if source is not None:
            if source.is_dir():
                if tree_bytes(source, int(size * (1 - FS_OVERHEAD))) > size * (1 - FS_OVERHEAD):
                    raise InvalidRequest(f"{source} holds more than fits in a volume of {size >> 20} MiB")
                content = source
            elif source.is_file():
                content = work / "content"
                content.mkdir()
                unpack(source, content, size)
            else:
                raise InvalidRequest(f"{source} is neither a directory nor a tarball")
        raw = work / "fs.raw"
        with open(raw, "wb") as f:
            f.truncate(size)  # sparse
        argv = [_mkfs(), "-q", "-F", "-L", "forkd-volume", "-E", "lazy_itable_init=1,lazy_journal_init=1"]
        if content is not None:
            argv += ["-d", str(content)]
        proc = subprocess.run([*argv, str(raw)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise InvalidRequest(f"making the volume's filesystem failed: {proc.stderr.strip()[-500:]}")
        tmp_out = work / "disk.qcow2"
        disk_mod.qemu_img("convert", "-q", "-f", "raw", "-O", "qcow2", "-o", "cluster_size=65536",
                          str(raw), str(tmp_out))
        os.replace(tmp_out, out)


__all__ = ["FILESYSTEMS", "MAX_TAR_MEMBERS", "build", "check_tarball", "export", "unpack"]
