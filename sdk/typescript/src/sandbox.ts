/**
 * Object-style SDK: `Sandbox` (one child VM) and `Snapshot` (a tag), the
 * twins of the Python SDK's `Sandbox` and `Snapshot`.
 *
 * ```ts
 * const sb = await Sandbox.create("py");
 * try {
 *   await sb.commands.run("pip install something-risky");
 *   const branch = await sb.branch({ mode: "diff" });
 *   for (const g of await branch.fork(5)) console.log((await g.eval("2 + 2")).result);
 * } finally {
 *   await sb.close();
 * }
 * ```
 */

import { Commands } from "./commands.js";
import { Controller } from "./controller.js";
import { ExploreError, ForkdError, NotFoundError } from "./errors.js";
import { Execution, type ExecutionCallbacks } from "./execution.js";
import type { Terminal, TerminalOptions } from "./terminal.js";
import type {
  BranchOptions,
  CheckpointList,
  CheckpointOptions,
  CodeOptions,
  EvalOptions,
  EvalResponse,
  FileData,
  FileUser,
  FileInfo,
  ForkError,
  ForkOptions,
  HibernateOptions,
  PingResponse,
  PromoteOptions,
  PromoteResponse,
  NetworkUpdateRequest,
  SandboxInfo,
  SandboxMemory,
  SandboxDiff,
  ApplyResponse,
  DiffOptions,
  SnapshotInfo,
  SpawnOptions,
  WaitOptions,
} from "./types.js";

let shared: Controller | undefined;

/** One controller per process, configured from `FORKD_URL` / `FORKD_TOKEN` on first use. */
function defaultController(): Controller {
  shared ??= new Controller();
  return shared;
}

/** Options of `Sandbox.runCode`: where the cell runs, and its callbacks. */
export interface RunCodeOptions extends CodeOptions, ExecutionCallbacks {}

/** Options of `Sandbox.create`: a spawn's (every field of the daemon's `SpawnRequest`) for one child. */
export interface SandboxCreateOptions extends Omit<SpawnOptions, "snapshotTag" | "n" | "childEnv"> {
  /** The controller to use; default one built from the environment. */
  controller?: Controller;
}

/** A fork of a running sandbox: the children that came up, as `Sandbox`es, and the errors. */
export interface ForkResult {
  parentId: string;
  snapshotTag: string;
  /** The children that came up, in index order (owned by the caller: close each). */
  children: Sandbox[];
  /** `{index, error}` for each child that did not come up. */
  errors: ForkError[];
  pauseMs: number | null;
  /** Fork-trees only. */
  treeId: string | null;
}

/** How one candidate of {@link Sandbox.explore} went. */
export interface ExploreOutcome<C, R> {
  index: number;
  candidate: C;
  sandbox: Sandbox | null;
  result?: R;
  score?: number;
  error?: string;
}

/** The best child of {@link Sandbox.explore}, every outcome, and the promote that kept it. */
export interface ExploreResult<C, R> {
  winner: Sandbox;
  best: ExploreOutcome<C, R>;
  outcomes: ExploreOutcome<C, R>[];
  promotion: PromoteResponse;
  /** With `applyWinner`: what the winner's file changes wrote into this sandbox. */
  applied?: ApplyResponse;
}

/** A registered snapshot tag. */
export class Snapshot {
  readonly controller: Controller;
  info: SnapshotInfo;

  constructor(info: SnapshotInfo, controller?: Controller) {
    this.info = info;
    this.controller = controller ?? defaultController();
  }

  get tag(): string {
    return this.info.tag;
  }

  /** Look up an existing snapshot. */
  static async fromTag(tag: string, controller?: Controller): Promise<Snapshot> {
    const ctrl = controller ?? defaultController();
    return new Snapshot(await ctrl.getSnapshot(tag), ctrl);
  }

  /** Re-read the SnapshotInfo. */
  async refresh(): Promise<Snapshot> {
    this.info = await this.controller.getSnapshot(this.tag);
    return this;
  }

  /** Wait until it can be forked (a live `wait: false` branch is `"writing"` for a while). */
  async waitReady(options: WaitOptions = {}): Promise<Snapshot> {
    if ((this.info.status ?? "ready") !== "ready") {
      this.info = await this.controller.waitSnapshotReady(this.tag, options);
    }
    return this;
  }

  /** Spawn `n` sandboxes of this snapshot (after {@link waitReady}); the caller owns them. */
  async fork(n = 1, options: Omit<SpawnOptions, "snapshotTag" | "n"> = {}): Promise<Sandbox[]> {
    await this.waitReady();
    const infos = await this.controller.spawnSandboxes({ ...options, snapshotTag: this.tag, n });
    return infos.map((info) => Sandbox.fromInfo(info, this.controller));
  }

  /** Unregister the tag and remove its files. */
  delete(options: { cascade?: boolean; force?: boolean } = {}): Promise<void> {
    return this.controller.deleteSnapshot(this.tag, options);
  }
}

/** `sandbox.files`: files in the sandbox, moved as streams. */
export class Files {
  readonly #sandbox: Sandbox;

  constructor(sandbox: Sandbox) {
    this.#sandbox = sandbox;
  }

  write(path: string, data: FileData, options: { mode?: number } & FileUser = {}): Promise<FileInfo> {
    return this.#sandbox.controller.writeFile(this.#sandbox.id, path, data, options);
  }

  read(path: string, options: FileUser = {}): Promise<Uint8Array> {
    return this.#sandbox.controller.readFile(this.#sandbox.id, path, options);
  }

  async readText(path: string, options: FileUser = {}): Promise<string> {
    return new TextDecoder().decode(await this.read(path, options));
  }

  stream(path: string, options: FileUser = {}): Promise<ReadableStream<Uint8Array>> {
    return this.#sandbox.controller.readFileStream(this.#sandbox.id, path, options);
  }

  upload(localPath: string, path: string): Promise<FileInfo> {
    return this.#sandbox.controller.uploadFile(this.#sandbox.id, localPath, path);
  }

  download(path: string, localPath: string): Promise<number> {
    return this.#sandbox.controller.downloadFile(this.#sandbox.id, path, localPath);
  }

  /** The entries of the directory `path`, sorted by name. */
  async list(path: string, options: FileUser = {}): Promise<FileInfo[]> {
    return (await this.#sandbox.controller.fileList(this.#sandbox.id, path, options)).entries;
  }

  stat(path: string, options: FileUser = {}): Promise<FileInfo> {
    return this.#sandbox.controller.fileStat(this.#sandbox.id, path, options);
  }

  exists(path: string): Promise<boolean> {
    return this.#sandbox.controller.fileExists(this.#sandbox.id, path);
  }

  /** Create the directory; `false` if `parents` and it already existed. */
  async mkdir(path: string, options: { parents?: boolean } & FileUser = {}): Promise<boolean> {
    return (await this.#sandbox.controller.fileMkdir(this.#sandbox.id, path, options)).created;
  }

  remove(path: string, options: { recursive?: boolean } & FileUser = {}): Promise<void> {
    return this.#sandbox.controller.fileRemove(this.#sandbox.id, path, options);
  }
}

/**
 * One child VM. `Sandbox.create(tag)` spawns one and owns it (`close()`
 * kills it); `Sandbox.connect(id)` attaches to a running one and never kills it
 * on `close()`.
 */
export class Sandbox {
  readonly id: string;
  readonly controller: Controller;
  readonly commands: Commands;
  readonly files: Files;
  /** Whether `close()` kills it (it was spawned on this object's behalf). */
  owned: boolean;
  #info: SandboxInfo | undefined;
  #killed = false;

  private constructor(id: string, controller: Controller, owned: boolean, info?: SandboxInfo) {
    this.id = id;
    this.controller = controller;
    this.owned = owned;
    this.#info = info;
    this.commands = new Commands(this);
    this.files = new Files(this);
  }

  /** Spawn one sandbox of snapshot `tag`; owned: `close()` kills it. */
  static async create(tag: string, options: SandboxCreateOptions = {}): Promise<Sandbox> {
    const { controller, ...spawn } = options;
    const ctrl = controller ?? defaultController();
    const [info] = await ctrl.spawnSandboxes({ ...spawn, snapshotTag: tag, n: 1 });
    if (!info) throw new ForkdError(`spawning one sandbox of '${tag}' returned none`);
    return new Sandbox(info.id, ctrl, true, info);
  }

  /** Attach to a running sandbox (not owned: `close()` leaves it running). */
  static connect(id: string, controller?: Controller): Sandbox {
    return new Sandbox(id, controller ?? defaultController(), false);
  }

  /** Wrap a sandbox spawned on the caller's behalf (owned). */
  static fromInfo(info: SandboxInfo, controller: Controller): Sandbox {
    return new Sandbox(info.id, controller, true, info);
  }

  /** The SandboxInfo (fetched on first use when attached). */
  async info(): Promise<SandboxInfo> {
    this.#info ??= await this.controller.getSandbox(this.id);
    return this.#info;
  }

  /** Re-read the SandboxInfo. */
  async refresh(): Promise<SandboxInfo> {
    this.#info = await this.controller.getSandbox(this.id);
    return this.#info;
  }

  ping(): Promise<PingResponse> {
    return this.controller.ping(this.id);
  }

  /** What this sandbox's filesystem changed since its snapshot (or `against` another state). */
  diff(options: DiffOptions = {}): Promise<SandboxDiff> {
    return this.controller.sandboxDiff(this.id, options);
  }

  /** The same changes as a unified patch. */
  patch(options: DiffOptions = {}): Promise<string> {
    return this.controller.sandboxPatch(this.id, options);
  }

  /** Write another sandbox's (a child's) changes since its snapshot into this one; 409 on a conflict. */
  apply(from: string, paths?: string[]): Promise<ApplyResponse> {
    return this.controller.applyChanges(this.id, { from, paths });
  }

  /** What this sandbox costs the host: shared and private RAM, untouched pages, its own disk (bytes). */
  memory(): Promise<SandboxMemory> {
    return this.controller.sandboxMemory(this.id);
  }

  /**
   * Evaluate Python in the warm PID 1 interpreter (state persists between
   * calls); `timeoutSecs` interrupts it after that long (daemon default 60).
   */
  eval(code: string, options: EvalOptions = {}): Promise<EvalResponse> {
    return this.controller.eval(this.id, code, options);
  }

  /**
   * Run a cell on one of this sandbox's Jupyter kernels (a snapshot of the
   * `code-interpreter` image; else a `ConflictError`) → its {@link Execution}.
   * `language`: `python`, `bash`, `javascript` (`js`) or `r` (default: the
   * context's, python for a new one); `context`: the kernel (default: the
   * language's); `timeoutSecs`: interrupt the kernel after that long (daemon
   * default 300); `env`: for this cell only. The callbacks are called in the
   * kernel's order as the events arrive (a returned promise is awaited). A
   * cell that raises resolves, with `error` set.
   */
  async runCode(code: string, options: RunCodeOptions = {}): Promise<Execution> {
    const { onStdout, onStderr, onResult, onError, ...codeOptions } = options;
    const execution = new Execution();
    const stream = await this.controller.codeStream(this.id, code, codeOptions);
    try {
      for await (const event of stream) await execution.add(event, { onStdout, onStderr, onResult, onError });
    } finally {
      stream.close();
    }
    return execution;
  }

  /** Interrupt the eval running in this sandbox (it answers `CancelledError`); false if none was running. */
  async cancelEval(): Promise<boolean> {
    return (await this.controller.cancelEval(this.id)).cancelled;
  }

  /**
   * `"<ip>:<port>"`: where the host reaches `port` in the guest (E2B's
   * `getHost`). Every port of the sandbox's `ip` is forwarded to the guest;
   * it needs a snapshot made with `nic: true`.
   */
  async getHost(port: number): Promise<string> {
    const info = this.#info?.ip ? this.#info : await this.refresh();
    if (!info.ip) {
      throw new ForkdError(`sandbox ${this.id} has no network address: fork it from a snapshot made with nic: true`);
    }
    return `${info.ip}:${Math.trunc(port)}`;
  }

  /** Branch this running sandbox into a new snapshot; it pauses briefly and resumes. */
  async branch(options: BranchOptions = {}): Promise<Snapshot> {
    return new Snapshot(await this.controller.branchSandbox(this.id, options), this.controller);
  }

  /** Fork this running sandbox into `count` children that start from its state now. */
  async fork(count = 1, options: Omit<ForkOptions, "count"> = {}): Promise<ForkResult> {
    return this.#forkResult(await this.controller.forkSandbox(this.id, { ...options, count }));
  }

  /** {@link fork} as one fork-tree: each child can {@link promote} itself. */
  async forkTree(count = 1, options: Omit<ForkOptions, "count"> = {}): Promise<ForkResult> {
    return this.#forkResult(await this.controller.forkTree(this.id, { ...options, count }));
  }

  #forkResult(body: Awaited<ReturnType<Controller["forkSandbox"]>>): ForkResult {
    return {
      parentId: body.parent_id,
      snapshotTag: body.snapshot_tag,
      children: body.children.map((info) => Sandbox.fromInfo(info, this.controller)),
      errors: body.errors,
      pauseMs: body.pause_ms ?? null,
      treeId: body.tree_id ?? null,
    };
  }

  /** Keep this fork-tree child: kill its siblings (and with `replaceParent` the source). */
  async promote(options: PromoteOptions = {}): Promise<PromoteResponse> {
    const body = await this.controller.promoteSandbox(this.id, options);
    this.#info = body.winner;
    return body;
  }

  /**
   * Best of N: fork a tree with one child per candidate, run `run(child,
   * candidate)` in all of them at once, score each (`score`, else the result
   * of `run` is the score; higher is better), promote the best and kill the
   * rest. Rejects with `ExploreError` if no candidate succeeded (every child
   * is killed then).
   */
  async explore<C, R>(
    candidates: readonly C[],
    run: (child: Sandbox, candidate: C) => Promise<R>,
    score?: (child: Sandbox, candidate: C, result: R) => number | Promise<number>,
    options: Omit<ForkOptions, "count"> & { replaceParent?: boolean; applyWinner?: boolean } = {},
  ): Promise<ExploreResult<C, R>> {
    if (candidates.length === 0) throw new TypeError("explore needs at least one candidate");
    const { replaceParent, applyWinner, ...forkOptions } = options;
    const tree = await this.forkTree(candidates.length, forkOptions);
    const byIndex = new Map<number, Sandbox>();
    for (const child of tree.children) {
      const index = Number((await child.info()).metadata?.fork_index);
      byIndex.set(index, child);
    }
    const outcomes = await Promise.all(
      candidates.map(async (candidate, index): Promise<ExploreOutcome<C, R>> => {
        const child = byIndex.get(index) ?? null;
        if (child === null) {
          const failure = tree.errors.find((e) => e.index === index);
          return { index, candidate, sandbox: null, error: `spawn: ${failure?.error ?? "missing"}` };
        }
        let stage = "run";
        let result: R | undefined;
        try {
          result = await run(child, candidate);
          stage = "score";
          const points = Number(score ? await score(child, candidate, result) : result);
          if (Number.isNaN(points)) throw new TypeError("the score is not a number");
          return { index, candidate, sandbox: child, result, score: points };
        } catch (err) {
          return { index, candidate, sandbox: child, result, error: `${stage}: ${String(err)}` };
        }
      }),
    );
    let best: ExploreOutcome<C, R> | undefined;
    for (const o of outcomes) {
      if (o.score !== undefined && o.sandbox && (best?.score === undefined || o.score > best.score)) best = o;
    }
    if (!best?.sandbox) {
      await Promise.allSettled(tree.children.map((c) => c.close()));
      const lines = outcomes.map((o) => `  #${o.index} ${o.sandbox?.id ?? "(not spawned)"}: ${o.error}`);
      throw new ExploreError(`every candidate of explore failed:\n${lines.join("\n")}`, outcomes);
    }
    let promotion: PromoteResponse;
    let applied: ApplyResponse | undefined;
    try {
      // applyWinner: the winner's changes written into this sandbox first (a conflict throws,
      // nothing written, and every child is closed below).
      applied = applyWinner ? await this.apply(best.sandbox.id) : undefined;
      promotion = await best.sandbox.promote({
        treeId: tree.treeId ?? undefined,
        cleanupSiblings: true,
        replaceParent: replaceParent ?? false,
      });
    } catch (err) {
      // No child may outlive a failed explore unowned.
      await Promise.allSettled(tree.children.map((c) => c.close()));
      throw err;
    }
    const gone = new Set(promotion.deleted.filter((d) => d.deleted).map((d) => d.id));
    for (const child of tree.children) if (gone.has(child.id)) child.owned = false;
    return { winner: best.sandbox, best, outcomes, promotion, applied };
  }

  /** Branch automatically after every `every`-th exec/eval call, keeping the newest `keep`. */
  setCheckpoints(every: number, options: CheckpointOptions = {}): Promise<CheckpointList> {
    return this.controller.setCheckpoints(this.id, every, options);
  }

  getCheckpoints(): Promise<CheckpointList> {
    return this.controller.getCheckpoints(this.id);
  }

  deleteCheckpoints(): Promise<CheckpointList> {
    return this.controller.deleteCheckpoints(this.id);
  }

  /** Kill this sandbox `timeoutSecs` from now (sooner or later than before). */
  async setTimeout(timeoutSecs: number): Promise<SandboxInfo> {
    this.#info = await this.controller.setSandboxTimeout(this.id, timeoutSecs);
    return this.#info;
  }

  /** Replace this sandbox's network policy (egress rules, port proxy settings) while it runs. */
  async updateNetwork(policy: NetworkUpdateRequest): Promise<SandboxInfo> {
    this.#info = await this.controller.updateSandboxNetwork(this.id, policy);
    return this.#info;
  }

  /** A login shell on a pty in this sandbox, over the daemon's WebSocket (see {@link Terminal}). */
  terminal(options: TerminalOptions = {}): Promise<Terminal> {
    return this.controller.openTerminal(this.id, options);
  }

  /** Put this sandbox to disk, its QEMU released, until its next request wakes it. */
  async hibernate(options: HibernateOptions = {}): Promise<SandboxInfo> {
    this.#info = await this.controller.hibernateSandbox(this.id, options);
    return this.#info;
  }

  /** Stop the VM now, whoever created it. */
  async kill(): Promise<void> {
    await this.controller.killSandbox(this.id);
    this.#killed = true;
  }

  /** Kill the sandbox if this object spawned it; a no-op for attached ones. */
  async close(): Promise<void> {
    if (!this.owned || this.#killed) return;
    try {
      await this.kill();
    } catch (err) {
      if (!(err instanceof NotFoundError)) throw err;
      this.#killed = true;
    }
  }
}
