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

/** One call; resolves to the JSON (or text) answer, rejects with ApiError(status, the daemon's message). */
export async function api(method, path, body, { text = false } = {}) {
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
  if (response.status === 204) return null;
  return text ? response.text() : response.json();
}
