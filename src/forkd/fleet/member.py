"""A daemon's membership in the fleet: its host record in etcd, under a lease it keeps alive.

While the daemon runs, :class:`FleetMember` keeps ``forkd/hosts/<host-id>``
current (what it holds changes as snapshots and sandboxes come and go) and
refreshes its lease every third of the TTL. If the daemon dies, nobody
refreshes the lease, etcd deletes the key once the TTL runs out, and the
gateway stops placing work there and reports its sandboxes gone. A lease that
expired anyway (etcd unreachable for longer than the TTL) is granted anew.
On a clean stop the lease is revoked at once.

It knows nothing of the daemon's internals: the daemon (api/app.py) hands it
``describe``, which builds the :class:`HostRecord` from the Runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable

from forkd.fleet.etcd import EtcdClient, EtcdError, LeaseGone
from forkd.fleet.hosts import HostRecord

log = logging.getLogger("forkd.fleet")

MIN_TTL = 2  # etcd refuses shorter leases than about 1.5 s


class FleetMember:
    def __init__(self, etcd: EtcdClient, describe: Callable[[], HostRecord], ttl: int) -> None:
        if ttl < MIN_TTL:
            raise ValueError(f"lease TTL must be at least {MIN_TTL} s")
        self._etcd = etcd
        self._describe = describe
        self._ttl = ttl
        self._lease: int | None = None
        self._published: HostRecord | None = None
        self._refreshed = 0.0
        self._task: asyncio.Task[None] | None = None
        self.last_error: str | None = None

    @property
    def tick(self) -> float:
        """How often it looks for changes; keepalives go every third of the TTL."""
        return min(1.0, self._ttl / 3)

    async def start(self) -> None:
        """Register now (a failure is logged and retried in the background) and keep it current."""
        await self.step()
        self._task = asyncio.create_task(self._run(), name="fleet-member")

    async def stop(self) -> None:
        if self._task is not None:  # cancelled and awaited, so it cannot outlive the loop
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task = None
        if self._lease is not None:
            with contextlib.suppress(EtcdError):
                await self._etcd.revoke(self._lease)  # gone from the fleet now, not in TTL seconds
            self._lease = None
        await self._etcd.close()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.tick)
            await self.step()

    async def step(self) -> None:
        """One round: register if needed, publish changes, refresh the lease when due."""
        record = self._describe()
        try:
            if self._lease is None:
                self._lease = await self._etcd.grant(self._ttl)
                self._refreshed = time.monotonic()
                self._published = None
                log.info("fleet: registered as %s (%s) under lease %x, TTL %ds",
                         record.host_id, record.url, self._lease, self._ttl)
            if self._published is None or _content(record) != _content(self._published):
                await self._etcd.put(record.key(), record.to_json(), lease=self._lease)
                self._published = record
            if time.monotonic() - self._refreshed >= self._ttl / 3:
                if await self._etcd.keepalive(self._lease) <= 0:
                    log.warning("fleet: lease %x expired; registering again", self._lease)
                    self._lease = None
                    return
                self._refreshed = time.monotonic()
            self.last_error = None
        except LeaseGone:
            log.warning("fleet: lease %x expired; registering again", self._lease or 0)
            self._lease = None
        except EtcdError as exc:
            if self.last_error is None:
                log.warning("fleet: cannot reach etcd: %s (retrying every %.1fs)", exc, self.tick)
            self.last_error = str(exc)


def _content(record: HostRecord) -> HostRecord:
    return dataclasses.replace(record, updated_at_unix=0.0, mem_available_mib=record.mem_available_mib // 256)


__all__ = ["FleetMember"]
