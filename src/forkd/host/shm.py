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
import subprocess
from pathlib import Path

from forkd.errors import InvalidRequest

SHM_ROOT = Path(os.environ.get("FORKD_SHM_DIR", "/dev/shm"))


class ShmMemory:
    def __init__(self, data_root: Path) -> None:
        # One directory per data dir, so two daemons (or test runs) never collide.
        digest = hashlib.sha256(str(data_root.resolve()).encode()).hexdigest()[:10]
        self.dir = SHM_ROOT / f"forkd-{digest}"
        self._locks: dict[str, asyncio.Lock] = {}

    def path(self, tag: str) -> Path:
        return self.dir / f"{tag}.mem"

    async def ensure(self, tag: str, source: Path) -> Path:
        """The shared-memory copy of ``source`` for snapshot ``tag`` (made once)."""
        target = self.path(tag)
        async with self._locks.setdefault(tag, asyncio.Lock()):
            if target.exists():
                return target
            if not SHM_ROOT.is_dir():
                raise InvalidRequest(f"live_fork needs a tmpfs at {SHM_ROOT}; mount one or set FORKD_SHM_DIR")
            need = os.stat(source).st_size
            st = os.statvfs(SHM_ROOT)
            if st.f_bavail * st.f_frsize < need + (64 << 20):
                raise InvalidRequest(
                    f"live_fork needs {need >> 20} MiB free on {SHM_ROOT} for snapshot {tag!r}'s "
                    f"memory; only {(st.f_bavail * st.f_frsize) >> 20} MiB are free"
                )
            self.dir.mkdir(mode=0o700, exist_ok=True)
            tmp = target.with_suffix(f".tmp-{os.getpid()}")
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
        """Drop copies of snapshots that no longer exist."""
        if not self.dir.is_dir():
            return
        for p in self.dir.iterdir():
            if p.suffix != ".mem" or p.stem not in keep:
                p.unlink(missing_ok=True)
        if not any(self.dir.iterdir()):
            shutil.rmtree(self.dir, ignore_errors=True)
