// Seed 002's TypeScript snippet ("TypeScript SDK BRANCH"), verbatim from the
// next import on: a live-fork parent in its own network namespace, a live
// fire-and-forget BRANCH, a poll until the snapshot is ready, five
// grandchildren. Run against a real daemon whose "pyagent" snapshot exists
// and whose host has the namespace forkd-child-0 (tests/integration/test_ways_in.py).
import { after, test } from "node:test";
import assert from "node:assert/strict";

import { Controller } from '@deeplethe/forkd';
const ctrl = new Controller(); // reads FORKD_URL, FORKD_TOKEN from env
const [parent] = await ctrl.spawnSandboxes({
snapshotTag: 'pyagent',
n: 1,
perChildNetns: true,
liveFork: true, // required upfront for mode: 'live' later
});
// ... drive parent ...
// Live BRANCH + fire-and-forget
const branch = await ctrl.branchSandbox(parent.id, { mode: 'live', wait: false });
// branch.status === "writing" at this point
// Poll for ready
let snap;
while (true) {
const snaps = await ctrl.listSnapshots();
snap = snaps.find(s => s.tag === branch.tag);
if (snap?.status === 'ready') break;
await new Promise(r => setTimeout(r, 500));
}
const kids = await ctrl.spawnSandboxes({ snapshotTag: branch.tag, n: 5 });
// ---- end of the seed's snippet ----

after(async () => {
  for (const sb of [...kids, parent]) await ctrl.killSandbox(sb.id).catch(() => undefined);
  await ctrl.deleteSnapshot(branch.tag, { force: true }).catch(() => undefined);
});

test("the seed's parent is a live-fork sandbox in its own network namespace", () => {
  assert.equal(parent.snapshot_tag, "pyagent");
  assert.equal(parent.live_fork, true);
  assert.match(parent.netns ?? "", /^forkd-child-\d+$/);
});

test("the live no-wait branch came back before its memory was copied, then turned ready", () => {
  assert.equal(branch.branched_from, parent.id);
  assert.ok(["writing", "ready"].includes(branch.status ?? ""), `status ${branch.status}`);
  assert.equal(typeof branch.pause_ms, "number");
  assert.equal(snap?.status, "ready");
});

test("the five grandchildren run from the branch, each its own VM", async () => {
  assert.equal(kids.length, 5);
  assert.equal(new Set(kids.map((k) => k.id)).size, 5);
  assert.equal(new Set(kids.map((k) => k.pid)).size, 5);
  for (const kid of kids) {
    assert.equal(kid.snapshot_tag, branch.tag);
    const pong = await ctrl.ping(kid.id);
    assert.equal(pong.pong, true);
  }
});
