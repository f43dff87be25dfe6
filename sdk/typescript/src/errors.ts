/**
 * The SDK's errors. An error status from the daemon is a {@link ForkdAPIError}
 * subclass picked by status, carrying `status` and the server's `{"error": ...}`
 * text as `message`; a daemon that cannot be reached is a {@link ForkdConnectionError}.
 */

/** Every error the SDK throws derives from this. */
export class ForkdError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** The daemon answered with an error status. */
export class ForkdAPIError extends ForkdError {
  /** The HTTP status, e.g. 404. */
  readonly status: number;
  /** The request that failed, e.g. `POST /v1/sandboxes`. */
  readonly request: string;

  constructor(status: number, message: string, request = "") {
    super(message);
    this.status = status;
    this.request = request;
  }
}

/** 400 (or 422): the request was malformed or asked for something invalid. */
export class BadRequestError extends ForkdAPIError {}
/** 401/403: missing or wrong bearer token (set `FORKD_TOKEN` or `FORKD_TOKEN_FILE`). */
export class UnauthorizedError extends ForkdAPIError {}
/** 404: no such snapshot tag or sandbox id. */
export class NotFoundError extends ForkdAPIError {}
/** 409: the tag exists, a branch to it is in flight, the snapshot is in use or not ready. */
export class ConflictError extends ForkdAPIError {}
/** 413: the request body is larger than the daemon accepts. */
export class PayloadTooLargeError extends ForkdAPIError {}
/** 5xx: the daemon failed (VM boot, restore, snapshot, guest agent, ...). */
export class ServerError extends ForkdAPIError {}
/** 503: the daemon is at a concurrency cap or still starting; retry shortly. */
export class ServiceUnavailableError extends ServerError {}
/**
 * 503 with `code: "no_capacity"`: the host (or, through a gateway, every host) holds as many
 * sandboxes as it may, or is short of memory. `retryAfter`: the server's Retry-After, in seconds.
 */
export class NoCapacityError extends ServiceUnavailableError {
  readonly retryAfter: number | undefined;

  constructor(status: number, message: string, request = "", retryAfter?: number) {
    super(status, message, request);
    this.retryAfter = retryAfter;
  }
}

/** The daemon could not be reached at all (refused, DNS, TLS). */
export class ForkdConnectionError extends ForkdError {
  readonly url: string;
  readonly reason: string;

  constructor(url: string, reason: string, options?: { cause?: unknown }) {
    super(
      `forkd daemon is not reachable at ${url} (${reason}). ` +
        "Start it with `forkd daemon`, or point FORKD_URL at the address it listens on.",
      options,
    );
    this.url = url;
    this.reason = reason;
  }
}

/** A request, or a wait such as `waitSnapshotReady`, took too long. */
export class ForkdTimeoutError extends ForkdError {}

/** A snapshot written in the background ended with `status: "failed"`. */
export class SnapshotFailedError extends ForkdError {
  readonly tag: string;
  readonly reason: string | undefined;

  constructor(tag: string, reason?: string | null) {
    super(`snapshot '${tag}' failed${reason ? `: ${reason}` : ""}`);
    this.tag = tag;
    this.reason = reason ?? undefined;
  }
}

/** No candidate of `Sandbox.explore` succeeded; `outcomes` says how each failed. */
export class ExploreError extends ForkdError {
  readonly outcomes: readonly unknown[];

  constructor(message: string, outcomes: readonly unknown[]) {
    super(message);
    this.outcomes = outcomes;
  }
}

const BY_STATUS: Record<number, new (status: number, message: string, request?: string) => ForkdAPIError> = {
  400: BadRequestError,
  401: UnauthorizedError,
  403: UnauthorizedError,
  404: NotFoundError,
  409: ConflictError,
  413: PayloadTooLargeError,
  422: BadRequestError,
  503: ServiceUnavailableError,
};

/** The most specific {@link ForkdAPIError} for an HTTP status and the answer's `code`. */
export function errorForStatus(
  status: number,
  message: string,
  request = "",
  code?: string,
  retryAfter?: number,
): ForkdAPIError {
  if (status === 503 && code === "no_capacity") return new NoCapacityError(status, message, request, retryAfter);
  const cls = BY_STATUS[status] ?? (status >= 500 ? ServerError : ForkdAPIError);
  return new cls(status, message, request);
}
