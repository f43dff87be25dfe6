"""What a sandbox costs the host: its guest RAM split into pages shared with its snapshot (and so
with its siblings) and pages of its own, and the size of its own disk layers.

An orchestrator asks "was forking worth it?": a child's private pages are what it made its own;
its shared pages are the snapshot's, held once in the page cache however many children read them.
Read from the host, never the guest (host/procmem.py: QEMU's mapping of the snapshot's memory
file), so a guest cannot lie about it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from forkd.controller.results import SandboxCost
from forkd.controller.sandboxes import SandboxTable
from forkd.errors import Conflict, ForkdError, VMError
from forkd.host import procmem
from forkd.store.records import SandboxRecord

# /metrics reads every live sandbox's smaps; a scrape at most this often pays for it.
TOTALS_TTL_SECS = 10.0


def own_disk_bytes(record: SandboxRecord) -> int:
    """Bytes the host holds for the sandbox's own disk layers (allocated, not their virtual size)."""
    total = 0
    for name in (*record.disk.pending_layers, record.disk.file):
        try:
            total += Path(name).stat().st_blocks * 512
        except OSError:
            continue  # a layer a branch is moving: counted in the snapshot it went to
    return total


def cost_of(record: SandboxRecord) -> SandboxCost:
    """The figures of a sandbox that has a QEMU (blocking: reads /proc/<pid>/smaps)."""
    if record.pid is None:
        raise VMError(f"sandbox {record.id} has no QEMU pid to measure")
    usage = procmem.ram_usage(record.pid, record.config.mem_mib << 20)
    return SandboxCost(
        sandbox_id=record.id, ram_bytes=usage.ram_bytes, shared_bytes=usage.shared_bytes,
        private_bytes=usage.private_bytes,
        untouched_bytes=max(0, usage.ram_bytes - usage.shared_bytes - usage.private_bytes),
        disk_bytes=own_disk_bytes(record))


class SandboxCosts:
    """Reads the cost of one sandbox, or the sum over every live one (for /metrics)."""

    def __init__(self, table: SandboxTable) -> None:
        self._table = table
        self._totals: tuple[float, dict[str, int]] | None = None

    async def of(self, sandbox_id: str) -> SandboxCost:
        """404 unknown, 409 hibernated (no QEMU: it holds no RAM), 502 its QEMU died."""
        sandbox_id = self._table.resolve(sandbox_id)
        record = self._table.records.get(sandbox_id)
        if record.hibernation is not None:
            raise Conflict(f"sandbox {sandbox_id!r} is hibernated: it holds no RAM on the host now, and "
                           "its disk is in its hibernation; wake it (any request) to measure it")
        self._table.get(sandbox_id)  # a live VM, or the usual 404/502
        return await asyncio.to_thread(cost_of, record)

    def totals(self) -> dict[str, int]:
        """Shared, private and disk bytes summed over every live sandbox (a sandbox's shared pages
        count once per sandbox that reads them), kept for TOTALS_TTL_SECS."""
        now = time.monotonic()
        if self._totals is not None and now - self._totals[0] < TOTALS_TTL_SECS:
            return self._totals[1]
        sums = {"shared": 0, "private": 0, "disk": 0}
        for sandbox_id in self._table.ids():
            vm = self._table.vm(sandbox_id)
            if vm is None or not vm.process.alive() or not self._table.records.has(sandbox_id):
                continue
            try:
                cost = cost_of(self._table.records.get(sandbox_id))
            except (ForkdError, OSError):
                continue  # it went while we read: the next scrape has it right
            sums["shared"] += cost["shared_bytes"]
            sums["private"] += cost["private_bytes"]
            sums["disk"] += cost["disk_bytes"]
        self._totals = (now, sums)
        return sums
