"""The options of a spawn and of a fork, as one typed value each.

``SpawnOptions`` flows unchanged from the request model (``SpawnRequest.options()``
in api/schemas/requests.py) to ``Runtime.spawn``, the ``Spawner`` and the warm pools'
claim key: a new spawn option is one field here and one in the request model,
and nothing unpacks it by hand in between. What a child's guest is given at restore
is one ``RestoreInputs`` (guest/protocol.py), ``SpawnOptions.guest``, filled from the
request's fields of the same names: a new guest input is a field there and in the
request model, and none here. It goes on from the Spawner, one per child with its
env, to ``VM.restore`` and to a warm-pool claim alike. ``ForkOptions`` is a fork's: the
SpawnOptions of its children plus the fields only a fork has.

Import-light on purpose (no VMM, no QEMU client): the API's schemas build these
values without importing the VMM.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from forkd import bounds
from forkd.errors import Conflict, InvalidRequest
from forkd.guest.protocol import RequestError, RestoreInputs
from forkd.host.egress import EgressPolicy
from forkd.store.volume_spec import VolumeMount

# The request's two egress fields, which become one ``EgressPolicy``.
EGRESS_FIELDS = ("allow_internet_access", "network")
# Options only the E2B layer sets: forkd's own API always wakes a hibernated sandbox,
# so /v1's SpawnRequest has no field for them.
E2B_ONLY_FIELDS = ("auto_resume", "hibernate_on_timeout_memory")
# The request fields that are guest inputs (``SpawnOptions.guest``): every RestoreInputs field but
# env, which is a spawn's own (merged per child with child_env), and trust, which the daemon sets
# (the sandbox's egress CA; no request may name what a guest trusts).
GUEST_FIELDS = tuple(f.name for f in dataclasses.fields(RestoreInputs)
                     if f.name != "env" and f.name not in RestoreInputs.DAEMON_ONLY)


def option_names() -> set[str]:
    """The request field names ``SpawnOptions.from_request`` takes, the egress pair as ``egress``."""
    return {f.name for f in dataclasses.fields(SpawnOptions) if f.name != "guest"} | set(GUEST_FIELDS)


@dataclass(frozen=True)
class TreeLabels:
    """A fork-tree's labels for children started by a spawn: a fleet gateway's share of a spread
    fork-tree placed on another host than the source's (gateway/spread.py). Child i gets
    fork_index ``first_index + i``."""

    tree_id: str
    parent_id: str
    first_index: int = 0

    def for_child(self, i: int) -> dict[str, str]:
        tree, parent, index = bounds.FORK_LABELS
        return {tree: self.tree_id, parent: self.parent_id, index: str(self.first_index + i)}


@dataclass(frozen=True)
class SpawnOptions:
    """Everything a spawn of ``n`` children of a snapshot may ask for, besides the tag and ``n``.

    ``timeout_secs``: each child is killed that long after the spawn returns (a
    claimed warm-pool member's clock starts at its claim). ``cpu_limit`` (cores)
    and ``pids_limit`` (QEMU's tasks) go in each child's cgroup, as does
    ``memory_limit_mib``. ``idle_pause_secs``: a child that long without a
    request is paused and resumed by its next one (controller/idle.py);
    ``idle_hibernate_secs``: hibernated (to disk, its QEMU gone) and woken by its
    next one (controller/hibernation.py). ``hibernate_on_timeout``: at its
    ``timeout_secs`` a child is hibernated rather than killed (E2B's ``autoPause``);
    ``hibernate_on_timeout_memory`` False: that hibernation keeps the disk alone, and the wake
    cold-boots it (E2B's ``autoPauseMemory: false``, a filesystem-only pause at the timeout);
    ``auto_resume`` False: once hibernated, E2B traffic no longer wakes it, only a resume
    (E2B's ``connect``) does (E2B's ``autoResume``; forkd's own API always wakes it).
    ``egress`` opens the children's outbound traffic, denied by default
    (host/egress.py). ``prewarm``: read the snapshot's memory into the page
    cache first. ``disk_quota_mib``: how far each child's own disk layers may
    grow on the host before it is stopped (controller/disk_quota.py); None: the
    daemon's default, 0: no quota. ``guest``: what each child's guest is given at its restore
    besides ``env`` (guest/protocol.py's ``RestoreInputs``: ``hostname``, ...); its fields are
    the request's of the same names. ``env`` and ``child_env`` stay here: they are merged per
    child (``child_specs``).
    """

    per_child_netns: bool = False
    memory_limit_mib: int | None = None
    live_fork: bool = False
    env: dict[str, str] | None = None
    child_env: list[dict[str, str]] | None = None
    metadata: dict[str, str] | None = None
    fork_tree: TreeLabels | None = None
    timeout_secs: float | None = None
    cpu_limit: float | None = None
    pids_limit: int | None = None
    idle_pause_secs: float | None = None
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    prewarm: bool = False
    disk_quota_mib: int | None = None
    idle_hibernate_secs: float | None = None
    hibernate_on_timeout: bool = False
    hibernate_on_timeout_memory: bool = True
    auto_resume: bool = True
    guest: RestoreInputs = field(default_factory=RestoreInputs)
    # hostdir volumes each child mounts besides its snapshot's (fork "shared"; Volumes.resolve checks them)
    volumes: list[VolumeMount] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.fork_tree, Mapping):  # from a request body (the only nested option)
            object.__setattr__(self, "fork_tree", TreeLabels(**self.fork_tree))
        # The checks that need no snapshot, before any VM starts (child_specs checks the rest;
        # RestoreInputs checked its own fields as it was made).
        if self.guest.env:
            raise InvalidRequest("a spawn's env is its own option (env, child_env), not the guest inputs'")
        if self.disk_quota_mib is not None:
            bounds.DISK_QUOTA_MIB.check(self.disk_quota_mib)
        _check_lifetimes(self.timeout_secs, self.idle_pause_secs, self.idle_hibernate_secs,
                         self.hibernate_on_timeout, live_fork=self.live_fork,
                         per_child_netns=self.per_child_netns)
        if not self.hibernate_on_timeout_memory and not self.hibernate_on_timeout:
            raise InvalidRequest("hibernate_on_timeout_memory false says what the timeout's hibernation "
                                 "keeps: it needs hibernate_on_timeout")

    @classmethod
    def from_request(cls, given: Mapping[str, Any]) -> SpawnOptions:
        """The options of a request body's fields (``model_dump(exclude_unset=True)``):
        each field of the same name as it is, the egress pair as one policy, and a
        400 for a field this daemon does not know. Unset fields keep the defaults above."""
        return cls(**request_fields(cls, given, "spawn"))

    def given(self) -> dict[str, Any]:
        """The options that differ from the defaults (what a request set), by request field name."""
        default = SpawnOptions()
        given = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                 if f.name != "guest" and getattr(self, f.name) != getattr(default, f.name)}
        return {**given, **self.guest.to_wire()}


@dataclass(frozen=True)
class ForkOptions:
    """A fork of a running sandbox: its children's ``SpawnOptions`` (the source keeps its own egress
    and lifetimes), plus what only a fork has: ``child_memory_limit_mib`` (one entry per child)
    and ``keep_snapshot`` (keep the branch the children come from)."""

    spawn: SpawnOptions = field(default_factory=SpawnOptions)
    child_memory_limit_mib: list[int | None] | None = None
    keep_snapshot: bool = False

    # The request fields that are a fork's own; every other one is a spawn option of its children.
    OWN: ClassVar[tuple[str, ...]] = ("child_memory_limit_mib", "keep_snapshot")

    @classmethod
    def from_request(cls, given: Mapping[str, Any]) -> ForkOptions:
        """As ``SpawnOptions.from_request``, for a fork's request body."""
        fields = dict(given)
        own = {name: fields.pop(name) for name in cls.OWN if name in fields}
        return cls(spawn=SpawnOptions(**request_fields(SpawnOptions, fields, "fork")), **own)


def request_fields(cls: type, given: Mapping[str, Any], what: str) -> dict[str, Any]:
    """A request's fields as ``cls``'s (a dataclass of options) keyword arguments: the egress pair
    as one policy; 400 for a field ``cls`` lacks."""
    fields = dict(given)
    if any(name in fields for name in EGRESS_FIELDS):
        fields["egress"] = EgressPolicy.from_request(fields.pop("allow_internet_access", None),
                                                     fields.pop("network", None))
    guest = {name: fields.pop(name) for name in GUEST_FIELDS if name in fields}
    if guest:
        try:
            fields["guest"] = RestoreInputs(**guest)
        except RequestError as exc:
            raise InvalidRequest(str(exc)) from None
    if isinstance(fields.get("volumes"), list):
        # Each entry a VolumeMount (store/volume_spec.py), checked where it is used (its check()).
        fields["volumes"] = [v if isinstance(v, VolumeMount) else VolumeMount(**v) for v in fields["volumes"]]
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise InvalidRequest(f"this daemon does not support {what} option(s): {', '.join(unknown)}")
    return fields


def _check_lifetimes(timeout_secs: float | None, idle_pause_secs: float | None,
                     idle_hibernate_secs: float | None, hibernate_on_timeout: bool, *,
                     live_fork: bool, per_child_netns: bool) -> None:
    """The bounds of a child's lifetime options, and the sandboxes that cannot be hibernated."""
    if timeout_secs is not None:
        bounds.SANDBOX_TIMEOUT_SECS.check(timeout_secs)
    if idle_pause_secs is not None:
        bounds.IDLE_PAUSE_SECS.check(idle_pause_secs)
    if idle_hibernate_secs is not None:
        bounds.IDLE_HIBERNATE_SECS.check(idle_hibernate_secs)
    if idle_hibernate_secs is not None or hibernate_on_timeout:
        # Refused now rather than at the first idle period (controller/hibernation.py says why).
        for name, on in (("live_fork", live_fork), ("per_child_netns", per_child_netns)):
            if on:
                raise Conflict(f"{name} sandboxes cannot be hibernated: idle_hibernate_secs and "
                               f"hibernate_on_timeout do not go with {name}")


__all__ = ["E2B_ONLY_FIELDS", "EGRESS_FIELDS", "ForkOptions", "SpawnOptions", "TreeLabels", "request_fields"]
