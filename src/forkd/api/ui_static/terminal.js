// A terminal on a sandbox: xterm.js (npm @xterm/xterm, served by the daemon at /ui/vendor/ once
// `make node-deps` installed it) on the daemon's WebSocket, a login shell on a pty in the guest.
// A browser cannot put a header on a WebSocket, so the token goes as a subprotocol
// (`bearer.<base64url>`), never in the URL.

import { token } from "./api.js";

const PROTOCOL = "forkd.terminal.v1";
const COLS = 100;
const ROWS = 28;
let current = null; // { ws, term, id }

function bearer() {
  const bytes = new TextEncoder().encode(token.get() ?? "");
  return "bearer." + btoa(String.fromCharCode(...bytes)).replaceAll("+", "-").replaceAll("/", "_").replaceAll("=", "");
}

async function loadXterm() {
  if (!document.querySelector("link[data-xterm]")) {
    const link = document.createElement("link");
    link.rel = "stylesheet";
    link.href = "/ui/vendor/xterm.css";
    link.dataset.xterm = "";
    document.head.append(link);
  }
  try {
    return (await import("/ui/vendor/xterm.mjs")).Terminal;
  } catch {
    throw new Error("the terminal needs xterm.js, which this daemon does not have: run `make node-deps`");
  }
}

export function closeTerminal() {
  if (!current) return;
  current.ws.close();
  current.term.dispose();
  current = null;
  document.getElementById("terminal").hidden = true;
}

/** Open a terminal on sandbox `id` in the #terminal card (closing any other one first). */
export async function openTerminal(id) {
  closeTerminal();
  const Terminal = await loadXterm();
  const card = document.getElementById("terminal");
  const status = document.getElementById("terminal-status");
  const screen = document.getElementById("terminal-screen");
  document.getElementById("terminal-title").textContent = id;
  status.textContent = "connecting…";
  screen.replaceChildren();
  card.hidden = false;

  const term = new Terminal({ cols: COLS, rows: ROWS, convertEol: false, cursorBlink: true,
    fontFamily: 'ui-monospace, "SFMono-Regular", Menlo, monospace', fontSize: 13 });
  term.open(screen);
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const ws = new WebSocket(`${scheme}://${location.host}/v1/sandboxes/${encodeURIComponent(id)}/terminal?cols=${COLS}&rows=${ROWS}`,
    [PROTOCOL, bearer()]);
  ws.binaryType = "arraybuffer";
  current = { ws, term, id };
  const encoder = new TextEncoder();
  ws.onopen = () => { status.textContent = "connected"; term.focus(); };
  ws.onmessage = (event) => {
    if (typeof event.data !== "string") {
      term.write(new Uint8Array(event.data));
      return;
    }
    const message = JSON.parse(event.data);
    if ("exit_code" in message) status.textContent = `shell exited with ${message.exit_code}`;
    if ("error" in message) status.textContent = `error: ${message.error}`;
  };
  ws.onclose = (event) => {
    if (status.textContent === "connecting…") status.textContent = `refused (${event.reason || event.code})`;
    else if (status.textContent === "connected") status.textContent = "disconnected";
  };
  term.onData((data) => { if (ws.readyState === WebSocket.OPEN) ws.send(encoder.encode(data)); });
}
