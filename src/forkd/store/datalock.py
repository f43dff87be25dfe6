"""Who has a data dir open: every Runtime shares it; the offline ``forkd pack``/``unpack`` take it alone.

A ``flock`` on ``<data>/forkd.lock``. The kernel drops it when its holder dies,
so a crashed daemon never leaves it held. Shared holders (daemons, embedded
Runtimes) do not exclude each other here. The exclusive holder writes the
registry from a second process, so it refuses while any Runtime has the dir
open, and a Runtime does not open the dir while it works.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable

from forkd.config import DataDir
from forkd.errors import Conflict


class DataDirLock:
    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    @classmethod
    def shared(cls, data: DataDir, *, when_alone: Callable[[], None] | None = None) -> DataDirLock:
        """Held by a Runtime for as long as it is open (Conflict during an offline pack/unpack).

        ``when_alone`` runs first if nobody else has the dir open (the lock taken exclusively for
        it, then shared): a clean-up that must not pull files from under a live Runtime.
        """
        why = "an offline forkd pack/unpack is using it; retry when it ends"
        if when_alone is not None:
            try:
                alone = cls._take(data, fcntl.LOCK_EX, why)
            except Conflict:
                pass  # another Runtime (or an offline command) has it: its files are its own
            else:
                try:
                    when_alone()
                    alone.downgrade()
                except BaseException:
                    alone.release()
                    raise
                return alone
        return cls._take(data, fcntl.LOCK_SH, why)

    def downgrade(self) -> None:
        """From exclusive to shared, never released in between (a failed upgrade would drop it)."""
        assert self._fd is not None
        fcntl.flock(self._fd, fcntl.LOCK_SH | fcntl.LOCK_NB)

    @classmethod
    def exclusive(cls, data: DataDir) -> DataDirLock:
        """Held by the offline commands (Conflict while a daemon or another offline command has it)."""
        return cls._take(data, fcntl.LOCK_EX,
                         "a forkd daemon is running on it: use `forkd push`/`pull` through the daemon, or "
                         "stop the daemon first")

    @classmethod
    def _take(cls, data: DataDir, mode: int, why: str) -> DataDirLock:
        data.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(data.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise Conflict(f"data dir {data.root} is busy: {why}") from None
        return cls(fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None


__all__ = ["DataDirLock"]
