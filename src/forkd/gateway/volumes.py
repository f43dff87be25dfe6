"""Named volumes through the gateway. A volume's files (or its disk) stay on the host that made
it, so everything that names one goes there:

* a call on one volume (forkd's ``/v1/volumes/{name}...``, E2B's ``/volumes/{id}`` and its
  content API ``/volumecontent/{id}/...``) goes to the host holding it;
* a spawn or a snapshot that mounts volumes is placed among the hosts holding all of them;
* a create goes to the host already holding that name (which answers its 409), else to the
  ``X-Forkd-Host`` one, else the least loaded;
* the lists merge every host's.

Which host holds a volume is read from the hosts' records in etcd; a volume made since a
record was last written is found by asking each host (``GET /v1/volumes/{name}``, with the
gateway's host token). Names are checked against the daemon's own rule before any of that.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from forkd.config import API_VERSION
from forkd.fleet.hosts import HostRecord
from forkd.fleet.placement import volume_holders
from forkd.gateway.answers import e2b_error, error, json_field
from forkd.gateway.proxy import HostFailed
from forkd.store.volume_spec import NAME_RE

if TYPE_CHECKING:
    from forkd.gateway.core import Gateway

# Volumes one request may name before the gateway stops placing by them (a host refuses more).
MAX_NAMED = 16


def named_volumes(body: bytes, field: str) -> list[str] | None:
    """The volume names a spawn's or a snapshot's JSON ``body`` mounts (``field``: forkd's
    ``volumes``, E2B's ``volumeMounts``; each entry's ``name``), or None when the body says
    something the gateway does not place by (not JSON, too many, a bad name, a ``host_path``):
    the host it goes to answers that in its own words."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    entries = data.get(field) if isinstance(data, dict) else None
    if entries is None:
        return []
    if not isinstance(entries, list) or len(entries) > MAX_NAMED:
        return None
    names = [entry.get("name") if isinstance(entry, dict) else None for entry in entries]
    if not all(isinstance(name, str) and NAME_RE.match(name) for name in names):
        return None
    return sorted({str(name) for name in names})


class VolumeRoutes:
    def __init__(self, gateway: Gateway) -> None:
        self._gw = gateway

    async def holding(self, names: Sequence[str]) -> list[HostRecord]:
        """The live hosts holding every volume of ``names``, least loaded first: as their records
        say, else (a volume made since its host's record was written) as each host answers."""
        hosts = self._gw.alive()
        known = volume_holders(hosts, names)
        if known or not names:
            return known
        answers = await asyncio.gather(*(self._has_all(h, names) for h in hosts))
        return [h for h, has in zip(hosts, answers, strict=True) if has]

    async def _has_all(self, host: HostRecord, names: Sequence[str]) -> bool:
        for name in names:
            try:
                found = await self._gw.proxy.call(host, "GET", f"/{API_VERSION}/volumes/{name}",
                                                  timeout=self._gw.settings.list_timeout)
            except HostFailed:
                return False
            if found.status_code != 200:
                return False
        return True

    async def create(self, request: Request, *, e2b: bool = False) -> Response:
        """``POST /v1/volumes`` or E2B's ``POST /volumes``: to the holder of that name, if any."""
        gw = self._gw
        body = await request.body()
        pinned, refusal = gw.pinned(request)
        if refusal is not None:
            return refusal
        name = json_field(body, "name")
        existing = await self.holding([name]) if name is not None and NAME_RE.match(name) else []
        targets = existing or [h for h in gw.alive() if pinned is None or h.host_id == pinned]
        return await gw.first_reachable(request, targets, body, e2b=e2b)

    async def to_holder(self, request: Request, name: str, *, e2b: bool = False,
                        stream_in: bool = False) -> Response:
        """A call on volume ``name``, at its host; an upload (``stream_in``) and a file's
        download relayed as they come. A volume no host holds: the first host answers its 404."""
        gw = self._gw
        holders = await self.holding([name]) if NAME_RE.match(name) else []
        body = None if stream_in else await request.body()
        if not holders:
            return await gw.first_reachable(request, gw.alive()[:1], body, e2b=e2b)
        stream_out = request.method == "GET" and request.url.path.endswith("/file")
        try:
            return await gw.proxy.forward(holders[0], request, body, stream_response=stream_out, e2b=e2b)
        except HostFailed as exc:
            return (e2b_error if e2b else error)(exc.status, str(exc))

    async def placed(self, body: bytes, field: str) -> list[HostRecord] | None:
        """Where a spawn or snapshot whose ``body`` mounts volumes (under ``field``) can run: the
        hosts holding them all; None when it names none the gateway places by, or no host holds
        them all (then it is placed as without volumes, and its host answers which it lacks)."""
        names = named_volumes(body, field)
        if not names:
            return None
        return await self.holding(names) or None


__all__ = ["MAX_NAMED", "VolumeRoutes", "named_volumes"]
