// Debian's headless chromium (never a downloaded browser) with a throwaway profile, as every
// browser test here launches it.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { chromium } from "playwright-core";

/** The browser context; `done()` closes it and removes its profile. */
export async function launch() {
  const profile = mkdtempSync(join(tmpdir(), "forkd-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    headless: true,
    viewport: { width: 1400, height: 1000 },
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
      "--disable-sync", "--no-first-run", "--disable-quic"],
  });
  const done = async () => {
    await context.close();
    rmSync(profile, { recursive: true, force: true });
  };
  return { context, done };
}

/** The console's page, signed in with `token`: what the browser logged, each request's URL and each
 * refused response go into `seen.console` and `seen.requests`. */
export async function signedIn(context, url, token, seen, timeoutMs) {
  const page = context.pages()[0] ?? (await context.newPage());
  page.setDefaultTimeout(timeoutMs);
  page.on("console", (m) => seen.console.push(`${m.type()}: ${m.text()}`));
  page.on("request", (r) => seen.requests.push(r.url()));
  page.on("response", (r) => { if (r.status() >= 400) seen.console.push(`response ${r.status()} ${r.url()}`); });
  await page.goto(`${url}/ui`);
  await page.fill("#token", token);
  await page.click("#login-form button[type=submit]");
  return page;
}
