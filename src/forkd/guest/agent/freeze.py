"""The ``fsfreeze``/``fsthaw`` actions: FIFREEZE/FITHAW of the guest's root filesystem.

A live branch snapshots the disk while the vCPUs keep running, so the guest
first freezes its root filesystem: the kernel flushes it and holds new writes,
and the copy is crash-free. Children restored from that state thaw their copy.
"""

from __future__ import annotations

import fcntl
import os
import threading

from forkd.guest.protocol import RequestError

# <linux/fs.h>
FIFREEZE = 0xC0045877
FITHAW = 0xC0045878


class RootFreezer:
    """FIFREEZE/FITHAW of the root filesystem, for crash-free disk snapshots."""

    FIFREEZE = FIFREEZE
    FITHAW = FITHAW

    def __init__(self, root: str = "/") -> None:
        self.root = root
        self.lock = threading.Lock()
        self.frozen = False

    @staticmethod
    def sync() -> dict[str, bool]:
        """Write every dirty page of the guest's filesystems to its disk (before a disk cut)."""
        os.sync()
        return {"synced": True}

    def freeze(self) -> bool:
        with self.lock:
            if self.frozen:
                return True
            fd = os.open(self.root, os.O_RDONLY)
            try:
                fcntl.ioctl(fd, FIFREEZE, 0)
            except OSError as exc:
                raise RequestError(f"cannot freeze the root filesystem: {exc.strerror}") from None
            finally:
                os.close(fd)
            self.frozen = True
            return True

    def thaw(self) -> bool:
        with self.lock:
            if not self.frozen:
                return False
            fd = os.open(self.root, os.O_RDONLY)
            try:
                fcntl.ioctl(fd, FITHAW, 0)
            except OSError:
                pass  # already thawed (EINVAL): the goal is reached either way
            finally:
                os.close(fd)
            self.frozen = False
            return True
