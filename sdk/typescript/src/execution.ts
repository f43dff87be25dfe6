/**
 * What a cell on a Jupyter kernel gives back (`Sandbox.runCode`): an
 * {@link Execution} folded from the events of `POST /v1/sandboxes/{id}/code`.
 */

import { ServerError } from "./errors.js";
import type { CodeEvent } from "./types.js";

/** The MIME types a {@link Result} has a field for; any other is in its `extra`. */
const MIME_FIELDS = {
  "text/plain": "text",
  "text/html": "html",
  "text/markdown": "markdown",
  "image/svg+xml": "svg",
  "image/png": "png",
  "image/jpeg": "jpeg",
  "application/pdf": "pdf",
  "text/latex": "latex",
  "application/json": "json",
  "application/javascript": "javascript",
  "e2b/data": "data",
  "e2b/chart": "chart",
} as const;

type MimeField = (typeof MIME_FIELDS)[keyof typeof MIME_FIELDS];

/**
 * One `result` event: the cell's value (`isMainResult`) or a `display()`/figure.
 * Each field is the MIME bundle's value for its type (`png`, `jpeg`, `pdf` as
 * base64 text, as the kernel sends them; `json`, `data`, `chart` as decoded
 * JSON), undefined where the bundle has none; `extra` holds the other types by
 * MIME name.
 */
export class Result {
  text?: string;
  html?: string;
  markdown?: string;
  svg?: string;
  png?: string;
  jpeg?: string;
  pdf?: string;
  latex?: string;
  json?: unknown;
  javascript?: string;
  data?: unknown;
  chart?: unknown;
  readonly isMainResult: boolean;
  readonly extra: Record<string, unknown> = {};

  constructor(bundle: Record<string, unknown>, isMainResult: boolean) {
    this.isMainResult = isMainResult;
    for (const [mime, value] of Object.entries(bundle)) {
      const name: MimeField | undefined = (MIME_FIELDS as Record<string, MimeField>)[mime];
      if (name) (this as Record<MimeField, unknown>)[name] = value;
      else this.extra[mime] = value;
    }
  }

  /** The names of the fields this result has (`"text"`, `"png"`, ...), then its extra MIME types. */
  formats(): string[] {
    const known = Object.values(MIME_FIELDS).filter((name) => this[name] !== undefined);
    return [...known, ...Object.keys(this.extra)];
  }
}

/**
 * The cell's exception: `name` (`ZeroDivisionError`; `""` for a bash exit
 * status), `value` (its message), `traceback` (as the kernel formats it, with
 * ANSI colours).
 */
export interface ExecutionError {
  name: string;
  value: string;
  traceback: string;
}

/** What the cell wrote, a piece per `stdout`/`stderr` event. */
export interface Logs {
  stdout: string[];
  stderr: string[];
}

/** Called as the cell's events arrive; a returned promise is awaited before the next event. */
export interface ExecutionCallbacks {
  onStdout?: (text: string) => void | Promise<void>;
  onStderr?: (text: string) => void | Promise<void>;
  onResult?: (result: Result) => void | Promise<void>;
  onError?: (error: ExecutionError) => void | Promise<void>;
}

/**
 * A cell's outcome: its `results`, `logs`, `error` (undefined if it ran
 * through), and from the `end` event `executionCount`, `timedOut` (interrupted
 * after its timeout; the `KeyboardInterrupt` is the `error`) and `restarted`
 * (its kernel was restarted).
 */
export class Execution {
  readonly results: Result[] = [];
  readonly logs: Logs = { stdout: [], stderr: [] };
  error?: ExecutionError;
  executionCount: number | null = null;
  timedOut = false;
  restarted = false;

  /** The main result's text (the cell's value as `text/plain`); undefined if it has none. */
  get text(): string | undefined {
    return this.results.find((r) => r.isMainResult)?.text;
  }

  /**
   * Fold one event in, calling its callback. An `end` with an `error` (the
   * stream broke, or the guest refused the cell: a language other than the
   * context's) throws a {@link ServerError}.
   */
  async add(event: CodeEvent, callbacks: ExecutionCallbacks = {}): Promise<void> {
    switch (event.type) {
      case "stdout":
        this.logs.stdout.push(event.text);
        await callbacks.onStdout?.(event.text);
        break;
      case "stderr":
        this.logs.stderr.push(event.text);
        await callbacks.onStderr?.(event.text);
        break;
      case "result": {
        const result = new Result(event.data ?? {}, event.is_main_result === true);
        this.results.push(result);
        await callbacks.onResult?.(result);
        break;
      }
      case "error": {
        const tb = event.traceback as unknown;
        this.error = {
          name: String(event.name ?? ""),
          value: String(event.value ?? ""),
          traceback: Array.isArray(tb) ? tb.join("\n") : String(tb ?? ""),
        };
        await callbacks.onError?.(this.error);
        break;
      }
      case "end":
        if (event.error) throw new ServerError(502, `the cell's stream ended: ${event.error}`);
        this.executionCount = event.execution_count ?? null;
        this.timedOut = event.timed_out === true;
        this.restarted = event.restarted === true;
        break;
      default:
        break; // an event type from a newer daemon
    }
  }
}
