// Runs a code cell in the web console's Code panel on a sandbox in Debian's headless chromium, for
// tests/integration/test_code_interpreter.py. Input (environment): FORKD_URL, FORKD_TOKEN, SANDBOX
// (an id on a template with a Jupyter kernel), OUT_DIR (the screenshot). Runs a matplotlib cell
// that prints and plots, waits for the plot's <img>, and prints one JSON line of what it saw; exits
// non-zero if a wait failed.
import { join } from "node:path";

import { launch, signedIn } from "./browser.mjs";

const { FORKD_URL: url, FORKD_TOKEN: token, SANDBOX: id, OUT_DIR: out } = process.env;
const CODE = [
  "import matplotlib.pyplot as plt",
  "print('forkd-' + str(6 * 7))",
  "plt.plot([1, 2, 3], [4, 1, 9], color='tab:red')",
  "plt.title('from the console')",
  "plt.show()",
].join("\n");
const seen = { console: [], requests: [] };
const { context, done } = await launch();
try {
  const page = await signedIn(context, url, token, seen, 120_000);
  await page.locator(`#sandboxes tr[data-sandbox="${id}"] button.code`).click();
  await page.locator("#cell").waitFor();
  await page.fill("#cell-code", CODE);
  await page.click("#cell-run");
  await page.locator("#cell-status", { hasText: "done" }).waitFor();
  const img = page.locator("#cell-output img.cell-image");
  await img.waitFor();
  await page.waitForFunction(() => document.querySelector("#cell-output img.cell-image")?.complete);
  seen.image = await img.evaluate((el) => ({ naturalWidth: el.naturalWidth, naturalHeight: el.naturalHeight,
    src: el.getAttribute("src").slice(0, 30) }));
  seen.stdout = await page.locator("#cell-output pre.cell-stdout").innerText();
  seen.status = await page.locator("#cell-status").innerText();
  await img.scrollIntoViewIfNeeded();
  await page.screenshot({ path: join(out, "cell.png"), fullPage: true });
  seen.tokenInUrl = seen.requests.some((u) => u.includes(token));
  process.stdout.write(JSON.stringify(seen) + "\n");
} finally {
  await done();
}
