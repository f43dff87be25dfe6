// The error a status maps to, from the answer's status, `code` and Retry-After: a host at
// capacity (503 `no_capacity`) is a NoCapacityError carrying when to retry. No daemon: a
// recording fetch answers.
import { test } from "node:test";
import assert from "node:assert/strict";

import { Controller, NoCapacityError, ServiceUnavailableError } from "@deeplethe/forkd";

test("a 503 no_capacity is a NoCapacityError with its Retry-After; a plain 503 is not", async () => {
  const fetch = async (_url: string | URL | Request, init?: RequestInit): Promise<Response> => {
    if (init?.method === "POST") {
      return new Response(JSON.stringify({ error: "this host is at capacity", code: "no_capacity" }), {
        status: 503,
        headers: { "content-type": "application/json", "retry-after": "5" },
      });
    }
    return new Response(JSON.stringify({ error: "the daemon is still starting" }), { status: 503 });
  };
  const ctrl = new Controller({ url: "http://forkd.invalid", token: "t".repeat(32), fetch });
  const full = await ctrl.spawnSandboxes("py").catch((e: unknown) => e);
  assert.ok(full instanceof NoCapacityError);
  assert.equal(full.retryAfter, 5);
  assert.equal(full.status, 503);
  assert.match(full.message, /capacity/);
  const busy = await ctrl.listSandboxes().catch((e: unknown) => e);
  assert.ok(busy instanceof ServiceUnavailableError && !(busy instanceof NoCapacityError));
});
