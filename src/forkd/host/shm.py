"""Snapshot memory on shared memory, for children spawned with ``live_fork``.

A ``live`` branch uses QEMU's background-snapshot, which write-protects guest
RAM with userfaultfd; the kernel allows that on anonymous and shmem mappings,
not on a private mapping of an ext4 file (QEMU: "Background-snapshot is not
compatible with guest memory configuration"). A private mapping of a *tmpfs*
file qualifies and keeps copy-on-write sharing, so each snapshot that has
live_fork children gets one copy of its ``mem`` on /dev/shm, shared by all of
them. Cost: the guest RAM size, once per snapshot, in RAM.

The copy is written in full, not sparse: a live branch makes QEMU populate the
whole guest RAM, and a read fault on a hole of a tmpfs file allocates a page
charged to the faulting QEMU's memory cgroup, which got children with a
``memory_limit_mib`` below the guest RAM size OOM-killed mid-branch. Written
in full, the pages are the daemon's, and children only map them.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import stat
import subprocess
from pathlib import Path

from forkd.errors import Conflict, InvalidRequest

SHM_ROOT = Path(os.environ.get("FORKD_SHM_DIR", "/dev/shm"))


def shm_dir_of(data_root: Path, shm_root: Path | None = None) -> Path:
    """The /dev/shm directory of the daemon whose data directory is ``data_root``."""
    # One directory per data dir, so two daemons (or test runs) never collide.
    digest = hashlib.sha256(str(data_root.resolve()).encode()).hexdigest()[:10]
    return (shm_root or SHM_ROOT) / f"forkd-{digest}"


def private_dir(path: Path, *, what: str = "guest memory", env: str = "FORKD_SHM_DIR") -> Path:
    """``path`` as a directory only this user can enter: made here (mode 0700), or, if it is
    there already, checked to be a real directory (not a link) of this uid with mode 0700.

    Its name is predictable and its parent (/dev/shm) is world-writable, so anyone may have
    made it first, to read or swap the guest memory put in it: refused, never reused.
    """
    try:
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)  # the umask cannot take bits away from 0700, but be explicit
        return path
    except FileExistsError:
        pass
    st = os.lstat(path)
    problems = []
    if not stat.S_ISDIR(st.st_mode):
        problems.append("is a symbolic link" if stat.S_ISLNK(st.st_mode) else "is not a directory")
    else:
        if st.st_uid != os.geteuid():
            problems.append(f"is owned by uid {st.st_uid}, not by this daemon's uid {os.geteuid()}")
        if stat.S_IMODE(st.st_mode) != 0o700:
            problems.append(f"has mode {stat.S_IMODE(st.st_mode):04o}, not 0700")
    if problems:
        raise Conflict(
            f"refusing to put {what} in {path}: it already exists and {' and '.join(problems)} "
            "(someone else may have made it to read or replace it). Check who made it, remove it "
            f"(rm -rf {path}) and try again, or set {env} to a private directory")
    return path


class ShmMemory:
    def __init__(self, data_root: Path) -> None:
        self.dir = shm_dir_of(data_root)
        self._locks: dict[str, asyncio.Lock] = {}

    def path(self, tag: str) -> Path:
        return self.dir / f"{tag}.mem"

    async def ensure(self, tag: str, source: Path) -> Path:
        """The shared-memory copy of ``source`` for snapshot ``tag`` (made once)."""
        target = self.path(tag)
        async with self._locks.setdefault(tag, asyncio.Lock()):
            if not SHM_ROOT.is_dir():
                raise InvalidRequest(f"live_fork needs a tmpfs at {SHM_ROOT}; mount one or set FORKD_SHM_DIR")
            if os.path.lexists(self.dir):
                private_dir(self.dir)  # before trusting anything in it
                if target.exists():
                    return target
            need = os.stat(source).st_size
            st = os.statvfs(SHM_ROOT)
            if st.f_bavail * st.f_frsize < need + (64 << 20):
                raise InvalidRequest(
                    f"live_fork needs {need >> 20} MiB free on {SHM_ROOT} for snapshot {tag!r}'s "
                    f"memory; only {(st.f_bavail * st.f_frsize) >> 20} MiB are free"
                )
            private_dir(self.dir)
            tmp = target.with_suffix(f".tmp-{os.getpid()}")
            tmp.unlink(missing_ok=True)
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
            # cp writes into the file made above and keeps its mode: private from the first byte.
            proc = await asyncio.create_subprocess_exec(
                "cp", "--sparse=never", str(source), str(tmp), stderr=subprocess.PIPE)
            _, err = await proc.communicate()
            if proc.returncode != 0:
                tmp.unlink(missing_ok=True)
                raise InvalidRequest(f"copying snapshot memory to {SHM_ROOT} failed: {err.decode().strip()}")
            os.replace(tmp, target)
            return target

    def remove(self, tag: str) -> None:
        self.path(tag).unlink(missing_ok=True)

    def prune(self, keep: set[str]) -> None:
        """Drop copies of snapshots that no longer exist (in a directory of ours only)."""
        if not os.path.lexists(self.dir):
            return
        try:
            private_dir(self.dir)
        except Conflict:
            return  # not ours: nothing in it is ours to delete (ensure says why, when it is needed)
        for p in self.dir.iterdir():
            if p.suffix != ".mem" or p.stem not in keep:
                p.unlink(missing_ok=True)
        if not any(self.dir.iterdir()):
            shutil.rmtree(self.dir, ignore_errors=True)
