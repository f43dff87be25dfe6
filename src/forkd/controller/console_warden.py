"""Keeps every VM's console log capped while the daemon runs (see vmm/console.py).

One background task for all VMs: templates being booted, children, and the
branch helpers, found by where their run directories live. It stats each log
once a second, in a worker thread, so a guest that floods its console costs
the host at most about a second of its output beyond the cap.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from forkd.config import DataDir
from forkd.controller.background import cancel_and_wait
from forkd.vmm import console

log = logging.getLogger("forkd.console")


def console_logs(data: DataDir) -> list[Path]:
    """The console log of every VM under ``data``: children, templates, branch helpers."""
    patterns = ("sandboxes/*/console.log", "snapshots/.*/console.log", "snapshots/.*/helper/console.log")
    return [p for pattern in patterns for p in data.root.glob(pattern)]


class ConsoleWarden:
    def __init__(self, data: DataDir, interval: float = console.CHECK_INTERVAL_SECS,
                 max_bytes: int = console.MAX_BYTES) -> None:
        self._data = data
        self._interval = interval
        self._max_bytes = max_bytes
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="console-warden")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    def sweep(self) -> int:
        """Cap every log once; how many were cut."""
        return console.cap_all(console_logs(self._data), self._max_bytes)

    async def _run(self) -> None:
        while True:
            try:
                cut = await asyncio.to_thread(self.sweep)
                if cut:
                    log.warning("capped %d guest console log(s) at %d bytes", cut, self._max_bytes)
            except Exception:  # the warden must outlive any one bad file
                log.exception("console warden sweep failed")
            await asyncio.sleep(self._interval)
