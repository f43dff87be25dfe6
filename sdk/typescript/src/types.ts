/**
 * The SDK's data types. Answers and request bodies are the daemon's own
 * OpenAPI schemas (`generated/schema.ts`, by `scripts/gen_ts_types.py`), so they
 * cannot drift from what the daemon serves; the option objects are the
 * camelCase spelling callers write (`generated/options.ts`, generated from the
 * same document), mapped onto those bodies by `wire.ts`.
 */

import type {
  BranchRequestOptions,
  CheckpointPolicyRequestOptions,
  CodeRequestOptions,
  CreateSnapshotRequestOptions,
  CreateSecretRequestOptions,
  CreateVolumeRequestOptions,
  ExportVolumeRequestOptions,
  CreateWorkspaceRequestOptions,
  EvalRequestOptions,
  ExecRequestOptions,
  ExecStreamRequestOptions,
  ForkRequestOptions,
  HibernateRequestOptions,
  NetworkPolicyOptions,
  PoolRequestOptions,
  ProcessStartRequestOptions,
  PromoteRequestOptions,
  PushRequestOptions,
  SpawnRequestOptions,
  SuspendWorkspaceRequestOptions,
  UpdateSecretRequestOptions,
} from "./generated/options.js";
import type { components } from "./generated/schema.js";

/** Every request body's camelCase options (`SpawnRequestOptions`, ...), generated. */
export type * from "./generated/options.js";

type Schemas = components["schemas"];

export type SnapshotInfo = Schemas["SnapshotInfo"];
export type SnapshotDetail = Schemas["SnapshotDetail"];
export type SandboxInfo = Schemas["SandboxInfo"];
export type SandboxMemory = Schemas["SandboxMemory"];
export type SandboxDiff = Schemas["SandboxDiff"];
export type ApplyResponse = Schemas["ApplyResponse"];

/** `GET /v1/sandboxes/{id}/diff`'s query: against `parent` (default), `snapshot:TAG` or `sandbox:ID`. */
export interface DiffOptions {
  against?: string;
  /** Only paths under these prefixes, or with a part matching these names. */
  include?: string[];
  /** Leave these out; default: /proc, /sys, /tmp, caches, ... */
  exclude?: string[];
}
export type ExecResponse = Schemas["ExecResponse"];
export type EvalResponse = Schemas["EvalResponse"];
export type PingResponse = Schemas["PingResponse"];
export type ForkResponse = Schemas["ForkResponse"];
export type ForkError = Schemas["ForkError"];
export type PromoteResponse = Schemas["PromoteResponse"];
export type Deletion = Schemas["Deletion"];
export type CheckpointList = Schemas["CheckpointList"];
export type PoolInfo = Schemas["PoolInfo"];
export type PushResult = Schemas["PushResult"];
export type PullResult = Schemas["PullResult"];
export type WorkspaceInfo = Schemas["WorkspaceInfo"];
export type VolumeInfo = Schemas["VolumeInfo"];
export type SecretInfo = Schemas["SecretInfo"];
export type VolumeExport = Schemas["VolumeExport"];
export type FileInfo = Schemas["FileInfo"];
export type FileList = Schemas["FileList"];
export type MkdirResponse = Schemas["MkdirResponse"];
export type Health = Schemas["Health"];
export type Version = Schemas["Version"];
export type SandboxNetwork = Schemas["SandboxNetwork"];
export type ProcessInfo = Schemas["ProcessInfo"];
export type StdinResponse = Schemas["StdinResponse"];
export type SignalResponse = Schemas["SignalResponse"];
export type CancelEvalResponse = Schemas["CancelEvalResponse"];

/** Request bodies, exactly as the daemon validates them. */
export type SpawnRequest = Schemas["SpawnRequest"];
export type ForkRequest = Schemas["ForkRequest"];
export type BranchRequest = Schemas["BranchRequest"];
export type CreateSnapshotRequest = Schemas["CreateSnapshotRequest"];
export type ExecRequest = Schemas["ExecRequest"];
export type PromoteRequest = Schemas["PromoteRequest"];
export type PoolRequest = Schemas["PoolRequest"];
export type CheckpointPolicyRequest = Schemas["CheckpointPolicyRequest"];
export type EvalRequest = Schemas["EvalRequest"];
export type ExecStreamRequest = Schemas["ExecStreamRequest"];
export type ProcessStartRequest = Schemas["ProcessStartRequest"];
export type StdinRequest = Schemas["StdinRequest"];
export type SignalRequest = Schemas["SignalRequest"];
export type NetworkUpdateRequest = Schemas["NetworkUpdateRequest"];
export type CodeRequest = Schemas["CodeRequest"];
/** A kernel's language, by every name the daemon takes (`js` is `javascript`). */
export type KernelLanguage = NonNullable<CodeRequest["language"]>;

/** The signals a process may be sent, by name. */
export type SignalName = SignalRequest["signal"];
/** How output `data` is carried: UTF-8 text, or base64 of the exact bytes. */
export type OutputEncoding = NonNullable<ExecStreamRequest["encoding"]>;

export type BranchMode = NonNullable<BranchRequest["mode"]>;
export type Env = Record<string, string>;

/**
 * The option objects of the requests below are generated from the daemon's request
 * models (src/generated/options.ts: every field, camelCase, with the daemon's own
 * description), so each field a model has can be sent; `toWire` (wire.ts) maps them
 * onto the snake_case bodies. Arguments a method takes positionally are left out.
 */

/** Outbound traffic a sandbox may send (E2B's `network`): denied by default. */
export type NetworkOptions = NetworkPolicyOptions;

/** `POST /v1/sandboxes`: fork `n` children of a snapshot. */
export type SpawnOptions = SpawnRequestOptions;

/** `POST /v1/sandboxes/{id}/fork` and `/fork-tree`: fork a running sandbox. */
export type ForkOptions = ForkRequestOptions;

/** Options every way of making children shares (spawn and fork). */
export type ChildOptions = Pick<SpawnOptions, keyof SpawnOptions & keyof ForkOptions>;

/** The egress options of a spawn, fork, pool or template (they need a snapshot with a NIC). */
export type EgressOptions = Pick<SpawnOptions, "allowInternetAccess" | "network">;

/** `POST /v1/sandboxes/{id}/branch`. */
export type BranchOptions = BranchRequestOptions;

/** `POST /v1/snapshots`: boot a template VM, warm it, snapshot it. */
export interface CreateSnapshotOptions extends Omit<CreateSnapshotRequestOptions, "setup"> {
  /** Commands run before the snapshot: a string runs via `/bin/sh -c`, an array is an argv. */
  setup?: (string | string[])[];
}

/** `POST /v1/sandboxes/{id}/exec`. */
export type ExecOptions = Omit<ExecRequestOptions, "args">;

/** A file operation's guest user (e.g. "user": uid 1000); default root. */
export interface FileUser {
  user?: string;
}

/** `POST /v1/sandboxes/{id}/eval`. */
export type EvalOptions = Omit<EvalRequestOptions, "code">;

/** How a process is started (`POST .../processes`; `.../exec/stream` adds `encoding`). */
export type ProcessOptions = Omit<ProcessStartRequestOptions, "args">;

/** `POST /v1/sandboxes/{id}/exec/stream`. */
export type ExecStreamOptions = Omit<ExecStreamRequestOptions, "args">;

/** `GET /v1/sandboxes/{id}/processes/{pid}/stream`. */
export interface StreamProcessOptions {
  /** `"start"` (default): the oldest output the guest still keeps (up to 1 MiB); `"now"`: only what comes next. */
  from?: "start" | "now";
  encoding?: OutputEncoding;
}

/** The first event of a process stream. */
export interface StartEvent {
  type: "start";
  /** The process's pid in the guest. */
  pid: number;
}

/** A piece of output, as the process wrote it (text, or base64 with `encoding: "base64"`). */
export interface OutputEvent {
  type: "stdout" | "stderr";
  data: string;
}

/** Output the guest no longer kept when this stream came to read it (`streamProcess` only). */
export interface DroppedEvent {
  type: "dropped";
  bytes: number;
}

/** The last event: how the process ended. */
export interface ExitEvent {
  type: "exit";
  pid: number;
  /** Negative: killed by that signal (also in `signal`); 124 after its `timeoutSecs`. */
  exit_code: number | null;
  signal: number | null;
  timed_out: boolean;
  error: string | null;
}

/** One line of a process stream (NDJSON); see docs/API.md "Processes in a sandbox". */
export type ProcessEvent = StartEvent | OutputEvent | DroppedEvent | ExitEvent;

/** `POST /v1/sandboxes/{id}/code`: where and how a cell runs. */
export interface CodeOptions extends Omit<CodeRequestOptions, "code"> {
  /** Interrupt the kernel after this many seconds (daemon default 300); `timeout`'s other name. */
  timeoutSecs?: number;
}

/** What the cell wrote. */
export interface CodeOutputEvent {
  type: "stdout" | "stderr";
  text: string;
}

/** The cell's value (`is_main_result`), or a `display()`/figure: its MIME bundle. */
export interface CodeResultEvent {
  type: "result";
  data: Record<string, unknown>;
  is_main_result: boolean;
}

/** The cell raised (an event of the cell, not a broken stream). */
export interface CodeErrorEvent {
  type: "error";
  name: string;
  value: string;
  traceback: string;
}

/** The last event; an `error` means the stream broke (or the guest refused the cell). */
export interface CodeEndEvent {
  type: "end";
  execution_count: number | null;
  timed_out: boolean;
  restarted: boolean;
  error?: string;
}

/** One line of a cell's stream (NDJSON); see docs/API.md "Code on a Jupyter kernel". */
export type CodeEvent = CodeOutputEvent | CodeResultEvent | CodeErrorEvent | CodeEndEvent;

/** Called with each piece of output text; a returned promise is awaited before the next. */
export type OutputCallback = (data: string) => void | Promise<void>;

/** `sandbox.commands.run` (and `connect`): E2B's options, with forkd's names for the rest. */
export interface RunOptions extends Omit<ProcessOptions, "timeoutSecs"> {
  /**
   * Kill the process group after this many seconds (default 30); `null` or 0:
   * no limit (then the command is streamed rather than run with a blocking exec).
   */
  timeoutSecs?: number | null;
  /** Resolve as soon as the process has started, to a `CommandHandle` (wait, kill, stdin, signals). */
  background?: boolean;
  /** Called with each piece of stdout as the command writes it. */
  onStdout?: OutputCallback;
  /** Called with each piece of stderr as the command writes it. */
  onStderr?: OutputCallback;
}

/** `POST /v1/sandboxes/{id}/promote`. */
export type PromoteOptions = PromoteRequestOptions;

/** `PUT /v1/snapshots/{tag}/pool` (the size is an argument). */
export type PoolOptions = Omit<PoolRequestOptions, "size">;

/** `POST /v1/sandboxes/{id}/checkpoints` (`every` is an argument). */
export type CheckpointOptions = Omit<CheckpointPolicyRequestOptions, "every">;

/** `POST /v1/sandboxes/{id}/hibernate`. */
export type HibernateOptions = HibernateRequestOptions;

/** `POST /v1/snapshots/{tag}/push`. */
export type PushOptions = PushRequestOptions;

/** `POST /v1/workspaces` (the name and the snapshot are arguments). */
export type CreateWorkspaceOptions = Omit<CreateWorkspaceRequestOptions, "name" | "snapshotTag">;

/** `POST /v1/volumes` (the name is an argument). */
export type CreateVolumeOptions = Omit<CreateVolumeRequestOptions, "name">;

/** `POST /v1/volumes/{name}/export` (the name and the directory are arguments). */
export type ExportVolumeOptions = Omit<ExportVolumeRequestOptions, "to">;

/** `POST /v1/secrets` (the name and the value are arguments). */
export type CreateSecretOptions = Omit<CreateSecretRequestOptions, "name" | "value">;

/** `PUT /v1/secrets/{name}`: a new value, new labels, or both. */
export type UpdateSecretOptions = UpdateSecretRequestOptions;

/** `POST /v1/workspaces/{name}/suspend`. */
export type SuspendWorkspaceOptions = SuspendWorkspaceRequestOptions;

/** `GET /v1/sandboxes` filters. */
export interface ListSandboxesOptions {
  /** Only children of this snapshot. */
  snapshotTag?: string;
  /** Only sandboxes whose metadata has every one of these pairs. */
  metadata?: Record<string, string>;
  /** Only sandboxes in this state. */
  state?: "running" | "paused" | "hibernated";
  /** A page of at most this many (1 to 1000), oldest first. */
  limit?: number;
  /** The page after this sandbox id (the last id of the previous page). */
  after?: string;
}

/** Waiting for a snapshot a live `wait: false` branch is still writing. */
export interface WaitOptions {
  /** Give up after this many milliseconds (default 600 000); `null` waits forever. */
  timeoutMs?: number | null;
  /** Poll interval in milliseconds (default 200). */
  intervalMs?: number;
}

/** Data accepted by a file write. */
export type FileData = string | Uint8Array | ArrayBuffer | Blob | ReadableStream<Uint8Array>;
