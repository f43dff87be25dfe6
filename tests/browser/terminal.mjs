// Opens the web console's terminal on a sandbox in Debian's headless chromium, for
// tests/integration/test_ways_in.py. Input (environment): FORKD_URL, FORKD_TOKEN, SANDBOX (an id),
// OUT_DIR (the screenshot). Types into the terminal (xterm.js) and reads what the shell answered
// from the page; prints one JSON line of what it saw; exits non-zero if a wait failed.
import { join } from "node:path";

import { launch, signedIn } from "./browser.mjs";

const { FORKD_URL: url, FORKD_TOKEN: token, SANDBOX: id, OUT_DIR: out } = process.env;
const seen = { console: [], requests: [] };
const { context, done } = await launch();
const screenText = (page) => page.locator("#terminal-screen .xterm-rows").innerText();
try {
  const page = await signedIn(context, url, token, seen, 60_000);
  await page.locator(`#sandboxes tr[data-sandbox="${id}"] button.terminal`).click();
  await page.locator("#terminal-status", { hasText: "connected" }).waitFor();
  await page.waitForFunction(() => /[#$] *$/m.test(document.querySelector("#terminal-screen .xterm-rows")?.innerText ?? ""));
  await page.locator("#terminal-screen .xterm-helper-textarea").focus();
  await page.keyboard.type("echo forkd-$((6*7)) && stty size && whoami");
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => document.querySelector("#terminal-screen .xterm-rows").innerText.includes("forkd-42"));
  await page.waitForFunction(() => /28 100\s+root\s/.test(document.querySelector("#terminal-screen .xterm-rows").innerText));
  seen.afterCommand = await screenText(page);
  await page.screenshot({ path: join(out, "terminal.png"), fullPage: true });
  await page.keyboard.type("exit 7");
  await page.keyboard.press("Enter");
  await page.locator("#terminal-status", { hasText: "shell exited with 7" }).waitFor();
  seen.status = await page.locator("#terminal-status").innerText();
  seen.tokenInUrl = seen.requests.some((u) => u.includes(token));
  process.stdout.write(JSON.stringify(seen) + "\n");
} finally {
  await done();
}
