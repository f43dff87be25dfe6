"""Disk quotas: how far a sandbox's own disk layers may grow on the host.

A sandbox writes a qcow2 overlay in its run directory; left alone it grows up to
the guest disk's virtual size (issue 24: 196 KiB to 1.62 GiB in 30 s). With a
quota (``disk_quota_mib``, per spawn; the daemon's ``--disk-quota-mib`` when the
spawn gives none; 0: none) QEMU itself watches the overlay: ``block-set-write-
threshold`` on the overlay's protocol (file) node, at the bytes the quota has
left, and QEMU sends ``BLOCK_WRITE_THRESHOLD`` as soon as a write goes past it.
No polling: one task per limited sandbox waits for that event.

Counted: every layer in the sandbox's run directory (its overlay, and the frozen
overlays its branches left; ``SandboxRecord.disk_used_bytes``). A BRANCH moves
the sandbox to a new overlay (vmm/branching.py), so the threshold is armed
again there (``after_disk_cut``) with what the quota has left.

A sandbox over its quota is stopped like one over its memory limit: its QEMU is
killed and the sandbox stays, dead, until it is killed; every call says why
(``SandboxTable.stop``). Stopping rather than pausing frees its memory, and a
paused sandbox could not finish a write anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

from forkd.bounds import DEFAULT_DISK_QUOTA_MIB
from forkd.controller.background import cancel_and_wait
from forkd.controller.sandbox_events import SandboxEvents
from forkd.controller.sandboxes import SandboxTable
from forkd.errors import ForkdError, VMError
from forkd.store.records import SandboxRecord
from forkd.store.rows.sandboxes import SandboxReader
from forkd.vmm.machine import VM

log = logging.getLogger("forkd.disk_quota")

MIB = 1 << 20


def stop_reason(record: SandboxRecord, used: int | None) -> str:
    grew = f" (its disk layers take {used / MIB:.0f} MiB)" if used is not None else ""
    return (f"stopped by its disk quota: it wrote past disk_quota_mib={record.disk_quota_mib} MiB"
            f"{grew}")


class DiskQuotas:
    def __init__(self, sandboxes: SandboxReader, table: SandboxTable, events: SandboxEvents,
                 default_mib: int = DEFAULT_DISK_QUOTA_MIB) -> None:
        """``default_mib``: the quota of a spawn that gives none (0: none)."""
        self._sandboxes = sandboxes
        self._table = table
        events.on_removed(self.after_removed)
        self.default_mib = default_mib
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._armed: dict[str, str] = {}  # sandbox id -> the file node its threshold is on

    def quota_for(self, asked: int | None) -> int | None:
        """The quota a child gets (MiB): what it asked for, else the daemon's default; None: none."""
        quota = self.default_mib if asked is None else asked
        return quota or None

    # ----------------------------------------------------------------- life

    async def start(self) -> None:
        """Watch the re-adopted sandboxes again (an event sent while no daemon ran is lost:
        arming again finds a sandbox already over its quota)."""
        for sb in self._sandboxes.all():
            if sb.disk_quota_mib and not sb.pooled and sb.id in self._table:
                with contextlib.suppress(ForkdError, OSError):
                    await self.limit(sb)

    async def stop(self) -> None:
        for sandbox_id in list(self._watchers):
            await self._forget(sandbox_id)

    async def after_removed(self, record: SandboxRecord) -> None:
        """``SandboxEvents.removed`` hook: its watcher goes with it."""
        await self._forget(record.id)

    async def _forget(self, sandbox_id: str) -> None:
        self._armed.pop(sandbox_id, None)
        await cancel_and_wait(self._watchers.pop(sandbox_id, None))

    # ----------------------------------------------------------------- quotas

    async def limit(self, record: SandboxRecord) -> None:
        """Enforce ``record.disk_quota_mib`` on a live sandbox from now on."""
        vm = self._table.vm(record.id)
        if not record.disk_quota_mib or vm is None:
            return
        await self._forget(record.id)
        listening = asyncio.Event()
        self._watchers[record.id] = asyncio.create_task(
            self._watch(record.id, vm, listening), name=f"forkd-disk-quota:{record.id}")
        await listening.wait()  # the listener is in place before the threshold is: no event is missed
        await self.arm(record.id)

    async def after_disk_cut(self, sandbox_id: str) -> None:
        """Brancher hook: the sandbox writes a new overlay now; arm its threshold."""
        if sandbox_id in self._watchers:
            await self.arm(sandbox_id)

    async def arm(self, sandbox_id: str) -> None:
        """Set the threshold of the overlay the sandbox writes now at what its quota has left."""
        record = self._sandboxes.get(sandbox_id)
        vm = self._table.vm(sandbox_id)
        if not record.disk_quota_mib or vm is None:
            return
        overlay = Path(record.disk.file)
        used = record.disk_used_bytes() or 0
        left = max(0, record.disk_quota_mib * MIB - used)
        # The overlay grows at its end: the next write past what the quota has left fires the
        # event (with nothing left, the next growth at all; the caller may hold the sandbox's lock,
        # so the stop is always the watcher's).
        node = await vm.file_node(overlay)
        self._armed[sandbox_id] = node  # before the threshold: its event may come at once
        await vm.limit_disk_writes(node, overlay.stat().st_size + left)

    async def _watch(self, sandbox_id: str, vm: VM, listening: asyncio.Event) -> None:
        with vm.disk_write_events() as events:
            listening.set()
            while True:
                event: dict[str, Any] = dict(await events.get())
                data: dict[str, Any] = event.get("data") or {}
                node = data.get("node-name")
                if node != self._armed.get(sandbox_id):
                    continue  # a layer the sandbox no longer writes (a branch moved it on)
                try:
                    record = self._sandboxes.get(sandbox_id)
                except ForkdError:
                    return
                log.info("sandbox %s wrote past its disk quota (%s)", sandbox_id, data)
                try:
                    await self._table.stop(sandbox_id, stop_reason(record, record.disk_used_bytes()))
                except (ForkdError, OSError) as exc:
                    raise VMError(f"could not stop sandbox {sandbox_id} over its disk quota: {exc}") from exc
                return


__all__ = ["DEFAULT_DISK_QUOTA_MIB", "DiskQuotas"]
