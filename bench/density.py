#!/usr/bin/env python3
"""Density: what N idle children cost the host, and how many this host holds at once.

For each N (default 10, 50, 100) one batch of N children of the same snapshot is
spawned, left to settle, then measured while idle:

  PSS per child         proportional set size, summed over the N QEMUs, over N: what each
                        child really adds (pages shared with siblings are split)
  RSS per child         what each QEMU appears to hold (shared pages counted in full)
  MemAvailable drop     the host's MemAvailable before the spawn minus after, over N
  idle CPU per child    QEMU CPU time over a quiet window, per child, in ms per second

Knobs, at the smallest N: children spawned with ``idle_pause_secs`` (paused once idle),
members of a full warm pool (paused), and a "legacy guest" template made the way forkd
made them before this change (the PIT left on, no idle kernel options), to show what
the quiet guest saves.

``--capacity`` (opt-in, bounded by ``--capacity-minutes``): spawn batches until 1000
children (the API's limit per request, here cumulative), a failure, or the host's
MemAvailable falling under ``--reserve-mib``; reports how many ran at once and what
ran out first (memory, CPU, file descriptors, or the error QEMU or the kernel gave).

Usage: .venv/bin/python bench/density.py [--sizes 10,50,100] [--window 10] [--no-knobs]
                                         [--capacity] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from common import cpu_ms, host_facts, mem_available_mib, scratch_runtime, smaps_kib, write_result
from forkd.controller.options import SpawnOptions
from forkd.controller.runtime import Runtime, SnapshotSpec
from forkd.vmm import cmdline

SETTLE_S = 5.0  # the first seconds after a batch restore are busier than steady idle
CAPACITY_BATCH = 25
MAX_CHILDREN = 1000


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def measure(rt: Runtime, pids: list[int], n: int, window: float, mem_before: float) -> dict[str, Any]:
    """Memory now, then CPU over ``window`` seconds of idleness, per child."""
    maps = [smaps_kib(p) for p in pids]
    pss = [m.get("Pss", 0) for m in maps]
    rss = [m.get("Rss", 0) for m in maps]
    anon = [m.get("Pss_Anon", 0) for m in maps]
    mem_after = mem_available_mib()
    c0 = {p: cpu_ms(p) for p in pids}
    t0 = time.monotonic()
    await asyncio.sleep(window)
    secs = time.monotonic() - t0
    cpu = [(cpu_ms(p) - c0[p]) / secs for p in pids]
    return {
        "children": n,
        "pss_mib_per_child": round(sum(pss) / 1024 / n, 2),
        "pss_anon_mib_per_child": round(sum(anon) / 1024 / n, 2),
        "rss_mib_per_child": round(sum(rss) / 1024 / n, 2),
        "mem_available_drop_mib_per_child": round((mem_before - mem_after) / n, 2),
        "idle_cpu_ms_per_s_per_child": round(statistics.mean(cpu), 3),
        "idle_cpu_ms_per_s_max": round(max(cpu), 3),
        "host_cpu_share_of_all_children": round(sum(cpu) / 1000 / (os.cpu_count() or 1), 4),
    }


async def batch(rt: Runtime, tag: str, n: int, window: float, **spawn: Any) -> dict[str, Any]:
    before = mem_available_mib()
    sbs = await rt.spawn(tag, n, SpawnOptions.from_request(spawn))
    try:
        await asyncio.sleep(SETTLE_S)
        if spawn.get("idle_pause_secs"):
            deadline = time.monotonic() + 60
            while not all(rt.idle.paused(sb.id) for sb in sbs) and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
        return await measure(rt, [sb.pid for sb in sbs if sb.pid], n, window, before)
    finally:
        await asyncio.gather(*(rt.kill(sb.id) for sb in sbs), return_exceptions=True)


async def pool_members(rt: Runtime, tag: str, n: int, window: float) -> dict[str, Any]:
    before = mem_available_mib()
    await rt.pools.configure(tag, n)
    try:
        deadline = time.monotonic() + 600
        while rt.pools.get(tag)["ready"] < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the pool did not fill: {rt.pools.get(tag)}")
            await asyncio.sleep(0.5)
        await asyncio.sleep(SETTLE_S)
        pids = [sb.pid for sb in rt.registry.sandboxes.all() if sb.pooled and sb.pid]
        return await measure(rt, pids, n, window, before)
    finally:
        await rt.pools.configure(tag, 0)


async def legacy_template(rt: Runtime, tag: str) -> None:
    """A template made as before the quiet guest: PIT on, no idle kernel options."""
    saved = cmdline.IDLE_QUIET, cmdline.machine_for
    cmdline.IDLE_QUIET = ()
    cmdline.machine_for = lambda accel: cmdline.MACHINE  # type: ignore[assignment]
    try:
        await rt.create_snapshot(SnapshotSpec(tag=tag))
    finally:
        cmdline.IDLE_QUIET, cmdline.machine_for = saved  # type: ignore[assignment]


async def capacity(rt: Runtime, tag: str, reserve_mib: float, minutes: float) -> dict[str, Any]:
    """Spawn batches until MAX_CHILDREN, a failure, the memory reserve, or the time bound."""
    ids: list[str] = []
    deadline = time.monotonic() + minutes * 60
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    out: dict[str, Any] = {"fd_limit": soft, "fd_limit_hard": hard, "reserve_mib": reserve_mib,
                           "batch": CAPACITY_BATCH, "steps": []}
    stop = "reached the API's limit of 1000 children"
    started = time.monotonic()
    try:
        while len(ids) < MAX_CHILDREN:
            if time.monotonic() > deadline:
                stop = f"time bound ({minutes:g} min) reached"
                break
            if mem_available_mib() < reserve_mib:
                stop = f"memory: the host's MemAvailable fell under the {reserve_mib:.0f} MiB reserve"
                break
            fds = open_fds()
            if fds + CAPACITY_BATCH * 4 > soft:
                stop = f"file descriptors: {fds} open of the daemon's limit of {soft}"
                break
            try:
                sbs = await rt.spawn(tag, CAPACITY_BATCH)
            except Exception as exc:
                stop = f"spawn failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                break
            ids += [sb.id for sb in sbs]
            load1 = os.getloadavg()[0]
            step = {"children": len(ids), "mem_available_mib": round(mem_available_mib()),
                    "daemon_fds": open_fds(), "loadavg1": round(load1, 2),
                    "elapsed_s": round(time.monotonic() - started, 1)}
            out["steps"].append(step)
            print(f"capacity: {step}", flush=True)
        # Are they all alive and answering? (a child that cannot run is not held)
        alive = await asyncio.gather(*(rt.ping(i) for i in ids), return_exceptions=True)
        out["answering"] = sum(1 for a in alive if isinstance(a, dict))
    finally:
        out["children"] = len(ids)
        out["stopped_by"] = stop
        await asyncio.gather(*(rt.kill(i) for i in ids), return_exceptions=True)
    return out


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10,50,100", help="N values (default 10,50,100)")
    ap.add_argument("--window", type=float, default=10.0, help="idle CPU window in seconds (default 10)")
    ap.add_argument("--no-knobs", action="store_true", help="skip the paused/pool/legacy comparisons")
    ap.add_argument("--capacity", action="store_true", help="also probe how many children fit (minutes)")
    ap.add_argument("--capacity-minutes", type=float, default=10.0, help="time bound of that probe")
    ap.add_argument("--reserve-mib", type=float, default=1536.0,
                    help="stop the probe when the host's MemAvailable falls under this (default 1536)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x]
    results: dict[str, Any] = {"host": host_facts(), "window_s": args.window, "settle_s": SETTLE_S,
                               "batches": [], "knobs": {}}
    async with scratch_runtime("forkd-bench-density-") as rt:
        await rt.create_snapshot(SnapshotSpec(tag="dense"))
        await asyncio.gather(*(rt.kill(sb.id) for sb in await rt.spawn("dense", 1)))  # page cache warm
        for n in sizes:
            m = await batch(rt, "dense", n, args.window)
            results["batches"].append(m)
            print(f"N={n:4d}: {m}", flush=True)
        if not args.no_knobs:
            n = min(sizes)
            knobs = results["knobs"]
            knobs["running (default)"] = results["batches"][0]
            knobs["idle_pause_secs=1 (paused)"] = await batch(rt, "dense", n, args.window, idle_pause_secs=1)
            knobs["warm pool members (paused)"] = await pool_members(rt, "dense", n, args.window)
            await legacy_template(rt, "legacy")
            knobs["legacy guest (PIT on, no idle options)"] = await batch(rt, "legacy", n, args.window)
            for name, m in knobs.items():
                print(f"{name:40s} idle CPU {m['idle_cpu_ms_per_s_per_child']:.2f} ms/s per child, "
                      f"PSS {m['pss_mib_per_child']} MiB", flush=True)
        if args.capacity:
            results["capacity"] = await capacity(rt, "dense", args.reserve_mib, args.capacity_minutes)
            print(f"capacity: {results['capacity']['children']} children; stopped by "
                  f"{results['capacity']['stopped_by']}", flush=True)
    write_result("density", results, args.out)
    if args.capacity:
        # Kept apart so that a plain `make bench` does not drop an earlier probe's figures.
        write_result("capacity", {"host": results["host"], **results["capacity"]},
                     str(Path(args.out).with_name("capacity.json")) if args.out else None)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
