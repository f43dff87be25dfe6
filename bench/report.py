#!/usr/bin/env python3
"""Regenerate docs/PERFORMANCE.md and its charts (docs/perf/*.png) from bench/results/.

Reads whatever results exist (fanout, density, capacity, latency, control_plane, branch,
fork_running, travel, network_setup, run); a missing one leaves its section saying how to produce it.
Every section states when, on what host and under what load its figures were
taken, and what bounds them.

Usage: .venv/bin/python bench/report.py [--results bench/results] [--doc docs/PERFORMANCE.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any, TypeGuard

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parent.parent
FLOOR = 'python3 -c "import numpy"'
Result = dict[str, Any]


def load(results: Path, name: str) -> Result | None:
    path = results / f"{name}.json"
    try:
        data: Result = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data


def when(r: Result) -> str:
    stamp = r.get("measured_at_unix")
    if not stamp:
        return "unknown date"
    return datetime.datetime.fromtimestamp(stamp, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def load_note(r: Result) -> str:
    host = r.get("host") or {}
    start = host.get("loadavg", "?")
    end = (r.get("host_end") or {}).get("loadavg", "?")
    others = host.get("other_qemu")
    extra = f"; {others} QEMU processes already running" if others else ""
    return f"measured {when(r)}; load average {start} at the start, {end} at the end{extra}"


def ms(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x * 1000:.{digits}f} ms"


def sec(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"


def measured_by(script: str, r: Result) -> str:
    """Where a section's figures come from, when, and under what load."""
    start = (r.get("host") or {}).get("loadavg", "?")
    end = (r.get("host_end") or {}).get("loadavg", "?")
    return (f"`bench/{script}.py` → `bench/results/{script}.json` (measured {when(r)}; load average "
            f"{start} at the start, {end} at the end)")


class Doc:
    def __init__(self, charts: Path) -> None:
        self.lines: list[str] = []
        self.charts = charts
        charts.mkdir(parents=True, exist_ok=True)

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def section(self, result: Result | None, title: str, script: str, *,
                run: str = ".venv/bin/python") -> TypeGuard[Result]:
        """The section's heading; False, after saying how to measure it, when ``result`` is missing."""
        self.add(title, "")
        if result is None:
            root = " (needs root)" if run.startswith("sudo") else ""
            self.add(f"Not measured yet: `{run} bench/{script}.py`{root}.", "")
            return False
        return True

    def table(self, *columns: str) -> None:
        """A table's header: the first column text, the others numbers (right-aligned)."""
        self.add("| " + " | ".join(columns) + " |", "|---|" + "---:|" * (len(columns) - 1))

    def chart(self, fig: Any, name: str, alt: str) -> None:
        path = self.charts / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        self.add("", f"![{alt}]({self.charts.name}/{name})", "")


# ---------------------------------------------------------------- sections


def host_section(doc: Doc, rs: dict[str, Result | None]) -> None:
    host = next((r["host"] for r in rs.values() if r and "host" in r), None)
    doc.add("## The host", "")
    if host is None:
        doc.add("No results yet: run `make bench`.", "")
        return
    doc.add("| fact | value |", "|---|---|")
    for key, label in (("cores", "CPU cores"), ("cpu_model", "CPU"), ("mem_total_mib", "memory (MiB)"),
                       ("dev_kvm", "/dev/kvm"), ("gpu", "accelerator card"), ("kernel", "host kernel"),
                       ("qemu", "QEMU"), ("python", "Python (daemon)")):
        doc.add(f"| {label} | {host.get(key, '?')} |")
    fan = rs.get("fanout")
    if fan and fan.get("guest"):
        g = fan["guest"]
        doc.add(f"| guest accelerator | {g['accel']} (a `/dev/kvm` here is PVM and cannot run the guest; "
                "see [FIELD-NOTES](FIELD-NOTES.md)) |",
                f"| guest | {g['mem_mib']} MiB, 1 vCPU, numpy {g['numpy']}, `-machine {g.get('machine')}` |")
    doc.add("", "**Load matters**: each section gives the host's load average at its start and end (the "
            "parts themselves load it; a start near 1 or below means nothing else ran). Under TCG every "
            "figure that involves guest CPU work is bound by the host's 2 cores; on a machine shared with "
            "other runs, single outliers of 2-4x are host noise, not the code path. Regenerate on a quiet "
            "machine (`make bench`) before quoting a figure.", "")


def targets_section(doc: Doc, rs: dict[str, Result | None]) -> None:
    fan, den, lat = rs.get("fanout"), rs.get("density"), rs.get("latency")

    def fanout(way: str, n: int) -> float | None:
        cell = ((fan or {}).get("ways") or {}).get(way, {}).get(str(n))
        return None if cell is None or cell.get("estimated") else cell["p50"]

    def knob(name: str) -> float | None:
        m = ((den or {}).get("knobs") or {}).get(name)
        return None if m is None else m["idle_cpu_ms_per_s_per_child"]

    def pss(n: int) -> float | None:
        for b in (den or {}).get("batches", []):
            if b["children"] == n:
                return float(b["pss_mib_per_child"])
        return None

    def eval_p50(path: str) -> float | None:
        cell = ((lat or {}).get(path) or {}).get("eval 1+1")
        return None if cell is None else float(cell["p50_ms"])

    pooled1, cold1 = fanout("pooled", 1), fanout("cold boot", 1)
    single = (fan or {}).get("single_child") or {}
    tbs = (single.get("jit") or {}).get("tbs", 0)
    qemu_ms = single.get("qemu_cpu_ms") or 0
    ratio = f"{cold1 / pooled1:.0f}x" if pooled1 and cold1 else "-"
    rows = [
        ("pooled: 100 children all answering, pool full", "≤ 1.5 s", fanout("pooled", 100), 1.5, sec,
         "host CPU: 100 QEMUs resumed at once each spend ~15-20 ms answering the claim's post-restore "
         "call (~5 ms for one claim alone: 100 vCPU and I/O threads waking on 2 cores) plus their first "
         "ping, and the daemon's own work per child (QMP cont, the call, the registry row) shares the "
         "same 2 cores"),
        ("pooled: one child answering", f"≤ 30 ms, ≥ 200x sooner than a cold boot (here {ratio})",
         pooled1, 0.030, sec, "QMP cont and one agent call; see the latency section"),
        ("unpooled: one child", "≤ 0.12 s", fanout("unpooled", 1), 0.12, sec,
         f"the guest's first request in a new QEMU: TCG translates every code path it runs "
         f"(~{tbs:,} translation blocks, ~{qemu_ms:.0f} ms of QEMU CPU; see *Where a fork's time goes*)"),
        ("unpooled: 50 children", "≤ 6 s", fanout("unpooled", 50), 6.0, sec,
         f"50 x the single child's ~{qemu_ms:.0f} ms of QEMU CPU on 2 cores, plus the daemon's work per "
         "child and the first seconds of the children already running"),
        ("idle claimed child", "≤ 3 ms CPU per second", knob("running (default)"), 3.0,
         lambda v: "-" if v is None else f"{v:.2f} ms/s", "guest timer ticks left after the idle options"),
        ("pooled member", "≈ 0 CPU", knob("warm pool members (paused)"), 0.2,
         lambda v: "-" if v is None else f"{v:.2f} ms/s", "paused: QEMU's main loop only"),
        ("warm eval round trip, in-process", "p50 ≤ 2 ms", eval_p50("in_process"), 2.0,
         lambda v: "-" if v is None else f"{v:.2f} ms",
         "the agent's serve loop, JSON and the virtio-serial hop, each a few hundred µs of emulated "
         "guest code under TCG (issue 8 item 4)"),
        ("warm eval round trip, HTTP", "p50 ≤ 4 ms", eval_p50("over_http"), 4.0,
         lambda v: "-" if v is None else f"{v:.2f} ms", "the in-process figure plus uvicorn, auth and JSON"),
        ("PSS per child at N = 50", "≤ 30 MiB", pss(50), 30.0,
         lambda v: "-" if v is None else f"{v:.1f} MiB",
         "per-QEMU private memory: TCG's code buffer (~10-12 MiB of translated guest code), QEMU's heap "
         "(~5 MiB), relocated library data (~4 MiB), guest pages written since the restore (~3 MiB)"),
    ]
    doc.add("## Targets (issue 8) and where they stand", "",
            "Measured by this run, side by side; never asserted in tests. *bound* says what limits a figure "
            "where the target is missed.", "",
            "| what | target | measured (p50) | met | bound |", "|---|---|---:|:---:|---|")
    for what, target, value, limit, fmt, bound in rows:
        met = "-" if value is None else ("yes" if value <= limit else "no")
        if what.startswith("pooled: one") and value is not None and pooled1 and cold1:
            met = "yes" if value <= limit and cold1 / pooled1 >= 200 else "no"
        doc.add(f"| {what} | {target} | {fmt(value)} | {met} | {bound if met == 'no' else ''} |")
    doc.add("")


def fanout_section(doc: Doc, fan: Result | None) -> None:
    if not doc.section(fan, "## Fan-out: N children, each answering a ping", "fanout"):
        return
    doc.add(f"`bench/fanout.py` → `bench/results/fanout.json` ({load_note(fan)}). From the request "
            "until every child has answered a ping:", "",
            "- **unpooled**: `POST /v1/sandboxes` with `n` = N, each child restored from the snapshot;",
            "- **pooled**: the same, with a full warm pool of N (claimed, resumed, reseeded);",
            f"- **cold boot**: the image booted N times, at most {fan['host']['cores']} at once (one per "
            "core), each until its agent answered with numpy imported;",
            f"- **floor**: N host processes of `{fan.get('floor_command') or FLOOR}` "
            "started at once, no sandbox at all.", "")
    ways = fan["ways"]
    sizes = fan["sizes"]
    doc.add("| N | " + " | ".join(ways) + " |", "|---:|" + "---:|" * len(ways))
    for n in sizes:
        cells = []
        for w in ways:
            c = ways[w].get(str(n))
            if c is None:
                cells.append("-")
            elif c.get("estimated"):
                cells.append(f"~{sec(c['p50'])} (estimated from N={c['from_n']})")
            else:
                cells.append(sec(c["p50"]) + (f" (n={c['n']})" if c.get("n", 1) > 1 else ""))
        doc.add(f"| {n} | " + " | ".join(cells) + " |")
    doc.add("", "p50 over the runs shown (n); N > 10 ran once. Estimated cold boots: the measured time per "
            "boot, times N over the cores (boots are CPU-bound and independent).")
    fig, ax = plt.subplots(figsize=(7, 4))
    for w, style in zip(ways, ("o-", "s-", "^--", "d:"), strict=False):
        xs = [n for n in sizes if str(n) in ways[w]]
        ax.plot(xs, [ways[w][str(n)]["p50"] for n in xs], style, label=w)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("children (N)")
    ax.set_ylabel("seconds until every child answered")
    ax.set_title("Fan-out, TCG, 2 cores")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    doc.chart(fig, "fanout.png", "fan-out time by N, four ways")


def restore_section(doc: Doc, fan: Result | None) -> None:
    doc.add("## Where a fork's time goes", "")
    if fan is None or "single_child" not in fan:
        doc.add("Not measured yet: `.venv/bin/python bench/fanout.py`.", "")
        return
    one = fan["single_child"]
    ph = one["phases_s"]
    steps = one.get("guest_steps_us") or {}
    jit = one.get("jit") or {}
    doc.add(f"One child at a time, 5 runs, the median run's phases (seconds from the start of its restore, "
            f"the same figures as its SandboxInfo `timings`; {load_note(fan)}):", "",
            "| phase | at |", "|---|---:|")
    for key, label in (("qemu_up_s", "QEMU up, QMP connected"), ("restored_s", "device state loaded"),
                       ("running_s", "guest running"), ("ready_s", "agent answered the post-restore call")):
        if key in ph:
            doc.add(f"| {label} | {ms(ph[key])} |")
    doc.add("", f"QEMU CPU time per child until it answered: {one['qemu_cpu_ms']:.0f} ms. "
            + (f"TCG translated {jit['tbs']:,} blocks of guest code for it ({jit['code_kib']:,} KiB of host "
               "code) by then. " if jit else "")
            + f"Inside the guest, the post-restore call itself took {ms(ph.get('guest_hook_s'))}, per step "
            "(its own clock; first run of each path in this QEMU):", "",
            "| step | µs |", "|---|---:|")
    for k, v in steps.items():
        doc.add(f"| {k} | {v:,} |")
    doc.add("", "The rest of the time to `ready` is the guest's first request as such: the kernel's "
            "virtio-console and scheduler paths, CPython's read loop, the agent's dispatch to a worker "
            "thread, JSON, the reply. Each runs for the first time in this QEMU process, so TCG "
            "translates it first; the translation, not the work, is what costs (a second call of the "
            "same kind takes 1-3 ms).", "")
    labels = [("qemu_up_s", "QEMU up"), ("restored_s", "state loaded"), ("running_s", "running"),
              ("ready_s", "post-restore answered")]
    fig, ax = plt.subplots(figsize=(7, 1.9))
    prev = 0.0
    for key, label in labels:
        if key in ph and ph[key] >= prev:
            ax.barh([0], [ph[key] - prev], left=prev, label=label)
            prev = ph[key]
    ax.set_yticks([])
    ax.set_xlabel("seconds from the start of the restore")
    ax.legend(ncol=4, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.45))
    ax.set_title("One unpooled fork, phase by phase")
    doc.chart(fig, "restore.png", "restore phases of one child")


def density_section(doc: Doc, den: Result | None, cap: Result | None) -> None:
    if doc.section(den, "## Density: idle children", "density"):
        doc.add(f"`bench/density.py` → `bench/results/density.json` ({load_note(den)}). N children spawned "
                f"at once, left {den['settle_s']:.0f} s to settle, then measured idle; CPU over "
                f"{den['window_s']:.0f} s.", "",
                "| N | PSS / child | of it anonymous | RSS / child | host MemAvailable drop / child "
                "| idle CPU / child | all N, share of the host's CPU |",
                "|---:|---:|---:|---:|---:|---:|---:|")
        for b in den["batches"]:
            doc.add(f"| {b['children']} | {b['pss_mib_per_child']} MiB | {b['pss_anon_mib_per_child']} MiB "
                    f"| {b['rss_mib_per_child']} MiB | {b['mem_available_drop_mib_per_child']} MiB "
                    f"| {b['idle_cpu_ms_per_s_per_child']:.2f} ms/s "
                    f"| {b['host_cpu_share_of_all_children'] * 100:.2f} % |")
        doc.add("", "PSS splits each page shared by several QEMUs between them (the snapshot's memory, "
                "QEMU's own code), so it is what a child really adds; RSS counts shared pages in full. "
                "The MemAvailable drop is the host-wide view, and on a shared machine other users' "
                "allocations move it (it can even come out negative): trust PSS.", "")
        knobs = den.get("knobs") or {}
        if knobs:
            n = next(iter(knobs.values()))["children"]
            doc.add(f"The knobs, at N = {n}:", "", "| children | idle CPU / child | PSS / child |",
                    "|---|---:|---:|")
            for name, m in knobs.items():
                doc.add(f"| {name} | {m['idle_cpu_ms_per_s_per_child']:.2f} ms/s "
                        f"| {m['pss_mib_per_child']} MiB |")
            doc.add("", "*legacy guest* is a template made the way forkd made them before this change "
                    "(the PIT left on, none of the idle kernel options), measured in the same run.", "")
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
        ns = [str(b["children"]) for b in den["batches"]]
        a1.bar([f"N={x}" for x in ns], [b["pss_mib_per_child"] for b in den["batches"]], label="PSS")
        a1.bar([f"N={x}" for x in ns], [b["rss_mib_per_child"] for b in den["batches"]], alpha=0.35,
               label="RSS")
        a1.set_ylabel("MiB per child")
        a1.set_title("Memory per idle child")
        a1.legend()
        if knobs:
            names = [k.split(" (")[0] for k in knobs]
            a2.barh(names, [m["idle_cpu_ms_per_s_per_child"] for m in knobs.values()])
            a2.set_xlabel("QEMU CPU ms per second, per child")
            a2.set_title("Idle CPU per child")
        doc.chart(fig, "density.png", "memory and idle CPU per child")
    doc.add("### How many children this host holds", "")
    if cap is None:
        doc.add("Not measured in this run: the probe is opt-in (`make bench-capacity`, or "
                "`.venv/bin/python bench/density.py --capacity`; bounded by `--capacity-minutes`, "
                "default 10, and stops while the host keeps `--reserve-mib` of MemAvailable).", "")
        return
    doc.add(f"`bench/density.py --capacity` → `bench/results/capacity.json` ({load_note(cap)}): "
            f"batches of {cap['batch']} children until 1000, a failure, or MemAvailable under "
            f"{cap['reserve_mib']:.0f} MiB.", "",
            f"**{cap['children']} children** ran at once ({cap.get('answering', '?')} answered a ping at "
            f"the end); the probe stopped on: **{cap['stopped_by']}**. The daemon's file-descriptor "
            f"limit was {cap['fd_limit']} (hard {cap['fd_limit_hard']}).", "")
    steps = cap.get("steps") or []
    if len(steps) >= 2:
        first, last = steps[0], steps[-1]
        per_child = (first["mem_available_mib"] - last["mem_available_mib"]) / max(
            1, last["children"] - first["children"])
        fds = (last["daemon_fds"] - first["daemon_fds"]) / max(1, last["children"] - first["children"])
        if per_child > 0:
            most = last["children"] + int((last["mem_available_mib"] - 1024) / per_child)
            idle = (den or {}).get("batches", [{}])[-1].get("idle_cpu_ms_per_s_per_child")
            cpu = f"; idle, that many would take ~{most * idle / 10:.0f} % of one core" if idle else ""
            doc.add(f"Each child took ~{per_child:.0f} MiB of the host's MemAvailable and {fds:.1f} of the "
                    f"runtime's file descriptors. At that rate **memory runs out first**: ~{most} children "
                    f"would leave the host 1 GiB{cpu}; the descriptors they need (~{int(most * fds)}) are "
                    "far below the limit, which the runtime raises to the hard limit at start (a soft "
                    "limit of 1024 would have stopped it near 500).", "")
    if steps:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.plot([s["children"] for s in steps], [s["mem_available_mib"] for s in steps], "o-",
                label="MemAvailable")
        ax.set_xlabel("children running")
        ax.set_ylabel("host MemAvailable (MiB)")
        ax2 = ax.twinx()
        ax2.plot([s["children"] for s in steps], [s["daemon_fds"] for s in steps], "s--", color="tab:red",
                 label="daemon fds")
        ax2.set_ylabel("daemon's open fds")
        ax.set_title("Capacity probe")
        ax.grid(True, alpha=0.3)
        doc.chart(fig, "capacity.png", "memory and fds as children are added")


def hibernation_section(doc: Doc, hib: Result | None, scale: Result | None) -> None:
    if doc.section(hib, "## Hibernation: idle sandboxes to disk", "hibernate"):
        doc.add(f"`bench/hibernate.py` → `bench/results/hibernate.json` ({load_note(hib)}). "
                f"{hib.get('n')} children of a numpy "
                "template, each after a small eval, hibernated one at a time (memory that differs from the "
                "snapshot's and the device state to disk, zstd-compressed; QEMU, cgroup and namespace "
                "released), "
                "then woken by an eval that reads its earlier state.", "")
        doc.table("what", "p50", "p99", "max")
        for key, label, unit in (("pause_ms", "pause (the guest stopped)", "ms"),
                                 ("hibernate_call_ms", "hibernate call", "ms"),
                                 ("wake_ready_ms", "wake: QEMU restored and the agent answering", "ms"),
                                 ("wake_to_first_answer_ms", "wake to the eval's answer", "ms"),
                                 ("disk_mib_per_sandbox", "disk per hibernated sandbox", "MiB"),
                                 ("changed_pages", "pages saved (differing from the snapshot)", "")):
            r = hib.get(key)
            if r:
                doc.add(f"| {label} | {r['p50']} {unit} | {r['p99']} {unit} | {r['max']} {unit} |")
        doc.add("")
    if not doc.section(scale, "### Thousands held at once (`make bench-capacity HIBERNATE_N=10000`)",
                       "hibernate_scale"):
        return
    last = scale["points"][-1]
    wake = scale.get("wake_to_first_answer_ms") or {}
    page = scale.get("list_page_ms") or {}
    doc.add(f"`bench/hibernate_scale.py` → `bench/results/hibernate_scale.json` ({load_note(scale)}). "
            f"{scale['n']} sandboxes made "
            f"from one numpy template, each with its own state (an eval), all but the last "
            f"{scale['running']} hibernated: {scale['states']} after {last['seconds']:.0f} s. Every one was "
            f"listed; a page of 100 took {page.get('p50')} ms (p50). {scale['sample']} hibernated ones "
            f"chosen at random were woken, each by an eval that reads its own earlier state: "
            f"p50 {wake.get('p50')} ms, p99 {wake.get('p99')} ms to the answer.", "",
            f"Host memory used: {scale['before']['memory_used_mib']:.0f} MiB before, "
            f"{last['memory_used_mib']:.0f} MiB with all of them held. Disk: "
            f"{scale['disk_mib_per_sandbox']} MiB per sandbox (the data dir's sandboxes, allocated "
            "blocks).", "")
    points = scale["points"]
    held = [p["held"] for p in points]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(held, [p["memory_used_mib"] for p in points], marker="o", label="host memory used (MiB)")
    ax.plot(held, [p["disk_mib"] for p in points], marker="s", label="sandboxes on disk (MiB)")
    ax.set_xlabel(f"sandboxes held (all but the last {scale['running']} hibernated)")
    ax.set_ylabel("MiB")
    ax.set_title("Hibernated sandboxes held at once")
    ax.grid(True, alpha=0.3)
    ax.legend()
    doc.chart(fig, "hibernate_scale.png", "memory and disk against sandboxes held")


def control_plane_section(doc: Doc, cp: Result | None) -> None:
    if not doc.section(cp, "## Control plane: many clients at once", "control_plane"):
        return
    doc.add(f"{measured_by('control_plane', cp)}. `wrk -t2 -c{cp.get('connections')} -d{cp.get('seconds')}s` "
            f"against a real `forkd daemon`, each request sent round-robin to {cp.get('children')} children. "
            "The daemon's CPU is its process's user + system time over the run, divided by the requests "
            "wrk completed.", "")
    by_daemon = cp.get("by_daemon") or cp.get("by_parser") or {"": cp}
    doc.table("daemon", "call", "req/s", "p50", "p99", "daemon CPU per request", "daemon cores")
    for parser, figures in by_daemon.items():
        for name in ("eval", "ping"):
            r = figures.get(name)
            if r:
                doc.add(f"| {parser or '?'} | {name} | {r['req_per_s']:.0f} | {r['p50_ms']:.1f} ms | "
                        f"{r['p99_ms']:.1f} ms | {r['daemon_cpu_ms_per_request']:.2f} ms | "
                        f"{r['daemon_cores']:.2f} |")
    one_client = ", ".join(f"{figures.get('one_client_eval_p50_ms')} ms ({parser or '?'})"
                           for parser, figures in by_daemon.items())
    doc.add("", f"One client's sequential `eval` p50: {one_client}.", "",
            "`httptools` is the daemon's default: the C HTTP parser, with plain JSON routes served "
            "by the fast path (api/fast_path.py). `:no-fast-path` is the same daemon with "
            "`--no-fast-path`, every request through FastAPI's routing; `h11` is the pure-Python "
            "parser (`--http-parser h11`).", "")


def control_plane_rows_section(doc: Doc, cpr: Result | None) -> None:
    if not doc.section(cpr, "### Control plane with thousands of sandbox rows", "control_plane_rows"):
        return
    doc.add(f"{measured_by('control_plane_rows', cpr)}; host load {(cpr.get('host') or {}).get('loadavg')} "
            f"at the start. A real `forkd daemon` over a data dir holding {cpr.get('rows')} hibernated "
            "sandboxes. The rows are **synthetic**: written with the registry's own API, each with a run "
            "directory, but no VM behind any (hibernating that many real ones takes hours here), so this "
            "is the daemon's own work per row, not a wake (see bench/hibernate.py for that).", "")
    doc.table("", "first start", "restart")
    rows = [("serving after start", "serving_after_start_s", None, "s"),
            ("`GET /v1/sandboxes?limit=100` p50", "list_first_page_ms", "p50", "ms"),
            ("… a page from the middle (`after=`) p50", "list_middle_page_ms", "p50", "ms"),
            ("… first page p99", "list_first_page_ms", "p99", "ms"),
            ("`GET /v1/sandboxes` (every row)", "list_all_ms", None, "ms"),
            ("`GET /v1/sandboxes/{id}` p50", "get_ms", "p50", "ms"),
            ("`GET /metrics` p50", "metrics_ms", "p50", "ms")]
    for label, key, stat, unit in rows:
        cells = []
        for run in ("start", "restart"):
            value = (cpr.get(run) or {}).get(key)
            cells.append("?" if value is None else f"{value[stat] if stat else value} {unit}")
        doc.add(f"| {label} | {cells[0]} | {cells[1]} |")
    doc.add("")


def latency_section(doc: Doc, lat: Result | None) -> None:
    if not doc.section(lat, "## Latency: a warm child's round trip", "latency"):
        return
    doc.add(f"{measured_by('latency', lat)}. One warm child, {lat.get('samples')} calls of each after "
            f"{lat.get('warmup')} unmeasured ones: in-process "
            "through the Runtime, and over HTTP to a real `forkd daemon` (one keep-alive connection, "
            "bearer token) on the very same VM. `exec python3 -c` starts a new interpreter in the guest, "
            "which is what `eval` avoids.", "")
    doc.table("call", "in-process p50", "p99", "HTTP p50", "p99")
    paths = {"in-process": lat.get("in_process") or {}, "HTTP": lat.get("over_http") or {}}
    ops = list(paths["in-process"] or paths["HTTP"])
    for op in ops:
        cells = []
        for path in paths.values():
            c = path.get(op)
            cells += [f"{c['p50_ms']:.2f} ms", f"{c['p99_ms']:.2f} ms"] if c else ["-", "-"]
        doc.add(f"| {op} | " + " | ".join(cells) + " |")
    doc.add("")
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.2
    series = (("in-process", "p50_ms"), ("in-process", "p99_ms"), ("HTTP", "p50_ms"), ("HTTP", "p99_ms"))
    for i, (path, q) in enumerate(series):
        vals = [paths[path].get(op, {}).get(q, 0) for op in ops]
        ax.bar([x + (i - 1.5) * width for x in range(len(ops))], vals, width,
               label=f"{path} {q.removesuffix('_ms')}")
    ax.set_xticks(range(len(ops)))
    ax.set_xticklabels(ops, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ms")
    ax.set_title("Round trip to a warm child")
    ax.legend(fontsize=8)
    doc.chart(fig, "latency.png", "round-trip latency by call")


def network_section(doc: Doc, net: Result | None) -> None:
    if not doc.section(net, "## A sandbox's network", "network_setup", run="sudo .venv/bin/python"):
        return
    doc.add(f"`bench/network_setup.py` → `bench/results/network_setup.json` (measured {when(net)}), as root. "
            "First the network alone, without VMs: making and removing each child's namespace, tap, veth "
            "pair, addresses, route and nftables table, one at a time and as many at once as a spawn "
            "restores:", "",
            "| policy | at once | set-up p50 / p95 | teardown p50 | wall time per child |",
            "|---|---:|---|---:|---:|")
    for row in net.get("setup_alone", []):
        doc.add(f"| {row['policy']} | {row['parallel']} | {row['setup']['p50_ms']:.1f} / "
                f"{row['setup']['p95_ms']:.1f} ms | {row['teardown']['p50_ms']:.1f} ms "
                f"| {row['setup_per_child_wall_ms']:.1f} ms |")
    forks = [f for f in net.get("forks") or [] if "spawn" in f]
    diff = next((f for f in net.get("forks") or [] if f.get("snapshot") == "difference"), None)
    if forks:
        doc.add("", "What a NIC adds to a fork (`spawn(n=1)` from a snapshot without and with a NIC):", "",
                "| snapshot | spawn p50 | of which the restore (`ready_s`) p50 |", "|---|---:|---:|")
        for f in forks:
            doc.add(f"| {'NIC' if f['nic'] else 'no NIC'} | {f['spawn']['p50_ms']:.0f} ms "
                    f"| {f['restore_ready']['p50_ms']:.0f} ms |")
        if diff:
            doc.add("", f"A NIC adds ~{diff['spawn_p50_added_ms']:.0f} ms to a fork here, "
                    f"~{diff['outside_restore_p50_added_ms']:.0f} ms of it outside the restore (the network "
                    "set-up above); the rest is QEMU's virtio-net device and the guest's network stack "
                    "under TCG.")
    rows = net.get("setup_alone", [])
    if rows:
        fig, ax = plt.subplots(figsize=(7, 3.2))
        labels = [f"{r['policy']}\n{r['parallel']} at once" for r in rows]
        ax.bar(labels, [r["setup"]["p50_ms"] for r in rows], label="set-up p50")
        ax.bar(labels, [r["teardown"]["p50_ms"] for r in rows], alpha=0.4, label="teardown p50")
        ax.set_ylabel("ms per child")
        ax.set_title("Per-child network set-up")
        ax.legend(fontsize=8)
        plt.setp(ax.get_xticklabels(), fontsize=7)
        doc.chart(fig, "network.png", "per-child network set-up")


def branch_section(doc: Doc, br: Result | None, fr: Result | None) -> None:
    if doc.section(br, "## BRANCH of a running sandbox", "branch"):
        env = br["environment"]
        doc.add(f"`bench/branch.py` → `bench/results/branch.json` (measured {env.get('date_utc')}; load "
                f"average {env.get('loadavg_start')} at the start, {env.get('loadavg_end')} at the end). One "
                "source per cell, dirtied with random bytes, branched repeatedly: `pause_ms` is the source's "
                "pause window as the runtime measures it; for `live`, *FIFREEZE* is how long the source's "
                "root filesystem was frozen around the disk cut (its CPU work went on, its disk writes "
                "waited); *total* is the whole synchronous branch including the conversion into a forkable "
                "snapshot.", "",
                "| mode | guest RAM | dirtied | pause p50 | pause p90 | FIFREEZE p50 | total p50 |",
                "|---|---:|---:|---:|---:|---:|---:|")
        for c in br["cells"]:
            fz = c.get("fs_freeze_ms")
            freeze = f"{fz['p50']:.1f} ms" if fz else "-"
            doc.add(f"| {c['mode']} | {c['mem_mib']} MiB | {c['dirty_mib']} MiB "
                    f"| {c['pause_ms']['p50']:.1f} ms | {c['pause_ms']['p90']:.1f} ms | {freeze} "
                    f"| {c['total_s']['p50']:.2f} s |")
        series = br.get("consecutive") or []
        if series:
            doc.add("", "Consecutive branches of one source, `pause_ms` of each (they do not compound):", "",
                    "| mode | " + " | ".join(f"#{i + 1}" for i in range(len(series[0]["branches"]))) + " |",
                    "|---|" + "---:|" * len(series[0]["branches"]))
            for s in series:
                pauses = " | ".join(f"{b['pause_ms']:.1f}" for b in s["branches"])
                doc.add(f"| {s['mode']} | {pauses} |")
        doc.add("", "Why each mode pauses as it does, and what the pause includes: "
                "[BRANCHING.md](BRANCHING.md#what-pause_ms-measures).")
        fig, ax = plt.subplots(figsize=(7, 3.6))
        cells = [c for c in br["cells"] if c["dirty_mib"] == min(x["dirty_mib"] for x in br["cells"]
                                                                 if x["mode"] == c["mode"])]
        labels = [f"{c['mode']}\n{c['mem_mib']} MiB" for c in cells]
        ax.bar(labels, [c["pause_ms"]["p50"] for c in cells], label="pause p50")
        fz = [(c.get("fs_freeze_ms") or {}).get("p50", 0) for c in cells]
        if any(fz):
            ax.bar(labels, fz, alpha=0.4, label="FIFREEZE p50 (live)")
        ax.set_yscale("log")
        ax.set_ylabel("ms")
        ax.set_title("BRANCH pause by mode (least dirtied)")
        ax.legend(fontsize=8)
        plt.setp(ax.get_xticklabels(), fontsize=7)
        doc.chart(fig, "branch.png", "branch pause by mode")
    if not doc.section(fr, "### Fork of a running sandbox", "fork_running"):
        return
    doc.add(f"`bench/fork_running.py` → `bench/results/fork_running.json` (measured {when(fr)}): a source "
            "holding 64 MiB of state and a ticking thread, forked into 1 and 10 children; until every child "
            "answered.", "", "| method | children | source pause p50 | until every child answers, p50 |",
            "|---|---:|---:|---:|")
    for row in fr["rows"]:
        pause = row.get("pause_ms_p50")
        doc.add(f"| {row['method']} | {row['count']} | {f'{pause:.1f} ms' if pause else '-'} "
                f"| {row['all_answer_s_p50']:.2f} s |")
    fig, ax = plt.subplots(figsize=(7, 3.4))
    counts = sorted({r["count"] for r in fr["rows"]})
    methods = list(dict.fromkeys(r["method"] for r in fr["rows"]))
    width = 0.8 / max(1, len(counts))
    for i, count in enumerate(counts):
        vals = [next((r["all_answer_s_p50"] for r in fr["rows"]
                      if r["method"] == m and r["count"] == count), 0) for m in methods]
        ax.bar([x + (i - (len(counts) - 1) / 2) * width for x in range(len(methods))], vals, width,
               label=f"{count} children")
    ax.set_xticks(range(len(methods)))
    ax.set_xticklabels(methods, fontsize=8)
    ax.set_ylabel("seconds until every child answered")
    ax.set_title("Fork of a running sandbox")
    ax.legend()
    doc.chart(fig, "fork_running.png", "fork of a running sandbox")


def travel_section(doc: Doc, tr: Result | None) -> None:
    if not doc.section(tr, "## Snapshots that travel", "travel"):
        return
    doc.add(f"`bench/travel.py` → `bench/results/travel.json` (measured {tr.get('when', '?')}): a "
            f"{tr['mem_mib']} MiB template and {tr['depth']} diff branches on top of it (each branch's "
            f"`mem`: {tr['mem_logical_mib']} MiB logical, {tr['mem_data_mib']} MiB of data), moto's S3 "
            "server on loopback, so the figures are this host's CPU, disk and loopback HTTP, not a "
            "network.", "")
    if tr.get("load_avg_1min_at_end") is not None:
        doc.add(f"Load average (1 min) at the end of the run: {tr['load_avg_1min_at_end']} on "
                f"{tr.get('cpus', '?')} cores: other work shares this host, so the figures are noisy.", "")
    if tr.get("accel_probe_s") is not None:
        doc.add(f"This host's accelerator was probed once first ({sec(tr['accel_probe_s'])}); every fresh "
                "data dir of the run starts with that result, as on a host that ran forkd before.", "")
    before: Result = tr.get("baseline") or {}
    if before:
        rev = before.get("rev", "?")
        doc.add(f"The same run first measured the code before the chunked format (format 1, revision "
                f"`{rev}`), side by side (`bench/travel.py --baseline {rev}`):", "",
                f"| step | before ({rev}) | now | bytes (now) |", "|---|---:|---:|---|")
    else:
        doc.add("| step | time | bytes |", "|---|---:|---|")
    rows = [
        ("pack the newest branch with its chain and base image", "pack_s",
         f"{tr['archive_mib']} MiB archive; {tr['pack_read_mib']} MiB read (data extents only)"),
        ("unpack into a fresh data dir", "unpack_s", f"{tr.get('unpack_mib_per_s', '-')} MiB/s of archive"),
        ("push into an empty store", "push_s", f"{tr['push_mib']} MiB uploaded"),
        ("push the same chain again", "push_again_s",
         f"{tr['push_again_blobs']} blobs uploaded (content-addressed)"),
        ("pull into a fresh data dir", "pull_s",
         f"{tr['pull_mib']} MiB downloaded, {tr.get('pull_mib_per_s', '-')} MiB/s"),
        ("spawn of a tag only in the store, until it answers", "spawn_from_store_s",
         # Code with the lazy path spawns lazily where FUSE serves (the bench says when it did not).
         "the small parts, then the fork, its memory arriving lazily" if "lazy_to_answer_s" in tr
         else "the pull, then the fork"),
        ("the next spawn of it there", "spawn_after_s", ""),
    ]
    if tr.get("lazy_to_answer_s") is not None:  # each in a fresh data dir, until an eval reads memory
        here = (f", holding {tr['lazy_chunks_here_before_answer']} of them"
                if tr.get("lazy_chunks_here_before_answer") is not None else "")
        rows += [
            ("eager: pull, spawn, until `int(arr.sum())` answers", "eager_to_answer_s",
             f"{tr['eager_fetched_mib']} MiB fetched before the answer"),
            ("lazy: spawn, until `int(arr.sum())` answers", "lazy_to_answer_s",
             f"{tr['lazy_fetched_mib']} MiB fetched before the answer "
             f"(of {tr['lazy_total_fetched_mib']} MiB; "
             f"{tr['lazy_chunks_fetched_before_answer']} GETs of the {tr['lazy_chunks']} chunks of the tag's "
             f"`mem`{here}); the whole chain's memory was here "
             f"{sec(tr['lazy_complete_after_answer_s'])} later"),
            ("local: the next spawn there, until `int(arr.sum())` answers", "local_to_answer_s",
             "nothing fetched"),
        ]
    for what, key, size in rows:
        if before:
            doc.add(f"| {what} | {sec(before.get(key))} | {sec(tr[key])} | {size} |")
        else:
            doc.add(f"| {what} | {sec(tr[key])} | {size} |")
    if before:
        doc.add("", f"Before: a {before.get('archive_mib')} MiB archive, unpacked at "
                f"{before.get('unpack_mib_per_s', '-')} MiB/s and pulled at "
                f"{before.get('pull_mib_per_s', '-')} MiB/s.")
    doc.add("", "Measured here: this host's CPU and disk, and loopback HTTP to moto's S3 server running in "
            "the benchmark's own process (it competes for the same 2 cores, and reads the whole object "
            "for every range GET, which S3 and MinIO do not). Not measured: a real network. There a "
            "pull should be bound by the link rather than by these steps (inferred, not measured: each "
            "blob comes down as up to 4 concurrent range GETs, 3 blobs at a time), and a pull of a "
            "snapshot whose base image and ancestors the host has moves only the new snapshot's "
            "chunks.")
    fig, ax = plt.subplots(figsize=(7, 3.2))
    labels = [r[0] for r in rows][::-1]
    if before:
        ys = range(len(labels))
        ax.barh([y + 0.2 for y in ys], [before.get(r[1]) or 0 for r in rows][::-1], height=0.4,
                label=f"before ({before.get('rev', '?')})")
        ax.barh([y - 0.2 for y in ys], [tr[r[1]] for r in rows][::-1], height=0.4, label="now")
        ax.set_yticks(list(ys), labels)
        ax.legend()
    else:
        ax.barh(labels, [tr[r[1]] for r in rows][::-1])
    ax.set_xlabel("seconds")
    ax.set_title("Snapshot travel")
    plt.setp(ax.get_yticklabels(), fontsize=7)
    doc.chart(fig, "travel.png", "snapshot travel steps")


STATIC_TAIL = (Path(__file__).resolve().parent / "performance_notes.md")


def render(results: Path, doc_path: Path) -> None:
    names = ("fanout", "density", "capacity", "latency", "branch", "fork_running", "travel", "network_setup",
             "control_plane", "control_plane_rows", "hibernate", "hibernate_scale", "run")
    rs = {n: load(results, n) for n in names}
    doc = Doc(doc_path.parent / "perf")
    doc.add("# Performance", "",
            "<!-- Generated by `make bench` (bench/report.py) from bench/results/: edit "
            "bench/report.py or bench/performance_notes.md, not this file. -->", "",
            "What forking, idling and talking to forkd sandboxes cost, measured side by side on one host by "
            "`make bench` (under 17 minutes on 2 cores; each part runs under its own time limit and leaves "
            "no VM behind, also when it fails). Raw numbers: `bench/results/*.json`.", "")
    run = rs.get("run")
    if run:
        doc.add("Parts of the last `make bench`: " + ", ".join(
            f"{p['part']} {p['status']} ({p['seconds']:.0f} s)" for p in run.get("parts", [])) + ".", "")
    host_section(doc, rs)
    targets_section(doc, rs)
    fanout_section(doc, rs.get("fanout"))
    restore_section(doc, rs.get("fanout"))
    density_section(doc, rs.get("density"), rs.get("capacity"))
    hibernation_section(doc, rs.get("hibernate"), rs.get("hibernate_scale"))
    latency_section(doc, rs.get("latency"))
    control_plane_section(doc, rs.get("control_plane"))
    control_plane_rows_section(doc, rs.get("control_plane_rows"))
    branch_section(doc, rs.get("branch"), rs.get("fork_running"))
    travel_section(doc, rs.get("travel"))
    network_section(doc, rs.get("network_setup"))
    if STATIC_TAIL.exists():
        doc.add(STATIC_TAIL.read_text().rstrip(), "")
    doc_path.write_text("\n".join(doc.lines).rstrip() + "\n")
    print(f"wrote {doc_path} and {len(list((doc_path.parent / 'perf').glob('*.png')))} charts")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--doc", default=str(ROOT / "docs" / "PERFORMANCE.md"))
    args = ap.parse_args()
    render(Path(args.results), Path(args.doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
