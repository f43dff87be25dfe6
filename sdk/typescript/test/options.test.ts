// Every field of every request model the SDK sends can be sent from TypeScript, under its
// snake_case name: each method is called with a value for every field of its request schema
// (read from openapi.json, the document the daemon serves, not from the SDK's generated
// files) and the body it sends is compared field by field. No daemon: a recording fetch
// answers every call.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

import { Controller, Sandbox, Snapshot } from "@deeplethe/forkd";

interface JsonSchema {
  $ref?: string;
  anyOf?: JsonSchema[];
  type?: string;
  enum?: unknown[];
  items?: JsonSchema;
  properties?: Record<string, JsonSchema>;
  required?: string[];
}

interface OpenApi {
  paths: Record<string, Record<string, { requestBody?: { content: Record<string, { schema: JsonSchema }> } }>>;
  components: { schemas: Record<string, JsonSchema> };
}

const OPENAPI = JSON.parse(readFileSync(new URL("../../openapi.json", import.meta.url), "utf8")) as OpenApi;
const SCHEMAS = OPENAPI.components.schemas;

const camel = (snake: string) => snake.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase());
const refName = (s: JsonSchema) => s.$ref?.split("/").pop();

/** A value for one field, distinct from every other field's, and what the body must carry. */
function sample(schema: JsonSchema, next: () => number): { option: unknown; wire: unknown } {
  const s = schema.anyOf?.find((o) => o.type !== "null") ?? schema;
  const ref = refName(s);
  if (ref) {
    const nested = sampleOf(ref, next);
    return { option: nested.options, wire: nested.body };
  }
  if (s.enum) return { option: s.enum[0], wire: s.enum[0] };
  switch (s.type) {
    case "boolean":
      return { option: true, wire: true };
    case "integer":
    case "number": {
      const n = next();
      return { option: n, wire: n };
    }
    case "array": {
      const item = sample(s.items ?? {}, next);
      return { option: [item.option], wire: [item.wire] };
    }
    case "object": {
      // A free-form map (env, metadata): its keys are the caller's, never camelCased.
      const map = { SOME_KEY: `v${next()}` };
      return { option: map, wire: map };
    }
    default: {
      const text = `s${next()}`;
      return { option: text, wire: text };
    }
  }
}

/** camelCase options with a value for every field of `schema`, and the body they must become. */
function sampleOf(schema: string, next: () => number) {
  const options: Record<string, unknown> = {};
  const body: Record<string, unknown> = {};
  for (const [field, fieldSchema] of Object.entries(SCHEMAS[schema]?.properties ?? {})) {
    const { option, wire } = sample(fieldSchema, next);
    options[camel(field)] = option;
    body[field] = wire;
  }
  return { options, body };
}

/** A controller whose fetch records each JSON body and answers with `answer(path)`. */
function recorder(answer: (method: string, path: string) => unknown = () => ({})) {
  const bodies: { method: string; path: string; body: Record<string, unknown> | undefined }[] = [];
  const fetch = (async (url: URL, init: RequestInit) => {
    const method = String(init.method);
    bodies.push({ method, path: url.pathname, body: init.body ? JSON.parse(String(init.body)) : undefined });
    const answered = answer(method, url.pathname);
    const text = typeof answered === "string" ? answered : JSON.stringify(answered);
    return new Response(text, { status: 200, headers: { "content-type": "application/json" } });
  }) as typeof globalThis.fetch;
  const ctrl = new Controller({ url: "http://forkd.invalid", token: "t".repeat(32), fetch });
  return { ctrl, bodies };
}

/** Options for `schema` without the fields `positional` names (the method's arguments). */
function split(schema: string, positional: string[]) {
  let n = 0;
  const { options, body } = sampleOf(schema, () => ++n);
  const args: Record<string, unknown> = {};
  for (const field of positional) {
    args[field] = body[field];
    delete options[camel(field)];
  }
  // Any type: each call below is checked against the schema at run time, field by field.
  return { options: options as any, body, args: args as any };
}

const FORKED = { parent_id: "sb-p", snapshot_tag: "t", children: [], errors: [], pause_ms: 1, tree_id: null };

/** Each request schema, and how a test below sends every one of its fields. */
const SENDERS: Record<string, (schema: string) => Promise<void>> = {
  SpawnRequest: async (schema) => {
    const { options, body } = split(schema, []);
    const { ctrl, bodies } = recorder(() => []);
    await ctrl.spawnSandboxes(options);
    assert.deepEqual(bodies[0]?.body, body);
  },
  ForkRequest: async (schema) => {
    const { options, body } = split(schema, []);
    const { ctrl, bodies } = recorder(() => FORKED);
    await ctrl.forkSandbox("sb-1", options);
    await ctrl.forkTree("sb-1", options);
    assert.deepEqual(bodies.map((b) => b.body), [body, body]);
  },
  CreateSnapshotRequest: async (schema) => {
    const { options, body } = split(schema, []);
    const { ctrl, bodies } = recorder();
    await ctrl.createSnapshot(options);
    assert.deepEqual(bodies[0]?.body, body);
  },
  PoolRequest: async (schema) => {
    const { options, body, args } = split(schema, ["size"]);
    const { ctrl, bodies } = recorder();
    await ctrl.setPool("t", args.size, options);
    assert.deepEqual(bodies[0]?.body, body);
  },
  BranchRequest: async (schema) => {
    const { options, body } = split(schema, []);
    const { ctrl, bodies } = recorder();
    await ctrl.branchSandbox("sb-1", options);
    assert.deepEqual(bodies[0]?.body, body);
  },
  PromoteRequest: async (schema) => {
    const { options, body } = split(schema, []);
    const { ctrl, bodies } = recorder();
    await ctrl.promoteSandbox("sb-1", options);
    assert.deepEqual(bodies[0]?.body, body);
  },
  ApplyRequest: async (schema) => {
    const { options, body } = split(schema, []);
    const { ctrl, bodies } = recorder();
    await ctrl.applyChanges("sb-1", options);
    assert.deepEqual(bodies[0]?.body, body);
  },
  CheckpointPolicyRequest: async (schema) => {
    const { options, body, args } = split(schema, ["every"]);
    const { ctrl, bodies } = recorder();
    await ctrl.setCheckpoints("sb-1", args.every, options);
    assert.deepEqual(bodies[0]?.body, body);
  },
  ExecRequest: async (schema) => {
    const { options, body, args } = split(schema, ["args"]);
    const { ctrl, bodies } = recorder();
    await ctrl.exec("sb-1", args.args, options);
    assert.deepEqual(bodies[0]?.body, body);
  },
  EvalRequest: async (schema) => {
    const { options, body, args } = split(schema, ["code"]);
    const { ctrl, bodies } = recorder();
    await ctrl.eval("sb-1", args.code, options);
    assert.deepEqual(bodies[0]?.body, body);
  },
  ExecStreamRequest: async (schema) => {
    const { options, body, args } = split(schema, ["args"]);
    const { ctrl, bodies } = recorder(() => "");
    (await ctrl.execStream("sb-1", args.args, options)).close();
    assert.deepEqual(bodies[0]?.body, body);
  },
  ProcessStartRequest: async (schema) => {
    const { options, body, args } = split(schema, ["args"]);
    const { ctrl, bodies } = recorder(() => ({ pid: 7 }));
    await ctrl.startProcess("sb-1", args.args, options);
    assert.deepEqual(bodies[0]?.body, body);
  },
  CodeRequest: async (schema) => {
    const { options, body, args } = split(schema, ["code"]);
    const { ctrl, bodies } = recorder(() => "");
    (await ctrl.codeStream("sb-1", args.code, options)).close();
    assert.deepEqual(bodies[0]?.body, body);
  },
  HibernateRequest: async (schema) => {
    const { options, body } = split(schema, []);
    const { ctrl, bodies } = recorder();
    await ctrl.hibernateSandbox("sb-1", options);
    assert.deepEqual(bodies[0]?.body, body);
  },
  PushRequest: async (schema) => {
    const { options, body } = split(schema, []);
    const { ctrl, bodies } = recorder();
    await ctrl.pushSnapshot("t", options);
    assert.deepEqual(bodies[0]?.body, body);
  },
  CreateVolumeRequest: async (schema) => {
    const { options, body, args } = split(schema, ["name"]);
    const { ctrl, bodies } = recorder();
    await ctrl.createVolume(args.name, options);
    assert.deepEqual(bodies[0]?.body, body);
  },
  ExportVolumeRequest: async (schema) => {
    const { options, body, args } = split(schema, ["to"]);
    const { ctrl, bodies } = recorder();
    await ctrl.exportVolume("v", args.to, options);
    assert.deepEqual(bodies[0]?.body, body);
  },
  CreateSecretRequest: async (schema) => {
    const { options, body, args } = split(schema, ["name", "value"]);
    const { ctrl, bodies } = recorder();
    await ctrl.createSecret(args.name, args.value, options);
    assert.deepEqual(bodies[0]?.body, body);
  },
  UpdateSecretRequest: async (schema) => {
    const { options, body } = split(schema, []);
    const { ctrl, bodies } = recorder();
    await ctrl.updateSecret("S", options);
    assert.deepEqual(bodies[0]?.body, body);
  },
  CreateWorkspaceRequest: async (schema) => {
    const { options, body, args } = split(schema, ["name", "snapshot_tag"]);
    const { ctrl, bodies } = recorder();
    await ctrl.createWorkspace(args.name, args.snapshot_tag, options);
    assert.deepEqual(bodies[0]?.body, body);
  },
  SuspendWorkspaceRequest: async (schema) => {
    const { options, body } = split(schema, []);
    const { ctrl, bodies } = recorder();
    await ctrl.suspendWorkspace("w", options);
    assert.deepEqual(bodies[0]?.body, body);
  },
  MkdirRequest: async (schema) => {
    const { options, body, args } = split(schema, ["path"]);
    const { ctrl, bodies } = recorder(() => ({ path: args.path, created: true }));
    await ctrl.fileMkdir("sb-1", args.path, options);
    assert.deepEqual(bodies[0]?.body, body);
  },
};

/** Request bodies whose every field is an argument of its method, or that no method sends. */
const ARGUMENTS_ONLY: Record<string, string> = {
  TimeoutRequest: "setSandboxTimeout(id, timeoutSecs)",
  CompactRequest: "compactSnapshot(tag, to)",
  StdinRequest: "sendStdin(id, pid, data, {eof})",
  SignalRequest: "signalProcess(id, pid, signal, {group})",
  NetworkUpdateRequest: "updateSandboxNetwork(id, policy): the body itself, typed from schema.ts",
  TemplateBuildRequest: "not in the TypeScript SDK (templates are built with the CLI or the Python SDK)",
  ImagePullRequest: "not in either SDK (images are pulled with the CLI, `forkd image pull`, or POST /v1/images)",
};

function requestSchemas(): string[] {
  const names = new Set<string>();
  for (const operations of Object.values(OPENAPI.paths)) {
    for (const operation of Object.values(operations)) {
      const schema = operation.requestBody?.content["application/json"]?.schema;
      for (const option of schema?.anyOf ?? (schema ? [schema] : [])) {
        const name = refName(option);
        if (name) names.add(name);
      }
    }
  }
  return [...names].sort();
}

describe("every request field is sendable", () => {
  test("each JSON request body of the API has a sender below (or is arguments only)", () => {
    const unknown = requestSchemas().filter((name) => !(name in SENDERS) && !(name in ARGUMENTS_ONLY));
    assert.deepEqual(unknown, [], "a new request body: send its options in controller.ts and add it here");
  });

  for (const schema of Object.keys(SENDERS)) {
    test(`${schema}: every field, camelCase in, snake_case out`, async () => {
      assert.ok(requestSchemas().includes(schema), `${schema} is no longer a request body`);
      await SENDERS[schema]!(schema);
    });
  }
});

describe("the object API forwards every option", () => {
  test("a spawn with diskQuotaMib, hibernateOnTimeout and prewarm sends disk_quota_mib, hibernate_on_timeout and prewarm", async () => {
    const { ctrl, bodies } = recorder(() => [{ id: "sb-1" }]);
    await ctrl.spawnSandboxes("py", { diskQuotaMib: 256, hibernateOnTimeout: true, prewarm: true });
    assert.deepEqual(bodies[0]?.body, {
      snapshot_tag: "py", disk_quota_mib: 256, hibernate_on_timeout: true, prewarm: true,
    });
  });

  test("Sandbox.create and Snapshot.fork send every spawn field but the ones they set", async () => {
    const { options, body } = split("SpawnRequest", ["snapshot_tag", "n", "child_env"]);
    delete body.child_env; // one child: no per-child environments
    const { ctrl, bodies } = recorder(() => [{ id: "sb-1" }]);
    await Sandbox.create("py", { ...options, controller: ctrl });
    assert.deepEqual(bodies[0]?.body, { ...body, snapshot_tag: "py", n: 1 });
    const snapshot = new Snapshot({ tag: "py", status: "ready" } as never, ctrl);
    await snapshot.fork(2, options);
    assert.deepEqual(bodies[1]?.body, { ...body, snapshot_tag: "py", n: 2 });
  });

  test("Sandbox.fork sends every fork field but the count it sets", async () => {
    const { options, body } = split("ForkRequest", ["count"]);
    const { ctrl, bodies } = recorder(() => FORKED);
    await Sandbox.connect("sb-1", ctrl).fork(3, options);
    assert.deepEqual(bodies[0]?.body, { ...body, count: 3 });
  });

  test("commands.run sends every exec field, and every process field in the background", async () => {
    const exec = split("ExecRequest", ["args"]);
    const { ctrl, bodies } = recorder(() => ({ pid: 7 }));
    const sb = Sandbox.connect("sb-1", ctrl);
    await sb.commands.run(exec.args.args, exec.options);
    assert.deepEqual(bodies[0]?.body, exec.body);
    const start = split("ProcessStartRequest", ["args"]);
    await sb.commands.run(start.args.args, { ...start.options, background: true });
    assert.deepEqual(bodies[1]?.body, start.body);
  });

  test("options the daemon has no field for are not sent; undefined ones keep its defaults", async () => {
    const { ctrl, bodies } = recorder(() => [{ id: "sb-1" }]);
    await Sandbox.create("py", { controller: ctrl, memoryLimitMib: undefined, network: { allowOut: ["10.0.0.1"] } });
    assert.deepEqual(bodies[0]?.body, { snapshot_tag: "py", n: 1, network: { allow_out: ["10.0.0.1"] } });
  });
});
