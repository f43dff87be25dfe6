/**
 * How requests reach the daemon: the address and token from the environment,
 * Node's built-in fetch, per-call timeouts, and errors mapped from statuses.
 */

import { readFileSync } from "node:fs";

import {
  ForkdConnectionError,
  ForkdError,
  ForkdTimeoutError,
  ServerError,
  errorForStatus,
} from "./errors.js";

export const DEFAULT_URL = "http://127.0.0.1:8889";
/** Milliseconds an ordinary request may take. */
export const DEFAULT_TIMEOUT_MS = 30_000;
/** Extra seconds an exec may take beyond its own timeout (kill, ship output). */
export const EXEC_GRACE_SECS = 30;
export const SDK_VERSION = "0.1.0";

/** How a {@link Controller} reaches its daemon. */
export interface ClientOptions {
  /** Daemon address; default `$FORKD_URL`, else `http://127.0.0.1:8889`. */
  url?: string;
  /** Bearer token; default `$FORKD_TOKEN`, else the contents of `$FORKD_TOKEN_FILE`. */
  token?: string;
  /** Milliseconds for ordinary requests (default 30 000). Spawns, branches, forks and evals wait as long as the daemon takes. */
  timeoutMs?: number;
  /** A fetch implementation (default: the global one, Node >= 18). */
  fetch?: typeof fetch;
}

/** What fetch accepts as a request body. */
export type RequestBody = NonNullable<RequestInit["body"]>;

/**
 * How long to wait for one call's answer: the client's default, none at all
 * (the daemon bounds the work itself, e.g. a spawn), or this many milliseconds.
 */
export type Wait = "default" | "unbounded" | number;

/** One request. `query` values that are arrays repeat the parameter. */
export interface Call {
  method: "GET" | "POST" | "PUT" | "DELETE";
  path: string;
  json?: unknown;
  body?: RequestBody;
  contentType?: string;
  query?: Record<string, string | string[] | undefined>;
  wait?: Wait;
  /** Ends the request when aborted (a stream the caller closed); the call then has no timeout of its own. */
  signal?: AbortSignal;
}

export function resolveUrl(url?: string): string {
  let resolved = (url || process.env.FORKD_URL || DEFAULT_URL).trim().replace(/\/+$/, "");
  if (!resolved.includes("://")) resolved = `http://${resolved}`;
  return resolved;
}

export function resolveToken(token?: string): string | undefined {
  if (token) return token;
  const fromEnv = process.env.FORKD_TOKEN?.trim();
  if (fromEnv) return fromEnv;
  const file = process.env.FORKD_TOKEN_FILE;
  if (file) {
    try {
      return readFileSync(file, "utf8").trim() || undefined;
    } catch (err) {
      throw new ForkdError(`cannot read FORKD_TOKEN_FILE ${file}: ${(err as Error).message}`);
    }
  }
  return undefined;
}

/** One path segment: ids and tags never add path levels. */
export function seg(value: string): string {
  return encodeURIComponent(value);
}

/** The server's `{"error": ...}` text, or the best substitute. */
/** The server's `{"error": ..., "code"?: ...}`: its text (or the best substitute) and code. */
async function errorBody(response: Response): Promise<{ message: string; code?: string }> {
  const text = await response.text();
  try {
    const body: unknown = JSON.parse(text);
    if (body && typeof body === "object" && "error" in body && typeof body.error === "string") {
      const code = "code" in body && typeof body.code === "string" ? body.code : undefined;
      return { message: body.error, code };
    }
  } catch {
    // not JSON: fall through to the raw text
  }
  return { message: text.trim().slice(0, 500) || `HTTP ${response.status} ${response.statusText}`.trim() };
}

/** Retry-After in seconds (the delay form, which forkd sends), or undefined. */
function retryAfter(response: Response): number | undefined {
  const value = response.headers.get("retry-after") ?? "";
  return /^[0-9]+$/.test(value) ? Number(value) : undefined;
}

/** Sends {@link Call}s to one daemon. */
export class Transport {
  readonly url: string;
  readonly timeoutMs: number;
  /** The bearer token (for a terminal's WebSocket, which does not go through fetch). */
  readonly token: string | undefined;
  readonly #headers: Record<string, string>;
  readonly #fetch: typeof fetch;

  constructor(options: ClientOptions = {}) {
    this.url = resolveUrl(options.url);
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const token = resolveToken(options.token);
    this.token = token;
    this.#headers = {
      "User-Agent": `forkd-sdk-ts/${SDK_VERSION}`,
      Accept: "application/json",
      ...(token ? { Authorization: `Bearer ${token}` } : {}),
    };
    this.#fetch = options.fetch ?? globalThis.fetch;
    if (typeof this.#fetch !== "function") {
      throw new ForkdError("no fetch implementation: use Node >= 18 or pass options.fetch");
    }
  }

  /** The response of a successful call; throws the mapped error otherwise. */
  async send(call: Call): Promise<Response> {
    const url = new URL(this.url + call.path);
    for (const [name, value] of Object.entries(call.query ?? {})) {
      if (value === undefined) continue;
      for (const item of Array.isArray(value) ? value : [value]) url.searchParams.append(name, item);
    }
    const headers: Record<string, string> = { ...this.#headers };
    let body: RequestBody | undefined = call.body;
    if (call.json !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(call.json);
    } else if (call.contentType) {
      headers["Content-Type"] = call.contentType;
    }
    const wait = call.wait ?? "default";
    const ms = wait === "default" ? this.timeoutMs : wait === "unbounded" ? undefined : wait;
    const init: RequestInit & { duplex?: "half" } = {
      method: call.method,
      headers,
      body,
      signal: call.signal ?? (ms === undefined ? null : AbortSignal.timeout(ms)),
    };
    // A stream body must be sent half-duplex (fetch's rule for request streams).
    if (body instanceof ReadableStream) init.duplex = "half";
    const request = `${call.method} ${call.path}`;
    let response: Response;
    try {
      response = await this.#fetch(url, init);
    } catch (err) {
      throw this.#translate(err, request);
    }
    if (!response.ok) {
      const { message, code } = await errorBody(response);
      throw errorForStatus(response.status, message, request, code, retryAfter(response));
    }
    return response;
  }

  /** The decoded JSON answer (`undefined` for 204). */
  async json<T>(call: Call): Promise<T> {
    const response = await this.send(call);
    if (response.status === 204) return undefined as T;
    const text = await response.text();
    if (!text) return undefined as T;
    try {
      return JSON.parse(text) as T;
    } catch {
      throw new ServerError(
        response.status,
        `daemon sent a non-JSON answer to ${call.method} ${call.path}: ${text.slice(0, 200)}`,
        `${call.method} ${call.path}`,
      );
    }
  }

  #translate(err: unknown, request: string): ForkdError {
    const error = err as Error & { cause?: { code?: string; message?: string } };
    if (error?.name === "TimeoutError" || error?.name === "AbortError") {
      return new ForkdTimeoutError(
        `${request}: the daemon at ${this.url} did not answer in time (raise timeoutMs for slow operations)`,
        { cause: err },
      );
    }
    const reason = error?.cause?.code ?? error?.cause?.message ?? error?.message ?? String(err);
    return new ForkdConnectionError(this.url, reason, { cause: err });
  }
}
