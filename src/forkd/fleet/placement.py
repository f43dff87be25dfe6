"""Where the gateway sends work: a host that holds the snapshot, else the least loaded.

Pure functions over host records, so the rule is tested without a fleet.
"""

from __future__ import annotations

from collections.abc import Iterable

from forkd.fleet.hosts import HostRecord


def by_load(hosts: Iterable[HostRecord]) -> list[HostRecord]:
    """Least loaded first (sandboxes per capacity), then most free memory, then by id (stable)."""
    return sorted(hosts, key=lambda h: (h.load, -h.mem_available_mib, h.host_id))


def spawn_candidates(hosts: Iterable[HostRecord], tag: str, pinned: str | None = None) -> list[HostRecord]:
    """Hosts to try for a spawn of ``tag``, best first.

    ``pinned`` (the ``X-Forkd-Host`` header) names the one host to use. Otherwise
    hosts holding ``tag`` come first (a warm pool of it first, then by load): no
    download. Then the others by load, which pull the snapshot from the store
    (only hosts that have a store can). The caller tries them in order while a
    host cannot be reached.
    """
    pool = list(hosts)
    if pinned is not None:
        return [h for h in pool if h.host_id == pinned]
    holders = sorted((h for h in pool if tag in h.snapshots),
                     key=lambda h: (h.pools.get(tag, 0) == 0, h.load, -h.mem_available_mib, h.host_id))
    others = by_load(h for h in pool if tag not in h.snapshots and h.store)
    return holders + others


def holders(hosts: Iterable[HostRecord], tag: str) -> list[HostRecord]:
    """Hosts that hold ``tag``, least loaded first."""
    return by_load(h for h in hosts if tag in h.snapshots)


__all__ = ["by_load", "holders", "spawn_candidates"]
