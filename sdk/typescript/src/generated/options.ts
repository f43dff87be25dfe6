// GENERATED from the daemon's OpenAPI document by scripts/gen_ts_types.py: do not edit.
// Change the models in src/forkd/api/schemas/, then run: python scripts/gen_ts_types.py

/**
 * Every JSON request body of the REST API as the camelCase options callers write
 * (`<Schema>Options`), and `WIRE_NAMES`: the snake_case name each option is sent
 * under. `toWire` (src/wire.ts) turns options into the body, so every field of a
 * request model can be sent from TypeScript without a hand-written line.
 */

import type { components } from "./schema.js";

type Schemas = components["schemas"];

/** `ApplyRequest` in camelCase. */
export interface ApplyRequestOptions {
  /**
   * The sandbox whose changes to apply: its diff against the snapshot it was forked from (a child
   * of the target, typically).
   */
  from: Schemas["ApplyRequest"]["from"];
  /**
   * Only changes under these paths (absolute prefixes, or names such as *.py); default: every
   * change a diff shows.
   */
  paths?: Schemas["ApplyRequest"]["paths"];
}

/** `BranchRequest` in camelCase. */
export interface BranchRequestOptions {
  /** Legacy v0.3 spelling of mode=diff; mutually exclusive with mode. */
  diff?: Schemas["BranchRequest"]["diff"];
  /** Legacy forkd 0.4 spelling of mode=live; mutually exclusive with mode. */
  live?: Schemas["BranchRequest"]["live"];
  /**
   * forkd 0.5's measurement hook, for a full branch: the answer adds what a dirty-page diff would
   * have cost (diff_physical_bytes, diff_logical_bytes, diff_ms; see docs/API.md). Not with diff or
   * live.
   */
  measureDiff?: Schemas["BranchRequest"]["measure_diff"];
  /** full (default), diff or live. */
  mode?: Schemas["BranchRequest"]["mode"];
  /**
   * forkd 0.5 chain edge, checked, not chosen: every branch is recorded on the snapshot its
   * source's disk sits on, and this must name that snapshot or the one the source was forked from
   * (else 409).
   */
  parentTag?: Schemas["BranchRequest"]["parent_tag"];
  /** Tag of the new snapshot; default branch-<source-id>-<seq> (seq counts per source). */
  tag?: Schemas["BranchRequest"]["tag"];
  /** mode=live only: false returns as soon as the source resumes. */
  wait?: Schemas["BranchRequest"]["wait"];
}

/** `CheckpointPolicyRequest` in camelCase. */
export interface CheckpointPolicyRequestOptions {
  /** Branch after every N exec/eval calls. */
  every: Schemas["CheckpointPolicyRequest"]["every"];
  /** How many of the newest checkpoints to keep; older ones are deleted. */
  keep?: Schemas["CheckpointPolicyRequest"]["keep"];
  /** Branch mode (live needs live_fork). */
  mode?: Schemas["CheckpointPolicyRequest"]["mode"];
}

/** `CodeRequest` in camelCase. */
export interface CodeRequestOptions {
  /**
   * The cell, in its kernel's language: Python run by IPython (magics, `!shell`, top-level await,
   * display()), bash, JavaScript (node; top-level await), or R (IRkernel).
   */
  code: Schemas["CodeRequest"]["code"];
  /**
   * The kernel to run on; one kernel per context, started on its first cell (default: the
   * language's default context: `default` for python, `default-bash`, `default-javascript`,
   * `default-r`).
   */
  context?: Schemas["CodeRequest"]["context"];
  /** Working directory of the context's kernel when it starts. */
  cwd?: Schemas["CodeRequest"]["cwd"];
  /** Extra environment variables. */
  env?: Schemas["CodeRequest"]["env"];
  /**
   * The kernel's language (`js` is `javascript`); default: the context's, python for a new one.
   * Another language than the context's is a 400.
   */
  language?: Schemas["CodeRequest"]["language"];
  /** Seconds the cell may run; then the kernel is interrupted. */
  timeout?: Schemas["CodeRequest"]["timeout"];
}

/** `CompactRequest` in camelCase. */
export interface CompactRequestOptions {
  /** Tag of the new, standalone snapshot; must not exist yet. */
  to: Schemas["CompactRequest"]["to"];
}

/** `CreateSecretRequest` in camelCase. */
export interface CreateSecretRequestOptions {
  /** Your own labels, returned as given. */
  metadata?: Schemas["CreateSecretRequest"]["metadata"];
  /** Its name, as `${secrets.NAME}` will name it. */
  name: Schemas["CreateSecretRequest"]["name"];
  /** Its value: write-only, sealed at rest, never returned or logged. */
  value: Schemas["CreateSecretRequest"]["value"];
}

/** `CreateSnapshotRequest` in camelCase. */
export interface CreateSnapshotRequestOptions {
  /**
   * The template's own egress while it boots and runs setup (e.g. pip install). Open outbound
   * traffic to the public internet (denied by default): every destination but private, link-local,
   * loopback and multicast ranges, the host and other sandboxes. Needs a snapshot with a NIC, and
   * net.ipv4.ip_forward=1 on the host.
   */
  allowInternetAccess?: Schemas["CreateSnapshotRequest"]["allow_internet_access"];
  /** Upper bound on waiting for the warm guest agent to answer after boot. */
  bootWaitSecs?: Schemas["CreateSnapshotRequest"]["boot_wait_secs"];
  /** Guest image to boot; build it first with `forkd image build`. */
  image?: Schemas["CreateSnapshotRequest"]["image"];
  /** Host path of an uncompressed ELF vmlinux; default: the image's. */
  kernel?: Schemas["CreateSnapshotRequest"]["kernel"];
  /** Guest RAM in MiB. */
  memMib?: Schemas["CreateSnapshotRequest"]["mem_mib"];
  /**
   * The template's own egress. Finer egress: allow_out / deny_out lists of destinations. Needs a
   * snapshot with a NIC.
   */
  network?: NetworkPolicyOptions | null;
  /**
   * Give the template, and so every child, a network device (eth0 with an address, a route and
   * DNS). The daemon makes the namespace and tap: no host set-up.
   */
  nic?: Schemas["CreateSnapshotRequest"]["nic"];
  /** Host path of an ext4 root filesystem; default: the image's. */
  rootfs?: Schemas["CreateSnapshotRequest"]["rootfs"];
  /**
   * Accepted for compatibility with the seeds and ignored: the root disk is always attached
   * read-write (children's overlays must be writable and their device config must match).
   */
  rw?: Schemas["CreateSnapshotRequest"]["rw"];
  /** argv lists run in the guest, in order, before the snapshot is taken. */
  setup?: Schemas["CreateSnapshotRequest"]["setup"];
  /**
   * Python code run in the warm PID 1 interpreter before the snapshot (e.g. load a dataset);
   * children inherit the result in memory.
   */
  setupEval?: Schemas["CreateSnapshotRequest"]["setup_eval"];
  /** Timeout of each setup command and each setup_eval step. */
  setupTimeoutSecs?: Schemas["CreateSnapshotRequest"]["setup_timeout_secs"];
  /** Name of the new snapshot. */
  tag: Schemas["CreateSnapshotRequest"]["tag"];
  /**
   * Name of the NIC's tap device inside each sandbox's namespace (default forkd-tap0); giving it
   * implies nic.
   */
  tap?: Schemas["CreateSnapshotRequest"]["tap"];
  /** Guest vCPUs. */
  vcpus?: Schemas["CreateSnapshotRequest"]["vcpus"];
  /**
   * Volumes mounted before setup runs: ext4 ones as virtio disks, hostdir ones served live (fork
   * shared); every child and branch of the snapshot gets them back (docs/BRANCHING.md says how they
   * fork).
   */
  volumes?: VolumeSpecOptions[];
  /** Python modules PID 1 imports before the snapshot; default: numpy. */
  warmImports?: Schemas["CreateSnapshotRequest"]["warm_imports"];
}

/** `CreateVolumeRequest` in camelCase. */
export interface CreateVolumeRequestOptions {
  /**
   * ext4: a disk of its own, attached to a snapshot, which each child copies (copy-on-write).
   * hostdir: files on the daemon's host, mounted live by running sandboxes at once (fork shared),
   * at a snapshot or at a spawn.
   */
  fs?: Schemas["CreateVolumeRequest"]["fs"];
  /** The volume's name, unique on this daemon. */
  name: Schemas["CreateVolumeRequest"]["name"];
  /** Its size: the most a guest can write to it, on the host too. */
  sizeMib?: Schemas["CreateVolumeRequest"]["size_mib"];
  /**
   * A host directory or tarball (tar, tar.gz, ...) on the daemon's host to fill it from; archive
   * members that would leave it (absolute, '..', links out, devices) are refused, and so is more
   * content than fits.
   */
  source?: Schemas["CreateVolumeRequest"]["source"];
}

/** `CreateWorkspaceRequest` in camelCase. */
export interface CreateWorkspaceRequestOptions {
  /** cgroup memory limit (MiB). */
  memoryLimitMib?: Schemas["CreateWorkspaceRequest"]["memory_limit_mib"];
  /** The workspace's name, unique on this daemon. */
  name: Schemas["CreateWorkspaceRequest"]["name"];
  /** As in POST /v1/sandboxes. */
  perChildNetns?: Schemas["CreateWorkspaceRequest"]["per_child_netns"];
  /** Snapshot its sandbox is forked from. */
  snapshotTag: Schemas["CreateWorkspaceRequest"]["snapshot_tag"];
}

/** `EvalRequest` in camelCase. */
export interface EvalRequestOptions {
  /**
   * Python code run in the warm PID 1 interpreter, like the REPL: the value of a trailing
   * expression is the result.
   */
  code: Schemas["EvalRequest"]["code"];
  /** Interrupt the evaluation after this long (it answers TimeoutError). */
  timeoutSecs?: Schemas["EvalRequest"]["timeout_secs"];
}

/** `ExecRequest` in camelCase. */
export interface ExecRequestOptions {
  /** argv of the subprocess. */
  args: Schemas["ExecRequest"]["args"];
  /** Working directory in the guest. */
  cwd?: Schemas["ExecRequest"]["cwd"];
  /** Extra environment variables. */
  env?: Schemas["ExecRequest"]["env"];
  /** Text fed to the subprocess's standard input. */
  stdin?: Schemas["ExecRequest"]["stdin"];
  /** Kill the subprocess after this. */
  timeoutSecs?: Schemas["ExecRequest"]["timeout_secs"];
  /**
   * The guest user to act as, by name from the guest's /etc/passwd (every image has "user", uid
   * 1000, home /home/user): its uid, gid and groups, HOME/USER/LOGNAME, its home as the default
   * working directory, and files it writes are its own. Omitted: root, in the agent's own
   * environment (working directory /root), as before. A name the guest does not know is a 400.
   */
  user?: Schemas["ExecRequest"]["user"];
}

/**
 * `ExecStreamRequest` in camelCase. A process started and streamed at once; a client that leaves
 * kills it.
 */
export interface ExecStreamRequestOptions {
  /** argv of the process. */
  args: Schemas["ExecStreamRequest"]["args"];
  /** Working directory in the guest. */
  cwd?: Schemas["ExecStreamRequest"]["cwd"];
  /** How output events carry the bytes: text (UTF-8, invalid bytes as U+FFFD) or base64 (exact). */
  encoding?: Schemas["ExecStreamRequest"]["encoding"];
  /** Extra environment variables. */
  env?: Schemas["ExecStreamRequest"]["env"];
  /** Text written to standard input first. */
  stdin?: Schemas["ExecStreamRequest"]["stdin"];
  /**
   * Keep standard input open after stdin, for POST .../processes/{pid}/stdin; else it is closed.
   */
  stdinOpen?: Schemas["ExecStreamRequest"]["stdin_open"];
  /** Any label of yours, shown in the process list. */
  tag?: Schemas["ExecStreamRequest"]["tag"];
  /** Kill the process group after this long; default: no limit. */
  timeoutSecs?: Schemas["ExecStreamRequest"]["timeout_secs"];
  /**
   * The guest user to act as, by name from the guest's /etc/passwd (every image has "user", uid
   * 1000, home /home/user): its uid, gid and groups, HOME/USER/LOGNAME, its home as the default
   * working directory, and files it writes are its own. Omitted: root, in the agent's own
   * environment (working directory /root), as before. A name the guest does not know is a 400.
   */
  user?: Schemas["ExecStreamRequest"]["user"];
}

/** `ExportVolumeRequest` in camelCase. */
export interface ExportVolumeRequestOptions {
  /**
   * Copy the volume as this snapshot holds it (what its template or branch source wrote); default:
   * the volume as made.
   */
  snapshot?: Schemas["ExportVolumeRequest"]["snapshot"];
  /**
   * A new directory on the daemon's host to copy the volume's files into (its parent must exist).
   */
  to: Schemas["ExportVolumeRequest"]["to"];
}

/** `ForkRequest` in camelCase. */
export interface ForkRequestOptions {
  /**
   * The children's egress (the source keeps its own). Open outbound traffic to the public internet
   * (denied by default): every destination but private, link-local, loopback and multicast ranges,
   * the host and other sandboxes. Needs a snapshot with a NIC, and net.ipv4.ip_forward=1 on the
   * host.
   */
  allowInternetAccess?: Schemas["ForkRequest"]["allow_internet_access"];
  /** One environment per child, over env. */
  childEnv?: Schemas["ForkRequest"]["child_env"];
  /** One memory limit per child (length count); null entries use memory_limit_mib. */
  childMemoryLimitMib?: Schemas["ForkRequest"]["child_memory_limit_mib"];
  /** Number of children. */
  count?: Schemas["ForkRequest"]["count"];
  /** Environment for every child (see POST /v1/sandboxes). */
  env?: Schemas["ForkRequest"]["env"];
  /**
   * Each child's hostname, set in the guest at its restore (what hostname and uname -n say,
   * /etc/hostname, and a 127.0.1.1 line of /etc/hosts): RFC 1123 labels joined by dots, at most 64
   * characters. Default: the snapshot's.
   */
  hostname?: Schemas["ForkRequest"]["hostname"];
  /** As in POST /v1/sandboxes, for each child. */
  idleHibernateSecs?: Schemas["ForkRequest"]["idle_hibernate_secs"];
  /** As in POST /v1/sandboxes, for each child. */
  idlePauseSecs?: Schemas["ForkRequest"]["idle_pause_secs"];
  /**
   * Keep the intermediate snapshot. Default: it is deleted once its last child is gone (and no
   * snapshot depends on it).
   */
  keepSnapshot?: Schemas["ForkRequest"]["keep_snapshot"];
  /** Children can later take mode=live branches. */
  liveFork?: Schemas["ForkRequest"]["live_fork"];
  /** cgroup memory limit per child (MiB). */
  memoryLimitMib?: Schemas["ForkRequest"]["memory_limit_mib"];
  /** Labels for every child. */
  metadata?: Schemas["ForkRequest"]["metadata"];
  /**
   * The children's egress. Finer egress: allow_out / deny_out lists of destinations. Needs a
   * snapshot with a NIC.
   */
  network?: NetworkPolicyOptions | null;
  /** As in POST /v1/sandboxes. */
  perChildNetns?: Schemas["ForkRequest"]["per_child_netns"];
  /**
   * Through a fleet gateway: place the children on several hosts (the source's host branches and
   * takes the first, the branch goes to the object store, the others start from it), and keep the
   * branch, since children elsewhere read from it. A daemon alone forks every child itself.
   */
  spread?: Schemas["ForkRequest"]["spread"];
  /**
   * Kill each child this many seconds after the fork returns (the source keeps its own deadline).
   * Default: no deadline.
   */
  timeoutSecs?: Schemas["ForkRequest"]["timeout_secs"];
}

/** `ForkTreeLabels` in camelCase. */
export interface ForkTreeLabelsOptions {
  /** fork_index of the first child. */
  firstIndex: Schemas["ForkTreeLabels"]["first_index"];
  /** The tree's source sandbox, on whichever host it runs. */
  parentId: Schemas["ForkTreeLabels"]["parent_id"];
  /** The fork-tree's id (its other children's fork_tree_id). */
  treeId: Schemas["ForkTreeLabels"]["tree_id"];
}

/** `HibernateRequest` in camelCase. */
export interface HibernateRequestOptions {
  /**
   * Keep its memory (the pages it changed and its device state): its wake resumes it where it
   * stopped. False: keep its disk alone (the guest syncs it first): its wake cold-boots its
   * template's kernel on that disk, same id, address and egress policy; files survive, processes,
   * kernels and memory do not (E2B's pause(keep_memory=False)).
   */
  memory?: Schemas["HibernateRequest"]["memory"];
}

/** `ImagePullRequest` in camelCase. */
export interface ImagePullRequestOptions {
  /** Convert again even if this image was converted from the same digest. */
  force?: Schemas["ImagePullRequest"]["force"];
  /**
   * The guest image's name here (default: the reference's last part and tag, e.g.
   * python-3.12-slim).
   */
  name?: Schemas["ImagePullRequest"]["name"];
  /**
   * The image: registry/name:tag or name@sha256:…; Docker Hub's short names (python:3.12 is
   * docker.io/library/python:3.12).
   */
  ref: Schemas["ImagePullRequest"]["ref"];
  /** The registry's credentials (this pull only, never stored). */
  registryAuth?: RegistryAuthOptions | null;
}

/** `MkdirRequest` in camelCase. */
export interface MkdirRequestOptions {
  /** Also create missing parents; an existing directory is fine. */
  parents?: Schemas["MkdirRequest"]["parents"];
  /** Absolute guest path of the directory. */
  path: Schemas["MkdirRequest"]["path"];
  /**
   * The guest user to act as, by name from the guest's /etc/passwd (every image has "user", uid
   * 1000, home /home/user): its uid, gid and groups, HOME/USER/LOGNAME, its home as the default
   * working directory, and files it writes are its own. Omitted: root, in the agent's own
   * environment (working directory /root), as before. A name the guest does not know is a 400.
   */
  user?: Schemas["MkdirRequest"]["user"];
}

/**
 * `NetworkPolicy` in camelCase. Fine-grained egress (E2B's ``network``): allow-list and deny-list
 * of destinations.
 */
export interface NetworkPolicyOptions {
  /**
   * Destinations always open (allow wins over deny); each an IPv4 address or CIDR, or a DNS name
   * (`*.` for every name below one), optionally with :PORT or :FIRST-LAST (TCP and UDP), e.g.
   * "10.0.0.0/8", "192.0.2.7:443", "198.51.100.0/24:8000-8100", "pypi.org",
   * "*.pythonhosted.org:443". Opens private ranges and the host too (the host is the sandboxes'
   * gateway, e.g. 10.201.0.1).
   */
  allowOut?: Schemas["NetworkPolicy"]["allow_out"];
  /**
   * Whether anyone who reaches the daemon may reach the sandbox's ports through its port proxy
   * (`{port}-{sandbox id}.<domain>` as the Host; docs/API.md). Off: a request needs the daemon's
   * bearer token or the sandbox's traffic token (`E2B-Traffic-Access-Token`).
   */
  allowPublicTraffic?: Schemas["NetworkPolicy"]["allow_public_traffic"];
  /**
   * Destinations closed even with allow_internet_access; each an IPv4 address or CIDR, or a DNS
   * name (`*.` for every name below one), optionally with :PORT or :FIRST-LAST (TCP and UDP), e.g.
   * "10.0.0.0/8", "192.0.2.7:443", "198.51.100.0/24:8000-8100", "pypi.org",
   * "*.pythonhosted.org:443".
   */
  denyOut?: Schemas["NetworkPolicy"]["deny_out"];
  /**
   * The Host header the sandbox's ports get from the port proxy instead of the client's; `${PORT}`
   * stands for the port, e.g. `localhost:${PORT}`.
   */
  maskRequestHost?: Schemas["NetworkPolicy"]["mask_request_host"];
  /**
   * Header transforms (E2B's `rules`), by host: a DNS name or `*.name` that is also in allow_out.
   * HTTPS to such a host is intercepted with the sandbox's own CA (which its guest is given to
   * trust) so that its requests get the headers and `${secrets.NAME}` placeholders are resolved;
   * every other connection passes untouched. E.g. `{"api.example.com": [{"transform": {"headers":
   * {"Authorization": "Bearer ${secrets.TOKEN}"}}}]}`.
   */
  rules?: Schemas["NetworkPolicy"]["rules"];
}

/**
 * `NetworkUpdateRequest` in camelCase. A running (or hibernated) sandbox's new network policy: it
 * replaces the whole policy, as a spawn would set it (an omitted field takes a spawn's default).
 */
export interface NetworkUpdateRequestOptions {
  /**
   * Open outbound traffic to the public internet (denied by default): every destination but
   * private, link-local, loopback and multicast ranges, the host and other sandboxes. Needs a
   * snapshot with a NIC, and net.ipv4.ip_forward=1 on the host.
   */
  allowInternetAccess?: Schemas["NetworkUpdateRequest"]["allow_internet_access"];
  /**
   * Destinations always open (allow wins over deny); each an IPv4 address or CIDR, or a DNS name
   * (`*.` for every name below one), optionally with :PORT or :FIRST-LAST (TCP and UDP), e.g.
   * "10.0.0.0/8", "192.0.2.7:443", "198.51.100.0/24:8000-8100", "pypi.org",
   * "*.pythonhosted.org:443". Opens private ranges and the host too (the host is the sandboxes'
   * gateway, e.g. 10.201.0.1).
   */
  allowOut?: Schemas["NetworkUpdateRequest"]["allow_out"];
  /**
   * Whether anyone who reaches the daemon may reach the sandbox's ports through its port proxy
   * (`{port}-{sandbox id}.<domain>` as the Host; docs/API.md). Off: a request needs the daemon's
   * bearer token or the sandbox's traffic token (`E2B-Traffic-Access-Token`).
   */
  allowPublicTraffic?: Schemas["NetworkUpdateRequest"]["allow_public_traffic"];
  /**
   * Destinations closed even with allow_internet_access; each an IPv4 address or CIDR, or a DNS
   * name (`*.` for every name below one), optionally with :PORT or :FIRST-LAST (TCP and UDP), e.g.
   * "10.0.0.0/8", "192.0.2.7:443", "198.51.100.0/24:8000-8100", "pypi.org",
   * "*.pythonhosted.org:443".
   */
  denyOut?: Schemas["NetworkUpdateRequest"]["deny_out"];
  /**
   * The Host header the sandbox's ports get from the port proxy instead of the client's; `${PORT}`
   * stands for the port, e.g. `localhost:${PORT}`.
   */
  maskRequestHost?: Schemas["NetworkUpdateRequest"]["mask_request_host"];
  /**
   * Header transforms (E2B's `rules`), by host: a DNS name or `*.name` that is also in allow_out.
   * HTTPS to such a host is intercepted with the sandbox's own CA (which its guest is given to
   * trust) so that its requests get the headers and `${secrets.NAME}` placeholders are resolved;
   * every other connection passes untouched. E.g. `{"api.example.com": [{"transform": {"headers":
   * {"Authorization": "Bearer ${secrets.TOKEN}"}}}]}`.
   */
  rules?: Schemas["NetworkUpdateRequest"]["rules"];
}

/** `PoolRequest` in camelCase. */
export interface PoolRequestOptions {
  /** Members' egress; only spawns asking for the same egress draw from the pool. */
  allowInternetAccess?: Schemas["PoolRequest"]["allow_internet_access"];
  /** Members can take mode=live branches; only live_fork spawns draw from the pool. */
  liveFork?: Schemas["PoolRequest"]["live_fork"];
  /** Members get this cgroup memory limit; only spawns asking for it draw from the pool. */
  memoryLimitMib?: Schemas["PoolRequest"]["memory_limit_mib"];
  /** Members' egress lists; only spawns asking for the same draw from the pool. */
  network?: NetworkPolicyOptions | null;
  /** Members run in forkd-child-<i> namespaces; only such spawns draw from the pool. */
  perChildNetns?: Schemas["PoolRequest"]["per_child_netns"];
  /** Paused children to keep ready; 0 drains the pool. */
  size: Schemas["PoolRequest"]["size"];
}

/** `ProcessStartRequest` in camelCase. */
export interface ProcessStartRequestOptions {
  /** argv of the process. */
  args: Schemas["ProcessStartRequest"]["args"];
  /** Working directory in the guest. */
  cwd?: Schemas["ProcessStartRequest"]["cwd"];
  /** Extra environment variables. */
  env?: Schemas["ProcessStartRequest"]["env"];
  /** Text written to standard input first. */
  stdin?: Schemas["ProcessStartRequest"]["stdin"];
  /**
   * Keep standard input open after stdin, for POST .../processes/{pid}/stdin; else it is closed.
   */
  stdinOpen?: Schemas["ProcessStartRequest"]["stdin_open"];
  /** Any label of yours, shown in the process list. */
  tag?: Schemas["ProcessStartRequest"]["tag"];
  /** Kill the process group after this long; default: no limit. */
  timeoutSecs?: Schemas["ProcessStartRequest"]["timeout_secs"];
  /**
   * The guest user to act as, by name from the guest's /etc/passwd (every image has "user", uid
   * 1000, home /home/user): its uid, gid and groups, HOME/USER/LOGNAME, its home as the default
   * working directory, and files it writes are its own. Omitted: root, in the agent's own
   * environment (working directory /root), as before. A name the guest does not know is a 400.
   */
  user?: Schemas["ProcessStartRequest"]["user"];
}

/** `PromoteRequest` in camelCase. */
export interface PromoteRequestOptions {
  /** Kill every other live child of the tree. */
  cleanupSiblings?: Schemas["PromoteRequest"]["cleanup_siblings"];
  /** Also kill the tree's source; its id then names the winner in every endpoint. */
  replaceParent?: Schemas["PromoteRequest"]["replace_parent"];
  /** The fork-tree; default: the winner's metadata fork_tree_id. */
  treeId?: Schemas["PromoteRequest"]["tree_id"];
}

/** `PushRequest` in camelCase. */
export interface PushRequestOptions {
  /** Replace a different snapshot of the same tag in the store. */
  force?: Schemas["PushRequest"]["force"];
}

/**
 * `RegistryAuth` in camelCase. A registry's user name and password or token, as Docker's
 * config.json holds them.
 */
export interface RegistryAuthOptions {
  /** The password or token. */
  password: Schemas["RegistryAuth"]["password"];
  /** The user name. */
  username: Schemas["RegistryAuth"]["username"];
}

/** `SignalRequest` in camelCase. */
export interface SignalRequestOptions {
  /**
   * Signal the process's whole process group (it is a session leader); false: the process alone.
   */
  group?: Schemas["SignalRequest"]["group"];
  /** The signal, by name. */
  signal: Schemas["SignalRequest"]["signal"];
}

/** `SpawnRequest` in camelCase. */
export interface SpawnRequestOptions {
  /**
   * Open outbound traffic to the public internet (denied by default): every destination but
   * private, link-local, loopback and multicast ranges, the host and other sandboxes. Needs a
   * snapshot with a NIC, and net.ipv4.ip_forward=1 on the host.
   */
  allowInternetAccess?: Schemas["SpawnRequest"]["allow_internet_access"];
  /** One environment per child (length n), applied over env. */
  childEnv?: Schemas["SpawnRequest"]["child_env"];
  /** CPU bandwidth per child in cores (0.5: half a core), a cgroup cpu quota on its QEMU. */
  cpuLimit?: Schemas["SpawnRequest"]["cpu_limit"];
  /**
   * How far each child's own disk layers (its copy-on-write overlay, and what its branches froze)
   * may grow on the host, in MiB. A child that writes past it is stopped: its QEMU is killed and
   * every call answers 502 saying so, as after an OOM kill by memory_limit_mib. Default: the
   * daemon's --disk-quota-mib (1024 unless set); 0: no quota.
   */
  diskQuotaMib?: Schemas["SpawnRequest"]["disk_quota_mib"];
  /**
   * Environment given to every child right after its restore: it shows in os.environ of the warm
   * interpreter (eval) and in every exec.
   */
  env?: Schemas["SpawnRequest"]["env"];
  /**
   * What a fleet gateway sets when it places part of a spread fork-tree on this host: the children
   * get the tree's labels (fork_tree_id, fork_parent_id, and fork_index counted from first_index)
   * as the tree's other children did, so promote finds them. The labels are otherwise set only by
   * fork-tree itself.
   */
  forkTree?: ForkTreeLabelsOptions | null;
  /**
   * At timeout_secs, hibernate each child rather than kill it (E2B's autoPause): it stays listed as
   * hibernated until killed, and its next request wakes it.
   */
  hibernateOnTimeout?: Schemas["SpawnRequest"]["hibernate_on_timeout"];
  /**
   * Each child's hostname, set in the guest at its restore (what hostname and uname -n say,
   * /etc/hostname, and a 127.0.1.1 line of /etc/hosts): RFC 1123 labels joined by dots, at most 64
   * characters. Default: the snapshot's.
   */
  hostname?: Schemas["SpawnRequest"]["hostname"];
  /**
   * Accepted from forkd 0.5 clients and without effect: children map their snapshot's memory file
   * privately (copy-on-write), which hugetlbfs pages cannot back; forkd 0.5 also fell back to 4 KiB
   * pages when none were free.
   */
  hugepages?: Schemas["SpawnRequest"]["hugepages"];
  /**
   * Hibernate each child once it has had no request for this many seconds: the guest pages it
   * changed and its device state go to disk (compressed), its QEMU, cgroup and network are
   * released; its next request of any kind wakes it (same id, address and egress policy, memory,
   * disk and processes intact) and steps its clock first. Not with live_fork or per_child_netns.
   * Default: never.
   */
  idleHibernateSecs?: Schemas["SpawnRequest"]["idle_hibernate_secs"];
  /**
   * Pause each child (QMP stop: it costs no CPU) once it has had no request for this many seconds;
   * its next request of any kind resumes it and steps its clock first. Default: never, since a
   * child with background work must not be paused behind its user's back.
   */
  idlePauseSecs?: Schemas["SpawnRequest"]["idle_pause_secs"];
  /** Boot children so that they can later take mode=live branches. */
  liveFork?: Schemas["SpawnRequest"]["live_fork"];
  /** cgroup memory limit per child (MiB). */
  memoryLimitMib?: Schemas["SpawnRequest"]["memory_limit_mib"];
  /**
   * Labels stored with every child, returned in SandboxInfo and usable as a list filter (GET
   * /v1/sandboxes?metadata=key=value).
   */
  metadata?: Schemas["SpawnRequest"]["metadata"];
  /** Number of children to fork. */
  n?: Schemas["SpawnRequest"]["n"];
  /** Finer egress: allow_out / deny_out lists of destinations. Needs a snapshot with a NIC. */
  network?: NetworkPolicyOptions | null;
  /**
   * Place each child in the namespace forkd-child-<i> (lowest free i): one scripts/netns-setup.sh
   * provisioned is used as it is; a missing one is made and removed with the child. Without it,
   * children of a snapshot with a NIC get a namespace forkd-<id> of their own.
   */
  perChildNetns?: Schemas["SpawnRequest"]["per_child_netns"];
  /**
   * Most tasks (threads) of each child's QEMU (cgroup pids.max); guest processes are not host
   * tasks.
   */
  pidsLimit?: Schemas["SpawnRequest"]["pids_limit"];
  /**
   * forkd 0.5 clients' option: read the snapshot's memory file into the host's page cache before
   * the children start, so their first page touches (and their first BRANCH) do not wait on the
   * disk. Children come from a warm pool of this snapshot whenever one is set, with or without it.
   */
  prewarm?: Schemas["SpawnRequest"]["prewarm"];
  /** Registered snapshot to fork from. */
  snapshotTag: Schemas["SpawnRequest"]["snapshot_tag"];
  /**
   * Kill each child (and free its resources) this many seconds after the spawn returns; POST
   * /v1/sandboxes/{id}/timeout moves the deadline. Default: no deadline.
   */
  timeoutSecs?: Schemas["SpawnRequest"]["timeout_secs"];
  /**
   * hostdir volumes (POST /v1/volumes with fs hostdir) each child mounts besides its snapshot's:
   * one set of files that every sandbox mounting it reads and writes at once (fork shared;
   * docs/BRANCHING.md#shared-volumes). An ext4 volume is a disk, attached when a snapshot is made:
   * naming one here is 400.
   */
  volumes?: VolumeSpecOptions[] | null;
}

/** `StdinRequest` in camelCase. */
export interface StdinRequestOptions {
  /** What to write (text, or base64 with encoding=base64). */
  data?: Schemas["StdinRequest"]["data"];
  /** How data is given: text (UTF-8) or base64. */
  encoding?: Schemas["StdinRequest"]["encoding"];
  /** Close standard input after data. */
  eof?: Schemas["StdinRequest"]["eof"];
}

/** `SuspendWorkspaceRequest` in camelCase. */
export interface SuspendWorkspaceRequestOptions {
  /**
   * Branch its state with mode diff (shorter pause, state as of the end of the copy) instead of
   * full (state as of the request); the sandbox stops either way.
   */
  diff?: Schemas["SuspendWorkspaceRequest"]["diff"];
}

/** `TemplateBuildRequest` in camelCase. */
export interface TemplateBuildRequestOptions {
  /**
   * The build's own egress while RUN steps run (e.g. pip install). Open outbound traffic to the
   * public internet (denied by default): every destination but private, link-local, loopback and
   * multicast ranges, the host and other sandboxes. Needs a snapshot with a NIC, and
   * net.ipv4.ip_forward=1 on the host.
   */
  allowInternetAccess?: Schemas["TemplateBuildRequest"]["allow_internet_access"];
  /** Upper bound on the base layer's boot. */
  bootWaitSecs?: Schemas["TemplateBuildRequest"]["boot_wait_secs"];
  /** Values of the Dockerfile's ARGs. */
  buildArgs?: Schemas["TemplateBuildRequest"]["build_args"];
  /** The build context COPY reads: the digest PUT /v1/templates/contexts answered. */
  context?: Schemas["TemplateBuildRequest"]["context"];
  /**
   * The Dockerfile's text: FROM (a forkd image), RUN, COPY/ADD, ENV, ARG, WORKDIR, USER
   * (docs/TEMPLATES.md).
   */
  dockerfile: Schemas["TemplateBuildRequest"]["dockerfile"];
  /** Guest RAM in MiB. */
  memMib?: Schemas["TemplateBuildRequest"]["mem_mib"];
  /**
   * The build's own egress. Finer egress: allow_out / deny_out lists of destinations. Needs a
   * snapshot with a NIC.
   */
  network?: NetworkPolicyOptions | null;
  /** Give the template, and so every child, a network device. */
  nic?: Schemas["TemplateBuildRequest"]["nic"];
  /** For a FROM of a private registry: its credentials (this build's pull only, never stored). */
  registryAuth?: RegistryAuthOptions | null;
  /** Replace an existing snapshot of this tag once the build has succeeded. */
  replace?: Schemas["TemplateBuildRequest"]["replace"];
  /** Timeout of each RUN and COPY step. */
  stepTimeoutSecs?: Schemas["TemplateBuildRequest"]["step_timeout_secs"];
  /** Name of the template's snapshot. */
  tag: Schemas["TemplateBuildRequest"]["tag"];
  /** Guest vCPUs. */
  vcpus?: Schemas["TemplateBuildRequest"]["vcpus"];
}

/** `TimeoutRequest` in camelCase. */
export interface TimeoutRequestOptions {
  /**
   * The sandbox is killed this many seconds from now, whether that is sooner or later than its
   * previous deadline (E2B's set_timeout).
   */
  timeoutSecs: Schemas["TimeoutRequest"]["timeout_secs"];
}

/** `UpdateSecretRequest` in camelCase. */
export interface UpdateSecretRequestOptions {
  /** New labels, replacing the old. */
  metadata?: Schemas["UpdateSecretRequest"]["metadata"];
  /** A new value (its version goes up by one). */
  value?: Schemas["UpdateSecretRequest"]["value"];
}

/**
 * `VolumeSpec` in camelCase. One volume to attach (store/volume_spec.py): exactly one of name and
 * host_path.
 */
export interface VolumeSpecOptions {
  /**
   * copy (an ext4 volume's, a host_path's): each child (and each branch) gets its own copy-on-write
   * view of the volume as it was at the snapshot. shared (a hostdir volume's): every sandbox that
   * mounts it reads and writes the one set of files. Default: the volume's kind says; the other is
   * 400.
   */
  fork?: Schemas["VolumeSpec"]["fork"];
  /**
   * A directory on the daemon's host, copied into a new volume kept with the snapshot (the host
   * directory is not written back).
   */
  hostPath?: Schemas["VolumeSpec"]["host_path"];
  /** Where the guest mounts it (an absolute path, e.g. /mnt/data). */
  mount: Schemas["VolumeSpec"]["mount"];
  /** A volume of POST /v1/volumes. */
  name?: Schemas["VolumeSpec"]["name"];
  /**
   * Attached read-only to the template and every child (one file, shared); writes fail in the
   * guest.
   */
  readOnly?: Schemas["VolumeSpec"]["read_only"];
  /** host_path only: the new volume's size (its quota); default 1024. */
  sizeMib?: Schemas["VolumeSpec"]["size_mib"];
}

/** Each request schema's options, by the schema's name. */
export interface RequestOptions {
  ApplyRequest: ApplyRequestOptions;
  BranchRequest: BranchRequestOptions;
  CheckpointPolicyRequest: CheckpointPolicyRequestOptions;
  CodeRequest: CodeRequestOptions;
  CompactRequest: CompactRequestOptions;
  CreateSecretRequest: CreateSecretRequestOptions;
  CreateSnapshotRequest: CreateSnapshotRequestOptions;
  CreateVolumeRequest: CreateVolumeRequestOptions;
  CreateWorkspaceRequest: CreateWorkspaceRequestOptions;
  EvalRequest: EvalRequestOptions;
  ExecRequest: ExecRequestOptions;
  ExecStreamRequest: ExecStreamRequestOptions;
  ExportVolumeRequest: ExportVolumeRequestOptions;
  ForkRequest: ForkRequestOptions;
  ForkTreeLabels: ForkTreeLabelsOptions;
  HibernateRequest: HibernateRequestOptions;
  ImagePullRequest: ImagePullRequestOptions;
  MkdirRequest: MkdirRequestOptions;
  NetworkPolicy: NetworkPolicyOptions;
  NetworkUpdateRequest: NetworkUpdateRequestOptions;
  PoolRequest: PoolRequestOptions;
  ProcessStartRequest: ProcessStartRequestOptions;
  PromoteRequest: PromoteRequestOptions;
  PushRequest: PushRequestOptions;
  RegistryAuth: RegistryAuthOptions;
  SignalRequest: SignalRequestOptions;
  SpawnRequest: SpawnRequestOptions;
  StdinRequest: StdinRequestOptions;
  SuspendWorkspaceRequest: SuspendWorkspaceRequestOptions;
  TemplateBuildRequest: TemplateBuildRequestOptions;
  TimeoutRequest: TimeoutRequestOptions;
  UpdateSecretRequest: UpdateSecretRequestOptions;
  VolumeSpec: VolumeSpecOptions;
}

/** A field's wire name, or `[wire name, schema]` for a field that is itself options. */
export type WireName<S extends keyof RequestOptions> =
  | keyof Schemas[S]
  | readonly [keyof Schemas[S], keyof RequestOptions];

/** The snake_case name each camelCase option is sent under, by schema. */
export const WIRE_NAMES = {
  ApplyRequest: {
    from: "from",
    paths: "paths",
  },
  BranchRequest: {
    diff: "diff",
    live: "live",
    measureDiff: "measure_diff",
    mode: "mode",
    parentTag: "parent_tag",
    tag: "tag",
    wait: "wait",
  },
  CheckpointPolicyRequest: {
    every: "every",
    keep: "keep",
    mode: "mode",
  },
  CodeRequest: {
    code: "code",
    context: "context",
    cwd: "cwd",
    env: "env",
    language: "language",
    timeout: "timeout",
  },
  CompactRequest: {
    to: "to",
  },
  CreateSecretRequest: {
    metadata: "metadata",
    name: "name",
    value: "value",
  },
  CreateSnapshotRequest: {
    allowInternetAccess: "allow_internet_access",
    bootWaitSecs: "boot_wait_secs",
    image: "image",
    kernel: "kernel",
    memMib: "mem_mib",
    network: ["network", "NetworkPolicy"],
    nic: "nic",
    rootfs: "rootfs",
    rw: "rw",
    setup: "setup",
    setupEval: "setup_eval",
    setupTimeoutSecs: "setup_timeout_secs",
    tag: "tag",
    tap: "tap",
    vcpus: "vcpus",
    volumes: ["volumes", "VolumeSpec"],
    warmImports: "warm_imports",
  },
  CreateVolumeRequest: {
    fs: "fs",
    name: "name",
    sizeMib: "size_mib",
    source: "source",
  },
  CreateWorkspaceRequest: {
    memoryLimitMib: "memory_limit_mib",
    name: "name",
    perChildNetns: "per_child_netns",
    snapshotTag: "snapshot_tag",
  },
  EvalRequest: {
    code: "code",
    timeoutSecs: "timeout_secs",
  },
  ExecRequest: {
    args: "args",
    cwd: "cwd",
    env: "env",
    stdin: "stdin",
    timeoutSecs: "timeout_secs",
    user: "user",
  },
  ExecStreamRequest: {
    args: "args",
    cwd: "cwd",
    encoding: "encoding",
    env: "env",
    stdin: "stdin",
    stdinOpen: "stdin_open",
    tag: "tag",
    timeoutSecs: "timeout_secs",
    user: "user",
  },
  ExportVolumeRequest: {
    snapshot: "snapshot",
    to: "to",
  },
  ForkRequest: {
    allowInternetAccess: "allow_internet_access",
    childEnv: "child_env",
    childMemoryLimitMib: "child_memory_limit_mib",
    count: "count",
    env: "env",
    hostname: "hostname",
    idleHibernateSecs: "idle_hibernate_secs",
    idlePauseSecs: "idle_pause_secs",
    keepSnapshot: "keep_snapshot",
    liveFork: "live_fork",
    memoryLimitMib: "memory_limit_mib",
    metadata: "metadata",
    network: ["network", "NetworkPolicy"],
    perChildNetns: "per_child_netns",
    spread: "spread",
    timeoutSecs: "timeout_secs",
  },
  ForkTreeLabels: {
    firstIndex: "first_index",
    parentId: "parent_id",
    treeId: "tree_id",
  },
  HibernateRequest: {
    memory: "memory",
  },
  ImagePullRequest: {
    force: "force",
    name: "name",
    ref: "ref",
    registryAuth: ["registry_auth", "RegistryAuth"],
  },
  MkdirRequest: {
    parents: "parents",
    path: "path",
    user: "user",
  },
  NetworkPolicy: {
    allowOut: "allow_out",
    allowPublicTraffic: "allow_public_traffic",
    denyOut: "deny_out",
    maskRequestHost: "mask_request_host",
    rules: "rules",
  },
  NetworkUpdateRequest: {
    allowInternetAccess: "allow_internet_access",
    allowOut: "allow_out",
    allowPublicTraffic: "allow_public_traffic",
    denyOut: "deny_out",
    maskRequestHost: "mask_request_host",
    rules: "rules",
  },
  PoolRequest: {
    allowInternetAccess: "allow_internet_access",
    liveFork: "live_fork",
    memoryLimitMib: "memory_limit_mib",
    network: ["network", "NetworkPolicy"],
    perChildNetns: "per_child_netns",
    size: "size",
  },
  ProcessStartRequest: {
    args: "args",
    cwd: "cwd",
    env: "env",
    stdin: "stdin",
    stdinOpen: "stdin_open",
    tag: "tag",
    timeoutSecs: "timeout_secs",
    user: "user",
  },
  PromoteRequest: {
    cleanupSiblings: "cleanup_siblings",
    replaceParent: "replace_parent",
    treeId: "tree_id",
  },
  PushRequest: {
    force: "force",
  },
  RegistryAuth: {
    password: "password",
    username: "username",
  },
  SignalRequest: {
    group: "group",
    signal: "signal",
  },
  SpawnRequest: {
    allowInternetAccess: "allow_internet_access",
    childEnv: "child_env",
    cpuLimit: "cpu_limit",
    diskQuotaMib: "disk_quota_mib",
    env: "env",
    forkTree: ["fork_tree", "ForkTreeLabels"],
    hibernateOnTimeout: "hibernate_on_timeout",
    hostname: "hostname",
    hugepages: "hugepages",
    idleHibernateSecs: "idle_hibernate_secs",
    idlePauseSecs: "idle_pause_secs",
    liveFork: "live_fork",
    memoryLimitMib: "memory_limit_mib",
    metadata: "metadata",
    n: "n",
    network: ["network", "NetworkPolicy"],
    perChildNetns: "per_child_netns",
    pidsLimit: "pids_limit",
    prewarm: "prewarm",
    snapshotTag: "snapshot_tag",
    timeoutSecs: "timeout_secs",
    volumes: ["volumes", "VolumeSpec"],
  },
  StdinRequest: {
    data: "data",
    encoding: "encoding",
    eof: "eof",
  },
  SuspendWorkspaceRequest: {
    diff: "diff",
  },
  TemplateBuildRequest: {
    allowInternetAccess: "allow_internet_access",
    bootWaitSecs: "boot_wait_secs",
    buildArgs: "build_args",
    context: "context",
    dockerfile: "dockerfile",
    memMib: "mem_mib",
    network: ["network", "NetworkPolicy"],
    nic: "nic",
    registryAuth: ["registry_auth", "RegistryAuth"],
    replace: "replace",
    stepTimeoutSecs: "step_timeout_secs",
    tag: "tag",
    vcpus: "vcpus",
  },
  TimeoutRequest: {
    timeoutSecs: "timeout_secs",
  },
  UpdateSecretRequest: {
    metadata: "metadata",
    value: "value",
  },
  VolumeSpec: {
    fork: "fork",
    hostPath: "host_path",
    mount: "mount",
    name: "name",
    readOnly: "read_only",
    sizeMib: "size_mib",
  },
} as const satisfies {
  readonly [S in keyof RequestOptions]: {
    readonly [K in keyof RequestOptions[S]]-?: WireName<S>;
  };
};
