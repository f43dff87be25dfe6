// The REST API from the browser: the token lives in sessionStorage (this tab
// only) and goes out as an Authorization header on every call, never in a URL.

const KEY = "forkd-token";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (value) => sessionStorage.setItem(KEY, value),
  clear: () => sessionStorage.removeItem(KEY),
};

async function send(method, path, body) {
  const headers = { Authorization: `Bearer ${token.get() ?? ""}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "omit",
    cache: "no-store",
  });
  if (!response.ok) {
    let message = `HTTP ${response.status}`;
    try {
      message = (await response.json()).error ?? message;
    } catch {
      // not JSON: keep the status line
    }
    throw new ApiError(response.status, message);
  }
  return response;
}

/** One call; resolves to the JSON (or text) answer, rejects with ApiError(status, the daemon's message). */
export async function api(method, path, body, { text = false } = {}) {
  const response = await send(method, path, body);
  if (response.status === 204) return null;
  return text ? response.text() : response.json();
}

/** A call answered with NDJSON: `onEvent` gets each line's object as it arrives; resolves at the end. */
export async function stream(method, path, body, onEvent) {
  const reader = (await send(method, path, body)).body.pipeThrough(new TextDecoderStream()).getReader();
  let pending = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    pending += value;
    const lines = pending.split("\n");
    pending = lines.pop();
    for (const line of lines) if (line.trim()) onEvent(JSON.parse(line));
  }
  if (pending.trim()) onEvent(JSON.parse(pending));
}
