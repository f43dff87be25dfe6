/**
 * `sandbox.commands`: processes in a sandbox, E2B-style. `run` waits for a
 * command (streaming its output to `onStdout`/`onStderr` as it comes), or with
 * `background: true` resolves to a {@link CommandHandle} as soon as it started.
 *
 * ```ts
 * const server = await sb.commands.run("python3 -m http.server 8000", { background: true, timeoutSecs: 0 });
 * for await (const { stdout } of server) if (stdout?.includes("Serving")) break;
 * await server.kill();
 * ```
 */

import { ForkdError } from "./errors.js";
import type { Sandbox } from "./sandbox.js";
import type {
  ExecResponse,
  OutputCallback,
  ProcessEvent,
  ProcessInfo,
  ProcessOptions,
  RunOptions,
  SignalName,
} from "./types.js";

/** One piece of a command's output: exactly one of the two is set. */
export interface OutputChunk {
  stdout?: string;
  stderr?: string;
}

/** Where a handle's output goes as it is read. */
export interface OutputCallbacks {
  onStdout?: OutputCallback;
  onStderr?: OutputCallback;
}

/**
 * A process running in the sandbox, from `commands.run(cmd, {background: true})`
 * or `commands.connect(pid)`. Iterate it for its output as it comes
 * (`for await (const {stdout, stderr} of handle)`), or {@link wait} for it
 * to end. Each iteration starts with the oldest output the guest still keeps
 * for it (up to 1 MiB), so output written before you looked is not lost;
 * `onStdout`/`onStderr` are called with each piece while it is iterated or
 * waited for.
 */
export class CommandHandle implements AsyncIterable<OutputChunk> {
  /** Its pid in the guest. */
  readonly pid: number;
  readonly #sandbox: Sandbox;
  readonly #callbacks: OutputCallbacks;
  #stdout: string[] = [];
  #stderr: string[] = [];
  #result: ExecResponse | undefined;

  constructor(sandbox: Sandbox, pid: number, callbacks: OutputCallbacks = {}) {
    this.#sandbox = sandbox;
    this.pid = pid;
    this.#callbacks = callbacks;
  }

  /** The stdout read so far. */
  get stdout(): string {
    return this.#stdout.join("");
  }

  /** The stderr read so far. */
  get stderr(): string {
    return this.#stderr.join("");
  }

  /** `null` until the process has ended (and been seen to, by iterating or {@link wait}). */
  get exitCode(): number | null {
    return this.#result?.exit_code ?? null;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<OutputChunk, void, undefined> {
    this.#stdout = [];
    this.#stderr = [];
    const events = await this.#sandbox.controller.streamProcess(this.#sandbox.id, this.pid);
    for await (const event of events) {
      const chunk = await this.record(event);
      if (chunk) yield chunk;
    }
  }

  /** @internal Record one event of its stream; the output chunk it carries, if any. */
  async record(event: ProcessEvent): Promise<OutputChunk | undefined> {
    if (event.type === "stdout") {
      this.#stdout.push(event.data);
      await this.#callbacks.onStdout?.(event.data);
      return { stdout: event.data };
    }
    if (event.type === "stderr") {
      this.#stderr.push(event.data);
      await this.#callbacks.onStderr?.(event.data);
      return { stderr: event.data };
    }
    if (event.type === "exit") {
      this.#result = {
        stdout: this.stdout,
        stderr: this.stderr,
        exit_code: event.exit_code,
        error: event.error,
        timed_out: event.timed_out,
      };
    }
    return undefined;
  }

  /**
   * Wait for the process to end: its output (what the guest kept) and exit
   * code. A non-zero exit is reported, not thrown (negative: killed by that
   * signal; 124: its `timeoutSecs` passed).
   */
  async wait(): Promise<ExecResponse> {
    if (this.#result === undefined) {
      for await (const _ of this) {
        // the callbacks see each piece; the exit event sets the result
      }
    }
    if (this.#result === undefined) throw new ForkdError(`the stream of process ${this.pid} ended without its exit`);
    return this.#result;
  }

  /** Write to its stdin (it must have been started with `stdinOpen: true`). */
  async sendStdin(data: string | Uint8Array): Promise<void> {
    await this.#sandbox.controller.sendStdin(this.#sandbox.id, this.pid, data);
  }

  /** Close its stdin (it reads end-of-file). */
  async closeStdin(): Promise<void> {
    await this.#sandbox.controller.closeStdin(this.#sandbox.id, this.pid);
  }

  /** Send a signal (default SIGTERM) to its process group. */
  async signal(signal: SignalName | string | number = "SIGTERM"): Promise<void> {
    await this.#sandbox.controller.signalProcess(this.#sandbox.id, this.pid, signal);
  }

  /** SIGKILL its process group; false if it was no longer running. */
  kill(): Promise<boolean> {
    return this.#sandbox.controller.killProcess(this.#sandbox.id, this.pid);
  }
}

/** `sandbox.commands`: subprocesses in the sandbox. */
export class Commands {
  readonly #sandbox: Sandbox;

  constructor(sandbox: Sandbox) {
    this.#sandbox = sandbox;
  }

  /**
   * Run `cmd` (a string via `/bin/sh -c`, an array as argv) and wait: a
   * non-zero exit is reported, not thrown. With `onStdout`/`onStderr` the
   * output is streamed to them as the command writes it. `timeoutSecs`
   * (default 30) is enforced in the guest; `null` or 0: no limit.
   *
   * With `background: true` it resolves to a {@link CommandHandle} as soon as
   * the process has started (`stdinOpen` keeps its stdin open for
   * `handle.sendStdin`; `tag` labels it in {@link list}).
   */
  run(cmd: string | readonly string[], options?: RunOptions & { background?: false }): Promise<ExecResponse>;
  run(cmd: string | readonly string[], options: RunOptions & { background: true }): Promise<CommandHandle>;
  run(cmd: string | readonly string[], options?: RunOptions): Promise<ExecResponse | CommandHandle>;
  async run(cmd: string | readonly string[], options: RunOptions = {}): Promise<ExecResponse | CommandHandle> {
    const { background, onStdout, onStderr, timeoutSecs, ...rest } = options;
    const limit = timeoutSecs === undefined ? 30 : timeoutSecs || undefined;
    const started: ProcessOptions = { ...rest, timeoutSecs: limit };
    const callbacks = { onStdout, onStderr };
    const ctrl = this.#sandbox.controller;
    if (background) {
      const info = await ctrl.startProcess(this.#sandbox.id, cmd, started);
      return new CommandHandle(this.#sandbox, info.pid, callbacks);
    }
    if (!onStdout && !onStderr && !rest.stdinOpen && limit !== undefined) {
      return ctrl.exec(this.#sandbox.id, cmd, { ...rest, timeoutSecs: limit });
    }
    const events = await ctrl.execStream(this.#sandbox.id, cmd, started);
    let handle: CommandHandle | undefined;
    for await (const event of events) {
      if (event.type === "start") handle = new CommandHandle(this.#sandbox, event.pid, callbacks);
      else await handle?.record(event);
    }
    if (!handle) throw new ForkdError("the command's stream ended before it started");
    return handle.wait();
  }

  /** A handle on a process already running (see {@link list}); rejects with `NotFoundError` if there is none. */
  async connect(pid: number, callbacks: OutputCallbacks = {}): Promise<CommandHandle> {
    await this.#sandbox.controller.getProcess(this.#sandbox.id, pid);
    return new CommandHandle(this.#sandbox, pid, callbacks);
  }

  /** The running processes forkd started in the sandbox (`pid`, `args`, `tag`, ...). */
  list(): Promise<ProcessInfo[]> {
    return this.#sandbox.controller.listProcesses(this.#sandbox.id);
  }

  /** SIGKILL the process (its group); false if it was not running. */
  kill(pid: number): Promise<boolean> {
    return this.#sandbox.controller.killProcess(this.#sandbox.id, pid);
  }

  async sendStdin(pid: number, data: string | Uint8Array): Promise<void> {
    await this.#sandbox.controller.sendStdin(this.#sandbox.id, pid, data);
  }

  async closeStdin(pid: number): Promise<void> {
    await this.#sandbox.controller.closeStdin(this.#sandbox.id, pid);
  }
}
