"""The gateway's view of the fleet: which hosts hold a live lease, read from etcd.

It re-reads ``forkd/hosts/`` every ``interval`` seconds (a range read of a few
KB). A host whose key is gone (its lease expired or was revoked) leaves the
view at the next read; every request proxied to it is then cut short (see
:meth:`Membership.gone`), so a dead host never holds a caller for longer than
its lease TTL plus one interval. If etcd itself cannot be read, the last view
is kept and marked stale; placement goes on with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from forkd.errors import InvalidRequest
from forkd.fleet.etcd import EtcdClient, EtcdError
from forkd.fleet.hosts import KEY_PREFIX, HostRecord

log = logging.getLogger("forkd.gateway")


class Membership:
    def __init__(self, etcd: EtcdClient, interval: float = 0.5) -> None:
        self._etcd = etcd
        self.interval = interval
        self._hosts: dict[str, HostRecord] = {}
        self._gone: dict[str, asyncio.Event] = {}
        self._task: asyncio.Task[None] | None = None
        self.read_at = 0.0  # monotonic time of the last good read
        self.last_error: str | None = None

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._run(), name="fleet-membership")

    async def stop(self) -> None:
        if self._task is not None:  # cancelled and awaited, so it cannot outlive the loop
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._etcd.close()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.refresh()

    async def refresh(self) -> None:
        try:
            kvs = await self._etcd.get_prefix(KEY_PREFIX)
        except EtcdError as exc:
            if self.last_error is None:
                log.warning("gateway: cannot read the fleet from etcd: %s (keeping the last view)", exc)
            self.last_error = str(exc)
            return
        hosts: dict[str, HostRecord] = {}
        for kv in kvs:
            try:
                record = HostRecord.from_json(kv.value)
            except InvalidRequest as exc:
                log.warning("gateway: ignoring %s: %s", kv.key, exc)
                continue
            if kv.key == record.key():
                hosts[record.host_id] = record
        for host_id in set(self._hosts) - set(hosts):
            log.warning("gateway: host %s left the fleet (its lease ended)", host_id)
            self._gone.pop(host_id, asyncio.Event()).set()
        for host_id in set(hosts) - set(self._hosts):
            log.info("gateway: host %s joined the fleet at %s", host_id, hosts[host_id].url)
        self._hosts = hosts
        self.read_at = time.monotonic()
        self.last_error = None

    def hosts(self) -> dict[str, HostRecord]:
        return dict(self._hosts)

    def get(self, host_id: str) -> HostRecord | None:
        return self._hosts.get(host_id)

    def gone(self, host_id: str) -> asyncio.Event:
        """Set once ``host_id`` leaves the fleet (at once if it is not in it now)."""
        event = self._gone.setdefault(host_id, asyncio.Event())
        if host_id not in self._hosts:
            event.set()
            self._gone.pop(host_id, None)
        return event


__all__ = ["Membership"]
