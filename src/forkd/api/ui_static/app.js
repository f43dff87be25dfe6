// The console: sign in, then every 2 s read snapshots, sandboxes, pools and
// /metrics and redraw; the buttons call the same REST API (fork N, branch, kill), open a terminal
// or a code cell.
// Everything is built with DOM calls and textContent, never parsed as HTML.

import { ApiError, api, token } from "./api.js";
import { drawLineage } from "./lineage.js";
import { histogram, parseMetrics } from "./metrics.js";
import { closeCell, openCell, runCell } from "./cell.js";
import { closeTerminal, openTerminal } from "./terminal.js";

const $ = (id) => document.getElementById(id);
const REFRESH_MS = 2000;
let timer = null;

function h(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (v !== undefined && v !== null && v !== false) node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

function age(unix) {
  const secs = Math.max(0, Date.now() / 1000 - unix);
  if (secs < 90) return `${Math.round(secs)} s`;
  if (secs < 5400) return `${Math.round(secs / 60)} min`;
  return `${(secs / 3600).toFixed(1)} h`;
}

function fmtSeconds(v) {
  if (v === null || v === undefined) return "–";
  return v < 1 ? `${(v * 1000).toFixed(0)} ms` : `${v.toFixed(2)} s`;
}

function fmtMs(v) {
  return v === null || v === undefined ? "–" : `${v.toFixed(1)} ms`;
}

function showError(message) {
  $("action-error").textContent = message;
}

/** Run an action, then refresh; a failure shows the daemon's message. */
async function act(what, fn) {
  showError("");
  try {
    await fn();
  } catch (err) {
    showError(`${what} failed: ${err.message}`);
    if (err instanceof ApiError && err.status === 401) signOut();
  }
  await refresh();
}

function countInput(name) {
  return h("input", { type: "number", min: 1, max: 100, value: 1, class: "count", "aria-label": name });
}

function renderSnapshots(snapshots) {
  const rows = snapshots.map((snap) => {
    const n = countInput(`children of ${snap.tag}`);
    const fork = h("button", {
      type: "button", class: "fork", disabled: snap.status && snap.status !== "ready",
      onclick: () => act(`fork of ${snap.tag}`, () =>
        api("POST", "/v1/sandboxes", { snapshot_tag: snap.tag, n: Number(n.value) })),
    }, "Fork");
    return h("tr", { dataset: { snapshot: snap.tag } },
      h("td", { class: "mono" }, snap.tag),
      h("td", {}, h("span", { class: `badge ${snap.status ?? "ready"}` }, snap.status ?? "ready")),
      h("td", { class: "mono" }, snap.branched_from ?? ""),
      h("td", {}, snap.pause_ms === undefined || snap.pause_ms === null ? "" : fmtMs(snap.pause_ms)),
      h("td", {}, age(snap.created_at_unix)),
      h("td", {}, n, fork));
  });
  $("snapshots").tBodies[0].replaceChildren(...rows);
}

/** "no egress", or what its policy opens: "internet", "2 allowed", "1 denied". */
function egressSummary(net) {
  const parts = [];
  if (net.allow_internet_access) parts.push("internet");
  if (net.allow_out.length) parts.push(`${net.allow_out.length} allowed`);
  if (net.deny_out.length) parts.push(`${net.deny_out.length} denied`);
  return parts.length ? parts.join(" · ") : "no egress";
}

/** Its address from the host and its egress policy; the whole policy on hover. */
function networkCell(sb) {
  const net = sb.network;
  if (!net) return h("td", { class: "net muted" }, "no NIC");
  const title = [`guest ${net.guest_ip}, host ${net.host_gateway}`,
    ...net.allow_out.map((d) => `allow ${d}`), ...net.deny_out.map((d) => `deny ${d}`)].join("\n");
  const open = net.allow_internet_access || net.allow_out.length > 0;
  return h("td", { class: "net", title },
    h("span", { class: "mono" }, sb.ip ?? ""), " ",
    h("span", { class: `egress ${open ? "open" : "closed"}` }, egressSummary(net)));
}

/** A badge for a child paused by idle_pause_secs or hibernated (to disk, no QEMU); either is woken by
 * its next request. None while running. */
function stateBadge(sb) {
  if (sb.state === "hibernated") {
    const mib = sb.hibernation?.disk_mib;
    const title = `hibernated${mib === undefined ? "" : ` (${mib} MiB on disk)`}: woken by its next request`;
    return [" ", h("span", { class: "badge paused", title }, "hibernated")];
  }
  if (sb.state !== "paused") return [];
  return [" ", h("span", { class: "badge paused", title: "idle: paused until its next request" }, "paused")];
}

function renderSandboxes(sandboxes) {
  const rows = sandboxes.map((sb) => {
    const n = countInput(`children of ${sb.id}`);
    const labels = Object.entries(sb.metadata ?? {}).map(([k, v]) => h("span", { class: "label" }, `${k}=${v}`));
    return h("tr", { dataset: { sandbox: sb.id } },
      h("td", { class: "mono" }, sb.id),
      h("td", { class: "mono" }, sb.snapshot_tag),
      networkCell(sb),
      h("td", {}, ...labels),
      h("td", {}, age(sb.created_at_unix), ...stateBadge(sb)),
      h("td", { class: "actions" },
        h("button", { type: "button", class: "branch",
          onclick: () => act(`branch of ${sb.id}`, () => api("POST", `/v1/sandboxes/${sb.id}/branch`, { mode: "diff" })) },
          "Branch"),
        n,
        h("button", { type: "button", class: "fork",
          onclick: () => act(`fork of ${sb.id}`, () =>
            api("POST", `/v1/sandboxes/${sb.id}/fork-tree`, { count: Number(n.value) })) },
          "Fork tree"),
        h("button", { type: "button", class: "terminal",
          onclick: () => act(`terminal on ${sb.id}`, () => openTerminal(sb.id)) },
          "Terminal"),
        h("button", { type: "button", class: "code", onclick: () => openCell(sb.id) }, "Code"),
        h("button", { type: "button", class: "kill danger",
          onclick: () => act(`kill of ${sb.id}`, () => api("DELETE", `/v1/sandboxes/${sb.id}`)) },
          "Kill")));
  });
  $("sandboxes").tBodies[0].replaceChildren(...rows);
}

function renderPools(pools) {
  const rows = pools.map((p) => h("tr", { dataset: { pool: p.tag } },
    h("td", { class: "mono" }, p.tag),
    h("td", {}, h("meter", { min: 0, max: Math.max(p.size, 1), value: p.ready }), ` ${p.ready} / ${p.size}`),
    h("td", {}, p.claims),
    h("td", {}, p.misses)));
  if (rows.length === 0) rows.push(h("tr", {}, h("td", { colspan: 4, class: "muted" }, "no warm pools (forkd pool TAG N)")));
  $("pools").tBodies[0].replaceChildren(...rows);
}

function renderLatency(text) {
  const samples = parseMetrics(text);
  const rows = [
    ["fork of a running sandbox", histogram(samples, "forkd_fork_seconds"), fmtSeconds],
    ["spawn from a snapshot", histogram(samples, "forkd_spawn_seconds"), fmtSeconds],
    ["child restore to ready", histogram(samples, "forkd_restore_phase_seconds", { phase: "ready" }), fmtSeconds],
    ["branch pause of the source", histogram(samples, "forkd_branch_pause_ms"), fmtMs],
  ].map(([what, s, fmt]) => h("tr", { dataset: { metric: what } },
    h("td", {}, what), h("td", {}, s.count), h("td", {}, fmt(s.mean)), h("td", {}, fmt(s.p50)), h("td", {}, fmt(s.p90))));
  $("latency").tBodies[0].replaceChildren(...rows);
}

async function refresh() {
  clearTimeout(timer);
  if (!token.get()) return;
  try {
    const [version, snapshots, sandboxes, pools, metrics] = await Promise.all([
      api("GET", "/version"),
      api("GET", "/v1/snapshots"),
      api("GET", "/v1/sandboxes"),
      api("GET", "/v1/pools"),
      api("GET", "/metrics", undefined, { text: true }),
    ]);
    renderSnapshots(snapshots);
    renderSandboxes(sandboxes);
    renderPools(pools);
    renderLatency(metrics);
    drawLineage($("lineage"), snapshots, sandboxes);
    $("status").textContent =
      `forkd ${version.version} · ${snapshots.length} snapshots · ${sandboxes.length} sandboxes · updated ${new Date().toLocaleTimeString()}`;
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) return signOut("the token was refused");
    $("status").textContent = `cannot reach the daemon: ${err.message}`;
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

function show(signedIn) {
  $("login").hidden = signedIn;
  $("dashboard").hidden = !signedIn;
  $("logout").hidden = !signedIn;
}

function signOut(reason = "") {
  clearTimeout(timer);
  closeTerminal();
  token.clear();
  show(false);
  $("login-error").textContent = reason;
  $("status").textContent = "";
}

async function signIn(event) {
  event.preventDefault();
  const value = $("token").value.trim();
  token.set(value);
  try {
    await api("GET", "/version");
  } catch (err) {
    return signOut(err instanceof ApiError && err.status === 401 ? "wrong token" : err.message);
  }
  $("token").value = "";
  $("login-error").textContent = "";
  show(true);
  await refresh();
}

$("login-form").addEventListener("submit", signIn);
$("logout").addEventListener("click", () => signOut());
$("terminal-close").addEventListener("click", () => closeTerminal());
$("cell-close").addEventListener("click", () => closeCell());
$("cell-form").addEventListener("submit", (event) => { event.preventDefault(); runCell(); });
show(Boolean(token.get()));
refresh();
