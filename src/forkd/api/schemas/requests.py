"""Request bodies of the REST API v1 (pydantic v2).

Strict (no "5" for 5, no "true" for true) and closed to unknown fields, so a
typo such as ``{"snapshot-tag": ...}`` is a 400 instead of a silently ignored
option.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, Self

from pydantic import (
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

from forkd import bounds
from forkd.api.schemas.common import (
    ENV_NAME_PATTERN,
    GUEST_PATH_PATTERN,
    INTERNET_HELP,
    MODULE_PATTERN,
    NETWORK_HELP,
    TAP_PATTERN,
    TREE_ID_PATTERN,
    BranchMode,
    CpuLimit,
    CString,
    DiskQuotaMib,
    EnvMap,
    EnvName,
    IdleHibernate,
    IdlePause,
    JSONInt,
    Labels,
    MemoryLimitMib,
    NetworkPolicy,
    NonEmptyCString,
    PidsLimit,
    RequestModel,
    RunAs,
    SandboxId,
    SandboxTimeout,
    Tag,
)
from forkd.api.schemas.volumes import VolumeSpec
from forkd.config import DEFAULT_IMAGE, DEFAULT_MEM_MIB, DEFAULT_VCPUS
from forkd.controller.options import ForkOptions, SpawnOptions
from forkd.guest.protocol import FILE_PATH_MAX, HOSTNAME_MAX, HOSTNAME_RE
from forkd.guest.volume_messages import MAX_SLOTS as SHARED_SLOTS
from forkd.host.egress import EgressPolicy


class CreateSnapshotRequest(RequestModel):
    tag: Tag = Field(description="Name of the new snapshot.", examples=["py"])
    image: Tag = Field(
        DEFAULT_IMAGE, description="Guest image to boot; build it first with `forkd image build`."
    )
    kernel: NonEmptyCString | None = Field(
        None, description="Host path of an uncompressed ELF vmlinux; default: the image's."
    )
    rootfs: NonEmptyCString | None = Field(
        None, description="Host path of an ext4 root filesystem; default: the image's."
    )
    rw: bool = Field(
        True,
        description="Accepted for compatibility with the seeds and ignored: the root disk is always "
        "attached read-write (children's overlays must be writable and their device config must match).",
    )
    nic: bool = Field(
        False, description="Give the template, and so every child, a network device (eth0 with an "
        "address, a route and DNS). The daemon makes the namespace and tap: no host set-up.",
    )
    tap: Annotated[str, StringConstraints(pattern=TAP_PATTERN)] | None = Field(
        None, description="Name of the NIC's tap device inside each sandbox's namespace (default "
        "forkd-tap0); giving it implies nic.",
    )
    allow_internet_access: bool = Field(False, description="The template's own egress while it boots "
                                        "and runs setup (e.g. pip install). " + INTERNET_HELP)
    network: NetworkPolicy | None = Field(None, description="The template's own egress. " + NETWORK_HELP)
    boot_wait_secs: float = Field(
        120,
        **bounds.BOOT_WAIT_SECS.field_kwargs(),
        description="Upper bound on waiting for the warm guest agent to answer after boot.",
    )
    mem_mib: JSONInt = Field(
        DEFAULT_MEM_MIB, **bounds.MEM_MIB.field_kwargs(), description="Guest RAM in MiB."
    )
    vcpus: JSONInt = Field(DEFAULT_VCPUS, **bounds.VCPUS.field_kwargs(), description="Guest vCPUs.")
    warm_imports: list[Annotated[str, StringConstraints(pattern=MODULE_PATTERN)]] | None = Field(
        None,
        max_length=bounds.MAX_WARM_IMPORTS,
        description="Python modules PID 1 imports before the snapshot; default: numpy.",
    )
    setup: list[Annotated[list[CString], Field(min_length=1)]] = Field(
        default_factory=list,
        max_length=bounds.MAX_SETUP_STEPS,
        description="argv lists run in the guest, in order, before the snapshot is taken.",
    )
    setup_eval: list[CString] = Field(
        default_factory=list,
        max_length=bounds.MAX_SETUP_STEPS,
        description="Python code run in the warm PID 1 interpreter before the snapshot "
        "(e.g. load a dataset); children inherit the result in memory.",
    )
    setup_timeout_secs: float = Field(
        600, **bounds.SETUP_TIMEOUT_SECS.field_kwargs(),
        description="Timeout of each setup command and each setup_eval step.",
    )
    volumes: list[VolumeSpec] = Field(
        default_factory=list, max_length=bounds.MAX_VOLUMES,
        description="Volumes mounted before setup runs: ext4 ones as virtio disks, hostdir ones served "
        "live (fork shared); every child and branch of the snapshot gets them back (docs/BRANCHING.md "
        "says how they fork).",
    )


# A child's hostname: RFC 1123 labels, as guest/protocol.py's check_hostname says (the daemon, through
# SpawnOptions, and the agent check it again); the length bound comes before the pattern.
HOSTNAME_PATTERN = f"^{HOSTNAME_RE.pattern}$"
Hostname = Annotated[str, StringConstraints(max_length=HOSTNAME_MAX, pattern=HOSTNAME_PATTERN)]
HOSTNAME_HELP = ("Each child's hostname, set in the guest at its restore (what hostname and uname -n say, "
                 "/etc/hostname, and a 127.0.1.1 line of /etc/hosts): RFC 1123 labels joined by dots, at "
                 "most 64 characters. Default: the snapshot's.")


class ForkTreeLabels(RequestModel):
    tree_id: Annotated[str, StringConstraints(pattern=TREE_ID_PATTERN)] = Field(
        description="The fork-tree's id (its other children's fork_tree_id).")
    parent_id: SandboxId = Field(description="The tree's source sandbox, on whichever host it runs.")
    first_index: JSONInt = Field(ge=0, le=int(bounds.SPAWN_N.high),
                                 description="fork_index of the first child.")


class SpawnRequest(RequestModel):
    snapshot_tag: Tag = Field(description="Registered snapshot to fork from.", examples=["py"])
    n: JSONInt = Field(1, **bounds.SPAWN_N.field_kwargs(), description="Number of children to fork.")
    per_child_netns: bool = Field(
        False, description="Place each child in the namespace forkd-child-<i> (lowest free i): one "
        "scripts/netns-setup.sh provisioned is used as it is; a missing one is made and removed with the "
        "child. Without it, children of a snapshot with a NIC get a namespace forkd-<id> of their own.",
    )
    allow_internet_access: bool = Field(False, description=INTERNET_HELP)
    network: NetworkPolicy | None = Field(None, description=NETWORK_HELP)
    memory_limit_mib: MemoryLimitMib | None = Field(None, description="cgroup memory limit per child (MiB).")
    live_fork: bool = Field(
        False, description="Boot children so that they can later take mode=live branches."
    )
    env: EnvMap | None = Field(
        None, description="Environment given to every child right after its restore: it shows in "
        "os.environ of the warm interpreter (eval) and in every exec.",
    )
    child_env: list[EnvMap] | None = Field(
        None, description="One environment per child (length n), applied over env.",
    )
    metadata: Labels | None = Field(
        None, description="Labels stored with every child, returned in SandboxInfo and usable as a "
        "list filter (GET /v1/sandboxes?metadata=key=value).",
    )
    cpu_limit: CpuLimit | None = Field(
        None, description="CPU bandwidth per child in cores (0.5: half "
        "a core), a cgroup cpu quota on its QEMU.",
    )
    pids_limit: PidsLimit | None = Field(
        None, description="Most tasks (threads) of each child's QEMU "
        "(cgroup pids.max); guest processes are not host tasks.",
    )
    timeout_secs: SandboxTimeout | None = Field(
        None, description="Kill each child (and free its resources) this many seconds after the spawn "
        "returns; POST /v1/sandboxes/{id}/timeout moves the deadline. Default: no deadline.",
    )
    idle_pause_secs: IdlePause | None = Field(
        None, description="Pause each child (QMP stop: it costs no CPU) once it has had no request for "
        "this many seconds; its next request of any kind resumes it and steps its clock first. "
        "Default: never, since a child with background work must not be paused behind its user's back.",
    )
    idle_hibernate_secs: IdleHibernate | None = Field(
        None, description="Hibernate each child once it has had no request for this many seconds: "
        "the guest pages it changed and its device state go to disk (compressed), its QEMU, cgroup and "
        "network are released; its next request of any kind wakes it (same id, address and egress "
        "policy, memory, disk and processes intact) and steps its clock first. Not with live_fork or "
        "per_child_netns. Default: never.",
    )
    hibernate_on_timeout: bool = Field(
        False, description="At timeout_secs, hibernate each child rather than kill it (E2B's "
        "autoPause): it stays listed as hibernated until killed, and its next request wakes it.",
    )
    prewarm: bool = Field(
        False, description="forkd 0.5 clients' option: read the snapshot's memory file into the host's "
        "page cache before the children start, so their first page touches (and their first BRANCH) "
        "do not wait on the disk. Children come from a warm pool of this snapshot whenever one is set, "
        "with or without it.",
    )
    hugepages: bool = Field(
        False, description="Accepted from forkd 0.5 clients and without effect: children map their "
        "snapshot's memory file privately (copy-on-write), which hugetlbfs pages cannot back; "
        "forkd 0.5 also fell back to 4 KiB pages when none were free.",
    )
    disk_quota_mib: DiskQuotaMib | None = Field(
        None, description="How far each child's own disk layers (its copy-on-write overlay, and what "
        "its branches froze) may grow on the host, in MiB. A child that writes past it is stopped: its "
        "QEMU is killed and every call answers 502 saying so, as after an OOM kill by memory_limit_mib. "
        "Default: the daemon's --disk-quota-mib (1024 unless set); 0: no quota.",
    )
    hostname: Hostname | None = Field(None, description=HOSTNAME_HELP)
    volumes: list[VolumeSpec] | None = Field(
        None, max_length=SHARED_SLOTS,
        description="hostdir volumes (POST /v1/volumes with fs hostdir) each child mounts besides its "
        "snapshot's: one set of files that every sandbox mounting it reads and writes at once (fork "
        "shared; docs/BRANCHING.md#shared-volumes). An ext4 volume is a disk, attached when a snapshot "
        "is made: naming one here is 400.",
    )
    fork_tree: ForkTreeLabels | None = Field(
        None, description="What a fleet gateway sets when it places part of a spread fork-tree on this "
        "host: the children get the tree's labels (fork_tree_id, fork_parent_id, and fork_index counted "
        "from first_index) as the tree's other children did, so promote finds them. The labels are "
        "otherwise set only by fork-tree itself.",
    )

    # Request fields that are not spawn options: the tag and count, and what is accepted without effect.
    NOT_OPTIONS: ClassVar[frozenset[str]] = frozenset({"snapshot_tag", "n", "hugepages"})

    def options(self) -> SpawnOptions:
        """The spawn options this request asks for: every field by its name (a new field needs no
        code here), unset ones left to SpawnOptions' defaults."""
        return SpawnOptions.from_request(self.model_dump(exclude=set(self.NOT_OPTIONS), exclude_unset=True))


class ExecRequest(RequestModel):
    args: list[CString] = Field(
        min_length=1,
        description="argv of the subprocess.",
        examples=[["python3", "-c", "print(2+2)"]],
    )
    timeout_secs: float = Field(
        30, **bounds.EXEC_TIMEOUT_SECS.field_kwargs(), description="Kill the subprocess after this."
    )
    env: dict[EnvName, CString] | None = Field(
        None,
        description="Extra environment variables.",
        # pydantic renders key constraints as patternProperties, which leaves
        # non-matching names unconstrained; propertyNames states the real rule.
        json_schema_extra={"propertyNames": {"pattern": ENV_NAME_PATTERN}},
    )
    cwd: NonEmptyCString | None = Field(None, description="Working directory in the guest.")
    stdin: str | None = Field(None, description="Text fed to the subprocess's standard input.")
    user: RunAs = None


class EvalRequest(RequestModel):
    code: str = Field(
        min_length=1,
        description="Python code run in the warm PID 1 interpreter, like the REPL: the value of a "
        "trailing expression is the result.",
        examples=["numpy.zeros(5).sum()"],
    )
    timeout_secs: float = Field(
        int(bounds.EVAL_TIMEOUT_SECS), **bounds.EVAL_TIMEOUT.field_kwargs(),
        description="Interrupt the evaluation after this long (it answers TimeoutError).",
    )


class MkdirRequest(RequestModel):
    path: Annotated[str, StringConstraints(pattern=GUEST_PATH_PATTERN)] = Field(
        max_length=FILE_PATH_MAX, examples=["/work/data"],
                                  description="Absolute guest path of the directory.")
    parents: bool = Field(False, description="Also create missing parents; an existing directory is fine.")
    user: RunAs = None


class BranchRequest(RequestModel):
    # The cross-field rules, also stated in the JSON Schema so that clients
    # and generated tests know them: mode excludes the legacy diff/live; at
    # most one of diff, live and measure_diff (which measures a full branch);
    # wait=false only for a live branch.
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {"not": {"required": ["mode", "diff"],
                         "properties": {"mode": {"type": "string"}, "diff": {"type": "boolean"}}}},
                {"not": {"required": ["mode", "live"],
                         "properties": {"mode": {"type": "string"}, "live": {"type": "boolean"}}}},
                {"not": {"required": ["diff", "live"],
                         "properties": {"diff": {"const": True}, "live": {"const": True}}}},
                {
                    "if": {"required": ["measure_diff"], "properties": {"measure_diff": {"const": True}}},
                    "then": {"properties": {"diff": {"not": {"const": True}},
                                            "live": {"not": {"const": True}},
                                            "mode": {"anyOf": [{"const": "full"}, {"type": "null"}]}}},
                },
                {
                    "if": {"required": ["wait"], "properties": {"wait": {"const": False}}},
                    "then": {"anyOf": [
                        {"required": ["mode"], "properties": {"mode": {"const": "live"}}},
                        {"required": ["live"], "properties": {"live": {"const": True},
                                                              "mode": {"type": "null"}}},
                    ]},
                },
            ]
        }
    )

    tag: Tag | None = Field(
        None, description="Tag of the new snapshot; default branch-<source-id>-<seq> (seq counts per source)."
    )
    mode: BranchMode | None = Field(None, description="full (default), diff or live.")
    diff: bool | None = Field(
        None, description="Legacy v0.3 spelling of mode=diff; mutually exclusive with mode."
    )
    live: bool | None = Field(
        None, description="Legacy forkd 0.4 spelling of mode=live; mutually exclusive with mode.")
    wait: bool = Field(True, description="mode=live only: false returns as soon as the source resumes.")
    measure_diff: bool = Field(
        False, description="forkd 0.5's measurement hook, for a full branch: the answer adds what a "
        "dirty-page diff would have cost (diff_physical_bytes, diff_logical_bytes, diff_ms; see "
        "docs/API.md). Not with diff or live.",
    )
    parent_tag: Tag | None = Field(
        None, description="forkd 0.5 chain edge, checked, not chosen: every branch is recorded on the "
        "snapshot its source's disk sits on, and this must name that snapshot or the one the source was "
        "forked from (else 409).",
    )

    @model_validator(mode="after")
    def _mode_rules(self) -> Self:
        if self.mode is not None and (self.diff is not None or self.live is not None):
            raise ValueError("'mode' and the legacy 'diff'/'live' are mutually exclusive; send only 'mode'")
        if bool(self.diff) + bool(self.live) + self.measure_diff > 1 or (
                self.measure_diff and self.mode not in (None, "full")):
            raise ValueError("set at most one of 'measure_diff', 'diff' and 'live' (or use 'mode'): "
                             "measure_diff measures a full branch")
        if not self.wait and self.effective_mode != "live":
            raise ValueError("'wait': false is only meaningful with 'mode': 'live'")
        return self

    @property
    def effective_mode(self) -> BranchMode:
        if self.mode is not None:
            return self.mode
        if self.live:
            return "live"
        return "diff" if self.diff else "full"


class ForkRequest(RequestModel):
    count: JSONInt = Field(1, **bounds.SPAWN_N.field_kwargs(), description="Number of children.")
    per_child_netns: bool = Field(False, description="As in POST /v1/sandboxes.")
    allow_internet_access: bool = Field(False, description="The children's egress (the source keeps "
                                        "its own). " + INTERNET_HELP)
    network: NetworkPolicy | None = Field(None, description="The children's egress. " + NETWORK_HELP)
    memory_limit_mib: MemoryLimitMib | None = Field(None, description="cgroup memory limit per child (MiB).")
    child_memory_limit_mib: list[MemoryLimitMib | None] | None = Field(
        None, description="One memory limit per child (length count); null entries use memory_limit_mib.",
    )
    live_fork: bool = Field(False, description="Children can later take mode=live branches.")
    env: EnvMap | None = Field(None, description="Environment for every child (see POST /v1/sandboxes).")
    child_env: list[EnvMap] | None = Field(None, description="One environment per child, over env.")
    metadata: Labels | None = Field(None, description="Labels for every child.")
    timeout_secs: SandboxTimeout | None = Field(
        None, description="Kill each child this many seconds after the fork returns (the source keeps "
        "its own deadline). Default: no deadline.",
    )
    keep_snapshot: bool = Field(
        False, description="Keep the intermediate snapshot. Default: it is deleted once its last child "
        "is gone (and no snapshot depends on it).",
    )
    idle_pause_secs: IdlePause | None = Field(None, description="As in POST /v1/sandboxes, for each "
                                                  "child.")
    idle_hibernate_secs: IdleHibernate | None = Field(None, description="As in POST /v1/sandboxes, "
                                                          "for each child.")
    hostname: Hostname | None = Field(None, description=HOSTNAME_HELP)

    spread: bool = Field(
        False, description="Through a fleet gateway: place the children on several hosts (the source's "
        "host branches and takes the first, the branch goes to the object store, the others start from "
        "it), and keep the branch, since children elsewhere read from it. A daemon alone forks every "
        "child itself.")

    # Fields of the request that are not fork options.
    NOT_OPTIONS: ClassVar[frozenset[str]] = frozenset({"count", "spread"})

    def options(self) -> ForkOptions:
        """The fork options this request asks for: every field by its name (a new field needs no
        code here), unset ones left to ForkOptions' defaults."""
        return ForkOptions.from_request(self.model_dump(exclude=set(self.NOT_OPTIONS), exclude_unset=True))


class CompactRequest(RequestModel):
    to: Tag = Field(description="Tag of the new, standalone snapshot; must not exist yet.",
                    examples=["py-flat"])


class CreateWorkspaceRequest(RequestModel):
    name: Tag = Field(description="The workspace's name, unique on this daemon.", examples=["agent-1"])
    snapshot_tag: Tag = Field(description="Snapshot its sandbox is forked from.", examples=["py"])
    per_child_netns: bool = Field(False, description="As in POST /v1/sandboxes.")
    memory_limit_mib: MemoryLimitMib | None = Field(None, description="cgroup memory limit (MiB).")


class SuspendWorkspaceRequest(RequestModel):
    diff: bool = Field(
        False, description="Branch its state with mode diff (shorter pause, state as of the end of "
        "the copy) instead of full (state as of the request); the sandbox stops either way.",
    )


class HibernateRequest(RequestModel):
    memory: bool = Field(
        True, description="Keep its memory (the pages it changed and its device state): its wake "
        "resumes it where it stopped. False: keep its disk alone (the guest syncs it first): its wake "
        "cold-boots its template's kernel on that disk, same id, address and egress policy; files "
        "survive, processes, kernels and memory do not (E2B's pause(keep_memory=False)).",
    )


class TimeoutRequest(RequestModel):
    timeout_secs: SandboxTimeout = Field(
        description="The sandbox is killed this many seconds from now, whether that is sooner or later "
        "than its previous deadline (E2B's set_timeout).",
    )


class NetworkUpdateRequest(NetworkPolicy):
    """A running (or hibernated) sandbox's new network policy: it replaces the whole policy, as a
    spawn would set it (an omitted field takes a spawn's default)."""

    allow_internet_access: bool = Field(False, description=INTERNET_HELP)

    def egress(self) -> EgressPolicy:
        network = self.model_dump(exclude={"allow_internet_access"})
        return EgressPolicy.from_request(self.allow_internet_access, network)


class PromoteRequest(RequestModel):
    tree_id: Annotated[str, StringConstraints(pattern=TREE_ID_PATTERN)] | None = Field(
        None, description="The fork-tree; default: the winner's metadata fork_tree_id.",
    )
    cleanup_siblings: bool = Field(True, description="Kill every other live child of the tree.")
    replace_parent: bool = Field(
        False, description="Also kill the tree's source; its id then names the winner in every endpoint.",
    )


class ApplyRequest(RequestModel):
    from_: SandboxId = Field(alias="from", description="The sandbox whose changes to apply: its diff "
                             "against the snapshot it was forked from (a child of the target, typically).")
    paths: list[Annotated[str, StringConstraints(min_length=1, max_length=4096)]] | None = Field(
        None, max_length=64, description="Only changes under these paths (absolute prefixes, or names "
        "such as *.py); default: every change a diff shows.")


class CheckpointPolicyRequest(RequestModel):
    every: JSONInt = Field(**bounds.CHECKPOINT_EVERY.field_kwargs(),
                           description="Branch after every N exec/eval calls.")
    keep: JSONInt = Field(3, **bounds.CHECKPOINT_KEEP.field_kwargs(),
                          description="How many of the newest checkpoints to keep; older ones are deleted.")
    mode: Literal["diff", "live"] = Field("diff", description="Branch mode (live needs live_fork).")


class PoolRequest(RequestModel):
    size: JSONInt = Field(**bounds.POOL_SIZE.field_kwargs(),
                          description="Paused children to keep ready; 0 drains the pool.")
    memory_limit_mib: MemoryLimitMib | None = Field(
        None, description="Members get this cgroup memory limit; only spawns asking for it draw from "
        "the pool.",
    )
    per_child_netns: bool = Field(
        False, description="Members run in forkd-child-<i> namespaces; only such spawns draw from the pool.",
    )
    live_fork: bool = Field(False, description="Members can take mode=live branches; only live_fork spawns "
                            "draw from the pool.")
    allow_internet_access: bool = Field(False, description="Members' egress; only spawns asking for the "
                                        "same egress draw from the pool.")
    network: NetworkPolicy | None = Field(None, description="Members' egress lists; only spawns asking for "
                                          "the same draw from the pool.")

class PushRequest(RequestModel):
    force: bool = Field(False, description="Replace a different snapshot of the same tag in the store.")
