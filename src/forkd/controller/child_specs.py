"""What each child of a spawn (or a fork) gets besides its snapshot: ``ChildSpec``, and ``child_specs``,
the one place a request's options become one spec per child.

Its own module because every owner that starts children hands the Spawner specs (a spawn, a fork,
a pool refill, a workspace's resume, a paused sandbox's), and building them from options is a pure
function of those options, checked before any VM starts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from forkd import bounds
from forkd.controller.options import SpawnOptions
from forkd.errors import InvalidRequest
from forkd.guest import protocol
from forkd.guest.protocol import RestoreInputs


@dataclass(frozen=True)
class ChildSpec:
    """What one child gets besides the snapshot: its host limits, labels, and what its guest is
    given at restore (``restore``: the one value ``VM.restore`` and a warm-pool claim both take)."""

    memory_limit_mib: int | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    cpu_limit: float | None = None
    pids_limit: int | None = None
    disk_quota_mib: int | None = None  # None: the daemon's default (DiskLimits.quota_for)
    restore: RestoreInputs = field(default_factory=RestoreInputs)
    # The id to register it under; None: a fresh one. A paused sandbox resumes
    # under the id it had (controller/suspend.py), which must be free by then.
    sandbox_id: str | None = None
    # Shared volumes it mounts besides its snapshot's (a spawn's ``volumes``, as recorded: their
    # slots follow the snapshot's entries); Volumes.spawn_entries checked them.
    volumes: tuple[dict[str, Any], ...] = ()

    @property
    def cgroup_limits(self) -> bool:
        """Whether the child needs a cgroup of its own."""
        return any(v is not None for v in (self.memory_limit_mib, self.cpu_limit, self.pids_limit))


def child_specs(n: int, options: SpawnOptions, child_memory_limit_mib: list[int | None] | None = None
                ) -> list[ChildSpec]:
    """One spec per child of a spawn (or fork, whose ``child_memory_limit_mib`` gives each child its
    own limit): ``env`` for all, then ``child_env[i]`` over it for child i, added to the options'
    ``guest`` inputs as they are: a new guest input needs no code here."""
    bounds.SPAWN_N.check(n)
    child_env = options.child_env
    for name, per_child in (("child_env", child_env), ("child_memory_limit_mib", child_memory_limit_mib)):
        if per_child is not None and len(per_child) != n:
            raise InvalidRequest(f"{name} has {len(per_child)} entries but {n} children were asked for; "
                                 "give one entry per child")
    try:
        common = protocol.check_env(options.env)
        own = [protocol.check_env(e) for e in child_env] if child_env is not None else [{}] * n
        for e in (common, *own):
            bounds.ENV.check_map(e)
        restore = [dataclasses.replace(options.guest, env={**common, **own[i]}) for i in range(n)]
    except protocol.RequestError as exc:
        raise InvalidRequest(str(exc)) from None
    metadata = options.metadata or {}
    bounds.METADATA.check_map(metadata)
    reserved = sorted(k for k in metadata if k in bounds.FORK_LABELS)
    if reserved:
        # promote trusts these labels (replace_parent kills fork_parent_id): only a fork-tree sets them.
        raise InvalidRequest(f"metadata keys {', '.join(reserved)} are set by fork-tree itself")
    if options.cpu_limit is not None:
        bounds.CPU_LIMIT.check(options.cpu_limit)
    if options.pids_limit is not None:
        bounds.PIDS_LIMIT.check(options.pids_limit)
    limits = child_memory_limit_mib or [None] * n
    tree = options.fork_tree
    return [ChildSpec(memory_limit_mib=limits[i] if limits[i] is not None else options.memory_limit_mib,
                      metadata={**metadata, **tree.for_child(i)} if tree else dict(metadata),
                      cpu_limit=options.cpu_limit, pids_limit=options.pids_limit,
                      disk_quota_mib=options.disk_quota_mib, restore=restore[i]) for i in range(n)]


__all__ = ["ChildSpec", "child_specs"]
