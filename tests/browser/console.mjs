// Drives the web console in Debian's headless chromium (never a downloaded
// browser) for tests/integration/test_ways_in.py. Input (environment):
//   FORKD_URL, FORKD_TOKEN   the daemon
//   OUT_DIR                  where the screenshots go
//   EXPECT                   JSON: {sandboxes: [ids], snapshots: [tags], tree: [ids], kill: id, fork_tag: tag, pool: tag,
//                                  net: id of a sandbox with a NIC and idle_pause_secs: 1}
// Prints one JSON line of what the page showed; exits non-zero if a wait failed.
import { join } from "node:path";

import { launch } from "./browser.mjs";

const { FORKD_URL: url, FORKD_TOKEN: token, OUT_DIR: out } = process.env;
const expect = JSON.parse(process.env.EXPECT);
const seen = { console: [], requests: [] };

const { context, done } = await launch();
try {
  const page = context.pages()[0] ?? (await context.newPage());
  page.setDefaultTimeout(60_000);
  page.on("console", (m) => seen.console.push(`${m.type()}: ${m.text()}`));
  page.on("request", (r) => seen.requests.push(r.url()));

  await page.goto(`${url}/ui`);
  await page.locator("#login").waitFor({ state: "visible" });
  seen.loginShown = true;

  // A wrong token is refused and nothing is shown.
  await page.fill("#token", "wrong-token-0123456789abcdef");
  await page.click("#login-form button[type=submit]");
  await page.locator("#login-error", { hasText: "wrong token" }).waitFor();
  seen.wrongTokenRefused = await page.locator("#dashboard").isHidden();

  await page.fill("#token", token);
  await page.click("#login-form button[type=submit]");
  await page.locator("#dashboard").waitFor({ state: "visible" });

  // Everything made through the API shows: rows, lineage nodes, pool level, latency.
  for (const id of expect.sandboxes) {
    await page.locator(`#sandboxes tr[data-sandbox="${id}"]`).waitFor();
    await page.locator(`#lineage g.node[data-key="b:${id}"]`).waitFor();
  }
  for (const tag of expect.snapshots) {
    await page.locator(`#snapshots tr[data-snapshot="${tag}"]`).waitFor();
    await page.locator(`#lineage g.node[data-key="s:${tag}"]`).waitFor();
  }
  await page.locator(`#pools tr[data-pool="${expect.pool}"]`).waitFor();
  await page.waitForFunction(() =>
    [...document.querySelectorAll("#latency tbody tr")].every((tr) => tr.children[1].textContent !== "0"));

  seen.treeNodes = await page.locator("#lineage g.node.tree").count();
  seen.edges = { fork: await page.locator("#lineage path.edge.fork").count(),
    branch: await page.locator("#lineage path.edge.branch").count() };
  seen.nodeTitles = await page.locator("#lineage g.node title").allTextContents();
  seen.latency = await page.$$eval("#latency tbody tr", (rows) =>
    rows.map((r) => [...r.children].map((td) => td.textContent)));
  seen.pool = await page.locator(`#pools tr[data-pool="${expect.pool}"]`).innerText();
  // Each sandbox's address and egress: the whole policy in the cell's title.
  const netCell = page.locator(`#sandboxes tr[data-sandbox="${expect.net}"] td.net`);
  seen.net = { text: await netCell.innerText(), title: await netCell.getAttribute("title") };
  // That sandbox idles with idle_pause_secs: 1, so a refresh soon shows it paused; the others run.
  await page.locator(`#sandboxes tr[data-sandbox="${expect.net}"] .badge.paused`).waitFor({ timeout: 60000 });
  seen.pausedBadges = await page.locator("#sandboxes .badge.paused").count();
  seen.noNic = await page.locator(`#sandboxes tr[data-sandbox="${expect.sandboxes[0]}"] td.net`).innerText();
  seen.status = await page.locator("#status").innerText();
  seen.tokenInUrl = page.url().includes(token);
  seen.cookies = (await context.cookies()).length;
  seen.sessionHasToken = (await page.evaluate(() => sessionStorage.getItem("forkd-token"))) === token;
  await page.screenshot({ path: join(out, "console.png"), fullPage: true });
  await page.locator("#lineage").screenshot({ path: join(out, "lineage.png") });

  // Actions through the page: kill one sandbox, fork N=2 children of a snapshot, branch one.
  await page.locator(`#sandboxes tr[data-sandbox="${expect.kill}"] button.kill`).click();
  await page.locator(`#sandboxes tr[data-sandbox="${expect.kill}"]`).waitFor({ state: "detached" });
  seen.killed = expect.kill;

  const before = await page.locator(`#sandboxes tr`).count();
  const row = page.locator(`#snapshots tr[data-snapshot="${expect.fork_tag}"]`);
  await row.locator("input.count").fill("2");
  await row.locator("button.fork").click();
  await page.waitForFunction((n) => document.querySelectorAll("#sandboxes tr").length === n + 2, before);
  seen.forkedThroughPage = 2;

  const snapsBefore = await page.locator("#snapshots tbody tr").count();
  await page.locator(`#sandboxes tr[data-sandbox="${expect.branch_from}"] button.branch`).click();
  await page.waitForFunction((n) => document.querySelectorAll("#snapshots tbody tr").length === n + 1, snapsBefore,
    { timeout: 120_000 });
  seen.branchedThroughPage = true;
  seen.actionError = await page.locator("#action-error").innerText();
  await page.screenshot({ path: join(out, "console-after-actions.png"), fullPage: true });

  // Signing out forgets the token.
  await page.click("#logout");
  seen.signedOut = (await page.evaluate(() => sessionStorage.getItem("forkd-token"))) === null &&
    (await page.locator("#login").isVisible());
} finally {
  await done();
}
console.log(JSON.stringify(seen));
