/**
 * The forkd TypeScript SDK.
 *
 * ```ts
 * import { Controller, Sandbox } from "@deeplethe/forkd";
 * const ctrl = new Controller();            // FORKD_URL, FORKD_TOKEN
 * const sb = await Sandbox.create("py");    // one child of snapshot "py"
 * console.log((await sb.commands.run("echo hi")).stdout);
 * await sb.close();
 * ```
 */

export { Controller, commandArgs, signalName, snapshotIsReady } from "./controller.js";
export { CommandHandle, Commands, type OutputCallbacks, type OutputChunk } from "./commands.js";
export { CodeEventStream, EventStream, ProcessEventStream } from "./stream.js";
export { Execution, Result, type ExecutionCallbacks, type ExecutionError, type Logs } from "./execution.js";
export { TERMINAL_PROTOCOL, Terminal, type TerminalOptions, type WebSocketConstructor } from "./terminal.js";
export { DEFAULT_URL, type ClientOptions } from "./http.js";
export * from "./errors.js";
export * from "./types.js";
export {
  Sandbox,
  Snapshot,
  type ExploreOutcome,
  type ExploreResult,
  type ForkResult,
  type RunCodeOptions,
  type SandboxCreateOptions,
} from "./sandbox.js";
export type { components, paths } from "./generated/schema.js";
