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
