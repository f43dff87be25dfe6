"""A small async etcd v3 client over etcd's JSON gateway (``/v3/...``), with httpx.

Only what membership needs: leases (grant, keep alive, revoke) and keys (put,
range by prefix, delete). Keys and values travel base64-encoded, as the JSON
gateway wants. Every call has a timeout and tries the next endpoint when one
cannot be reached, so a dead etcd member never hangs a caller. (etcd 3.4, as
Debian ships it, serves this gateway on its client port.)
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import httpx

from forkd.errors import ForkdError

DEFAULT_TIMEOUT = 3.0


class EtcdError(ForkdError):
    """etcd could not be reached or refused a request (503: the fleet's coordinator is unavailable)."""

    status = 503


class LeaseGone(EtcdError):
    """etcd no longer knows the lease named (it expired): register again under a new one."""


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _unb64(text: str) -> str:
    return base64.b64decode(text).decode()


def prefix_end(prefix: str) -> str:
    """The key just past every key starting with ``prefix`` (etcd's range_end for a prefix)."""
    raw = prefix.encode()
    return (raw[:-1] + bytes([raw[-1] + 1])).decode()


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: str
    lease: int


class EtcdClient:
    def __init__(self, endpoints: list[str], timeout: float = DEFAULT_TIMEOUT) -> None:
        if not endpoints:
            raise ValueError("etcd needs at least one endpoint URL")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout))

    async def close(self) -> None:
        await self._client.aclose()

    async def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        errors = []
        for endpoint in self.endpoints:
            try:
                r = await self._client.post(f"{endpoint}/v3/{path}", json=body)
            except httpx.HTTPError as exc:
                errors.append(f"{endpoint}: {type(exc).__name__}: {exc}")
                continue
            if "requested lease not found" in r.text[:1000]:
                # A put under a lease that expired (the host was cut off past its TTL): the
                # caller must grant a new one, not retry this one for ever.
                raise LeaseGone(f"etcd {endpoint}: lease not found ({path})")
            if r.status_code != 200:
                raise EtcdError(f"etcd {endpoint} answered {r.status_code} to {path}: {r.text[:300]}")
            data: dict[str, Any] = r.json()
            if "error" in data:
                raise EtcdError(f"etcd {endpoint} refused {path}: {data.get('message') or data['error']}")
            return data
        raise EtcdError(f"no etcd endpoint answered {path}: {'; '.join(errors)}")

    async def grant(self, ttl: int) -> int:
        data = await self._call("lease/grant", {"TTL": ttl})
        return int(data["ID"])

    async def keepalive(self, lease: int) -> int:
        """Refresh ``lease``; returns its TTL, 0 when it has already expired (its keys are gone)."""
        data = await self._call("lease/keepalive", {"ID": str(lease)})
        return int((data.get("result") or {}).get("TTL") or 0)

    async def revoke(self, lease: int) -> None:
        await self._call("lease/revoke", {"ID": str(lease)})

    async def put(self, key: str, value: str, lease: int | None = None) -> None:
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease is not None:
            body["lease"] = str(lease)
        await self._call("kv/put", body)

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        data = await self._call("kv/range", {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))})
        return [KeyValue(_unb64(kv["key"]), _unb64(kv.get("value", "")), int(kv.get("lease", 0)))
                for kv in data.get("kvs", [])]

    async def delete(self, key: str) -> None:
        await self._call("kv/deleterange", {"key": _b64(key)})


__all__ = ["EtcdClient", "EtcdError", "KeyValue", "LeaseGone", "prefix_end"]
