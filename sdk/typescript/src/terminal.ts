/**
 * A terminal on a sandbox: a login shell on a pty over the daemon's WebSocket
 * (`/v1/sandboxes/{id}/terminal`, docs/API.md). What you `send` is the
 * keyboard; output comes to `onData` as the guest wrote it; `resize` changes
 * the size; `exited` resolves with the shell's exit code. Closing it kills the
 * shell.
 *
 * It uses the platform's standard `WebSocket` (browsers, Node >= 22; Node 20
 * with `--experimental-websocket`), or the `WebSocket` constructor you pass
 * (e.g. the `ws` package's). The token goes as a subprotocol, as a browser
 * must send it: a standard WebSocket cannot carry headers.
 */
import { ForkdError } from "./errors.js";

export const TERMINAL_PROTOCOL = "forkd.terminal.v1";

/** What a standard WebSocket constructor looks like, as far as a terminal needs it. */
export type WebSocketConstructor = new (url: string, protocols?: string | string[]) => WebSocket;

export interface TerminalOptions {
  /** Columns and rows of the pty (default 80 x 24). */
  cols?: number;
  rows?: number;
  /** The guest user to run the shell as (default root). */
  user?: string;
  /** Called with each piece of output. */
  onData?: (data: Uint8Array) => void;
  /** A WebSocket implementation, where the platform has none. */
  WebSocket?: WebSocketConstructor;
}

function bearer(token: string): string {
  return "bearer." + Buffer.from(token, "utf8").toString("base64url");
}

/** An open terminal; get one from `Sandbox.terminal()` or `Controller.openTerminal()`. */
export class Terminal {
  readonly #ws: WebSocket;
  /** The shell's exit code once it has ended (null if the connection closed first). */
  readonly exited: Promise<number | null>;
  #exitCode: number | null = null;

  private constructor(ws: WebSocket, onData: ((data: Uint8Array) => void) | undefined) {
    this.#ws = ws;
    this.exited = new Promise((resolve) => {
      ws.addEventListener("message", (event: MessageEvent) => {
        if (typeof event.data === "string") {
          const message = JSON.parse(event.data) as { exit_code?: number; error?: string };
          if (message.exit_code !== undefined) this.#exitCode = message.exit_code;
          return;
        }
        onData?.(new Uint8Array(event.data as ArrayBuffer));
      });
      ws.addEventListener("close", () => resolve(this.#exitCode));
    });
  }

  /** Open a terminal on sandbox `id` of the daemon at `url` (http(s)://host:port). */
  static open(url: string, token: string | undefined, id: string, options: TerminalOptions = {}): Promise<Terminal> {
    const Impl = options.WebSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
    if (!Impl) {
      throw new ForkdError("no WebSocket implementation: use Node >= 22 (or 20 with --experimental-websocket), " +
        "or pass options.WebSocket (e.g. from the ws package)");
    }
    const target = new URL(`${url.replace(/^http/, "ws")}/v1/sandboxes/${encodeURIComponent(id)}/terminal`);
    target.searchParams.set("cols", String(options.cols ?? 80));
    target.searchParams.set("rows", String(options.rows ?? 24));
    if (options.user) target.searchParams.set("user", options.user);
    const ws = new Impl(target.toString(), token ? [TERMINAL_PROTOCOL, bearer(token)] : [TERMINAL_PROTOCOL]);
    ws.binaryType = "arraybuffer";
    const terminal = new Terminal(ws, options.onData);
    return new Promise((resolve, reject) => {
      ws.addEventListener("open", () => resolve(terminal), { once: true });
      ws.addEventListener("error", () => reject(new ForkdError(`cannot open a terminal on ${id} at ${url}`)),
        { once: true });
    });
  }

  /** Type `keys` (text goes as UTF-8). */
  send(keys: string | Uint8Array): void {
    this.#ws.send(typeof keys === "string" ? new TextEncoder().encode(keys) : keys);
  }

  /** Change the pty's size. */
  resize(cols: number, rows: number): void {
    this.#ws.send(JSON.stringify({ resize: [cols, rows] }));
  }

  /** Close the connection: the shell is killed if it still runs. */
  close(): void {
    this.#ws.close();
  }
}
