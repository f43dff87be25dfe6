# GENERATED from the daemon's OpenAPI document by scripts/gen_sdk_models.py — do not edit.
# Change the models in src/forkd/api/schemas/ (or the records in src/forkd/controller/results.py
# that its response models derive from), then run: python scripts/gen_sdk_models.py
"""The REST API's request and response bodies as ``TypedDict``s (generated).

One per schema of ``GET /openapi.json``. The controllers return the daemon's JSON
as plain dicts; these types describe them. ``*Extra`` are the optional request
fields a controller method does not name itself: it takes them as keyword
arguments and sends them unchanged.
"""

from typing import Any, Literal, Required, TypedDict


ApplyRequest = TypedDict('ApplyRequest', {'from': Required[str], 'paths': list[str] | None}, total=False)
# The ``ApplyRequest`` schema.


class ApplyResponse(TypedDict, total=False):
    """What POST /v1/sandboxes/{id}/apply wrote."""

    sandbox_id: Required[str]

    source: Required[str]
    """The sandbox whose changes were applied."""

    against: Required[str]
    """The state both were compared with: the source's snapshot."""

    written: Required[list[str]]
    """Paths written (added or modified)."""

    deleted: Required[list[str]]
    """Paths removed."""

    unchanged: Required[list[str]]
    """Paths the target already had as the source has them."""


class BranchRequest(TypedDict, total=False):
    """The ``BranchRequest`` schema."""

    tag: str | None
    """Tag of the new snapshot; default branch-<source-id>-<seq> (seq counts per source)."""

    mode: Literal["full", "diff", "live"] | None
    """full (default), diff or live."""

    diff: bool | None
    """Legacy v0.3 spelling of mode=diff; mutually exclusive with mode."""

    live: bool | None
    """Legacy forkd 0.4 spelling of mode=live; mutually exclusive with mode."""

    wait: bool
    """mode=live only: false returns as soon as the source resumes."""

    measure_diff: bool
    """forkd 0.5's measurement hook, for a full branch: the answer adds what a dirty-page diff would
    have cost (diff_physical_bytes, diff_logical_bytes, diff_ms; see docs/API.md). Not with diff or
    live.
    """

    parent_tag: str | None
    """forkd 0.5 chain edge, checked, not chosen: every branch is recorded on the snapshot its source's
    disk sits on, and this must name that snapshot or the one the source was forked from (else 409).
    """


class BuildContextInfo(TypedDict, total=False):
    """The ``BuildContextInfo`` schema."""

    context: Required[str]
    """The tar's sha256: name it as a build's `context`."""

    bytes: Required[int]
    """The tar's size."""


class CancelEvalResponse(TypedDict, total=False):
    """The ``CancelEvalResponse`` schema."""

    cancelled: Required[bool]
    """False when no eval was running."""


class CheckpointPolicy(TypedDict, total=False):
    """The ``CheckpointPolicy`` schema."""

    every: Required[int]

    keep: Required[int]

    mode: Required[str]


class VolumeAttachment(TypedDict, total=False):
    """A volume a snapshot attaches (and so every child and branch of it), as snapshot.json records it.
    """

    name: str | None
    """The volume of /v1/volumes it layers on."""

    host_path: str | None
    """The host directory it was copied from."""

    mount: Required[str]
    """Where the guest has it mounted."""

    read_only: Required[bool]

    fork: Required[str]
    """copy: each child and branch has its own copy-on-write view."""

    size_bytes: Required[int]
    """Its size: the most a guest can write to it."""


class SnapshotInfo(TypedDict, total=False):
    """The ``SnapshotInfo`` schema."""

    tag: Required[str]

    dir: Required[str]

    created_at_unix: Required[int]

    branched_from: str | None
    """Source sandbox id; present only for snapshots made by BRANCH."""

    pause_ms: int | float | None
    """Measured source pause window in ms; present only for BRANCH snapshots."""

    fs_freeze_ms: int | float | None
    """Live BRANCH only: how long the source's root filesystem was frozen (its disk writes waited; its
    CPU work went on), in ms.
    """

    status: Literal["ready", "writing", "failed"] | None
    """writing while a live no-wait branch copies memory; then ready or failed."""

    error: str | None
    """Why the snapshot failed (status=failed)."""

    auto_delete: bool | None
    """Present (true) on a fork's intermediate snapshot: deleted once no sandbox runs from it and no
    snapshot depends on it.
    """

    checkpoint_of: str | None
    """The sandbox whose checkpoint policy made it."""

    compacted_from: str | None
    """The snapshot a compaction flattened into this one."""

    diff_physical_bytes: int | None
    """measure_diff: RAM bytes the source wrote since its restore (its private copy-on-write pages),
    measured just before the pause: what a dirty-page diff saves.
    """

    diff_logical_bytes: int | None
    """measure_diff: the guest RAM size."""

    diff_ms: float | None
    """measure_diff: an estimate, not a second capture: this branch's pause scaled to the share of its
    captured RAM stream that the written pages make up.
    """

    volumes: list[VolumeAttachment] | None
    """Its volumes, in device order; omitted when it has none."""


class CheckpointList(TypedDict, total=False):
    """The ``CheckpointList`` schema."""

    sandbox_id: Required[str]

    policy: Required[CheckpointPolicy | None]
    """null once the policy was deleted (or never set)."""

    calls: Required[int]
    """exec/eval calls counted since the policy was set."""

    checkpoints: Required[list[SnapshotInfo]]
    """The kept checkpoints, oldest first."""

    last_error: str | None
    """Why the latest checkpoint attempt failed, if it did."""


class CheckpointPolicyRequest(TypedDict, total=False):
    """The ``CheckpointPolicyRequest`` schema."""

    every: Required[int]
    """Branch after every N exec/eval calls."""

    keep: int
    """How many of the newest checkpoints to keep; older ones are deleted."""

    mode: Literal["diff", "live"]
    """Branch mode (live needs live_fork)."""


class CodeRequest(TypedDict, total=False):
    """The ``CodeRequest`` schema."""

    code: Required[str]
    """The cell, in its kernel's language: Python run by IPython (magics, `!shell`, top-level await,
    display()), bash, JavaScript (node; top-level await), or R (IRkernel).
    """

    context: str | None
    """The kernel to run on; one kernel per context, started on its first cell (default: the language's
    default context: `default` for python, `default-bash`, `default-javascript`, `default-r`).
    """

    language: Literal["python", "bash", "javascript", "js", "r"] | None
    """The kernel's language (`js` is `javascript`); default: the context's, python for a new one.
    Another language than the context's is a 400.
    """

    timeout: float
    """Seconds the cell may run; then the kernel is interrupted."""

    env: dict[str, str] | None
    """Extra environment variables."""

    cwd: str | None
    """Working directory of the context's kernel when it starts."""


class CompactRequest(TypedDict, total=False):
    """The ``CompactRequest`` schema."""

    to: Required[str]
    """Tag of the new, standalone snapshot; must not exist yet."""


class CreateSecretRequest(TypedDict, total=False):
    """The ``CreateSecretRequest`` schema."""

    name: Required[str]
    """Its name, as `${secrets.NAME}` will name it."""

    value: Required[str]
    """Its value: write-only, sealed at rest, never returned or logged."""

    metadata: dict[str, str]
    """Your own labels, returned as given."""


class NetworkTransform(TypedDict, total=False):
    """The ``NetworkTransform`` schema."""

    headers: dict[str, str]
    """Headers set on every HTTPS request to the rule's host (replacing the guest's of the same name).
    `${secrets.NAME}` in a value is the secret's value, put in at egress: the sandbox never holds
    it.
    """


class NetworkRule(TypedDict, total=False):
    """The ``NetworkRule`` schema."""

    transform: NetworkTransform | None
    """What is done to the host's requests."""


class NetworkPolicy(TypedDict, total=False):
    """Fine-grained egress (E2B's ``network``): allow-list and deny-list of destinations."""

    allow_out: list[str]
    """Destinations always open (allow wins over deny); each an IPv4 address or CIDR, or a DNS name
    (`*.` for every name below one), optionally with :PORT or :FIRST-LAST (TCP and UDP), e.g.
    "10.0.0.0/8", "192.0.2.7:443", "198.51.100.0/24:8000-8100", "pypi.org",
    "*.pythonhosted.org:443". Opens private ranges and the host too (the host is the sandboxes'
    gateway, e.g. 10.201.0.1).
    """

    deny_out: list[str]
    """Destinations closed even with allow_internet_access; each an IPv4 address or CIDR, or a DNS name
    (`*.` for every name below one), optionally with :PORT or :FIRST-LAST (TCP and UDP), e.g.
    "10.0.0.0/8", "192.0.2.7:443", "198.51.100.0/24:8000-8100", "pypi.org",
    "*.pythonhosted.org:443".
    """

    allow_public_traffic: bool
    """Whether anyone who reaches the daemon may reach the sandbox's ports through its port proxy
    (`{port}-{sandbox id}.<domain>` as the Host; docs/API.md). Off: a request needs the daemon's
    bearer token or the sandbox's traffic token (`E2B-Traffic-Access-Token`).
    """

    mask_request_host: str | None
    """The Host header the sandbox's ports get from the port proxy instead of the client's; `${PORT}`
    stands for the port, e.g. `localhost:${PORT}`.
    """

    rules: dict[str, list[NetworkRule]]
    """Header transforms (E2B's `rules`), by host: a DNS name or `*.name` that is also in allow_out.
    HTTPS to such a host is intercepted with the sandbox's own CA (which its guest is given to
    trust) so that its requests get the headers and `${secrets.NAME}` placeholders are resolved;
    every other connection passes untouched. E.g. `{"api.example.com": [{"transform": {"headers":
    {"Authorization": "Bearer ${secrets.TOKEN}"}}}]}`.
    """


class VolumeSpec(TypedDict, total=False):
    """One volume to attach (store/volume_spec.py): exactly one of name and host_path."""

    name: str | None
    """A volume of POST /v1/volumes."""

    host_path: str | None
    """A directory on the daemon's host, copied into a new volume kept with the snapshot (the host
    directory is not written back).
    """

    mount: Required[str]
    """Where the guest mounts it (an absolute path, e.g. /mnt/data)."""

    read_only: bool
    """Attached read-only to the template and every child (one file, shared); writes fail in the guest.
    """

    fork: Literal["copy", "shared"] | None
    """copy (an ext4 volume's, a host_path's): each child (and each branch) gets its own copy-on-write
    view of the volume as it was at the snapshot. shared (a hostdir volume's): every sandbox that
    mounts it reads and writes the one set of files. Default: the volume's kind says; the other is
    400.
    """

    size_mib: int | None
    """host_path only: the new volume's size (its quota); default 1024."""


class CreateSnapshotRequest(TypedDict, total=False):
    """The ``CreateSnapshotRequest`` schema."""

    tag: Required[str]
    """Name of the new snapshot."""

    image: str
    """Guest image to boot; build it first with `forkd image build`."""

    kernel: str | None
    """Host path of an uncompressed ELF vmlinux; default: the image's."""

    rootfs: str | None
    """Host path of an ext4 root filesystem; default: the image's."""

    rw: bool
    """Accepted for compatibility with the seeds and ignored: the root disk is always attached read-
    write (children's overlays must be writable and their device config must match).
    """

    nic: bool
    """Give the template, and so every child, a network device (eth0 with an address, a route and DNS).
    The daemon makes the namespace and tap: no host set-up.
    """

    tap: str | None
    """Name of the NIC's tap device inside each sandbox's namespace (default forkd-tap0); giving it
    implies nic.
    """

    allow_internet_access: bool
    """The template's own egress while it boots and runs setup (e.g. pip install). Open outbound
    traffic to the public internet (denied by default): every destination but private, link-local,
    loopback and multicast ranges, the host and other sandboxes. Needs a snapshot with a NIC, and
    net.ipv4.ip_forward=1 on the host.
    """

    network: NetworkPolicy | None
    """The template's own egress. Finer egress: allow_out / deny_out lists of destinations. Needs a
    snapshot with a NIC.
    """

    boot_wait_secs: float
    """Upper bound on waiting for the warm guest agent to answer after boot."""

    mem_mib: int
    """Guest RAM in MiB."""

    vcpus: int
    """Guest vCPUs."""

    warm_imports: list[str] | None
    """Python modules PID 1 imports before the snapshot; default: numpy."""

    setup: list[list[str]]
    """argv lists run in the guest, in order, before the snapshot is taken."""

    setup_eval: list[str]
    """Python code run in the warm PID 1 interpreter before the snapshot (e.g. load a dataset);
    children inherit the result in memory.
    """

    setup_timeout_secs: float
    """Timeout of each setup command and each setup_eval step."""

    volumes: list[VolumeSpec]
    """Volumes mounted before setup runs: ext4 ones as virtio disks, hostdir ones served live (fork
    shared); every child and branch of the snapshot gets them back (docs/BRANCHING.md says how they
    fork).
    """


class CreateVolumeRequest(TypedDict, total=False):
    """The ``CreateVolumeRequest`` schema."""

    name: Required[str]
    """The volume's name, unique on this daemon."""

    size_mib: int
    """Its size: the most a guest can write to it, on the host too."""

    fs: Literal["ext4", "hostdir"]
    """ext4: a disk of its own, attached to a snapshot, which each child copies (copy-on-write).
    hostdir: files on the daemon's host, mounted live by running sandboxes at once (fork shared), at
    a snapshot or at a spawn.
    """

    source: str | None
    """A host directory or tarball (tar, tar.gz, ...) on the daemon's host to fill it from; archive
    members that would leave it (absolute, '..', links out, devices) are refused, and so is more
    content than fits.
    """


class CreateWorkspaceRequest(TypedDict, total=False):
    """The ``CreateWorkspaceRequest`` schema."""

    name: Required[str]
    """The workspace's name, unique on this daemon."""

    snapshot_tag: Required[str]
    """Snapshot its sandbox is forked from."""

    per_child_netns: bool
    """As in POST /v1/sandboxes."""

    memory_limit_mib: int | None
    """cgroup memory limit (MiB)."""


class Deletion(TypedDict, total=False):
    """The ``Deletion`` schema."""

    id: Required[str]

    deleted: Required[bool]

    error: str | None


class ErrorBody(TypedDict, total=False):
    """The ``ErrorBody`` schema."""

    error: Required[str]
    """Human-readable message."""

    code: str | None
    """Machine-readable cause, when there is one: 'no_capacity' on the 503 of a host at its sandbox or
    memory ceiling.
    """


class EvalRequest(TypedDict, total=False):
    """The ``EvalRequest`` schema."""

    code: Required[str]
    """Python code run in the warm PID 1 interpreter, like the REPL: the value of a trailing expression
    is the result.
    """

    timeout_secs: float
    """Interrupt the evaluation after this long (it answers TimeoutError)."""


class EvalResponse(TypedDict, total=False):
    """The ``EvalResponse`` schema."""

    result: Required[str | None]

    error: Required[str | None]

    exit_code: Required[int]


class ExecRequest(TypedDict, total=False):
    """The ``ExecRequest`` schema."""

    args: Required[list[str]]
    """argv of the subprocess."""

    timeout_secs: float
    """Kill the subprocess after this."""

    env: dict[str, str] | None
    """Extra environment variables."""

    cwd: str | None
    """Working directory in the guest."""

    stdin: str | None
    """Text fed to the subprocess's standard input."""

    user: str | None
    """The guest user to act as, by name from the guest's /etc/passwd (every image has "user", uid
    1000, home /home/user): its uid, gid and groups, HOME/USER/LOGNAME, its home as the default
    working directory, and files it writes are its own. Omitted: root, in the agent's own
    environment (working directory /root), as before. A name the guest does not know is a 400.
    """


class ExecResponse(TypedDict, total=False):
    """The ``ExecResponse`` schema."""

    stdout: Required[str]

    stderr: Required[str]

    exit_code: Required[int | None]
    """Exit status; null if the process did not exit."""

    error: str | None

    timed_out: bool | None

    stdout_truncated: bool | None

    stderr_truncated: bool | None


class ExecStreamRequest(TypedDict, total=False):
    """A process started and streamed at once; a client that leaves kills it."""

    args: Required[list[str]]
    """argv of the process."""

    timeout_secs: float | None
    """Kill the process group after this long; default: no limit."""

    env: dict[str, str] | None
    """Extra environment variables."""

    cwd: str | None
    """Working directory in the guest."""

    stdin: str | None
    """Text written to standard input first."""

    stdin_open: bool
    """Keep standard input open after stdin, for POST .../processes/{pid}/stdin; else it is closed.
    """

    tag: str | None
    """Any label of yours, shown in the process list."""

    user: str | None
    """The guest user to act as, by name from the guest's /etc/passwd (every image has "user", uid
    1000, home /home/user): its uid, gid and groups, HOME/USER/LOGNAME, its home as the default
    working directory, and files it writes are its own. Omitted: root, in the agent's own
    environment (working directory /root), as before. A name the guest does not know is a 400.
    """

    encoding: Literal["text", "base64"]
    """How output events carry the bytes: text (UTF-8, invalid bytes as U+FFFD) or base64 (exact).
    """


class ExportVolumeRequest(TypedDict, total=False):
    """The ``ExportVolumeRequest`` schema."""

    to: Required[str]
    """A new directory on the daemon's host to copy the volume's files into (its parent must exist).
    """

    snapshot: str | None
    """Copy the volume as this snapshot holds it (what its template or branch source wrote); default:
    the volume as made.
    """


class FileInfo(TypedDict, total=False):
    """The ``FileInfo`` schema."""

    path: Required[str]

    name: Required[str]
    """The last component of path."""

    type: Required[Literal["file", "dir", "symlink", "other"]]
    """symlink only for a dangling link (stat follows links)."""

    size: Required[int]
    """Bytes."""

    mode: Required[int]
    """Permission bits (e.g. 420 = 0o644)."""

    mtime: Required[float]
    """Last modification, seconds since the epoch (guest clock)."""

    owner: str | None
    """The owner's user name (its uid when the guest has no name)."""

    group: str | None
    """The group's name (its gid when the guest has no name)."""

    metadata: dict[str, str] | None
    """The file's metadata (its user.e2b.* extended attributes, the prefix stripped; set by an upload's
    X-Metadata-<key> headers); absent when it has none.
    """


class FileList(TypedDict, total=False):
    """The ``FileList`` schema."""

    path: Required[str]

    entries: Required[list[FileInfo]]
    """Sorted by name; symlinks are not followed."""

    truncated: Required[bool]
    """True when the directory had more entries than the cap (10000)."""


class ForkError(TypedDict, total=False):
    """The ``ForkError`` schema."""

    index: Required[int]
    """Which child (0-based) failed."""

    error: Required[str]


class ForkRequest(TypedDict, total=False):
    """The ``ForkRequest`` schema."""

    count: int
    """Number of children."""

    per_child_netns: bool
    """As in POST /v1/sandboxes."""

    allow_internet_access: bool
    """The children's egress (the source keeps its own). Open outbound traffic to the public internet
    (denied by default): every destination but private, link-local, loopback and multicast ranges,
    the host and other sandboxes. Needs a snapshot with a NIC, and net.ipv4.ip_forward=1 on the
    host.
    """

    network: NetworkPolicy | None
    """The children's egress. Finer egress: allow_out / deny_out lists of destinations. Needs a
    snapshot with a NIC.
    """

    memory_limit_mib: int | None
    """cgroup memory limit per child (MiB)."""

    child_memory_limit_mib: list[int | None] | None
    """One memory limit per child (length count); null entries use memory_limit_mib."""

    live_fork: bool
    """Children can later take mode=live branches."""

    env: dict[str, str] | None
    """Environment for every child (see POST /v1/sandboxes)."""

    child_env: list[dict[str, str]] | None
    """One environment per child, over env."""

    metadata: dict[str, str] | None
    """Labels for every child."""

    timeout_secs: float | None
    """Kill each child this many seconds after the fork returns (the source keeps its own deadline).
    Default: no deadline.
    """

    keep_snapshot: bool
    """Keep the intermediate snapshot. Default: it is deleted once its last child is gone (and no
    snapshot depends on it).
    """

    idle_pause_secs: float | None
    """As in POST /v1/sandboxes, for each child."""

    idle_hibernate_secs: float | None
    """As in POST /v1/sandboxes, for each child."""

    hostname: str | None
    """Each child's hostname, set in the guest at its restore (what hostname and uname -n say,
    /etc/hostname, and a 127.0.1.1 line of /etc/hosts): RFC 1123 labels joined by dots, at most 64
    characters. Default: the snapshot's.
    """

    spread: bool
    """Through a fleet gateway: place the children on several hosts (the source's host branches and
    takes the first, the branch goes to the object store, the others start from it), and keep the
    branch, since children elsewhere read from it. A daemon alone forks every child itself.
    """


class HibernationInfo(TypedDict, total=False):
    """The ``HibernationInfo`` schema."""

    hibernated_at_unix: Required[float]

    memory: Required[bool]
    """Whether its memory was kept. False: a disk-only hibernation (pages and devices_bytes 0); its
    wake cold-boots its disk: a fresh kernel, no process, cell or file descriptor of before.
    """

    pages: Required[int]
    """Guest pages (4 KiB) it had changed since its restore: all that was saved of its memory (the rest
    is its snapshot's).
    """

    memory_bytes: Required[int]
    """Those pages on disk, compressed."""

    devices_bytes: Required[int]
    """Its device state on disk."""

    disk_mib: Required[float]
    """memory_bytes + devices_bytes, in MiB: the disk a hibernated sandbox takes beyond its disk layers
    (disk_used_mib).
    """

    pause_ms: Required[float]
    """From its VM's stop to its state on disk."""


class SandboxNetwork(TypedDict, total=False):
    """The ``SandboxNetwork`` schema."""

    guest_ip: Required[str]
    """eth0's address inside the guest: the same in every sandbox."""

    host_gateway: Required[str]
    """The host as the guest sees it (its default gateway)."""

    dns: Required[list[str]]
    """The resolvers in the guest's /etc/resolv.conf."""

    allow_internet_access: Required[bool]

    allow_out: Required[list[str]]

    deny_out: Required[list[str]]

    allow_public_traffic: bool
    """Whether its ports are open to anyone through the daemon's port proxy, without a token."""

    mask_request_host: str | None
    """The Host header its ports get from the proxy."""

    rules: dict[str, list[dict[str, Any]]]
    """Its header transforms by host (as given: secrets appear only as their `${secrets.NAME}`
    placeholders).
    """


class SandboxInfo(TypedDict, total=False):
    """The ``SandboxInfo`` schema."""

    id: Required[str]

    snapshot_tag: Required[str]

    netns: str | None
    """The network namespace its QEMU runs in: forkd-child-<i> (per_child_netns), forkd-<id> (a
    snapshot with a NIC), else null.
    """

    ip: str | None
    """Where the host reaches this sandbox: every port of this address is forwarded to the guest.
    Present for snapshots with a NIC.
    """

    network: SandboxNetwork | None
    """Its network: the guest's view and its egress policy. Present for snapshots with a NIC."""

    volumes: list[VolumeAttachment] | None
    """Its volumes, in device order; omitted when it has none."""

    guest_addr: Required[str]
    """How the host reaches the guest agent; here unix:<path> (virtio-serial)."""

    created_at_unix: Required[int]

    pid: int | None
    """Host PID of the sandbox's QEMU process."""

    memory_limit_mib: int | None

    cpu_limit: float | None
    """CPU bandwidth limit in cores, if one was set."""

    pids_limit: int | None
    """Task limit of its QEMU's cgroup, if one was set."""

    disk_quota_mib: int | None
    """Its disk quota (MiB), if it has one."""

    disk_used_mib: float | None
    """Host disk its own layers take now (MiB): what it wrote since its spawn, counted against
    disk_quota_mib.
    """

    live_fork: bool | None

    timings: dict[str, float] | None
    """Where the fork's time went: seconds from the start of the restore until QEMU was up (qemu_up_s),
    the guest ran from the loaded state (restored_s) and its agent answered (ready_s).
    """

    metadata: dict[str, str] | None
    """Labels given at spawn; fork-tree children also carry fork_tree_id, fork_parent_id and
    fork_index.
    """

    expires_at_unix: float | None
    """When the sandbox is killed (unix seconds); absent without a timeout_secs."""

    idle_pause_secs: float | None
    """Paused after this many idle seconds; absent without idle_pause_secs."""

    idle_hibernate_secs: float | None
    """Hibernated after this many idle seconds; absent without idle_hibernate_secs."""

    hibernate_on_timeout: bool | None
    """At its deadline it is hibernated rather than killed; absent unless set."""

    hibernation: HibernationInfo | None
    """While hibernated: when, and what its saved state takes on disk."""

    state: Literal["running", "paused", "hibernated"]
    """paused: stopped after idle_pause_secs without a request; hibernated: on disk with no QEMU (POST
    /v1/sandboxes/{id}/hibernate, idle_hibernate_secs or hibernate_on_timeout). The next request of
    any kind resumes or wakes it.
    """


class SandboxMemory(TypedDict, total=False):
    """What a sandbox costs the host, in bytes, read from the host (never the guest)."""

    sandbox_id: Required[str]

    ram_bytes: Required[int]
    """The guest's RAM."""

    shared_bytes: Required[int]
    """Pages read from its snapshot and never written: held once in the host's page cache, shared with
    the snapshot and every sibling that read them.
    """

    private_bytes: Required[int]
    """Pages it wrote since its restore: its own copies."""

    untouched_bytes: Required[int]
    """Pages it has not touched yet (neither shared nor private)."""

    disk_bytes: Required[int]
    """What its own disk layers (its copy-on-write overlay, and those its branches froze) take on the
    host.
    """


class ForkResponse(TypedDict, total=False):
    """The ``ForkResponse`` schema."""

    parent_id: Required[str]
    """The source sandbox (it keeps running)."""

    snapshot_tag: Required[str]
    """The intermediate snapshot the children were forked from."""

    children: Required[list[SandboxInfo]]

    errors: Required[list[ForkError]]
    """One entry per child that failed; it left nothing behind."""

    pause_ms: int | float | None
    """How long the source was paused."""

    tree_id: str | None
    """fork-tree only: the id stamped on every child."""

    memory: list[SandboxMemory]
    """What each child costs the host right after its restore, by sandbox_id (as GET
    /v1/sandboxes/{id}/memory answers): most of its RAM is shared with its siblings at first. A
    child that could not be read is left out.
    """


class ForkTreeLabels(TypedDict, total=False):
    """The ``ForkTreeLabels`` schema."""

    tree_id: Required[str]
    """The fork-tree's id (its other children's fork_tree_id)."""

    parent_id: Required[str]
    """The tree's source sandbox, on whichever host it runs."""

    first_index: Required[int]
    """fork_index of the first child."""


class FsChange(TypedDict, total=False):
    """One path added, modified or deleted."""

    path: Required[str]
    """The path in the guest."""

    type: Required[str]
    """file | dir | symlink | other (the new side's; the old one's for a deletion)"""

    size: Required[int]
    """Its size in bytes (the old size for a deletion)."""

    mode: Required[int]
    """Its permission bits (e.g. 420 = 0644)."""

    uid: Required[int]

    gid: Required[int]

    old_mode: int | None
    """The permission bits before, where they changed."""

    old_uid: int | None
    """The owner before, where it changed."""

    old_gid: int | None
    """The group before, where it changed."""

    content_changed: Required[bool]
    """Whether the content (or a link's target) differs; false for a change of mode or owner only.
    """

    target: str | None
    """A symbolic link's target."""


class Health(TypedDict, total=False):
    """The ``Health`` schema."""

    ok: Required[bool]


class HibernateRequest(TypedDict, total=False):
    """The ``HibernateRequest`` schema."""

    memory: bool
    """Keep its memory (the pages it changed and its device state): its wake resumes it where it
    stopped. False: keep its disk alone (the guest syncs it first): its wake cold-boots its
    template's kernel on that disk, same id, address and egress policy; files survive, processes,
    kernels and memory do not (E2B's pause(keep_memory=False)).
    """


class RegistryAuth(TypedDict, total=False):
    """A registry's user name and password or token, as Docker's config.json holds them."""

    username: Required[str]
    """The user name."""

    password: Required[str]
    """The password or token."""


class ImagePullRequest(TypedDict, total=False):
    """The ``ImagePullRequest`` schema."""

    ref: Required[str]
    """The image: registry/name:tag or name@sha256:…; Docker Hub's short names (python:3.12 is
    docker.io/library/python:3.12).
    """

    name: str | None
    """The guest image's name here (default: the reference's last part and tag, e.g. python-3.12-slim).
    """

    registry_auth: RegistryAuth | None
    """The registry's credentials (this pull only, never stored)."""

    force: bool
    """Convert again even if this image was converted from the same digest."""


class MkdirRequest(TypedDict, total=False):
    """The ``MkdirRequest`` schema."""

    path: Required[str]
    """Absolute guest path of the directory."""

    parents: bool
    """Also create missing parents; an existing directory is fine."""

    user: str | None
    """The guest user to act as, by name from the guest's /etc/passwd (every image has "user", uid
    1000, home /home/user): its uid, gid and groups, HOME/USER/LOGNAME, its home as the default
    working directory, and files it writes are its own. Omitted: root, in the agent's own
    environment (working directory /root), as before. A name the guest does not know is a 400.
    """


class MkdirResponse(TypedDict, total=False):
    """The ``MkdirResponse`` schema."""

    path: Required[str]

    created: Required[bool]
    """False when parents=true and the directory already existed."""


class NetworkDecision(TypedDict, total=False):
    """The ``NetworkDecision`` schema."""

    time: Required[float]
    """When the guest asked (Unix seconds)."""

    kind: Required[Literal["dns", "connect"]]
    """`dns`: a name asked of the sandbox's resolver; `connect`: a TCP connection to an answered
    address, checked by the name it carried (TLS SNI or HTTP Host).
    """

    name: Required[str]
    """The name asked for, or the name the connection carried ("": none)."""

    address: Required[str]
    """`connect`: the address and port it was for ("" otherwise)."""

    allowed: Required[bool]
    """Whether the sandbox's egress policy let it through."""

    detail: Required[str]
    """The addresses answered (and opened), or why it was refused."""


class NetworkLog(TypedDict, total=False):
    """The ``NetworkLog`` schema."""

    sandbox_id: Required[str]

    entries: Required[list[NetworkDecision]]
    """The latest names its guest asked for, oldest first (at most 256; none without names in its
    egress policy).
    """


class NetworkUpdateRequest(TypedDict, total=False):
    """A running (or hibernated) sandbox's new network policy: it replaces the whole policy, as a spawn
    would set it (an omitted field takes a spawn's default).
    """

    allow_out: list[str]
    """Destinations always open (allow wins over deny); each an IPv4 address or CIDR, or a DNS name
    (`*.` for every name below one), optionally with :PORT or :FIRST-LAST (TCP and UDP), e.g.
    "10.0.0.0/8", "192.0.2.7:443", "198.51.100.0/24:8000-8100", "pypi.org",
    "*.pythonhosted.org:443". Opens private ranges and the host too (the host is the sandboxes'
    gateway, e.g. 10.201.0.1).
    """

    deny_out: list[str]
    """Destinations closed even with allow_internet_access; each an IPv4 address or CIDR, or a DNS name
    (`*.` for every name below one), optionally with :PORT or :FIRST-LAST (TCP and UDP), e.g.
    "10.0.0.0/8", "192.0.2.7:443", "198.51.100.0/24:8000-8100", "pypi.org",
    "*.pythonhosted.org:443".
    """

    allow_public_traffic: bool
    """Whether anyone who reaches the daemon may reach the sandbox's ports through its port proxy
    (`{port}-{sandbox id}.<domain>` as the Host; docs/API.md). Off: a request needs the daemon's
    bearer token or the sandbox's traffic token (`E2B-Traffic-Access-Token`).
    """

    mask_request_host: str | None
    """The Host header the sandbox's ports get from the port proxy instead of the client's; `${PORT}`
    stands for the port, e.g. `localhost:${PORT}`.
    """

    rules: dict[str, list[NetworkRule]]
    """Header transforms (E2B's `rules`), by host: a DNS name or `*.name` that is also in allow_out.
    HTTPS to such a host is intercepted with the sandbox's own CA (which its guest is given to
    trust) so that its requests get the headers and `${secrets.NAME}` placeholders are resolved;
    every other connection passes untouched. E.g. `{"api.example.com": [{"transform": {"headers":
    {"Authorization": "Bearer ${secrets.TOKEN}"}}}]}`.
    """

    allow_internet_access: bool
    """Open outbound traffic to the public internet (denied by default): every destination but private,
    link-local, loopback and multicast ranges, the host and other sandboxes. Needs a snapshot with a
    NIC, and net.ipv4.ip_forward=1 on the host.
    """


class PingResponse(TypedDict, total=False):
    """The ``PingResponse`` schema."""

    pong: Required[bool]

    numpy_version: str | None

    pid: int | None


class PoolInfo(TypedDict, total=False):
    """The ``PoolInfo`` schema."""

    tag: Required[str]

    size: Required[int]
    """Target: paused children kept ready (0: no pool)."""

    ready: Required[int]
    """Members restored, reseeded and paused right now."""

    memory_limit_mib: int | None
    """The spawn options a spawn must match to draw from the pool: memory limit, per_child_netns,
    live_fork.
    """

    per_child_netns: bool

    live_fork: bool

    allow_internet_access: bool

    network: dict[str, list[str]] | None
    """allow_out / deny_out of the members."""

    claims: int
    """Children handed out from the pool since the daemon started."""

    misses: int
    """Children of this snapshot restored fresh instead (pool empty, options differed, or a member
    failed its claim).
    """

    last_error: str | None
    """Why the latest refill failed (retried with back-off)."""


class PoolRequest(TypedDict, total=False):
    """The ``PoolRequest`` schema."""

    size: Required[int]
    """Paused children to keep ready; 0 drains the pool."""

    memory_limit_mib: int | None
    """Members get this cgroup memory limit; only spawns asking for it draw from the pool."""

    per_child_netns: bool
    """Members run in forkd-child-<i> namespaces; only such spawns draw from the pool."""

    live_fork: bool
    """Members can take mode=live branches; only live_fork spawns draw from the pool."""

    allow_internet_access: bool
    """Members' egress; only spawns asking for the same egress draw from the pool."""

    network: NetworkPolicy | None
    """Members' egress lists; only spawns asking for the same draw from the pool."""


class ProcessInfo(TypedDict, total=False):
    """The ``ProcessInfo`` schema."""

    pid: Required[int]
    """Its pid in the guest: how every process route names it."""

    tag: str | None

    args: Required[list[str]]

    env: Required[dict[str, str]]
    """The extra environment it was started with."""

    cwd: str | None

    user: str | None
    """The user it runs as; null: root, as the agent."""

    running: Required[bool]

    exit_code: Required[int | None]
    """Once ended: its status (negative: killed by that signal; 124: timed out)."""

    signal: Required[int | None]
    """The signal that ended it, if one did."""

    timed_out: Required[bool]

    stdin_open: Required[bool]

    started_at: Required[float | None]
    """Seconds since the epoch (guest clock)."""

    ended_at: float | None

    pty: dict[str, int] | None
    """Its terminal's size, {"cols", "rows"}, for a process started on one (E2B's pty); null otherwise.
    """


class ProcessStartRequest(TypedDict, total=False):
    """The ``ProcessStartRequest`` schema."""

    args: Required[list[str]]
    """argv of the process."""

    timeout_secs: float | None
    """Kill the process group after this long; default: no limit."""

    env: dict[str, str] | None
    """Extra environment variables."""

    cwd: str | None
    """Working directory in the guest."""

    stdin: str | None
    """Text written to standard input first."""

    stdin_open: bool
    """Keep standard input open after stdin, for POST .../processes/{pid}/stdin; else it is closed.
    """

    tag: str | None
    """Any label of yours, shown in the process list."""

    user: str | None
    """The guest user to act as, by name from the guest's /etc/passwd (every image has "user", uid
    1000, home /home/user): its uid, gid and groups, HOME/USER/LOGNAME, its home as the default
    working directory, and files it writes are its own. Omitted: root, in the agent's own
    environment (working directory /root), as before. A name the guest does not know is a 400.
    """


class PromoteRequest(TypedDict, total=False):
    """The ``PromoteRequest`` schema."""

    tree_id: str | None
    """The fork-tree; default: the winner's metadata fork_tree_id."""

    cleanup_siblings: bool
    """Kill every other live child of the tree."""

    replace_parent: bool
    """Also kill the tree's source; its id then names the winner in every endpoint."""


class PromoteResponse(TypedDict, total=False):
    """The ``PromoteResponse`` schema."""

    winner: Required[SandboxInfo]

    tree_id: Required[str]

    deleted: Required[list[Deletion]]
    """Each sibling (and the parent, with replace_parent) killed."""

    replaced_parent: str | None
    """The source id that now names the winner."""


class PullResult(TypedDict, total=False):
    """The ``PullResult`` schema."""

    tag: Required[str]

    created: Required[list[str]]
    """Snapshots registered here by this pull, oldest first."""

    reused: Required[list[str]]
    """Snapshots of the chain this host already held (same content)."""

    bytes_downloaded: Required[int]
    """Compressed bytes fetched."""


class PushRequest(TypedDict, total=False):
    """The ``PushRequest`` schema."""

    force: bool
    """Replace a different snapshot of the same tag in the store."""


class PushResult(TypedDict, total=False):
    """The ``PushResult`` schema."""

    tag: Required[str]

    store: Required[str]
    """The object store, s3://bucket/prefix."""

    lineage: Required[list[str]]
    """The snapshots pushed, oldest first: the chain its disk needs."""

    blobs: Required[int]
    """Distinct files the chain is made of (base image included)."""

    blobs_uploaded: Required[int]
    """Those the store lacked (content-addressed: the rest were there)."""

    bytes_uploaded: Required[int]
    """Compressed bytes sent."""


class SandboxDiff(TypedDict, total=False):
    """What a sandbox's filesystem changed (GET /v1/sandboxes/{id}/diff?format=json)."""

    sandbox_id: Required[str]

    against: Required[str]
    """What it was compared with: snapshot:TAG or sandbox:ID."""

    method: Required[str]
    """How the changed files were found: layers (the copy-on-write layers' changed blocks, mapped to
    inodes).
    """

    added: Required[list[FsChange]]

    modified: Required[list[FsChange]]

    deleted: Required[list[FsChange]]

    skipped: int
    """Changed names left out because they are not printable UTF-8."""

    elapsed_ms: Required[float]


class SecretInfo(TypedDict, total=False):
    """A secret as every API shows it: never its value."""

    name: Required[str]

    version: Required[int]
    """1 when made; one more at each new value."""

    metadata: Required[dict[str, str]]

    created_at_unix: Required[float]

    updated_at_unix: Required[float]


class SignalRequest(TypedDict, total=False):
    """The ``SignalRequest`` schema."""

    signal: Required[Literal[
        "SIGHUP", "SIGINT", "SIGQUIT", "SIGKILL", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGTERM",
        "SIGCONT", "SIGSTOP", "SIGTSTP", "SIGWINCH"
    ]]
    """The signal, by name."""

    group: bool
    """Signal the process's whole process group (it is a session leader); false: the process alone.
    """


class SignalResponse(TypedDict, total=False):
    """The ``SignalResponse`` schema."""

    pid: Required[int]

    signal: Required[int]

    signalled: Required[bool]


class SnapshotDetail(TypedDict, total=False):
    """The ``SnapshotDetail`` schema."""

    tag: Required[str]

    dir: Required[str]

    created_at_unix: Required[int]

    branched_from: str | None
    """Source sandbox id; present only for snapshots made by BRANCH."""

    pause_ms: int | float | None
    """Measured source pause window in ms; present only for BRANCH snapshots."""

    fs_freeze_ms: int | float | None
    """Live BRANCH only: how long the source's root filesystem was frozen (its disk writes waited; its
    CPU work went on), in ms.
    """

    status: Literal["ready", "writing", "failed"] | None
    """writing while a live no-wait branch copies memory; then ready or failed."""

    error: str | None
    """Why the snapshot failed (status=failed)."""

    auto_delete: bool | None
    """Present (true) on a fork's intermediate snapshot: deleted once no sandbox runs from it and no
    snapshot depends on it.
    """

    checkpoint_of: str | None
    """The sandbox whose checkpoint policy made it."""

    compacted_from: str | None
    """The snapshot a compaction flattened into this one."""

    diff_physical_bytes: int | None
    """measure_diff: RAM bytes the source wrote since its restore (its private copy-on-write pages),
    measured just before the pause: what a dirty-page diff saves.
    """

    diff_logical_bytes: int | None
    """measure_diff: the guest RAM size."""

    diff_ms: float | None
    """measure_diff: an estimate, not a second capture: this branch's pause scaled to the share of its
    captured RAM stream that the written pages make up.
    """

    volumes: list[VolumeAttachment] | None
    """Its volumes, in device order; omitted when it has none."""

    ancestors: list[str]
    """Snapshot tags this one descends from, nearest first."""

    dependents: list[str]
    """Snapshot tags descending from this one (all generations), which depend on its files."""

    parent_tag: str | None
    """The snapshot this one was branched from, if any."""

    sandboxes: list[str]
    """Ids of alive sandboxes forked from it."""


class SpawnRequest(TypedDict, total=False):
    """The ``SpawnRequest`` schema."""

    snapshot_tag: Required[str]
    """Registered snapshot to fork from."""

    n: int
    """Number of children to fork."""

    per_child_netns: bool
    """Place each child in the namespace forkd-child-<i> (lowest free i): one scripts/netns-setup.sh
    provisioned is used as it is; a missing one is made and removed with the child. Without it,
    children of a snapshot with a NIC get a namespace forkd-<id> of their own.
    """

    allow_internet_access: bool
    """Open outbound traffic to the public internet (denied by default): every destination but private,
    link-local, loopback and multicast ranges, the host and other sandboxes. Needs a snapshot with a
    NIC, and net.ipv4.ip_forward=1 on the host.
    """

    network: NetworkPolicy | None
    """Finer egress: allow_out / deny_out lists of destinations. Needs a snapshot with a NIC."""

    memory_limit_mib: int | None
    """cgroup memory limit per child (MiB)."""

    live_fork: bool
    """Boot children so that they can later take mode=live branches."""

    env: dict[str, str] | None
    """Environment given to every child right after its restore: it shows in os.environ of the warm
    interpreter (eval) and in every exec.
    """

    child_env: list[dict[str, str]] | None
    """One environment per child (length n), applied over env."""

    metadata: dict[str, str] | None
    """Labels stored with every child, returned in SandboxInfo and usable as a list filter (GET
    /v1/sandboxes?metadata=key=value).
    """

    cpu_limit: float | None
    """CPU bandwidth per child in cores (0.5: half a core), a cgroup cpu quota on its QEMU."""

    pids_limit: int | None
    """Most tasks (threads) of each child's QEMU (cgroup pids.max); guest processes are not host tasks.
    """

    timeout_secs: float | None
    """Kill each child (and free its resources) this many seconds after the spawn returns; POST
    /v1/sandboxes/{id}/timeout moves the deadline. Default: no deadline.
    """

    idle_pause_secs: float | None
    """Pause each child (QMP stop: it costs no CPU) once it has had no request for this many seconds;
    its next request of any kind resumes it and steps its clock first. Default: never, since a child
    with background work must not be paused behind its user's back.
    """

    idle_hibernate_secs: float | None
    """Hibernate each child once it has had no request for this many seconds: the guest pages it
    changed and its device state go to disk (compressed), its QEMU, cgroup and network are released;
    its next request of any kind wakes it (same id, address and egress policy, memory, disk and
    processes intact) and steps its clock first. Not with live_fork or per_child_netns. Default:
    never.
    """

    hibernate_on_timeout: bool
    """At timeout_secs, hibernate each child rather than kill it (E2B's autoPause): it stays listed as
    hibernated until killed, and its next request wakes it.
    """

    prewarm: bool
    """forkd 0.5 clients' option: read the snapshot's memory file into the host's page cache before the
    children start, so their first page touches (and their first BRANCH) do not wait on the disk.
    Children come from a warm pool of this snapshot whenever one is set, with or without it.
    """

    hugepages: bool
    """Accepted from forkd 0.5 clients and without effect: children map their snapshot's memory file
    privately (copy-on-write), which hugetlbfs pages cannot back; forkd 0.5 also fell back to 4 KiB
    pages when none were free.
    """

    disk_quota_mib: int | None
    """How far each child's own disk layers (its copy-on-write overlay, and what its branches froze)
    may grow on the host, in MiB. A child that writes past it is stopped: its QEMU is killed and
    every call answers 502 saying so, as after an OOM kill by memory_limit_mib. Default: the
    daemon's --disk-quota-mib (1024 unless set); 0: no quota.
    """

    hostname: str | None
    """Each child's hostname, set in the guest at its restore (what hostname and uname -n say,
    /etc/hostname, and a 127.0.1.1 line of /etc/hosts): RFC 1123 labels joined by dots, at most 64
    characters. Default: the snapshot's.
    """

    volumes: list[VolumeSpec] | None
    """hostdir volumes (POST /v1/volumes with fs hostdir) each child mounts besides its snapshot's: one
    set of files that every sandbox mounting it reads and writes at once (fork shared;
    docs/BRANCHING.md#shared-volumes). An ext4 volume is a disk, attached when a snapshot is made:
    naming one here is 400.
    """

    fork_tree: ForkTreeLabels | None
    """What a fleet gateway sets when it places part of a spread fork-tree on this host: the children
    get the tree's labels (fork_tree_id, fork_parent_id, and fork_index counted from first_index) as
    the tree's other children did, so promote finds them. The labels are otherwise set only by fork-
    tree itself.
    """


class StdinRequest(TypedDict, total=False):
    """The ``StdinRequest`` schema."""

    data: str
    """What to write (text, or base64 with encoding=base64)."""

    encoding: Literal["text", "base64"]
    """How data is given: text (UTF-8) or base64."""

    eof: bool
    """Close standard input after data."""


class StdinResponse(TypedDict, total=False):
    """The ``StdinResponse`` schema."""

    pid: Required[int]

    written: Required[int]
    """Bytes queued for the process (it reads them at its pace)."""

    stdin_open: Required[bool]


class SuspendWorkspaceRequest(TypedDict, total=False):
    """The ``SuspendWorkspaceRequest`` schema."""

    diff: bool
    """Branch its state with mode diff (shorter pause, state as of the end of the copy) instead of full
    (state as of the request); the sandbox stops either way.
    """


class TemplateBuildRequest(TypedDict, total=False):
    """The ``TemplateBuildRequest`` schema."""

    tag: Required[str]
    """Name of the template's snapshot."""

    dockerfile: Required[str]
    """The Dockerfile's text: FROM (a forkd image), RUN, COPY/ADD, ENV, ARG, WORKDIR, USER
    (docs/TEMPLATES.md).
    """

    context: str | None
    """The build context COPY reads: the digest PUT /v1/templates/contexts answered."""

    build_args: dict[str, str]
    """Values of the Dockerfile's ARGs."""

    mem_mib: int
    """Guest RAM in MiB."""

    vcpus: int
    """Guest vCPUs."""

    nic: bool
    """Give the template, and so every child, a network device."""

    allow_internet_access: bool
    """The build's own egress while RUN steps run (e.g. pip install). Open outbound traffic to the
    public internet (denied by default): every destination but private, link-local, loopback and
    multicast ranges, the host and other sandboxes. Needs a snapshot with a NIC, and
    net.ipv4.ip_forward=1 on the host.
    """

    network: NetworkPolicy | None
    """The build's own egress. Finer egress: allow_out / deny_out lists of destinations. Needs a
    snapshot with a NIC.
    """

    replace: bool
    """Replace an existing snapshot of this tag once the build has succeeded."""

    step_timeout_secs: float
    """Timeout of each RUN and COPY step."""

    boot_wait_secs: float
    """Upper bound on the base layer's boot."""

    registry_auth: RegistryAuth | None
    """For a FROM of a private registry: its credentials (this build's pull only, never stored)."""


class TimeoutRequest(TypedDict, total=False):
    """The ``TimeoutRequest`` schema."""

    timeout_secs: Required[float]
    """The sandbox is killed this many seconds from now, whether that is sooner or later than its
    previous deadline (E2B's set_timeout).
    """


class UpdateSecretRequest(TypedDict, total=False):
    """The ``UpdateSecretRequest`` schema."""

    value: str | None
    """A new value (its version goes up by one)."""

    metadata: dict[str, str] | None
    """New labels, replacing the old."""


class Version(TypedDict, total=False):
    """The ``Version`` schema."""

    version: Required[str]

    api: Required[str]


class VolumeExport(TypedDict, total=False):
    """The ``VolumeExport`` schema."""

    name: Required[str]

    to: Required[str]
    """The new host directory its files were copied into."""

    snapshot: str | None
    """The snapshot whose view of the volume was copied."""


class VolumeInfo(TypedDict, total=False):
    """The ``VolumeInfo`` schema."""

    name: Required[str]

    size_mib: Required[int]
    """Its size: the most a guest can write to it (the host file grows no further, but for qcow2
    metadata).
    """

    fs: Required[str]
    """ext4: a disk each child copies (fork copy); hostdir: files on the daemon's host that running
    sandboxes share (fork shared).
    """

    created_at_unix: Required[int]

    used_mib: Required[float]
    """What it takes on the host: its own disk file (ext4), or its files (hostdir)."""

    snapshots: Required[list[str]]
    """The snapshots that attach it: while there are any, it cannot be deleted (409)."""

    sandboxes: Required[list[str]]
    """The sandboxes that mount it (hostdir): while there are any, it cannot be deleted (409)."""


class WorkspaceInfo(TypedDict, total=False):
    """The ``WorkspaceInfo`` schema."""

    id: Required[str]

    name: Required[str]

    source_snapshot_tag: Required[str]

    status: Required[Literal["running", "suspended", "stale"]]
    """running: its sandbox is alive; suspended: paused, resumable; stale: neither (killed or expired);
    resume starts it again from source_snapshot_tag.
    """

    live_sandbox_id: str | None
    """Its sandbox, while running (the same id across suspend/resume)."""

    current_state_tag: str | None
    """The state snapshot it resumes from, while suspended."""

    created_at_unix: Required[int]

    last_active_unix: Required[int]


class CreateSnapshotExtra(TypedDict, total=False):
    """The optional fields of ``CreateSnapshotRequest`` that ``create_snapshot`` takes as keyword
    arguments (the rest are parameters of their own).
    """

    rw: bool
    """Accepted for compatibility with the seeds and ignored: the root disk is always attached read-
    write (children's overlays must be writable and their device config must match).
    """

    tap: str | None
    """Name of the NIC's tap device inside each sandbox's namespace (default forkd-tap0); giving it
    implies nic.
    """

    setup_eval: list[str]
    """Python code run in the warm PID 1 interpreter before the snapshot (e.g. load a dataset);
    children inherit the result in memory.
    """

    setup_timeout_secs: float
    """Timeout of each setup command and each setup_eval step."""

    volumes: list[VolumeSpec]
    """Volumes mounted before setup runs: ext4 ones as virtio disks, hostdir ones served live (fork
    shared); every child and branch of the snapshot gets them back (docs/BRANCHING.md says how they
    fork).
    """


class SpawnExtra(TypedDict, total=False):
    """The optional fields of ``SpawnRequest`` that ``spawn_sandboxes`` takes as keyword arguments (the
    rest are parameters of their own).
    """

    cpu_limit: float | None
    """CPU bandwidth per child in cores (0.5: half a core), a cgroup cpu quota on its QEMU."""

    pids_limit: int | None
    """Most tasks (threads) of each child's QEMU (cgroup pids.max); guest processes are not host tasks.
    """

    idle_hibernate_secs: float | None
    """Hibernate each child once it has had no request for this many seconds: the guest pages it
    changed and its device state go to disk (compressed), its QEMU, cgroup and network are released;
    its next request of any kind wakes it (same id, address and egress policy, memory, disk and
    processes intact) and steps its clock first. Not with live_fork or per_child_netns. Default:
    never.
    """

    hibernate_on_timeout: bool
    """At timeout_secs, hibernate each child rather than kill it (E2B's autoPause): it stays listed as
    hibernated until killed, and its next request wakes it.
    """

    prewarm: bool
    """forkd 0.5 clients' option: read the snapshot's memory file into the host's page cache before the
    children start, so their first page touches (and their first BRANCH) do not wait on the disk.
    Children come from a warm pool of this snapshot whenever one is set, with or without it.
    """

    hugepages: bool
    """Accepted from forkd 0.5 clients and without effect: children map their snapshot's memory file
    privately (copy-on-write), which hugetlbfs pages cannot back; forkd 0.5 also fell back to 4 KiB
    pages when none were free.
    """

    disk_quota_mib: int | None
    """How far each child's own disk layers (its copy-on-write overlay, and what its branches froze)
    may grow on the host, in MiB. A child that writes past it is stopped: its QEMU is killed and
    every call answers 502 saying so, as after an OOM kill by memory_limit_mib. Default: the
    daemon's --disk-quota-mib (1024 unless set); 0: no quota.
    """

    hostname: str | None
    """Each child's hostname, set in the guest at its restore (what hostname and uname -n say,
    /etc/hostname, and a 127.0.1.1 line of /etc/hosts): RFC 1123 labels joined by dots, at most 64
    characters. Default: the snapshot's.
    """

    volumes: list[VolumeSpec] | None
    """hostdir volumes (POST /v1/volumes with fs hostdir) each child mounts besides its snapshot's: one
    set of files that every sandbox mounting it reads and writes at once (fork shared;
    docs/BRANCHING.md#shared-volumes). An ext4 volume is a disk, attached when a snapshot is made:
    naming one here is 400.
    """

    fork_tree: ForkTreeLabels | None
    """What a fleet gateway sets when it places part of a spread fork-tree on this host: the children
    get the tree's labels (fork_tree_id, fork_parent_id, and fork_index counted from first_index) as
    the tree's other children did, so promote finds them. The labels are otherwise set only by fork-
    tree itself.
    """


class ForkExtra(TypedDict, total=False):
    """The optional fields of ``ForkRequest`` that ``fork_sandbox`` and ``fork_tree`` take as keyword
    arguments (the rest are parameters of their own).
    """

    idle_pause_secs: float | None
    """As in POST /v1/sandboxes, for each child."""

    idle_hibernate_secs: float | None
    """As in POST /v1/sandboxes, for each child."""

    hostname: str | None
    """Each child's hostname, set in the guest at its restore (what hostname and uname -n say,
    /etc/hostname, and a 127.0.1.1 line of /etc/hosts): RFC 1123 labels joined by dots, at most 64
    characters. Default: the snapshot's.
    """

    spread: bool
    """Through a fleet gateway: place the children on several hosts (the source's host branches and
    takes the first, the branch goes to the object store, the others start from it), and keep the
    branch, since children elsewhere read from it. A daemon alone forks every child itself.
    """


class BranchExtra(TypedDict, total=False):
    """The optional fields of ``BranchRequest`` that ``branch_sandbox`` takes as keyword arguments (the
    rest are parameters of their own).
    """

    live: bool | None
    """Legacy forkd 0.4 spelling of mode=live; mutually exclusive with mode."""

    measure_diff: bool
    """forkd 0.5's measurement hook, for a full branch: the answer adds what a dirty-page diff would
    have cost (diff_physical_bytes, diff_logical_bytes, diff_ms; see docs/API.md). Not with diff or
    live.
    """

    parent_tag: str | None
    """forkd 0.5 chain edge, checked, not chosen: every branch is recorded on the snapshot its source's
    disk sits on, and this must name that snapshot or the one the source was forked from (else 409).
    """


class PoolExtra(TypedDict, total=False):
    """The optional fields of ``PoolRequest`` that ``set_pool`` takes as keyword arguments (the rest
    are parameters of their own).
    """


class TemplateBuildExtra(TypedDict, total=False):
    """The optional fields of ``TemplateBuildRequest`` that ``build_template`` takes as keyword
    arguments (the rest are parameters of their own).
    """

    build_args: dict[str, str]
    """Values of the Dockerfile's ARGs."""

    mem_mib: int
    """Guest RAM in MiB."""

    vcpus: int
    """Guest vCPUs."""

    nic: bool
    """Give the template, and so every child, a network device."""

    allow_internet_access: bool
    """The build's own egress while RUN steps run (e.g. pip install). Open outbound traffic to the
    public internet (denied by default): every destination but private, link-local, loopback and
    multicast ranges, the host and other sandboxes. Needs a snapshot with a NIC, and
    net.ipv4.ip_forward=1 on the host.
    """

    network: NetworkPolicy | None
    """The build's own egress. Finer egress: allow_out / deny_out lists of destinations. Needs a
    snapshot with a NIC.
    """

    replace: bool
    """Replace an existing snapshot of this tag once the build has succeeded."""

    step_timeout_secs: float
    """Timeout of each RUN and COPY step."""

    boot_wait_secs: float
    """Upper bound on the base layer's boot."""

    registry_auth: RegistryAuth | None
    """For a FROM of a private registry: its credentials (this build's pull only, never stored)."""


__all__ = [
    "ApplyRequest",
    "ApplyResponse",
    "BranchExtra",
    "BranchRequest",
    "BuildContextInfo",
    "CancelEvalResponse",
    "CheckpointList",
    "CheckpointPolicy",
    "CheckpointPolicyRequest",
    "CodeRequest",
    "CompactRequest",
    "CreateSecretRequest",
    "CreateSnapshotExtra",
    "CreateSnapshotRequest",
    "CreateVolumeRequest",
    "CreateWorkspaceRequest",
    "Deletion",
    "ErrorBody",
    "EvalRequest",
    "EvalResponse",
    "ExecRequest",
    "ExecResponse",
    "ExecStreamRequest",
    "ExportVolumeRequest",
    "FileInfo",
    "FileList",
    "ForkError",
    "ForkExtra",
    "ForkRequest",
    "ForkResponse",
    "ForkTreeLabels",
    "FsChange",
    "Health",
    "HibernateRequest",
    "HibernationInfo",
    "ImagePullRequest",
    "MkdirRequest",
    "MkdirResponse",
    "NetworkDecision",
    "NetworkLog",
    "NetworkPolicy",
    "NetworkRule",
    "NetworkTransform",
    "NetworkUpdateRequest",
    "PingResponse",
    "PoolExtra",
    "PoolInfo",
    "PoolRequest",
    "ProcessInfo",
    "ProcessStartRequest",
    "PromoteRequest",
    "PromoteResponse",
    "PullResult",
    "PushRequest",
    "PushResult",
    "RegistryAuth",
    "SandboxDiff",
    "SandboxInfo",
    "SandboxMemory",
    "SandboxNetwork",
    "SecretInfo",
    "SignalRequest",
    "SignalResponse",
    "SnapshotDetail",
    "SnapshotInfo",
    "SpawnExtra",
    "SpawnRequest",
    "StdinRequest",
    "StdinResponse",
    "SuspendWorkspaceRequest",
    "TemplateBuildExtra",
    "TemplateBuildRequest",
    "TimeoutRequest",
    "UpdateSecretRequest",
    "Version",
    "VolumeAttachment",
    "VolumeExport",
    "VolumeInfo",
    "VolumeSpec",
    "WorkspaceInfo",
]
