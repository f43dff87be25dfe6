// The SDK's surface against a real daemon with real VMs (FORKD_URL, FORKD_TOKEN;
// the snapshot FORKD_TEST_TAG, default "pyagent"). Every test kills what it made.
import { after, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

import {
  BadRequestError,
  ConflictError,
  Controller,
  ForkdAPIError,
  ForkdConnectionError,
  NotFoundError,
  Sandbox,
  Snapshot,
  UnauthorizedError,
} from "@deeplethe/forkd";

const TAG = process.env.FORKD_TEST_TAG ?? "pyagent";
const ctrl = new Controller();
const made: Sandbox[] = [];
const snapshots: string[] = [];

after(async () => {
  for (const sb of made) await sb.close().catch(() => undefined);
  for (const tag of snapshots.reverse()) {
    await ctrl.deleteSnapshot(tag, { cascade: true, force: true }).catch(() => undefined);
  }
});

async function create(options: Parameters<typeof Sandbox.create>[1] = {}): Promise<Sandbox> {
  const sb = await Sandbox.create(TAG, { controller: ctrl, ...options });
  made.push(sb);
  return sb;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("status and errors", () => {
  test("healthz, version and metrics", async () => {
    assert.deepEqual(await ctrl.healthz(), { ok: true });
    const version = await ctrl.version();
    assert.equal(version.api, "v1");
    assert.match(await ctrl.metrics(), /forkd_sandboxes_active/);
  });

  test("an unknown sandbox is a NotFoundError with the status and the server's message", async () => {
    const err = await ctrl.getSandbox("sb-000000-0000").catch((e: unknown) => e);
    assert.ok(err instanceof NotFoundError);
    assert.ok(err instanceof ForkdAPIError);
    assert.equal(err.status, 404);
    assert.match(err.message, /sb-000000-0000/);
    assert.equal(err.request, "GET /v1/sandboxes/sb-000000-0000");
  });

  test("bad input is a BadRequestError naming the field", async () => {
    const err = await ctrl.spawnSandboxes({ snapshotTag: TAG, n: 0 }).catch((e: unknown) => e);
    assert.ok(err instanceof BadRequestError);
    assert.equal(err.status, 400);
    assert.match(err.message, /\bn\b/);
  });

  test("a wrong token is an UnauthorizedError", async () => {
    const wrong = new Controller({ token: "not-the-token-0123456789" });
    const err = await wrong.listSandboxes().catch((e: unknown) => e);
    assert.ok(err instanceof UnauthorizedError);
    assert.equal(err.status, 401);
    assert.equal(err.message, "missing or invalid bearer token");
  });

  test("a daemon that is not there is a ForkdConnectionError", async () => {
    const gone = new Controller({ url: "http://127.0.0.1:9" });
    const err = await gone.listSnapshots().catch((e: unknown) => e);
    assert.ok(err instanceof ForkdConnectionError);
    assert.match(err.message, /not reachable at http:\/\/127\.0\.0\.1:9/);
  });

  test("an existing tag is a ConflictError", async () => {
    const [sb] = await ctrl.spawnSandboxes(TAG, { n: 1 });
    made.push(Sandbox.fromInfo(sb!, ctrl));
    const err = await ctrl.branchSandbox(sb!.id, { tag: TAG }).catch((e: unknown) => e);
    assert.ok(err instanceof ConflictError);
    assert.equal(err.status, 409);
  });
});

describe("a sandbox", () => {
  test("exec, eval, ping, labels and a timeout", async () => {
    const sb = await create({ env: { GREETING: "hi" }, metadata: { suite: "ts-sdk" } });
    assert.equal((await sb.ping()).pong, true);

    const shell = await sb.commands.run("echo $GREETING; echo oops >&2; exit 3");
    assert.deepEqual([shell.stdout, shell.stderr, shell.exit_code], ["hi\n", "oops\n", 3]);
    const argv = await sb.commands.run(["python3", "-c", "import sys; print(sys.stdin.read()[::-1])"], {
      stdin: "abc",
      cwd: "/tmp",
    });
    assert.equal(argv.stdout, "cba\n");

    assert.equal((await sb.eval("x = 20")).exit_code, 0);
    assert.equal((await sb.eval("x * 2 + 2")).result, "42");
    const failed = await sb.eval("1 / 0");
    assert.equal(failed.result, null);
    assert.match(failed.error ?? "", /ZeroDivisionError/);

    const labelled = await ctrl.listSandboxes({ metadata: { suite: "ts-sdk" } });
    assert.deepEqual(labelled.map((s) => s.id), [sb.id]);
    const info = await sb.setTimeout(600);
    assert.ok((info.expires_at_unix ?? 0) > Date.now() / 1000 + 500);

    // To disk and back: the next request wakes it, its memory as it was.
    const asleep = await sb.hibernate();
    assert.equal(asleep.state, "hibernated");
    assert.ok((asleep.hibernation?.pages ?? 0) > 0);
    assert.equal((await sb.eval("x * 2 + 2")).result, "42");
    assert.equal((await ctrl.getSandbox(sb.id)).state, "running");
  });

  test("files: write, read, list, stat, mkdir, upload, download, remove", async () => {
    const sb = await create();
    const local = await mkdtemp(join(tmpdir(), "forkd-ts-"));
    try {
      assert.equal(await sb.files.mkdir("/work/sub", { parents: true }), true);
      const written = await sb.files.write("/work/a.txt", "hello forkd");
      assert.equal(written.size, 11);
      assert.equal(await sb.files.readText("/work/a.txt"), "hello forkd");
      const bytes = new Uint8Array(300_000).map((_, i) => i % 251);
      await writeFile(join(local, "up.bin"), bytes);
      await sb.files.upload(join(local, "up.bin"), "/work/sub/up.bin");
      assert.equal((await sb.files.stat("/work/sub/up.bin")).size, bytes.length);
      assert.equal(await sb.files.download("/work/sub/up.bin", join(local, "down.bin")), bytes.length);
      assert.deepEqual(new Uint8Array(await readFile(join(local, "down.bin"))), bytes);
      const names = (await sb.files.list("/work")).map((e) => `${e.name}:${e.type}`);
      assert.deepEqual(names, ["a.txt:file", "sub:dir"]);
      await sb.files.remove("/work", { recursive: true });
      assert.equal(await sb.files.exists("/work"), false);
      const missing = await sb.files.read("/nope").catch((e: unknown) => e);
      assert.ok(missing instanceof NotFoundError);
    } finally {
      await rm(local, { recursive: true, force: true });
    }
  });

  test("users: commands and files as the guest's user, root by default", async () => {
    const sb = await create();
    assert.equal((await sb.commands.run("id -u")).stdout, "0\n");
    const asUser = await sb.commands.run("echo $(id -u) $HOME $(pwd)", { user: "user" });
    assert.equal(asUser.stdout, "1000 /home/user /home/user\n");
    const written = await sb.files.write("/home/user/mine.txt", "x", { user: "user" });
    assert.equal(written.owner, "user");
    assert.equal((await sb.files.stat("/home/user/mine.txt")).group, "user");
    assert.equal(await sb.files.readText("/home/user/mine.txt", { user: "user" }), "x");
    const refused = await sb.files.write("/root/nope.txt", "x", { user: "user" }).catch((e: unknown) => e);
    assert.ok(refused instanceof BadRequestError && /Permission denied/.test(refused.message));
  });

  test("branch a running sandbox, fork the branch, see its lineage", async () => {
    const sb = await create();
    await sb.eval("state = 'before'");
    const branch = await sb.branch({ mode: "diff" });
    snapshots.push(branch.tag);
    assert.equal(branch.info.branched_from, sb.id);
    await sb.eval("state = 'after'");
    const [grandchild] = await branch.fork(1);
    made.push(grandchild!);
    assert.equal((await grandchild!.eval("state")).result, "'before'");
    const detail = await ctrl.getSnapshot(branch.tag);
    assert.deepEqual(detail.ancestors, [TAG]);
    assert.deepEqual(detail.sandboxes, [grandchild!.id]);
    const again = await Snapshot.fromTag(branch.tag, ctrl);
    assert.equal(again.tag, branch.tag);
  });

  test("fork with per-child env, fork-tree and promote", async () => {
    const sb = await create();
    await sb.eval("import os; base = 7");
    const forked = await sb.fork(2, { childEnv: [{ SEED: "a" }, { SEED: "b" }] });
    made.push(...forked.children);
    assert.deepEqual(forked.errors, []);
    const seeds = await Promise.all(forked.children.map((c) => c.eval("os.environ['SEED'] + str(base)")));
    assert.deepEqual(seeds.map((s) => s.result).sort(), ["'a7'", "'b7'"]);

    const tree = await sb.forkTree(2);
    made.push(...tree.children);
    assert.match(tree.treeId ?? "", /^ft-[0-9a-f]{12}$/);
    const winner = tree.children[1]!;
    const promoted = await winner.promote();
    assert.equal(promoted.winner.id, winner.id);
    assert.deepEqual(promoted.deleted.map((d) => [d.id, d.deleted]), [[tree.children[0]!.id, true]]);
    const left = await ctrl.listSandboxes({ metadata: { fork_tree_id: tree.treeId! } });
    assert.deepEqual(left.map((s) => s.id), [winner.id]);
  });

  test("explore keeps the best candidate and kills the others", async () => {
    const sb = await create();
    const result = await sb.explore(
      [3, 9, 5],
      async (child, n) => (await child.eval(`${n} * 2`)).result,
      (_child, _n, out) => Number(out),
    );
    made.push(result.winner);
    assert.equal(result.best.candidate, 9);
    assert.equal(result.best.score, 18);
    assert.equal(result.promotion.deleted.filter((d) => d.deleted).length, 2);
  });

  test("auto-checkpoints branch after every exec/eval call", async () => {
    const sb = await create();
    const set = await sb.setCheckpoints(1, { keep: 2 });
    assert.deepEqual(set.policy, { every: 1, keep: 2, mode: "diff" });
    await sb.eval("n = 1");
    let list = await sb.getCheckpoints();
    assert.equal(list.calls, 1);
    assert.equal(list.checkpoints.length, 1);
    const tag = list.checkpoints[0]!.tag;
    snapshots.push(tag);
    await ctrl.waitSnapshotReady(tag);
    list = await sb.deleteCheckpoints();
    assert.equal(list.policy, null);
  });
});

describe("warm pools", () => {
  test("a pooled child is claimed, then the pool drains", async () => {
    await ctrl.setPool(TAG, 1);
    try {
      for (let i = 0; (await ctrl.getPool(TAG)).ready < 1; i++) {
        assert.ok(i < 600, "the pool did not fill within 5 minutes");
        await sleep(500);
      }
      const sb = await create();
      const info = await sb.info();
      assert.ok(info.timings && "claimed_s" in info.timings, JSON.stringify(info.timings));
      const pools = await ctrl.listPools();
      assert.equal(pools.find((p) => p.tag === TAG)?.claims, 1);
    } finally {
      const drained = await ctrl.setPool(TAG, 0);
      assert.equal(drained.size, 0);
    }
  });
});

describe("compact and workspaces", () => {
  test("a workspace suspends to disk and resumes under the same id; a compacted copy stands alone", async () => {
    const ws = await ctrl.createWorkspace("ts-ws", TAG);
    try {
      assert.equal(ws.status, "running");
      const id = ws.live_sandbox_id!;
      assert.equal((await ctrl.eval(id, "kept = 6 * 7")).exit_code, 0);
      const suspended = await ctrl.suspendWorkspace("ts-ws");
      assert.equal(suspended.status, "suspended");
      assert.ok(suspended.current_state_tag);
      await assert.rejects(ctrl.getSandbox(id), NotFoundError);
      const resumed = await ctrl.resumeWorkspace("ts-ws");
      assert.equal(resumed.live_sandbox_id, id);
      assert.equal((await ctrl.eval(id, "kept")).result, "42");
      assert.deepEqual((await ctrl.listWorkspaces()).map((w) => w.name), ["ts-ws"]);
    } finally {
      await ctrl.deleteWorkspace("ts-ws");
    }
    await assert.rejects(ctrl.getWorkspace("ts-ws"), NotFoundError);

    snapshots.push("ts-flat");
    const flat = await ctrl.compactSnapshot(TAG, "ts-flat");
    assert.equal(flat.compacted_from, TAG);
    assert.deepEqual((await ctrl.getSnapshot("ts-flat")).ancestors, []);
  });
});
