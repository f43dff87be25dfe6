"""Claims that span every forkd daemon on one host.

Most of a daemon's state is its own (its data directory, its ``/dev/shm``
directory), but a few names belong to the host: the seeds' ``forkd-child-<i>``
network namespaces, the address indices (``fkn<i>``, the host devices' names,
held also while a hibernated sandbox has no device) and the lock around each
daemon's host table. Two daemons that each
decide alone who holds such a name can meet in one namespace, or one can drop
the table the other just added an element to.

A claim is an ``flock`` on ``/run/forkd/<name>.lock``. The kernel drops it
when its holder dies, so a crashed daemon never leaves a stale claim, and a
lock is per open file, so two daemons in one process exclude each other too.
``/run`` is writable by root only, so no other user can plant the directory
or hold a lock forever; the directory is still checked like ``/dev/shm``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

from forkd.host.shm import private_dir

LOCK_DIR = Path(os.environ.get("FORKD_HOST_LOCK_DIR", "/run/forkd"))
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _open_lock(directory: Path, name: str) -> int:
    """An fd of ``name``'s lock file, made 0600 in the checked directory if missing."""
    if not _NAME_RE.match(name):
        raise ValueError(f"not a host claim name: {name!r}")
    path = private_dir(directory, what="host-wide locks", env="FORKD_HOST_LOCK_DIR") / f"{name}.lock"
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)


class HostClaims:
    """Names this daemon holds host-wide, each for as long as it likes (a sandbox's life)."""

    def __init__(self, directory: Path | None = None) -> None:
        self._dir = directory or LOCK_DIR
        self._held: dict[str, int] = {}  # name -> the fd whose flock is the claim

    def try_claim(self, name: str) -> bool:
        """Claim ``name`` unless another holder has it (no waiting); True if this one holds it."""
        if name in self._held:
            return True
        fd = _open_lock(self._dir, name)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._held[name] = fd
        return True

    def release(self, name: str) -> None:
        fd = self._held.pop(name, None)
        if fd is not None:
            os.close(fd)  # closing the only descriptor of the open file drops the flock

    def holds(self, name: str) -> bool:
        return name in self._held

    def close(self) -> None:
        for name in list(self._held):
            self.release(name)


@contextlib.asynccontextmanager
async def host_lock(name: str, directory: Path | None = None) -> AsyncIterator[None]:
    """Hold ``name`` exclusively among this host's daemons for a short critical section."""
    fd = _open_lock(directory or LOCK_DIR, name)
    try:
        # Waiting in a thread keeps the event loop serving (the holder may be this process).
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
