#!/usr/bin/env python3
"""BRANCH pause windows, every mode side by side in one run.

For each guest RAM size (one template snapshot each), each mode and each amount
of memory dirtied in the guest's PID 1, one source sandbox is spawned, made to
dirty that much RAM with random bytes (so the pages are not zero), and branched
``--repeat`` times. Recorded per branch: the source's pause window (``pause_ms``,
as the runtime measures it) and the wall time of the whole synchronous branch
(capture + conversion into a forkable snapshot).

Then, per mode, six consecutive branches of one source (largest RAM size, 30 MiB
dirtied), to show whether pauses compound with the number of branches.

Modes:
  full       stop, stream all RAM, cont: pause grows with the memory the guest touched
  diff       precopy while the guest runs; pause = the final stop-and-copy pass
  live       background snapshot (userfaultfd): pause = device state only
  diff-busy  diff while a guest thread keeps rewriting part of the dirtied buffer
             (--writer-mib-s): what a guest dirtying memory during the copy costs

Prints, and writes to bench/results/branch.json and branch.md (a markdown table).

Usage: .venv/bin/python bench/branch.py [--repeat 5] [--sizes 256,1024] [--dirty 0,30,200]
                                        [--modes full,diff,live,diff-busy] [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from common import percentile, qemu_pids, scratch_data
from forkd.controller.options import SpawnOptions
from forkd.controller.runtime import Runtime, SnapshotSpec
from forkd.store.layout import SnapshotDir
from forkd.vmm import probe as accel_mod

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("full", "diff", "live", "diff-busy")
DEFAULT_MODES = "full,diff,live,diff-busy"

# Leave the guest this much of its MemAvailable when dirtying (PID 1 must not be OOM-killed).
GUEST_MARGIN_MIB = 48
BRANCH_TIMEOUT_S = 900
EVAL_TIMEOUT_S = 900

# Fill a fresh bytearray 1 MiB at a time: only N MiB of guest pages end up
# non-zero (bytearray(os.urandom(N)) would touch 2N: the freed temporary's pages
# keep their random content, and a full capture would carry them too).
DIRTY_CODE = """
import os
_n = {mib} << 20
buf = bytearray(_n)
for _o in range(0, _n, 1 << 20):
    buf[_o:_o + (1 << 20)] = os.urandom(1 << 20)
len(buf) >> 20
"""

# A guest thread that rewrites `rate` MiB/s of `buf`, in chunks every 50 ms.
WRITER_CODE = """
import os, threading, time
_writer_on = [True]
def _writer(rate, period=0.05):
    chunk = min(len(buf), max(4096, int(rate * period)))
    pat = os.urandom(chunk)
    span = len(buf) - chunk + 1
    off = 0
    while _writer_on[0]:
        buf[off:off + chunk] = pat
        off = (off + chunk) % span
        time.sleep(period)
threading.Thread(target=_writer, args=({mib} << 20,), daemon=True).start()
"""

MEM_AVAILABLE = (
    "int([l.split()[1] for l in open('/proc/meminfo') if l.startswith('MemAvailable:')][0]) >> 10"
)


# ---------------------------------------------------------------- statistics


def summary(samples: list[float], digits: int = 3) -> dict:
    return {"n": len(samples), "min": round(min(samples), digits),
            "p50": round(statistics.median(samples), digits),
            "p90": round(percentile(samples, 0.9), digits), "max": round(max(samples), digits)}


# ---------------------------------------------------------------- host helpers


def rss_mib(pid: int | None) -> float | None:
    if not pid:
        return None
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def alloc_mib(path: Path) -> float | None:
    try:
        return round(os.stat(path).st_blocks * 512 / (1 << 20), 1)
    except OSError:
        return None


# ---------------------------------------------------------------- measurements


@dataclass
class Bench:
    rt: Runtime
    writer_mib_s: int
    dirty_cap: dict[int, int] = field(default_factory=dict)  # guest MiB -> most we can dirty
    sandbox_ids: list[str] = field(default_factory=list)

    async def eval(self, sb_id: str, code: str) -> str:
        res = await self.rt.eval(sb_id, code, timeout_secs=EVAL_TIMEOUT_S)
        if res["exit_code"] != 0:
            raise RuntimeError(f"guest eval failed in {sb_id}: {res['error']}")
        return res["result"]

    async def cell(self, tpl: str, mem_mib: int, mode: str, dirty_req: int, branches: int) -> dict:
        """One source, ``branches`` consecutive branches of it; samples kept in order."""
        capture_mode = "diff" if mode == "diff-busy" else mode
        sb = (await self.rt.spawn(tpl, 1, SpawnOptions(live_fork=mode == "live")))[0]
        self.sandbox_ids.append(sb.id)
        tags: list[str] = []
        try:
            if mem_mib not in self.dirty_cap:
                avail = int(await self.eval(sb.id, MEM_AVAILABLE))
                self.dirty_cap[mem_mib] = max(0, (avail - GUEST_MARGIN_MIB) // 10 * 10)
            dirty = min(dirty_req, self.dirty_cap[mem_mib])
            t0 = time.monotonic()
            if dirty:
                await self.eval(sb.id, DIRTY_CODE.format(mib=dirty))
            dirty_s = time.monotonic() - t0
            if mode == "diff-busy":
                await self.eval(sb.id, WRITER_CODE.format(mib=self.writer_mib_s))
            source_rss = rss_mib(sb.pid)
            samples = []
            for _ in range(branches):
                t0 = time.monotonic()
                async with asyncio.timeout(BRANCH_TIMEOUT_S):
                    rec = await self.rt.branch(sb.id, mode=capture_mode)
                total_s = time.monotonic() - t0
                tags.append(rec.tag)
                sdir = SnapshotDir(Path(rec.dir))
                meta = sdir.read_meta()
                samples.append({"pause_ms": rec.pause_ms, "fs_freeze_ms": rec.fs_freeze_ms,
                                "total_s": round(total_s, 3),
                                "convert_s": meta.get("convert_secs"),
                                "mem_alloc_mib": alloc_mib(sdir.mem)})
        finally:
            with contextlib.suppress(Exception):
                await self.rt.kill(sb.id)
            # Each branch's disk is layered on the previous one's, and the source's
            # on the newest: so they can only go once the source is gone, newest first.
            for tag in reversed(tags):
                with contextlib.suppress(Exception):
                    await self.rt.delete_snapshot(tag)
        pauses = [s["pause_ms"] for s in samples]
        totals = [s["total_s"] for s in samples]
        freezes = [s["fs_freeze_ms"] for s in samples if s["fs_freeze_ms"] is not None]
        return {"mode": mode, "mem_mib": mem_mib, "dirty_requested_mib": dirty_req, "dirty_mib": dirty,
                "dirty_fill_s": round(dirty_s, 2), "source_rss_mib": source_rss,
                "writer_mib_s": self.writer_mib_s if mode == "diff-busy" else 0,
                "pause_ms": summary(pauses), "total_s": summary(totals),
                "fs_freeze_ms": summary(freezes) if freezes else None,
                "branches": samples}


# ---------------------------------------------------------------- report


def fmt_dirty(c: dict) -> str:
    if c["dirty_mib"] != c["dirty_requested_mib"]:
        return f"{c['dirty_mib']}*"
    return str(c["dirty_mib"])


def render(results: dict) -> str:
    env = results["environment"]
    lines = [
        f"BRANCH pause windows - accelerator {env['accel']}, {env['host_cpus']} host cores, "
        f"{env['date_utc']}",
        f"{env['qemu']}; guest numpy {env['guest_numpy']}; repeat {results['repeat']} per cell; "
        f"diff-busy writer {results['writer_mib_s']} MiB/s",
        f"host load average at start {env['loadavg_start']}, at end {env['loadavg_end']}; "
        f"{env['other_qemu_at_start']} other qemu-system processes running at start "
        "(shared machine: numbers are noisy)",
        "",
        "| mode | guest RAM (MiB) | dirtied (MiB) | pause p50 (ms) | pause p90 (ms) | FIFREEZE p50 (ms) "
        "| total p50 (s) | source RSS (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in results["cells"]:
        freeze = c.get("fs_freeze_ms")
        freeze_p50 = f"{freeze['p50']:.1f}" if freeze else "-"
        lines.append(f"| {c['mode']} | {c['mem_mib']} | {fmt_dirty(c)} | {c['pause_ms']['p50']:.1f} "
                     f"| {c['pause_ms']['p90']:.1f} | {freeze_p50} "
                     f"| {c['total_s']['p50']:.2f} | {c['source_rss_mib']} |")
    capped = {(c["mem_mib"], c["dirty_requested_mib"], c["dirty_mib"]) for c in results["cells"]
              if c["dirty_mib"] != c["dirty_requested_mib"]}
    for mem, req, got in sorted(capped):
        lines.append(f"\n\\* {req} MiB does not fit in a {mem} MiB guest's free memory; {got} MiB "
                     f"dirtied instead (the guest's MemAvailable minus {GUEST_MARGIN_MIB} MiB, "
                     "rounded down to 10 MiB).")
    lines.append("\nFIFREEZE: live mode only, how long the source's root filesystem was frozen "
                 "(its disk writes waited; its CPU work went on).")
    lines.append("\np50/p90: linear interpolation over the samples (with 5 samples p90 sits between "
                 "the 4th and 5th). total = the whole synchronous branch: capture + conversion into a "
                 "forkable snapshot.")
    series = results.get("consecutive") or []
    if series:
        n = max(len(s["branches"]) for s in series)
        first = series[0]
        lines += [
            "",
            f"Consecutive branches of one source ({first['mem_mib']} MiB guest, "
            f"{fmt_dirty(first)} MiB dirtied): pause_ms of branch 1..{n}",
            "",
            "| mode | " + " | ".join(f"#{i + 1}" for i in range(n)) + " | last / first |",
            "|---|" + "---:|" * (n + 1),
        ]
        for s in series:
            pauses = [b["pause_ms"] for b in s["branches"]]
            ratio = pauses[-1] / pauses[0] if pauses[0] else float("nan")
            lines.append(f"| {s['mode']} | " + " | ".join(f"{p:.1f}" for p in pauses)
                         + f" | {ratio:.2f} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5, help="branches per cell (default 5)")
    ap.add_argument("--sizes", default="256,1024", help="guest RAM sizes in MiB (default 256,1024)")
    ap.add_argument("--dirty", default="0,30,200", help="MiB dirtied in the guest (default 0,30,200)")
    ap.add_argument("--modes", default=DEFAULT_MODES, help=f"modes (default {DEFAULT_MODES})")
    ap.add_argument("--consecutive", type=int, default=6,
                    help="consecutive branches of one source per mode (default 6; 0 to skip)")
    ap.add_argument("--consecutive-dirty", type=int, default=30, help="MiB dirtied for that series")
    ap.add_argument("--writer-mib-s", type=int, default=16,
                    help="diff-busy: MiB/s the guest thread rewrites (default 16)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 repeat, 256 MiB only, dirty 0,30, 2 consecutive branches")
    ap.add_argument("--out", default=str(RESULTS / "branch.json"),
                    help="JSON output (the markdown goes next to it, .md)")
    args = ap.parse_args()
    if args.quick:
        args.repeat, args.sizes, args.dirty, args.consecutive = 1, "256", "0,30", 2
    args.size_list = [int(x) for x in args.sizes.split(",") if x]
    args.dirty_list = [int(x) for x in args.dirty.split(",") if x]
    args.mode_list = [m for m in args.modes.split(",") if m]
    bad = [m for m in args.mode_list if m not in MODES]
    if bad:
        ap.error(f"unknown mode(s) {bad}; choose from {', '.join(MODES)}")
    if args.repeat < 1 or not args.size_list or not args.dirty_list:
        ap.error("--repeat must be >= 1 and --sizes/--dirty non-empty")
    return args


INTERRUPTED = [False]


def _cleanup_sigint(*_: object) -> None:
    print("\ncleaning up (stopping VMs, removing snapshots); please wait", file=sys.stderr, flush=True)


async def main(args: argparse.Namespace) -> int:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)

    data = scratch_data("forkd-bench-branch-")
    root = data.root
    started = datetime.datetime.now(datetime.UTC)
    env = {"host_cpus": os.cpu_count(), "host_kernel": platform.release(),
           "date_utc": started.strftime("%Y-%m-%d %H:%M UTC"),
           "loadavg_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
           "other_qemu_at_start": len(qemu_pids())}
    results: dict = {"environment": env, "repeat": args.repeat, "writer_mib_s": args.writer_mib_s,
                     "cells": [], "consecutive": []}
    rt: Runtime | None = None
    bench: Bench | None = None
    try:
        rt = await Runtime.open(data)
        bench = Bench(rt, args.writer_mib_s)
        templates = {}
        for mem in sorted(set(args.size_list)):
            t0 = time.monotonic()
            snap = await rt.create_snapshot(SnapshotSpec(tag=f"tpl-{mem}", mem_mib=mem))
            templates[mem] = snap.tag
            meta = SnapshotDir(Path(snap.dir)).read_meta()
            env.update(accel=meta["config"]["accel"], guest_numpy=meta["numpy_version"],
                       qemu=meta.get("qemu_version") or accel_mod.qemu_version())
            print(f"template {mem} MiB ready in {time.monotonic() - t0:.1f} s "
                  f"(accelerator {env['accel']})", flush=True)

        for mem in args.size_list:
            for mode in args.mode_list:
                for dirty in args.dirty_list:
                    if mode == "diff-busy" and dirty == 0:
                        continue  # the writer rewrites the dirtied buffer: needs one
                    c = await bench.cell(templates[mem], mem, mode, dirty, args.repeat)
                    results["cells"].append(c)
                    print(f"{mode:9s} {mem:5d} MiB  dirty {fmt_dirty(c):>4s} MiB  pause p50 "
                          f"{c['pause_ms']['p50']:8.1f} ms  p90 {c['pause_ms']['p90']:8.1f} ms  "
                          f"total p50 {c['total_s']['p50']:6.2f} s  "
                          f"pauses {[b['pause_ms'] for b in c['branches']]}", flush=True)

        if args.consecutive:
            mem = max(args.size_list)
            for mode in args.mode_list:
                s = await bench.cell(templates[mem], mem, mode, args.consecutive_dirty, args.consecutive)
                results["consecutive"].append(s)
                print(f"consecutive {mode:9s} {mem} MiB dirty {fmt_dirty(s)} MiB: pause_ms "
                      f"{[b['pause_ms'] for b in s['branches']]}", flush=True)
    finally:
        # Ctrl-C / SIGTERM cancel this task; the runtime may re-raise that as its own error.
        INTERRUPTED[0] = task.cancelling() > 0
        signal.signal(signal.SIGINT, _cleanup_sigint)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
        shm_dir = rt.shm.dir if rt is not None else None
        if rt is not None:
            try:
                await rt.close()
            except Exception as exc:
                print(f"runtime close failed: {exc}", file=sys.stderr)
        # Belt and braces: nothing of ours may outlive the run.
        for marker in (str(root), str(shm_dir) if shm_dir else None):
            if marker:
                for pid in qemu_pids(marker):
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                        print(f"killed leftover qemu {pid}", file=sys.stderr)
        shutil.rmtree(root, ignore_errors=True)
        if shm_dir is not None:
            shutil.rmtree(shm_dir, ignore_errors=True)
        tmp = Path(tempfile.gettempdir())
        for sb_id in bench.sandbox_ids if bench else []:
            for err in tmp.glob(f"forkd-.branch-{sb_id}-*.err"):
                err.unlink(missing_ok=True)

    env["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    env["duration_s"] = round((datetime.datetime.now(datetime.UTC) - started).total_seconds())
    results["measured_at_unix"] = int(time.time())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    table = render(results)
    out.with_suffix(".md").write_text(table)
    print()
    print(table, end="")
    print(f"results written to {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main(parse_args())))
    except (KeyboardInterrupt, asyncio.CancelledError, Exception):
        if not INTERRUPTED[0] and not isinstance(sys.exc_info()[1], KeyboardInterrupt):
            raise
        print("interrupted; everything this run started has been removed", file=sys.stderr)
        sys.exit(130)
