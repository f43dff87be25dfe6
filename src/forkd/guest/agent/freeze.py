"""The ``fsfreeze``/``fsthaw`` actions: FIFREEZE/FITHAW of the guest's root filesystem and of the
mounts the request names (its writable volumes).

A live branch snapshots the disks while the vCPUs keep running, so the guest
first freezes the filesystems on them: the kernel flushes each and holds new
writes, and the copy is crash-free. Children restored from that state thaw their
copy (every filesystem this agent froze: the list is in the memory they restore).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Sequence

from forkd.guest.protocol import INVALID, RequestError

# <linux/fs.h>
FIFREEZE = 0xC0045877
FITHAW = 0xC0045878
FREEZE_MOUNTS_MAX = 16  # a sandbox has at most bounds.MAX_VOLUMES volumes; room, not a second limit
MOUNT_PATH_MAX = 4096


def check_freeze_mounts(mounts: object) -> list[str]:
    """fsfreeze's ``mounts`` (from the host): absolute paths of mount points besides the root."""
    if mounts is None:
        return []
    if not isinstance(mounts, list) or len(mounts) > FREEZE_MOUNTS_MAX:
        raise RequestError(f"mounts must be a list of at most {FREEZE_MOUNTS_MAX} paths", INVALID)
    for path in mounts:
        if (not isinstance(path, str) or not path.startswith("/") or len(path) > MOUNT_PATH_MAX
                or "\0" in path):
            raise RequestError(f"mounts: {str(path)[:80]!r} is not an absolute path", INVALID)
    return list(mounts)


class RootFreezer:
    """FIFREEZE/FITHAW of the root filesystem (and of named mounts), for crash-free disk snapshots."""

    FIFREEZE = FIFREEZE
    FITHAW = FITHAW

    def __init__(self, root: str = "/") -> None:
        self.root = root
        self.lock = threading.Lock()
        self.frozen: list[str] = []  # in the order frozen; thawed in reverse

    @staticmethod
    def sync() -> dict[str, bool]:
        """Write every dirty page of the guest's filesystems to its disk (before a disk cut)."""
        os.sync()
        return {"synced": True}

    def freeze(self, mounts: Sequence[str] = ()) -> bool:
        """Freeze the root filesystem, then each of ``mounts`` (absolute paths of mount points).
        One that cannot be frozen thaws what was frozen before it, so a refusal leaves nothing held."""
        with self.lock:
            if self.frozen:
                return True
            for path in [self.root, *mounts]:
                try:
                    self._ioctl(path, FIFREEZE)
                except OSError as exc:
                    self._thaw_all()
                    raise RequestError(f"cannot freeze the filesystem at {path}: {exc.strerror}") from None
                self.frozen.append(path)
            return True

    def thaw(self) -> bool:
        with self.lock:
            if not self.frozen:
                return False
            self._thaw_all()
            return True

    def _thaw_all(self) -> None:
        for path in reversed(self.frozen):
            # Already thawed (EINVAL), or gone: the goal is reached either way.
            with contextlib.suppress(OSError):
                self._ioctl(path, FITHAW)
        self.frozen = []

    @staticmethod
    def _ioctl(path: str, request: int) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(fd, request, 0)
        finally:
            os.close(fd)
