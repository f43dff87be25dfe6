#!/usr/bin/env python3
"""Fork a *running* sandbox: the source's pause and the time until every child answers.

Side by side, in one run, for ``count`` children (default 1 and 10):

  fork (diff source)   POST /v1/sandboxes/{id}/fork of a sandbox spawned normally:
                       one diff-mode branch (precopy), then ``count`` children
  fork (live source)   the same of a sandbox spawned with live_fork: a live branch
                       (userfaultfd), which pauses the source for device state only
  branch + spawn       what a user without fork does: a diff BRANCH, then a spawn
                       of ``count`` children from it, as two calls
  spawn (template)     a plain spawn of ``count`` children from the warm template,
                       i.e. the cost of the children alone, without the source's state

Every source holds a 64 MiB random buffer in its warm interpreter and runs a
ticking thread, so the branch has real state to copy while the guest runs.
"until every child answers" is the time from the request until the last child
has answered a ping (the fork returns once each child's agent has answered its
post-restore call; the ping confirms it).

Prints, and writes bench/results/fork_running.json and fork_running.md.

Usage: .venv/bin/python bench/fork_running.py [--repeat 3] [--counts 1,10] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from common import scratch_data
from forkd.controller.options import SpawnOptions
from forkd.controller.runtime import Runtime, SnapshotSpec
from forkd.store.layout import SnapshotDir

RESULTS = Path(__file__).resolve().parent / "results"
STATE_MIB = 64
LOAD = f"""
import os, threading, time
state = bytearray({STATE_MIB} << 20)
for _o in range(0, len(state), 1 << 20):
    state[_o:_o + (1 << 20)] = os.urandom(1 << 20)
ticks = [0]
def _tick():
    while True:
        ticks[0] += 1
        time.sleep(0.01)
threading.Thread(target=_tick, daemon=True).start()
"""

# One trial: (pause_ms or None, seconds until every child answered, the tag to delete or None).
Trial = tuple[float | None, float, str | None]


def p50(samples: list[float]) -> float:
    return round(statistics.median(samples), 3)


async def loaded_source(rt: Runtime, *, live: bool) -> str:
    [src] = await rt.spawn("bench", 1, SpawnOptions(live_fork=live))
    out = await rt.eval(src.id, LOAD, timeout_secs=600)
    assert out["exit_code"] == 0, out
    return src.id


async def all_answer(rt: Runtime, ids: list[str]) -> None:
    await asyncio.gather(*(rt.ping(i) for i in ids))


async def trial_fork(rt: Runtime, count: int, *, live: bool) -> Trial:
    src = await loaded_source(rt, live=live)
    try:
        started = time.perf_counter()
        result = await rt.fork(src, count)
        await all_answer(rt, [c.id for c in result.children])
        elapsed = time.perf_counter() - started
        assert not result.errors, result.errors
        await asyncio.gather(*(rt.kill(c.id) for c in result.children))  # its snapshot goes with them
        return result.pause_ms, elapsed, None
    finally:
        await rt.kill(src)


async def trial_branch_then_spawn(rt: Runtime, count: int) -> Trial:
    src = await loaded_source(rt, live=False)
    try:
        started = time.perf_counter()
        snap = await rt.branch(src, None, "diff")
        kids = await rt.spawn(snap.tag, count)
        await all_answer(rt, [k.id for k in kids])
        elapsed = time.perf_counter() - started
        await asyncio.gather(*(rt.kill(k.id) for k in kids))
        return snap.pause_ms, elapsed, snap.tag
    finally:
        await rt.kill(src)


async def trial_template(rt: Runtime, count: int) -> Trial:
    started = time.perf_counter()
    kids = await rt.spawn("bench", count)
    await all_answer(rt, [k.id for k in kids])
    elapsed = time.perf_counter() - started
    await asyncio.gather(*(rt.kill(k.id) for k in kids))
    return None, elapsed, None


async def measure(rt: Runtime, count: int, repeat: int,
                  methods: list[tuple[str, Callable[[], Awaitable[Trial]]]]) -> list[dict[str, Any]]:
    """Run the methods round-robin, ``repeat`` rounds, so that a busy moment of the
    host falls on every method alike rather than on whichever ran then."""
    pauses: dict[str, list[float]] = {name: [] for name, _ in methods}
    walls: dict[str, list[float]] = {name: [] for name, _ in methods}
    for _ in range(repeat):
        for name, trial in methods:
            pause, wall, tag = await trial()
            if pause is not None:
                pauses[name].append(pause)
            walls[name].append(wall)
            if tag is not None:
                await rt.delete_snapshot(tag)
    rows = []
    for name, _ in methods:
        w, p = walls[name], pauses[name]
        row: dict[str, Any] = {"method": name, "count": count, "runs": repeat,
                               "all_answer_s_p50": p50(w), "all_answer_s_max": round(max(w), 3),
                               "all_answer_s": [round(x, 3) for x in w]}
        if p:
            row.update(pause_ms_p50=p50(p), pause_ms_max=round(max(p), 3), pause_ms=[round(x, 3) for x in p])
        pause_txt = f"pause p50 {row['pause_ms_p50']:8.1f} ms" if p else f"{'(no source)':>22}"
        print(f"{name:18s} count {count:3d}  {pause_txt}  all answer p50 {row['all_answer_s_p50']:7.3f} s "
              f"(max {row['all_answer_s_max']:.3f})", flush=True)
        rows.append(row)
    return rows


def markdown(results: dict[str, Any]) -> str:
    env = results["env"]
    lines = [
        f"Fork of a running sandbox - accelerator {env['accel']}, {env['host_cpus']} host cores, "
        f"guest {env['guest_mem_mib']} MiB with {STATE_MIB} MiB of state; p50 of {env['repeat']} runs",
        "",
        "| method | children | source pause (ms) | until every child answers (s) |",
        "|---|---|---|---|",
    ]
    for row in results["rows"]:
        pause = f"{row['pause_ms_p50']:.1f}" if "pause_ms_p50" in row else "-"
        lines.append(f"| {row['method']} | {row['count']} | {pause} | {row['all_answer_s_p50']:.3f} |")
    return "\n".join(lines) + "\n"


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each measurement (default 3)")
    ap.add_argument("--counts", default="1,10", help="children per fork (default 1,10)")
    ap.add_argument("--out", default=str(RESULTS / "fork_running.json"))
    args = ap.parse_args()
    counts = [int(x) for x in args.counts.split(",") if x]

    data = scratch_data("forkd-bench-")
    rt = await Runtime.open(data)
    results: dict[str, Any] = {"rows": []}
    try:
        snap = await rt.create_snapshot(SnapshotSpec(tag="bench"))
        meta = SnapshotDir(Path(snap.dir)).read_meta()
        results["env"] = {"accel": meta["config"]["accel"], "guest_mem_mib": meta["config"]["mem_mib"],
                          "host_cpus": os.cpu_count(), "host_kernel": platform.release(),
                          "repeat": args.repeat}
        print(f"accelerator: {results['env']['accel']}  guest: {meta['config']['mem_mib']} MiB", flush=True)
        for count in counts:
            methods: list[tuple[str, Callable[[], Awaitable[Trial]]]] = [
                ("fork (diff source)", lambda c=count: trial_fork(rt, c, live=False)),
                ("fork (live source)", lambda c=count: trial_fork(rt, c, live=True)),
                ("branch + spawn", lambda c=count: trial_branch_then_spawn(rt, c)),
                ("spawn (template)", lambda c=count: trial_template(rt, c)),
            ]
            results["rows"] += await measure(rt, count, args.repeat, methods)
    finally:
        await rt.close()
        shutil.rmtree(data.root, ignore_errors=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results["measured_at_unix"] = int(time.time())
    out.write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    out.with_suffix(".md").write_text(table)
    print("\n" + table + f"\nresults written to {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
