"""Where the gateway sends work: a host that holds the snapshot, else the least loaded.

Pure functions over host records, so the rule is tested without a fleet.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

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


def spread_plan(hosts: Iterable[HostRecord], source_host: str, count: int) -> list[tuple[HostRecord, int]]:
    """How many of a spread fork's ``count`` children each host gets, the source's host first.

    The source's host takes the first child (it branches, so it holds the snapshot: no
    download); the others can only start from the object store, so only hosts with one
    take part. Each further child goes to the host that would then be least loaded, by
    sandboxes per capacity counting what this plan already gave it, then by free
    memory (an even split among equal hosts); a host that holds a warm pool is no help
    here, since a fork's branch is new. Hosts given nothing are left out.
    """
    pool = list(hosts)
    source = next((h for h in pool if h.host_id == source_host), None)
    if source is None or count < 1:
        return []
    others = [h for h in pool if h.host_id != source_host and h.store] if source.store else []
    given = {h.host_id: 0 for h in [source, *others]}
    given[source.host_id] = 1
    members = [source, *others]
    for _ in range(count - 1):
        best = min(members, key=lambda h: ((h.sandboxes + given[h.host_id]) / max(1, h.capacity),
                                           given[h.host_id], -h.mem_available_mib, h.host_id))
        given[best.host_id] += 1
    return [(h, given[h.host_id]) for h in members if given[h.host_id]]


def holders(hosts: Iterable[HostRecord], tag: str) -> list[HostRecord]:
    """Hosts that hold ``tag``, least loaded first."""
    return by_load(h for h in hosts if tag in h.snapshots)


def volume_holders(hosts: Iterable[HostRecord], names: Collection[str]) -> list[HostRecord]:
    """Hosts whose records name every volume of ``names``, least loaded first. A volume stays on
    the host that made it, so a sandbox that mounts several runs where they all are."""
    wanted = set(names)
    return by_load(h for h in hosts if wanted <= set(h.volumes))


__all__ = ["by_load", "holders", "spawn_candidates", "spread_plan", "volume_holders"]
