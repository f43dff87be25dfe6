"""What a fleet host tells the others about itself: its record under its lease in etcd.

``forkd/hosts/<host-id>`` holds one JSON :class:`HostRecord`; the key lives
under the host's lease, so it disappears when the host stops refreshing it.
The record is bounded (it is read by every gateway on every poll).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from forkd import bounds
from forkd.errors import InvalidRequest

KEY_PREFIX = "forkd/hosts/"
MAX_TAGS = 10_000  # snapshots named in one record; more are left out (placement then pulls)
MAX_VOLUMES = 10_000  # volumes named in one record; more are left out (found by asking)
MIB_PER_SANDBOX = 512  # the default capacity: one sandbox per 512 MiB of host RAM


def default_capacity() -> int:
    """How many sandboxes this host is planned for, when --capacity does not say."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return 8
    return max(1, total // (MIB_PER_SANDBOX << 20))


def mem_available_mib() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


@dataclass(frozen=True)
class HostRecord:
    host_id: str
    url: str  # where the gateway reaches its REST API
    capacity: int  # sandboxes it is planned for (placement only; not enforced)
    sandboxes: int = 0
    snapshots: list[str] = field(default_factory=list)  # ready tags it holds
    pools: dict[str, int] = field(default_factory=dict)  # tag -> paused members ready
    mem_available_mib: int = 0
    store: bool = False  # whether it can pull from (and push to) the object store
    updated_at_unix: float = 0.0
    volumes: list[str] = field(default_factory=list)  # named volumes it holds (they stay on it)

    @property
    def load(self) -> float:
        """Fraction of its capacity in use: placement picks the lowest."""
        return self.sandboxes / max(1, self.capacity)

    def key(self) -> str:
        return KEY_PREFIX + self.host_id

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> HostRecord:
        try:
            d: dict[str, Any] = json.loads(text)
            record = cls(
                host_id=str(d["host_id"]), url=str(d["url"]), capacity=int(d["capacity"]),
                sandboxes=int(d.get("sandboxes", 0)),
                snapshots=[str(t) for t in d.get("snapshots", [])][:MAX_TAGS],
                pools={str(k): int(v) for k, v in (d.get("pools") or {}).items()},
                mem_available_mib=int(d.get("mem_available_mib", 0)), store=bool(d.get("store", False)),
                updated_at_unix=float(d.get("updated_at_unix", 0.0)),
                volumes=[str(v) for v in d.get("volumes", [])][:MAX_VOLUMES])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidRequest(f"bad host record: {exc}") from None
        if not bounds.HOST_ID_RE.match(record.host_id):
            raise InvalidRequest(f"bad host record: host id {record.host_id!r}")
        if not record.url.startswith(("http://", "https://")):
            raise InvalidRequest(f"bad host record: url {record.url!r}")
        return record

    def info(self) -> dict[str, Any]:
        """What ``GET /v1/fleet`` shows of it."""
        return {**asdict(self), "load": round(self.load, 4)}


__all__ = ["KEY_PREFIX", "MAX_TAGS", "MAX_VOLUMES", "HostRecord", "default_capacity", "mem_available_mib"]
