/**
 * Process event streams: the daemon's NDJSON answers to `exec/stream` and
 * `processes/{pid}/stream`, read line by line as the process writes.
 */

import { ForkdError, ServerError } from "./errors.js";
import type { CodeEvent, ProcessEvent } from "./types.js";

/**
 * The longest line accepted. The daemon cuts output into pieces far smaller
 * than this; a longer line means something other than the daemon answered,
 * and must not grow this process's memory without end.
 */
const MAX_LINE_CHARS = 16 * 1024 * 1024;

/** One NDJSON line as a {@link ProcessEvent}; an `error` line (the stream broke) throws. */
export function parseEvent(line: string, request: string): ProcessEvent {
  const event = parseLine(line, request);
  if (event.type === "error") throw new ServerError(502, String((event as { error?: unknown }).error), request);
  return event as ProcessEvent;
}

/** One NDJSON line of a cell as a {@link CodeEvent}; an `error` line is the cell's exception. */
export function parseCodeEvent(line: string, request: string): CodeEvent {
  return parseLine(line, request) as CodeEvent;
}

/** One NDJSON line: an object with a string `type`. */
function parseLine(line: string, request: string): { type: string } {
  let event: unknown;
  try {
    event = JSON.parse(line);
  } catch {
    throw new ServerError(502, `daemon sent a non-JSON line in ${request}: ${line.slice(0, 200)}`, request);
  }
  if (!event || typeof event !== "object" || typeof (event as { type?: unknown }).type !== "string") {
    throw new ServerError(502, `daemon sent a line without a type in ${request}: ${line.slice(0, 200)}`, request);
  }
  return event as { type: string };
}

/**
 * The events of one NDJSON answer, in order, each parsed as it comes. Iterate
 * it once with `for await`; leaving the loop early (or {@link close}) ends the
 * request.
 */
export class EventStream<E> implements AsyncIterable<E> {
  readonly #body: ReadableStream<Uint8Array> | null;
  readonly #abort: AbortController;
  readonly #request: string;
  readonly #parse: (line: string, request: string) => E;
  #used = false;

  /** @internal Built by the `Controller` from a response it got with `abort`'s signal. */
  constructor(body: ReadableStream<Uint8Array> | null, abort: AbortController, request: string,
              parse: (line: string, request: string) => E) {
    this.#body = body;
    this.#abort = abort;
    this.#request = request;
    this.#parse = parse;
  }

  /** End the request now. */
  close(): void {
    this.#abort.abort();
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<E, void, undefined> {
    if (this.#used) throw new ForkdError(`the event stream of ${this.#request} can be iterated only once`);
    this.#used = true;
    if (!this.#body) return;
    const reader = this.#body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    try {
      for (;;) {
        let chunk: Awaited<ReturnType<typeof reader.read>>;
        try {
          chunk = await reader.read();
        } catch (err) {
          if (this.#abort.signal.aborted) return; // closed by our side
          throw new ServerError(502, `${this.#request}: the stream broke: ${(err as Error).message}`, this.#request);
        }
        if (chunk.done) break;
        buffer += decoder.decode(chunk.value, { stream: true });
        let newline: number;
        while ((newline = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, newline).trim();
          buffer = buffer.slice(newline + 1);
          if (line) yield this.#parse(line, this.#request);
        }
        if (buffer.length > MAX_LINE_CHARS) {
          throw new ServerError(502, `${this.#request}: a line longer than ${MAX_LINE_CHARS} characters`, this.#request);
        }
      }
      const rest = (buffer + decoder.decode()).trim();
      if (rest) yield this.#parse(rest, this.#request);
    } finally {
      // Whether it ended, broke, or the caller left the loop: the request ends here.
      this.#abort.abort();
      reader.releaseLock();
    }
  }
}

/**
 * The events of one process, in order: `start`, then `stdout`/`stderr`
 * (`data`) and `dropped` (`bytes`) as they come, last `exit`. Iterate it once
 * with `for await`; leaving the loop early (or {@link close}) ends the request,
 * which for `execStream` kills the process and for `streamProcess` leaves it
 * running.
 */
export class ProcessEventStream extends EventStream<ProcessEvent> {
  /** @internal Built by the `Controller` from a response it got with `abort`'s signal. */
  constructor(body: ReadableStream<Uint8Array> | null, abort: AbortController, request: string) {
    super(body, abort, request, parseEvent);
  }

  /** End the request now (an `execStream`'s process is killed). */
  override close(): void {
    super.close();
  }
}

/**
 * The events of one cell (`codeStream`), in order: `stdout`/`stderr` (`text`),
 * `result` (`data`, `is_main_result`) and `error` (the cell raised) as they
 * come, last `end`. Leaving the loop early (or {@link close}) interrupts the cell.
 */
export class CodeEventStream extends EventStream<CodeEvent> {
  /** @internal Built by the `Controller` from a response it got with `abort`'s signal. */
  constructor(body: ReadableStream<Uint8Array> | null, abort: AbortController, request: string) {
    super(body, abort, request, parseCodeEvent);
  }
}
