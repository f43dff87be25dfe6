"""Request and response bodies of the REST API v1 (pydantic v2).

Request models are strict (no "5" for 5, no "true" for true) and forbid
unknown fields, so a typo such as ``{"snapshot-tag": ...}`` is a 400 instead
of a silently ignored option. Response models allow extra fields: the runtime
may report more than the seeds list (e.g. exec timings) and the API should
pass that through rather than drop it.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

from forkd import bounds
from forkd.config import DEFAULT_IMAGE, DEFAULT_MEM_MIB, DEFAULT_VCPUS
from forkd.controller.options import SpawnOptions
from forkd.errors import InvalidRequest
from forkd.guest.protocol import FILE_PATH_MAX, TAG_MAX
from forkd.host.egress import ENTRY_PATTERN, Destination

# One definition of each name and bound (forkd.bounds), shared with the runtime's checks.
TAG_PATTERN = bounds.TAG_RE.pattern
TREE_ID_PATTERN = r"^ft-[0-9a-f]{12}$"  # controller/forks.py: f"ft-{secrets.token_hex(6)}"
SANDBOX_ID_PATTERN = bounds.SANDBOX_ID_RE.pattern
TAP_PATTERN = bounds.TAP_RE.pattern
MODULE_PATTERN = bounds.MODULE_RE.pattern
# execve() cannot carry NUL bytes. Saying so in the schema (rather than in a
# validator) keeps the OpenAPI document honest about what is accepted.
NO_NUL_PATTERN = r"^[^\x00]*$"
NON_EMPTY_NO_NUL_PATTERN = r"^[^\x00]+$"
ENV_NAME_PATTERN = r"^[^=\x00]+$"
GUEST_PATH_PATTERN = r"^/[^\x00]*$"  # absolute, no NUL (forkd.guest.protocol.check_path)

Tag = Annotated[str, StringConstraints(pattern=TAG_PATTERN)]
SandboxId = Annotated[str, StringConstraints(pattern=SANDBOX_ID_PATTERN)]
BranchMode = Literal["full", "diff", "live"]
CString = Annotated[str, StringConstraints(pattern=NO_NUL_PATTERN)]
NonEmptyCString = Annotated[str, StringConstraints(pattern=NON_EMPTY_NO_NUL_PATTERN)]
EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME_PATTERN)]
# Who runs a command or a file operation in the guest: one definition for every body that takes
# it (exec, processes, mkdir) and the file routes' ``user`` query parameter.
GUEST_USER_PATTERN = bounds.GUEST_USER_RE.pattern
GUEST_USER_HELP = (
    "The guest user to act as, by name from the guest's /etc/passwd (every image has \"user\", "
    "uid 1000, home /home/user): its uid, gid and groups, HOME/USER/LOGNAME, its home as the default "
    "working directory, and files it writes are its own. Omitted: root, in the agent's own "
    "environment (working directory /root), as before. A name the guest does not know is a 400."
)
GuestUserName = Annotated[str, StringConstraints(pattern=GUEST_USER_PATTERN)]
RunAs = Annotated[GuestUserName | None, Field(None, description=GUEST_USER_HELP, examples=["user"])]


def _integral_float_to_int(value: Any) -> Any:
    # JSON has one number type and JSON Schema's "integer" admits 31.0; some
    # clients (JavaScript) cannot tell 31 from 31.0. Accept integral floats,
    # still reject 2.5, "5" and booleans.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JSONInt = Annotated[int, BeforeValidator(_integral_float_to_int)]
# pydantic renders key constraints as patternProperties, which leaves
# non-matching names unconstrained; propertyNames states the real rule.
EnvMap = Annotated[
    dict[Annotated[str, StringConstraints(pattern=ENV_NAME_PATTERN, max_length=bounds.ENV.max_key)],
         Annotated[str, StringConstraints(pattern=NO_NUL_PATTERN, max_length=bounds.ENV.max_value)]],
    Field(max_length=bounds.ENV.max_entries, json_schema_extra={
        "propertyNames": {"pattern": ENV_NAME_PATTERN, "maxLength": bounds.ENV.max_key}}),
]
Labels = Annotated[
    dict[Annotated[str, StringConstraints(min_length=1, max_length=bounds.METADATA.max_key)],
         Annotated[str, StringConstraints(max_length=bounds.METADATA.max_value)]],
    Field(max_length=bounds.METADATA.max_entries),
]
# Bounds before the BeforeValidator: the other way round pydantic renders
# them as unknown keywords ("ge") instead of minimum/maximum.
MemoryLimitMib = Annotated[
    int, Field(**bounds.MEMORY_LIMIT_MIB.field_kwargs()), BeforeValidator(_integral_float_to_int)
]
SandboxTimeout = Annotated[float, Field(**bounds.SANDBOX_TIMEOUT_SECS.field_kwargs())]
IdlePause = Annotated[float, Field(**bounds.IDLE_PAUSE_SECS.field_kwargs())]
CpuLimit = Annotated[float, Field(**bounds.CPU_LIMIT.field_kwargs())]
PidsLimit = Annotated[int, Field(**bounds.PIDS_LIMIT.field_kwargs()), BeforeValidator(_integral_float_to_int)]
DiskQuotaMib = Annotated[
    int, Field(**bounds.DISK_QUOTA_MIB.field_kwargs()), BeforeValidator(_integral_float_to_int)
]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow")


def _egress_entry(value: str) -> str:
    """The entry's own 400 message (domain names, IPv6, ports) rather than a bare pattern mismatch."""
    try:
        Destination.parse(value, "entry")
    except InvalidRequest as exc:
        raise ValueError(str(exc)) from None
    return value


# The pattern is documented, not enforced by pydantic: _egress_entry says what is wrong.
EgressEntry = Annotated[str, StringConstraints(min_length=1, max_length=bounds.MAX_EGRESS_ENTRY_CHARS),
                        AfterValidator(_egress_entry), Field(json_schema_extra={"pattern": ENTRY_PATTERN})]
EGRESS_ENTRY_HELP = ("an IPv4 address or CIDR, optionally with :PORT or :FIRST-LAST (TCP and UDP), "
                     "e.g. \"10.0.0.0/8\", \"192.0.2.7:443\", \"198.51.100.0/24:8000-8100\"")


class NetworkPolicy(_Request):
    """Fine-grained egress (E2B's ``network``): allow-list and deny-list of destinations."""

    allow_out: list[EgressEntry] = Field(
        default_factory=list, max_length=bounds.MAX_EGRESS_ENTRIES,
        description=f"Destinations always open (allow wins over deny); each {EGRESS_ENTRY_HELP}. "
        "Opens private ranges and the host too (the host is the sandboxes' gateway, e.g. 10.201.0.1).",
    )
    deny_out: list[EgressEntry] = Field(
        default_factory=list, max_length=bounds.MAX_EGRESS_ENTRIES,
        description=f"Destinations closed even with allow_internet_access; each {EGRESS_ENTRY_HELP}.",
    )


INTERNET_HELP = ("Open outbound traffic to the public internet (denied by default): every destination "
                 "but private, link-local, loopback and multicast ranges, the host and other sandboxes. "
                 "Needs a snapshot with a NIC, and net.ipv4.ip_forward=1 on the host.")
NETWORK_HELP = "Finer egress: allow_out / deny_out lists of destinations. Needs a snapshot with a NIC."


# --------------------------------------------------------------------- requests


class CreateSnapshotRequest(_Request):
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


class SpawnRequest(_Request):
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

    # Request fields that are not spawn options: the tag and count, and what is accepted without effect.
    NOT_OPTIONS: ClassVar[frozenset[str]] = frozenset({"snapshot_tag", "n", "hugepages"})

    def options(self) -> SpawnOptions:
        """The spawn options this request asks for: every field by its name (a new field needs no
        code here), unset ones left to SpawnOptions' defaults."""
        return SpawnOptions.from_request(self.model_dump(exclude=set(self.NOT_OPTIONS), exclude_unset=True))


class ExecRequest(_Request):
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


class EvalRequest(_Request):
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


OutputEncoding = Literal["text", "base64"]
ProcessArgs = Annotated[list[CString], Field(min_length=1, description="argv of the process.",
                                             examples=[["python3", "-u", "train.py"]])]
ProcessEnv = Annotated[dict[EnvName, CString] | None, Field(
    None, description="Extra environment variables.",
    json_schema_extra={"propertyNames": {"pattern": ENV_NAME_PATTERN}})]
ProcessTag = Annotated[str | None, Field(None, max_length=TAG_MAX,
                                         description="Any label of yours, shown in the process list.")]


class ProcessStartRequest(_Request):
    args: ProcessArgs
    timeout_secs: float | None = Field(
        None, **bounds.EXEC_TIMEOUT_SECS.field_kwargs(),
        description="Kill the process group after this long; default: no limit.")
    env: ProcessEnv = None
    cwd: NonEmptyCString | None = Field(None, description="Working directory in the guest.")
    stdin: str | None = Field(None, description="Text written to standard input first.")
    stdin_open: bool = Field(False, description="Keep standard input open after stdin, for "
                             "POST .../processes/{pid}/stdin; else it is closed.")
    tag: ProcessTag = None
    user: RunAs = None


class ExecStreamRequest(ProcessStartRequest):
    """A process started and streamed at once; a client that leaves kills it."""

    encoding: OutputEncoding = Field("text", description="How output events carry the bytes: text "
                                     "(UTF-8, invalid bytes as U+FFFD) or base64 (exact).")


# What base64.b64decode(..., validate=True) accepts.
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


class StdinRequest(_Request):
    # Stated in the JSON Schema too: with encoding=base64, data must be base64.
    model_config = ConfigDict(json_schema_extra={"allOf": [{
        "if": {"required": ["encoding"], "properties": {"encoding": {"const": "base64"}}},
        "then": {"properties": {"data": {"pattern": BASE64_PATTERN}}},
    }]})

    data: str = Field("", description="What to write (text, or base64 with encoding=base64).")
    encoding: OutputEncoding = Field("text", description="How data is given: text (UTF-8) or base64.")
    eof: bool = Field(False, description="Close standard input after data.")


# The signals a process may be sent (by name, as E2B's SDK sends them).
SignalName = Literal["SIGHUP", "SIGINT", "SIGQUIT", "SIGKILL", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGTERM",
                     "SIGCONT", "SIGSTOP", "SIGTSTP", "SIGWINCH"]


class SignalRequest(_Request):
    signal: SignalName = Field(description="The signal, by name.", examples=["SIGTERM"])
    group: bool = Field(True, description="Signal the process's whole process group (it is a session "
                        "leader); false: the process alone.")


class MkdirRequest(_Request):
    path: Annotated[str, StringConstraints(pattern=GUEST_PATH_PATTERN)] = Field(
        max_length=FILE_PATH_MAX, examples=["/work/data"],
                                  description="Absolute guest path of the directory.")
    parents: bool = Field(False, description="Also create missing parents; an existing directory is fine.")
    user: RunAs = None


class BranchRequest(_Request):
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


class ForkRequest(_Request):
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


class CompactRequest(_Request):
    to: Tag = Field(description="Tag of the new, standalone snapshot; must not exist yet.",
                    examples=["py-flat"])


class CreateWorkspaceRequest(_Request):
    name: Tag = Field(description="The workspace's name, unique on this daemon.", examples=["agent-1"])
    snapshot_tag: Tag = Field(description="Snapshot its sandbox is forked from.", examples=["py"])
    per_child_netns: bool = Field(False, description="As in POST /v1/sandboxes.")
    memory_limit_mib: MemoryLimitMib | None = Field(None, description="cgroup memory limit (MiB).")


class SuspendWorkspaceRequest(_Request):
    diff: bool = Field(
        False, description="Branch its state with mode diff (shorter pause, state as of the end of "
        "the copy) instead of full (state as of the request); the sandbox stops either way.",
    )


class TimeoutRequest(_Request):
    timeout_secs: SandboxTimeout = Field(
        description="The sandbox is killed this many seconds from now, whether that is sooner or later "
        "than its previous deadline (E2B's set_timeout).",
    )


class PromoteRequest(_Request):
    tree_id: Annotated[str, StringConstraints(pattern=TREE_ID_PATTERN)] | None = Field(
        None, description="The fork-tree; default: the winner's metadata fork_tree_id.",
    )
    cleanup_siblings: bool = Field(True, description="Kill every other live child of the tree.")
    replace_parent: bool = Field(
        False, description="Also kill the tree's source; its id then names the winner in every endpoint.",
    )


class CheckpointPolicyRequest(_Request):
    every: JSONInt = Field(**bounds.CHECKPOINT_EVERY.field_kwargs(),
                           description="Branch after every N exec/eval calls.")
    keep: JSONInt = Field(3, **bounds.CHECKPOINT_KEEP.field_kwargs(),
                          description="How many of the newest checkpoints to keep; older ones are deleted.")
    mode: Literal["diff", "live"] = Field("diff", description="Branch mode (live needs live_fork).")


class PoolRequest(_Request):
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


# -------------------------------------------------------------------- responses


class SnapshotInfo(_Response):
    tag: str
    dir: str
    created_at_unix: int
    branched_from: str | None = Field(
        None, description="Source sandbox id; present only for snapshots made by BRANCH."
    )
    pause_ms: int | float | None = Field(
        None, description="Measured source pause window in ms; present only for BRANCH snapshots."
    )
    fs_freeze_ms: int | float | None = Field(
        None, description="Live BRANCH only: how long the source's root filesystem was frozen (its "
        "disk writes waited; its CPU work went on), in ms.",
    )
    status: Literal["ready", "writing", "failed"] | None = Field(
        None, description="writing while a live no-wait branch copies memory; then ready or failed."
    )
    error: str | None = Field(None, description="Why the snapshot failed (status=failed).")
    auto_delete: bool | None = Field(
        None, description="Present (true) on a fork's intermediate snapshot: deleted once no sandbox "
        "runs from it and no snapshot depends on it.",
    )
    checkpoint_of: str | None = Field(None, description="The sandbox whose checkpoint policy made it.")
    compacted_from: str | None = Field(None, description="The snapshot a compaction flattened into this one.")
    diff_physical_bytes: int | None = Field(
        None, description="measure_diff: RAM bytes the source wrote since its restore (its private "
        "copy-on-write pages), measured just before the pause: what a dirty-page diff saves.")
    diff_logical_bytes: int | None = Field(None, description="measure_diff: the guest RAM size.")
    diff_ms: float | None = Field(
        None, description="measure_diff: an estimate, not a second capture: this branch's pause "
        "scaled to the share of its captured RAM stream that the written pages make up.")


class SnapshotDetail(SnapshotInfo):
    ancestors: list[str] = Field(
        default_factory=list, description="Snapshot tags this one descends from, nearest first."
    )
    dependents: list[str] = Field(
        default_factory=list,
        description="Snapshot tags descending from this one (all generations), which depend on its files.",
    )
    parent_tag: str | None = Field(None, description="The snapshot this one was branched from, if any.")
    sandboxes: list[str] = Field(default_factory=list, description="Ids of alive sandboxes forked from it.")


class SandboxNetwork(_Response):
    guest_ip: str = Field(description="eth0's address inside the guest: the same in every sandbox.",
                          examples=["172.16.0.2"])
    host_gateway: str = Field(description="The host as the guest sees it (its default gateway).",
                              examples=["10.201.0.1"])
    dns: list[str] = Field(description="The resolvers in the guest's /etc/resolv.conf.")
    allow_internet_access: bool
    allow_out: list[str]
    deny_out: list[str]


class SandboxInfo(_Response):
    id: str = Field(examples=["sb-67a1b3-0000"])
    snapshot_tag: str
    netns: str | None = Field(None, description="The network namespace its QEMU runs in: forkd-child-<i> "
                              "(per_child_netns), forkd-<id> (a snapshot with a NIC), else null.")
    ip: str | None = Field(None, description="Where the host reaches this sandbox: every port of this "
                           "address is forwarded to the guest. Present for snapshots with a NIC.",
                           examples=["10.201.0.7"])
    network: SandboxNetwork | None = Field(None, description="Its network: the guest's view and its egress "
                                           "policy. Present for snapshots with a NIC.")
    guest_addr: str = Field(
        description="How the host reaches the guest agent; here unix:<path> (virtio-serial).",
        examples=["unix:/var/lib/forkd/sandboxes/sb-67a1b3-0000/agent.sock"],
    )
    created_at_unix: int
    pid: int | None = Field(None, description="Host PID of the sandbox's QEMU process.")
    memory_limit_mib: int | None = None
    cpu_limit: float | None = Field(None, description="CPU bandwidth limit in cores, if one was set.")
    pids_limit: int | None = Field(None, description="Task limit of its QEMU's cgroup, if one was set.")
    disk_quota_mib: int | None = Field(None, description="Its disk quota (MiB), if it has one.")
    disk_used_mib: float | None = Field(
        None, description="Host disk its own layers take now (MiB): what it wrote since its spawn, "
        "counted against disk_quota_mib.",
    )
    live_fork: bool | None = None
    timings: dict[str, float] | None = Field(
        None,
        description="Where the fork's time went: seconds from the start of the restore until QEMU was up "
        "(qemu_up_s), the guest ran from the loaded state (restored_s) and its agent answered (ready_s).",
    )
    metadata: dict[str, str] | None = Field(
        None, description="Labels given at spawn; fork-tree children also carry fork_tree_id, "
        "fork_parent_id and fork_index.",
    )
    expires_at_unix: float | None = Field(
        None, description="When the sandbox is killed (unix seconds); absent without a timeout_secs.",
    )
    idle_pause_secs: float | None = Field(
        None, description="Paused after this many idle seconds; absent without idle_pause_secs.",
    )
    state: Literal["running", "paused"] = Field(
        "running", description="paused: stopped after idle_pause_secs without a request; the next "
        "request resumes it.",
    )


class WorkspaceInfo(_Response):
    id: str = Field(examples=["ws-agent-1"])
    name: str
    source_snapshot_tag: str
    status: Literal["running", "suspended", "stale"] = Field(
        description="running: its sandbox is alive; suspended: paused, resumable; stale: neither "
        "(killed or expired); resume starts it again from source_snapshot_tag.")
    live_sandbox_id: str | None = Field(None, description="Its sandbox, while running (the same id "
                                        "across suspend/resume).")
    current_state_tag: str | None = Field(None, description="The state snapshot it resumes from, "
                                          "while suspended.")
    created_at_unix: int
    last_active_unix: int


class ForkError(_Response):
    index: int = Field(description="Which child (0-based) failed.")
    error: str


class ForkResponse(_Response):
    parent_id: str = Field(description="The source sandbox (it keeps running).")
    snapshot_tag: str = Field(description="The intermediate snapshot the children were forked from.")
    children: list[SandboxInfo]
    errors: list[ForkError] = Field(description="One entry per child that failed; it left nothing behind.")
    pause_ms: int | float | None = Field(None, description="How long the source was paused.")
    tree_id: str | None = Field(None, description="fork-tree only: the id stamped on every child.")


class Deletion(_Response):
    id: str
    deleted: bool
    error: str | None = None


class PromoteResponse(_Response):
    winner: SandboxInfo
    tree_id: str
    deleted: list[Deletion] = Field(description="Each sibling (and the parent, with replace_parent) killed.")
    replaced_parent: str | None = Field(None, description="The source id that now names the winner.")


class CheckpointPolicy(_Response):
    every: int
    keep: int
    mode: str


class CheckpointList(_Response):
    sandbox_id: str
    policy: CheckpointPolicy | None = Field(description="null once the policy was deleted (or never set).")
    calls: int = Field(description="exec/eval calls counted since the policy was set.")
    checkpoints: list[SnapshotInfo] = Field(description="The kept checkpoints, oldest first.")
    last_error: str | None = Field(None, description="Why the latest checkpoint attempt failed, if it did.")


class PoolInfo(_Response):
    tag: str
    size: int = Field(description="Target: paused children kept ready (0: no pool).")
    ready: int = Field(description="Members restored, reseeded and paused right now.")
    memory_limit_mib: int | None = Field(None, description="The spawn options a spawn must match to draw "
                                         "from the pool: memory limit, per_child_netns, live_fork.")
    per_child_netns: bool = False
    live_fork: bool = False
    allow_internet_access: bool = False
    network: dict[str, list[str]] | None = Field(None, description="allow_out / deny_out of the members.")
    claims: int = Field(0, description="Children handed out from the pool since the daemon started.")
    misses: int = Field(0, description="Children of this snapshot restored fresh instead (pool empty, "
                        "options differed, or a member failed its claim).")
    last_error: str | None = Field(None, description="Why the latest refill failed (retried with back-off).")


class FileInfo(_Response):
    path: str = Field(examples=["/work/data.csv"])
    name: str = Field(description="The last component of path.")
    type: Literal["file", "dir", "symlink", "other"] = Field(
        description="symlink only for a dangling link (stat follows links).")
    size: int = Field(description="Bytes.")
    mode: int = Field(description="Permission bits (e.g. 420 = 0o644).")
    mtime: float = Field(description="Last modification, seconds since the epoch (guest clock).")
    owner: str | None = Field(None, description="The owner's user name (its uid when the guest has no name).")
    group: str | None = Field(None, description="The group's name (its gid when the guest has no name).")


class FileList(_Response):
    path: str
    entries: list[FileInfo] = Field(description="Sorted by name; symlinks are not followed.")
    truncated: bool = Field(description="True when the directory had more entries than the cap (10000).")


class MkdirResponse(_Response):
    path: str
    created: bool = Field(description="False when parents=true and the directory already existed.")


class PingResponse(_Response):
    pong: bool
    numpy_version: str | None = None
    pid: int | None = None


class ProcessInfo(_Response):
    pid: int = Field(description="Its pid in the guest: how every process route names it.")
    tag: str | None = None
    args: list[str]
    env: dict[str, str] = Field(description="The extra environment it was started with.")
    cwd: str | None = None
    user: str | None = Field(None, description="The user it runs as; null: root, as the agent.")
    running: bool
    exit_code: int | None = Field(description="Once ended: its status (negative: killed by that signal; "
                                  "124: timed out).")
    signal: int | None = Field(description="The signal that ended it, if one did.")
    timed_out: bool
    stdin_open: bool
    started_at: float | None = Field(description="Seconds since the epoch (guest clock).")
    ended_at: float | None = None


class StdinResponse(_Response):
    pid: int
    written: int = Field(description="Bytes queued for the process (it reads them at its pace).")
    stdin_open: bool


class SignalResponse(_Response):
    pid: int
    signal: int
    signalled: bool


class CancelEvalResponse(_Response):
    cancelled: bool = Field(description="False when no eval was running.")


class ExecResponse(_Response):
    stdout: str
    stderr: str
    exit_code: int | None = Field(description="Exit status; null if the process did not exit.")
    error: str | None = None
    timed_out: bool | None = None
    stdout_truncated: bool | None = None
    stderr_truncated: bool | None = None


class EvalResponse(_Response):
    result: str | None
    error: str | None
    exit_code: int


class PushRequest(_Request):
    force: bool = Field(False, description="Replace a different snapshot of the same tag in the store.")


class PushResult(_Response):
    tag: str
    store: str = Field(description="The object store, s3://bucket/prefix.")
    lineage: list[str] = Field(description="The snapshots pushed, oldest first: the chain its disk needs.")
    blobs: int = Field(description="Distinct files the chain is made of (base image included).")
    blobs_uploaded: int = Field(description="Those the store lacked (content-addressed: the rest were "
                                "there).")
    bytes_uploaded: int = Field(description="Compressed bytes sent.")


class PullResult(_Response):
    tag: str
    created: list[str] = Field(description="Snapshots registered here by this pull, oldest first.")
    reused: list[str] = Field(description="Snapshots of the chain this host already held (same content).")
    bytes_downloaded: int = Field(description="Compressed bytes fetched.")


class ErrorBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    error: str = Field(description="Human-readable message.", examples=["snapshot 'py' is not registered"])


class Health(BaseModel):
    ok: bool


class Version(BaseModel):
    version: str = Field(examples=["0.1.0"])
    api: str = Field(examples=["v1"])
