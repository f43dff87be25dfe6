/**
 * `Controller`: one method per route of the daemon's REST API (v1), the
 * TypeScript twin of the Python SDK's `forkd.Controller`.
 */

import { createReadStream, createWriteStream } from "node:fs";
import { constants as osConstants } from "node:os";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { ReadableStream as NodeReadableStream } from "node:stream/web";

import { ForkdTimeoutError, NotFoundError, SnapshotFailedError } from "./errors.js";
import { type Call, type ClientOptions, EXEC_GRACE_SECS, type RequestBody, Transport, seg } from "./http.js";
import { CodeEventStream, ProcessEventStream } from "./stream.js";
import { Terminal, type TerminalOptions } from "./terminal.js";
import { toWire, toWireOrNone } from "./wire.js";
import type {
  BranchOptions,
  CancelEvalResponse,
  CodeOptions,
  EvalOptions,
  ExecStreamOptions,
  ProcessInfo,
  ProcessOptions,
  SignalName,
  SignalRequest,
  SignalResponse,
  StdinRequest,
  StdinResponse,
  StreamProcessOptions,
  CheckpointList,
  CheckpointOptions,
  CreateSnapshotOptions,
  CreateSecretOptions,
  CreateVolumeOptions,
  ExportVolumeOptions,
  CreateWorkspaceOptions,
  HibernateOptions,
  PushOptions,
  SuspendWorkspaceOptions,
  EvalResponse,
  ExecOptions,
  ExecResponse,
  FileData,
  FileUser,
  FileInfo,
  FileList,
  ForkOptions,
  ForkResponse,
  Health,
  ListSandboxesOptions,
  NetworkUpdateRequest,
  MkdirResponse,
  PingResponse,
  PoolInfo,
  PoolOptions,
  PromoteOptions,
  PromoteResponse,
  PullResult,
  VolumeExport,
  VolumeInfo,
  SecretInfo,
  UpdateSecretOptions,
  WorkspaceInfo,
  PushResult,
  SandboxInfo,
  SandboxMemory,
  SandboxDiff,
  ApplyResponse,
  ApplyRequestOptions,
  DiffOptions,
  SnapshotDetail,
  SnapshotInfo,
  SpawnOptions,
  Version,
  WaitOptions,
} from "./types.js";

/** A shell string runs via `/bin/sh -c`; an array is the argv itself. */
export function commandArgs(cmd: string | readonly string[]): string[] {
  if (typeof cmd === "string") return ["/bin/sh", "-c", cmd];
  if (cmd.length === 0) throw new TypeError("command must not be empty");
  return [...cmd];
}

/** A pid as a path segment: a positive integer, never anything that adds a path level. */
function pidSegment(pid: number): string {
  if (!Number.isInteger(pid) || pid < 1) throw new TypeError(`a pid is a positive integer, not ${pid}`);
  return String(pid);
}

const SIGNAL_NUMBERS: Readonly<Record<string, number>> = osConstants.signals;

/** `15`, `"TERM"`, `"sigterm"` or `"SIGTERM"` → `"SIGTERM"` (the API's spelling; Linux numbers). */
export function signalName(signal: SignalName | string | number): SignalName {
  if (typeof signal === "number" || /^\d+$/.test(signal)) {
    const number = Number(signal);
    const name = Object.keys(SIGNAL_NUMBERS).find((n) => SIGNAL_NUMBERS[n] === number);
    if (!name) throw new TypeError(`no signal number ${signal}`);
    return name as SignalName;
  }
  const name = signal.toUpperCase();
  return (name.startsWith("SIG") ? name : `SIG${name}`) as SignalName;
}

/** True once a snapshot can be forked; throws if its background write failed. */
export function snapshotIsReady(info: SnapshotInfo): boolean {
  const status = info.status ?? "ready";
  if (status === "failed") throw new SnapshotFailedError(info.tag, info.error);
  return status === "ready";
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * Talks to a forkd daemon over its REST API. `new Controller()` reads
 * `FORKD_URL` and `FORKD_TOKEN` (or `FORKD_TOKEN_FILE`) from the environment.
 *
 * Every method resolves to the daemon's JSON answer, typed from its OpenAPI
 * document, and rejects with a `ForkdAPIError` subclass (`status`, `message`)
 * on an error status or a `ForkdConnectionError` if the daemon is not running.
 *
 * ```ts
 * const ctrl = new Controller();
 * const [parent] = await ctrl.spawnSandboxes({ snapshotTag: "py", n: 1, liveFork: true });
 * const branch = await ctrl.branchSandbox(parent.id, { mode: "diff" });
 * const kids = await ctrl.spawnSandboxes({ snapshotTag: branch.tag, n: 5 });
 * ```
 */
export class Controller {
  readonly #http: Transport;

  constructor(options: ClientOptions = {}) {
    this.#http = new Transport(options);
  }

  /** The daemon address in use. */
  get url(): string {
    return this.#http.url;
  }

  // ------------------------------------------------------------------ status

  /** `GET /healthz` → `{ok: true}` (needs no token). */
  healthz(): Promise<Health> {
    return this.#http.json({ method: "GET", path: "/healthz" });
  }

  /** `GET /version` → `{version, api}`. */
  version(): Promise<Version> {
    return this.#http.json({ method: "GET", path: "/version" });
  }

  /** `GET /metrics`: Prometheus text exposition. */
  async metrics(): Promise<string> {
    return (await this.#http.send({ method: "GET", path: "/metrics" })).text();
  }

  // --------------------------------------------------------------- snapshots

  /** `GET /v1/snapshots`: every registered snapshot. */
  listSnapshots(): Promise<SnapshotInfo[]> {
    return this.#http.json({ method: "GET", path: "/v1/snapshots" });
  }

  /** `GET /v1/snapshots/{tag}`: one snapshot with its lineage (ancestors, dependents, sandboxes). */
  getSnapshot(tag: string): Promise<SnapshotDetail> {
    return this.#http.json({ method: "GET", path: `/v1/snapshots/${seg(tag)}` });
  }

  /** `POST /v1/snapshots`: boot a template VM, warm it up, snapshot it. Resolves once it is ready. */
  createSnapshot(options: CreateSnapshotOptions): Promise<SnapshotInfo> {
    const body = toWire("CreateSnapshotRequest", {
      ...options,
      setup: options.setup?.map((step) => commandArgs(step)),
    });
    return this.#http.json({ method: "POST", path: "/v1/snapshots", json: body, wait: "unbounded" });
  }

  /**
   * `DELETE /v1/snapshots/{tag}`. `cascade` also deletes the snapshots that
   * depend on it; `force` also kills the sandboxes running from it.
   */
  async deleteSnapshot(tag: string, options: { cascade?: boolean; force?: boolean } = {}): Promise<void> {
    await this.#http.json({
      method: "DELETE",
      path: `/v1/snapshots/${seg(tag)}`,
      query: { cascade: options.cascade ? "true" : undefined, force: options.force ? "true" : undefined },
      wait: "unbounded",
    });
  }

  /**
   * Poll `GET /v1/snapshots/{tag}` until it is `"ready"` (a live `wait: false`
   * branch is `"writing"` for a while). Rejects with `SnapshotFailedError` or
   * `ForkdTimeoutError`.
   */
  async waitSnapshotReady(tag: string, options: WaitOptions = {}): Promise<SnapshotDetail> {
    const timeoutMs = options.timeoutMs === undefined ? 600_000 : options.timeoutMs;
    const interval = options.intervalMs ?? 200;
    const deadline = timeoutMs === null ? Infinity : Date.now() + timeoutMs;
    for (;;) {
      const info = await this.getSnapshot(tag);
      if (snapshotIsReady(info)) return info;
      const left = deadline - Date.now();
      if (left <= 0) {
        throw new ForkdTimeoutError(`snapshot '${tag}' is still '${info.status}' after ${timeoutMs} ms`);
      }
      await sleep(Math.min(interval, left));
    }
  }

  // --------------------------------------------------------------- sandboxes

  /**
   * `POST /v1/sandboxes`: fork `n` children of a snapshot, copy-on-write.
   * `spawnSandboxes({snapshotTag: "py", n: 5})` or `spawnSandboxes("py", {n: 5})`.
   */
  spawnSandboxes(options: SpawnOptions): Promise<SandboxInfo[]>;
  spawnSandboxes(snapshotTag: string, options?: Omit<SpawnOptions, "snapshotTag">): Promise<SandboxInfo[]>;
  spawnSandboxes(
    first: SpawnOptions | string,
    rest: Omit<SpawnOptions, "snapshotTag"> = {},
  ): Promise<SandboxInfo[]> {
    const o: SpawnOptions = typeof first === "string" ? { ...rest, snapshotTag: first } : first;
    const body = toWire("SpawnRequest", o);
    return this.#http.json({ method: "POST", path: "/v1/sandboxes", json: body, wait: "unbounded" });
  }

  /** `GET /v1/sandboxes`: every live sandbox, or those matching the filters. */
  listSandboxes(options: ListSandboxesOptions = {}): Promise<SandboxInfo[]> {
    const metadata = Object.entries(options.metadata ?? {}).map(([k, v]) => `${k}=${v}`);
    return this.#http.json({
      method: "GET",
      path: "/v1/sandboxes",
      query: {
        snapshot_tag: options.snapshotTag,
        metadata: metadata.length ? metadata : undefined,
        state: options.state,
        limit: options.limit === undefined ? undefined : String(options.limit),
        after: options.after,
      },
    });
  }

  /** `GET /v1/sandboxes/{id}`. */
  getSandbox(id: string): Promise<SandboxInfo> {
    return this.#http.json({ method: "GET", path: `/v1/sandboxes/${seg(id)}` });
  }

  /**
   * `GET /v1/sandboxes/{id}/memory`: what it costs the host, in bytes: RAM shared with its
   * snapshot and siblings, RAM of its own, pages untouched, its own disk layers. 409 while hibernated.
   */
  sandboxMemory(id: string): Promise<SandboxMemory> {
    return this.#http.json({ method: "GET", path: `/v1/sandboxes/${seg(id)}/memory` });
  }

  #diffCall(id: string, format: string, options: DiffOptions): Call {
    return {
      method: "GET",
      path: `/v1/sandboxes/${seg(id)}/diff`,
      query: { against: options.against ?? "parent", format, include: options.include, exclude: options.exclude },
      wait: "unbounded",
    };
  }

  /**
   * `GET /v1/sandboxes/{id}/diff`: what its filesystem changed since its snapshot (or against
   * `snapshot:TAG` / `sandbox:ID`): added, modified and deleted paths, with mode and owner changes.
   */
  sandboxDiff(id: string, options: DiffOptions = {}): Promise<SandboxDiff> {
    return this.#http.json(this.#diffCall(id, "json", options));
  }

  /** The same changes as a unified patch (`patch -p1` applies it; binary files are flagged). */
  async sandboxPatch(id: string, options: DiffOptions = {}): Promise<string> {
    return (await this.#http.send(this.#diffCall(id, "patch", options))).text();
  }

  /** The added and modified files as a tar. */
  async sandboxDiffTar(id: string, options: DiffOptions = {}): Promise<Uint8Array> {
    return new Uint8Array(await (await this.#http.send(this.#diffCall(id, "tar", options))).arrayBuffer());
  }

  /**
   * `POST /v1/sandboxes/{id}/apply`: write another sandbox's changes since its snapshot (a child's)
   * into this one. A conflict (a path both changed, differently) is a 409 naming every such path,
   * and nothing is written.
   */
  applyChanges(id: string, options: ApplyRequestOptions): Promise<ApplyResponse> {
    return this.#http.json({ method: "POST", path: `/v1/sandboxes/${seg(id)}/apply`,
      json: toWire("ApplyRequest", options), wait: "unbounded" });
  }

  /** `DELETE /v1/sandboxes/{id}`: stop the VM. Snapshots branched from it stay. */
  async killSandbox(id: string): Promise<void> {
    await this.#http.json({ method: "DELETE", path: `/v1/sandboxes/${seg(id)}`, wait: "unbounded" });
  }

  /** `POST /v1/sandboxes/{id}/hibernate`: its changed memory and device state to disk, its QEMU
   * released; its next request of any kind wakes it (`state`: `"hibernated"` meanwhile). */
  hibernateSandbox(id: string, options: HibernateOptions = {}): Promise<SandboxInfo> {
    return this.#http.json({
      method: "POST",
      path: `/v1/sandboxes/${seg(id)}/hibernate`,
      json: toWireOrNone("HibernateRequest", options),
      wait: 60_000,
    });
  }

  /** `POST /v1/sandboxes/{id}/timeout`: kill the sandbox `timeoutSecs` from now. */
  setSandboxTimeout(id: string, timeoutSecs: number): Promise<SandboxInfo> {
    return this.#http.json({
      method: "POST",
      path: `/v1/sandboxes/${seg(id)}/timeout`,
      json: { timeout_secs: timeoutSecs },
    });
  }

  /** `PUT /v1/sandboxes/{id}/network`: replace the sandbox's network policy while it runs (what the
   * body omits takes a spawn's default); a hibernated sandbox gets it at its wake. */
  updateSandboxNetwork(id: string, policy: NetworkUpdateRequest): Promise<SandboxInfo> {
    return this.#http.json({ method: "PUT", path: `/v1/sandboxes/${seg(id)}/network`, json: policy });
  }

  /** `POST /v1/sandboxes/{id}/ping` → `{pong: true, pid: 1, ...}`. */
  ping(id: string): Promise<PingResponse> {
    return this.#http.json({ method: "POST", path: `/v1/sandboxes/${seg(id)}/ping`, wait: 60_000 });
  }

  /**
   * `POST /v1/sandboxes/{id}/exec`: run a subprocess and capture its output.
   * An array is the argv; a string runs via `/bin/sh -c`. A failing command
   * is an answer (`exit_code`, `timed_out`), not a rejection.
   */
  exec(id: string, cmd: string | readonly string[], options: ExecOptions = {}): Promise<ExecResponse> {
    const timeoutSecs = options.timeoutSecs ?? 30;
    const body = toWire("ExecRequest", { ...options, args: commandArgs(cmd), timeoutSecs });
    return this.#http.json({
      method: "POST",
      path: `/v1/sandboxes/${seg(id)}/exec`,
      json: body,
      wait: (timeoutSecs + EXEC_GRACE_SECS) * 1000,
    });
  }

  /**
   * `POST /v1/sandboxes/{id}/eval`: run Python in the warm PID 1 interpreter;
   * the value of a trailing expression is `result` (its repr). One eval runs
   * at most `timeoutSecs` (daemon default 60 s): it then answers
   * `"TimeoutError: ..."`; {@link cancelEval} interrupts it sooner.
   */
  eval(id: string, code: string, options: EvalOptions = {}): Promise<EvalResponse> {
    const body = toWire("EvalRequest", { ...options, code });
    return this.#http.json({
      method: "POST",
      path: `/v1/sandboxes/${seg(id)}/eval`,
      json: body,
      // The daemon answers within the eval's limit; wait that long plus a grace.
      wait: options.timeoutSecs == null ? "unbounded" : (options.timeoutSecs + EXEC_GRACE_SECS) * 1000,
    });
  }

  /**
   * `POST /v1/sandboxes/{id}/eval/cancel`: interrupt the running eval (it
   * answers `"CancelledError: eval cancelled"`) → `{cancelled}`, false when
   * none was running.
   */
  cancelEval(id: string): Promise<CancelEvalResponse> {
    return this.#http.json({ method: "POST", path: `/v1/sandboxes/${seg(id)}/eval/cancel` });
  }

  // --------------------------------------------------------------- processes

  #processes(id: string, what = ""): string {
    return `/v1/sandboxes/${seg(id)}/processes${what}`;
  }

  /** Open an NDJSON stream: resolves once the daemon answered 200 (errors before that reject). */
  async #stream(call: Call): Promise<ProcessEventStream> {
    const abort = new AbortController();
    const response = await this.#http.send({ ...call, wait: "unbounded", signal: abort.signal });
    return new ProcessEventStream(response.body, abort, `${call.method} ${call.path}`);
  }

  /**
   * `POST /v1/sandboxes/{id}/exec/stream`: start a command and stream its
   * events as it runs. Resolves once it has started (a command that cannot
   * start rejects); then `for await (const ev of stream)` yields `start`,
   * `stdout`/`stderr` (`data`), last `exit`. Leaving the loop early (or
   * `stream.close()`) kills the command.
   */
  execStream(id: string, cmd: string | readonly string[], options: ExecStreamOptions = {}): Promise<ProcessEventStream> {
    const body = toWire("ExecStreamRequest", { ...options, args: commandArgs(cmd) });
    return this.#stream({ method: "POST", path: `/v1/sandboxes/${seg(id)}/exec/stream`, json: body });
  }

  /**
   * `POST /v1/sandboxes/{id}/code`: run a cell on one of the sandbox's
   * Jupyter kernels and stream its events as it runs. Resolves once the daemon
   * has answered (a sandbox without a kernel rejects with a `ConflictError`);
   * then `for await (const ev of stream)` yields `stdout`/`stderr` (`text`),
   * `result` (`data`: the MIME bundle, `is_main_result`), `error` (the cell
   * raised: `name`, `value`, `traceback`), last `end`. Leaving the loop early
   * (or `stream.close()`) interrupts the cell. `Sandbox.runCode` folds these
   * into an `Execution`.
   */
  async codeStream(id: string, code: string, options: CodeOptions = {}): Promise<CodeEventStream> {
    const { timeoutSecs, ...rest } = options;
    const body = toWire("CodeRequest", { ...rest, code, timeout: rest.timeout ?? timeoutSecs });
    const abort = new AbortController();
    const call: Call = { method: "POST", path: `/v1/sandboxes/${seg(id)}/code`, json: body };
    const response = await this.#http.send({ ...call, wait: "unbounded", signal: abort.signal });
    return new CodeEventStream(response.body, abort, `${call.method} ${call.path}`);
  }

  /**
   * `POST /v1/sandboxes/{id}/processes`: start a background process → its
   * ProcessInfo (`pid`). It runs until it exits, is killed or its
   * `timeoutSecs` pass; watch it with {@link streamProcess}.
   */
  startProcess(id: string, cmd: string | readonly string[], options: ProcessOptions = {}): Promise<ProcessInfo> {
    const body = toWire("ProcessStartRequest", { ...options, args: commandArgs(cmd) });
    return this.#http.json({ method: "POST", path: this.#processes(id), json: body });
  }

  /** `GET /v1/sandboxes/{id}/processes`: the running processes forkd started there. */
  listProcesses(id: string): Promise<ProcessInfo[]> {
    return this.#http.json({ method: "GET", path: this.#processes(id) });
  }

  /** `GET /v1/sandboxes/{id}/processes/{pid}`: running, or among the 16 that ended last. */
  getProcess(id: string, pid: number): Promise<ProcessInfo> {
    return this.#http.json({ method: "GET", path: this.#processes(id, `/${pidSegment(pid)}`) });
  }

  /**
   * `GET /v1/sandboxes/{id}/processes/{pid}/stream`: a process's events, as
   * for {@link execStream}: from the oldest output the guest still keeps
   * (`from: "start"`, up to 1 MiB; a `dropped` event says how much it no
   * longer had) or from now. Leaving the loop leaves the process running.
   */
  streamProcess(id: string, pid: number, options: StreamProcessOptions = {}): Promise<ProcessEventStream> {
    return this.#stream({
      method: "GET",
      path: this.#processes(id, `/${pidSegment(pid)}/stream`),
      query: { from: options.from ?? "start", encoding: options.encoding === "base64" ? "base64" : undefined },
    });
  }

  /**
   * `POST .../processes/{pid}/stdin`: write to its standard input (it must
   * have been started with `stdinOpen`). A string is sent as UTF-8, bytes
   * exactly; `eof` closes it afterwards.
   */
  sendStdin(id: string, pid: number, data: string | Uint8Array, options: { eof?: boolean } = {}): Promise<StdinResponse> {
    const body: StdinRequest =
      typeof data === "string"
        ? { data }
        : { data: Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString("base64"), encoding: "base64" };
    if (options.eof) body.eof = true;
    return this.#http.json({ method: "POST", path: this.#processes(id, `/${pidSegment(pid)}/stdin`), json: body });
  }

  /** Close a process's standard input (it reads end-of-file). */
  closeStdin(id: string, pid: number): Promise<StdinResponse> {
    return this.sendStdin(id, pid, "", { eof: true });
  }

  /**
   * `POST .../processes/{pid}/signal`: `"SIGTERM"` (default), `"INT"`, `9`, ...
   * to its whole process group, or (`group: false`) the process alone.
   */
  signalProcess(
    id: string,
    pid: number,
    signal: SignalName | string | number = "SIGTERM",
    options: { group?: boolean } = {},
  ): Promise<SignalResponse> {
    const body: SignalRequest = { signal: signalName(signal) };
    if (options.group === false) body.group = false;
    return this.#http.json({ method: "POST", path: this.#processes(id, `/${pidSegment(pid)}/signal`), json: body });
  }

  /**
   * `/v1/sandboxes/{id}/terminal` (a WebSocket): a login shell on a pty in the sandbox;
   * closing the terminal kills it. See {@link Terminal}.
   */
  openTerminal(id: string, options: TerminalOptions = {}): Promise<Terminal> {
    return Terminal.open(this.#http.url, this.#http.token, id, options);
  }

  /** `DELETE .../processes/{pid}`: SIGKILL its process group; false if it was not running. */
  async killProcess(id: string, pid: number): Promise<boolean> {
    try {
      await this.#http.json({ method: "DELETE", path: this.#processes(id, `/${pidSegment(pid)}`) });
      return true;
    } catch (err) {
      if (err instanceof NotFoundError) return false;
      throw err;
    }
  }

  /**
   * `POST /v1/sandboxes/{id}/branch`: snapshot a running sandbox into a new tag;
   * it pauses briefly and resumes. With `{mode: "live", wait: false}` the
   * answer comes while the memory is still copied (`status: "writing"`).
   */
  branchSandbox(id: string, options: BranchOptions = {}): Promise<SnapshotInfo> {
    const body = toWire("BranchRequest", options);
    return this.#http.json({
      method: "POST",
      path: `/v1/sandboxes/${seg(id)}/branch`,
      json: body,
      wait: "unbounded",
    });
  }

  // ------------------------------------------------- forking a running sandbox

  /**
   * `POST /v1/sandboxes/{id}/fork`: fork a running sandbox into `count`
   * children that start from its state now; it keeps running. Each child
   * succeeds or fails on its own (`children`, `errors`).
   */
  forkSandbox(id: string, options: ForkOptions = {}): Promise<ForkResponse> {
    return this.#fork(id, "fork", options);
  }

  /** `POST /v1/sandboxes/{id}/fork-tree`: {@link forkSandbox} as one fork-tree (`tree_id`), for {@link promoteSandbox}. */
  forkTree(id: string, options: ForkOptions = {}): Promise<ForkResponse> {
    return this.#fork(id, "fork-tree", options);
  }

  #fork(id: string, route: "fork" | "fork-tree", o: ForkOptions): Promise<ForkResponse> {
    const body = toWire("ForkRequest", o);
    return this.#http.json({
      method: "POST",
      path: `/v1/sandboxes/${seg(id)}/${route}`,
      json: body,
      wait: "unbounded",
    });
  }

  /**
   * `POST /v1/sandboxes/{id}/promote`: keep this fork-tree child, kill its
   * siblings; with `replaceParent` the source goes too and its id names the winner.
   */
  promoteSandbox(id: string, options: PromoteOptions = {}): Promise<PromoteResponse> {
    const body = toWire("PromoteRequest", options);
    return this.#http.json({
      method: "POST",
      path: `/v1/sandboxes/${seg(id)}/promote`,
      json: body,
      wait: "unbounded",
    });
  }

  /** `POST /v1/sandboxes/{id}/checkpoints`: branch after every `every`-th exec/eval call, keep the newest `keep`. */
  setCheckpoints(id: string, every: number, options: CheckpointOptions = {}): Promise<CheckpointList> {
    const body = toWire("CheckpointPolicyRequest", { ...options, every });
    return this.#http.json({ method: "POST", path: `/v1/sandboxes/${seg(id)}/checkpoints`, json: body });
  }

  /** `GET /v1/sandboxes/{id}/checkpoints`: the policy and the kept checkpoints, oldest first. */
  getCheckpoints(id: string): Promise<CheckpointList> {
    return this.#http.json({ method: "GET", path: `/v1/sandboxes/${seg(id)}/checkpoints` });
  }

  /** `DELETE /v1/sandboxes/{id}/checkpoints`: stop the policy; the checkpoints taken stay. */
  deleteCheckpoints(id: string): Promise<CheckpointList> {
    return this.#http.json({ method: "DELETE", path: `/v1/sandboxes/${seg(id)}/checkpoints` });
  }

  // -------------------------------------------------------------- warm pools

  /** `PUT /v1/snapshots/{tag}/pool`: keep `size` children restored and paused (0 drains). */
  setPool(tag: string, size: number, options: PoolOptions = {}): Promise<PoolInfo> {
    const body = toWire("PoolRequest", { ...options, size });
    return this.#http.json({
      method: "PUT",
      path: `/v1/snapshots/${seg(tag)}/pool`,
      json: body,
      wait: "unbounded",
    });
  }

  /** `GET /v1/snapshots/{tag}/pool` → `{size, ready, claims, misses, ...}`. */
  getPool(tag: string): Promise<PoolInfo> {
    return this.#http.json({ method: "GET", path: `/v1/snapshots/${seg(tag)}/pool` });
  }

  /** `GET /v1/pools`: every warm pool. */
  listPools(): Promise<PoolInfo[]> {
    return this.#http.json({ method: "GET", path: "/v1/pools" });
  }

  // ------------------------------------------------------- the object store

  /** `POST /v1/snapshots/{tag}/push`: publish it (and the chain its disk needs) to the object store. */
  pushSnapshot(tag: string, options: PushOptions = {}): Promise<PushResult> {
    return this.#http.json({
      method: "POST",
      path: `/v1/snapshots/${seg(tag)}/push`,
      json: toWireOrNone("PushRequest", options),
      wait: "unbounded",
    });
  }

  /** `POST /v1/snapshots/{tag}/pull`: fetch it from the object store onto the daemon's host. */
  pullSnapshot(tag: string): Promise<PullResult> {
    return this.#http.json({ method: "POST", path: `/v1/snapshots/${seg(tag)}/pull`, wait: "unbounded" });
  }

  /** `POST /v1/snapshots/{tag}/compact`: copy `tag` into `to`, standalone (disk chain flattened, no parent). */
  compactSnapshot(tag: string, to: string): Promise<SnapshotInfo> {
    return this.#http.json({
      method: "POST",
      path: `/v1/snapshots/${seg(tag)}/compact`,
      json: { to },
      wait: "unbounded",
    });
  }

  // -------------------------------------------------------------- volumes

  /** `POST /v1/volumes`: an ext4 volume of `sizeMib` (its quota), empty or filled from `source`. */
  createVolume(name: string, options: CreateVolumeOptions = {}): Promise<VolumeInfo> {
    return this.#http.json({
      method: "POST",
      path: "/v1/volumes",
      json: toWire("CreateVolumeRequest", { ...options, name }),
      wait: "unbounded",
    });
  }

  /** `GET /v1/volumes`. */
  listVolumes(): Promise<VolumeInfo[]> {
    return this.#http.json({ method: "GET", path: "/v1/volumes" });
  }

  /** `GET /v1/volumes/{name}`: `snapshots` names those that attach it. */
  getVolume(name: string): Promise<VolumeInfo> {
    return this.#http.json({ method: "GET", path: `/v1/volumes/${seg(name)}` });
  }

  /** `POST /v1/volumes/{name}/export`: copy its files into `to`, a new directory on the daemon's host. */
  exportVolume(name: string, to: string, options: ExportVolumeOptions = {}): Promise<VolumeExport> {
    return this.#http.json({
      method: "POST",
      path: `/v1/volumes/${seg(name)}/export`,
      json: toWire("ExportVolumeRequest", { ...options, to }),
      wait: "unbounded",
    });
  }

  /** `DELETE /v1/volumes/{name}`: 409 while a snapshot attaches it. */
  async deleteVolume(name: string): Promise<void> {
    await this.#http.json({ method: "DELETE", path: `/v1/volumes/${seg(name)}` });
  }

  // -------------------------------------------------------------- secrets

  /**
   * `POST /v1/secrets`: a write-only secret; `${secrets.NAME}` in a request to a host with a
   * header rule (`network.rules`) becomes its value at egress, outside the sandbox.
   */
  createSecret(name: string, value: string, options: CreateSecretOptions = {}): Promise<SecretInfo> {
    return this.#http.json({
      method: "POST",
      path: "/v1/secrets",
      json: toWire("CreateSecretRequest", { ...options, name, value }),
    });
  }

  /** `GET /v1/secrets`: names, versions and labels (never a value). */
  listSecrets(): Promise<SecretInfo[]> {
    return this.#http.json({ method: "GET", path: "/v1/secrets" });
  }

  /** `GET /v1/secrets/{name}`. */
  getSecret(name: string): Promise<SecretInfo> {
    return this.#http.json({ method: "GET", path: `/v1/secrets/${seg(name)}` });
  }

  /** `PUT /v1/secrets/{name}`: a new value (its version goes up) or new labels. */
  updateSecret(name: string, options: UpdateSecretOptions): Promise<SecretInfo> {
    return this.#http.json({
      method: "PUT",
      path: `/v1/secrets/${seg(name)}`,
      json: toWire("UpdateSecretRequest", options),
    });
  }

  /** `DELETE /v1/secrets/{name}`. */
  async deleteSecret(name: string): Promise<void> {
    await this.#http.json({ method: "DELETE", path: `/v1/secrets/${seg(name)}` });
  }

  // -------------------------------------------------------------- workspaces

  /**
   * `POST /v1/workspaces`: fork a sandbox of `snapshotTag` under a name that lives
   * through suspend and resume (forkd 0.5's workspaces, E2B's pause/resume).
   */
  createWorkspace(
    name: string,
    snapshotTag: string,
    options: CreateWorkspaceOptions = {},
  ): Promise<WorkspaceInfo> {
    return this.#http.json({
      method: "POST",
      path: "/v1/workspaces",
      json: toWire("CreateWorkspaceRequest", { ...options, name, snapshotTag }),
      wait: "unbounded",
    });
  }

  /** `GET /v1/workspaces`. */
  listWorkspaces(): Promise<WorkspaceInfo[]> {
    return this.#http.json({ method: "GET", path: "/v1/workspaces" });
  }

  /** `GET /v1/workspaces/{name}`: `status` is running, suspended or stale. */
  getWorkspace(name: string): Promise<WorkspaceInfo> {
    return this.#http.json({ method: "GET", path: `/v1/workspaces/${seg(name)}` });
  }

  /** `DELETE /v1/workspaces/{name}`: kill its sandbox (or drop its saved state). */
  async deleteWorkspace(name: string): Promise<void> {
    await this.#http.json({ method: "DELETE", path: `/v1/workspaces/${seg(name)}`, wait: "unbounded" });
  }

  /** `POST /v1/workspaces/{name}/suspend`: branch its sandbox to a state snapshot, then stop it. */
  suspendWorkspace(name: string, options: SuspendWorkspaceOptions = {}): Promise<WorkspaceInfo> {
    return this.#http.json({
      method: "POST",
      path: `/v1/workspaces/${seg(name)}/suspend`,
      json: toWireOrNone("SuspendWorkspaceRequest", options),
      wait: "unbounded",
    });
  }

  /** `POST /v1/workspaces/{name}/resume`: start its sandbox again, under the same id. */
  resumeWorkspace(name: string): Promise<WorkspaceInfo> {
    return this.#http.json({ method: "POST", path: `/v1/workspaces/${seg(name)}/resume`, wait: "unbounded" });
  }

  // ------------------------------------------------------------------- files

  #files(id: string, what = ""): string {
    return `/v1/sandboxes/${seg(id)}/files${what}`;
  }

  // Each file method takes `user` (in its options): the guest user it acts as (permissions
  // checked as theirs, what it creates is theirs); default root.

  /** `GET .../files/stat` → `{path, name, type, size, mode, mtime, owner, group}`. */
  fileStat(id: string, path: string, options: FileUser = {}): Promise<FileInfo> {
    return this.#http.json({ method: "GET", path: this.#files(id, "/stat"), query: { path, user: options.user } });
  }

  /** `GET .../files/list` → `{path, entries, truncated}`. */
  fileList(id: string, path: string, options: FileUser = {}): Promise<FileList> {
    return this.#http.json({ method: "GET", path: this.#files(id, "/list"), query: { path, user: options.user } });
  }

  /** `POST .../files/mkdir` → `{path, created}`. */
  fileMkdir(id: string, path: string, options: { parents?: boolean } & FileUser = {}): Promise<MkdirResponse> {
    return this.#http.json({
      method: "POST",
      path: this.#files(id, "/mkdir"),
      json: toWire("MkdirRequest", { ...options, path }),
    });
  }

  /** `DELETE .../files`: a file, or a directory (`recursive` if not empty). */
  async fileRemove(id: string, path: string, options: { recursive?: boolean } & FileUser = {}): Promise<void> {
    await this.#http.json({
      method: "DELETE",
      path: this.#files(id),
      query: { path, recursive: options.recursive ? "true" : undefined, user: options.user },
    });
  }

  /** Whether `path` exists in the sandbox. */
  async fileExists(id: string, path: string): Promise<boolean> {
    try {
      await this.fileStat(id, path);
      return true;
    } catch (err) {
      if (err instanceof NotFoundError) return false;
      throw err;
    }
  }

  /**
   * `PUT .../files`: write `data` to `path`, replacing it atomically. A
   * string is written as UTF-8; a ReadableStream is streamed, never held whole.
   */
  writeFile(id: string, path: string, data: FileData, options: { mode?: number } & FileUser = {}): Promise<FileInfo> {
    const body: RequestBody = typeof data === "string" ? new TextEncoder().encode(data) : data;
    return this.#http.json({
      method: "PUT",
      path: this.#files(id),
      query: { path, mode: options.mode === undefined ? undefined : String(options.mode), user: options.user },
      body,
      contentType: "application/octet-stream",
      wait: "unbounded",
    });
  }

  /** `GET .../files` as a stream of bytes (for large files). */
  async readFileStream(id: string, path: string, options: FileUser = {}): Promise<ReadableStream<Uint8Array>> {
    const response = await this.#http.send({
      method: "GET",
      path: this.#files(id),
      query: { path, user: options.user },
      wait: "unbounded",
    });
    if (!response.body) return new Blob([]).stream();
    return response.body;
  }

  /** The whole contents of `path`. */
  async readFile(id: string, path: string, options: FileUser = {}): Promise<Uint8Array> {
    const response = await this.#http.send({
      method: "GET",
      path: this.#files(id),
      query: { path, user: options.user },
      wait: "unbounded",
    });
    return new Uint8Array(await response.arrayBuffer());
  }

  /** Stream the local file `localPath` to `path` in the sandbox. */
  uploadFile(id: string, localPath: string, path: string, options: { mode?: number } = {}): Promise<FileInfo> {
    const stream = Readable.toWeb(createReadStream(localPath)) as unknown as ReadableStream<Uint8Array>;
    return this.writeFile(id, path, stream, options);
  }

  /** Stream `path` in the sandbox into the local file `localPath`; resolves to its size. */
  async downloadFile(id: string, path: string, localPath: string): Promise<number> {
    const stream = await this.readFileStream(id, path);
    let size = 0;
    const counted = Readable.fromWeb(stream as unknown as NodeReadableStream<Uint8Array>);
    counted.on("data", (chunk: Uint8Array) => {
      size += chunk.byteLength;
    });
    await pipeline(counted, createWriteStream(localPath));
    return size;
  }
}
