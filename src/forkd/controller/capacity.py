"""How many sandboxes this host will hold, and the memory it keeps free: a spawn past either is a
503 ``no_capacity`` with a Retry-After, before any VM starts.

A host that takes every spawn finds out it is full by failures (QEMU killed by the OOM killer,
restores that time out); a fleet's gateway cannot tell that from a broken host. Refusing up front,
with a typed answer, lets a gateway try the next host and a client back off.

``max_sandboxes`` counts the sandboxes that hold a VM (running or paused, warm-pool members
included); a hibernated one holds no QEMU and no memory, so it does not count. Children a spawn
is restoring count from the moment they are admitted, so two concurrent spawns cannot both take
the last place. ``memory_reserve_mib``: a spawn is refused while the host's available memory
(``MemAvailable``) is below it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from forkd.config import HostLimits
from forkd.errors import NoCapacity

MEMINFO = Path("/proc/meminfo")
RETRY_AFTER_SECS = 5  # a sandbox's lifetime is seconds to hours: ask again soon, not at once


def available_mib(meminfo: Path = MEMINFO) -> int | None:
    """The kernel's estimate of memory available for new work, MiB (None: it cannot be read)."""
    with contextlib.suppress(OSError, ValueError):
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    return None


class HostCapacity:
    """Admits new VMs against ``limits``; ``live()`` counts the sandboxes that hold one now."""

    def __init__(self, live: Callable[[], int], limits: HostLimits | None = None,
                 meminfo: Path = MEMINFO) -> None:
        self.limits = limits or HostLimits()
        self._live = live
        self._meminfo = meminfo
        self._admitted = 0  # children admitted whose restore has not ended yet

    def check(self, n: int) -> None:
        """NoCapacity (503) if ``n`` more VMs would pass a limit now."""
        limits = self.limits
        if limits.max_sandboxes is not None:
            held = self._live() + self._admitted
            if held + n > limits.max_sandboxes:
                free = max(0, limits.max_sandboxes - held)
                raise NoCapacity(f"this host is at capacity: {held} of its {limits.max_sandboxes} sandboxes "
                                 f"(--max-sandboxes) are taken and {n} more were asked for ({free} free); "
                                 "retry later, kill or hibernate a sandbox, or spawn on another host",
                                 retry_after_secs=RETRY_AFTER_SECS)
        if limits.memory_reserve_mib:
            free_mib = available_mib(self._meminfo)
            if free_mib is not None and free_mib < limits.memory_reserve_mib:
                raise NoCapacity(f"this host is low on memory: {free_mib} MiB available, below its "
                                 f"reserve of {limits.memory_reserve_mib} MiB (--memory-reserve-mib); retry "
                                 "later, kill or hibernate a sandbox, or spawn on another host",
                                 retry_after_secs=RETRY_AFTER_SECS)

    @contextlib.contextmanager
    def admit(self, n: int) -> Iterator[None]:
        """Hold ``n`` places while their VMs start (checked first); released when the block ends,
        by which time the children that started are live and count by themselves."""
        self.check(n)
        self._admitted += n
        try:
            yield
        finally:
            self._admitted -= n
