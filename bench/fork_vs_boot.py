#!/usr/bin/env python3
"""Cold boot vs. copy-on-write fork, measured side by side in one run.

Prints, and writes to bench/results/fork_vs_boot.json:
  * cold boot of the guest image to "agent ready, numpy imported"
  * fork of 1 child to agent-ready
  * fork of N=10 and N=50 children to all-ready
  * per-child PSS vs RSS of the N=10 batch (how much memory forks really share)
  * fork of 1 and of 10 children from a full warm pool (restored, reseeded, paused
    children claimed and resumed), beside the unpooled figures

Usage: .venv/bin/python bench/fork_vs_boot.py [--repeat 3] [--sizes 10,50] [--pooled-sizes 1,10]
       [--no-cold-boot]
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
from pathlib import Path

from forkd.config import DataDir
from forkd.controller.runtime import Runtime, SnapshotSpec
from forkd.image.builder import load_image
from forkd.store.layout import SnapshotDir
from forkd.vmm.cmdline import VMConfig, kernel_cmdline
from forkd.vmm.disk import create_overlay
from forkd.vmm.machine import VM

RESULTS = Path(__file__).resolve().parent / "results"


def pss_rss_kib(pid: int) -> tuple[int, int]:
    vals = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        k, v = line.split(":", 1)
        vals[k] = int(v.split()[0])
    return vals["Pss"], vals["Rss"]


def summary(samples: list[float]) -> dict:
    s = sorted(samples)
    return {"n": len(s), "min": round(s[0], 4), "p50": round(statistics.median(s), 4),
            "max": round(s[-1], 4), "samples": [round(x, 4) for x in s]}


async def cold_boot(rt: Runtime, workdir: Path) -> float:
    """Boot the image from scratch until its agent has imported numpy and answers."""
    image = load_image(rt.data)
    accel = await rt.host_accel(image)
    run = workdir / f"cold-{time.monotonic_ns()}"
    run.mkdir()
    create_overlay(image.rootfs, run / "disk.qcow2", "raw")
    started = time.monotonic()
    vm, _ = await VM.boot(run, VMConfig.new(512, 1, accel), mem_path=run / "mem", disk=run / "disk.qcow2",
                          kernel=image.kernel, initrd=image.initrd,
                          append=kernel_cmdline(["numpy"], accel=accel), timeout=300)
    elapsed = time.monotonic() - started
    await vm.destroy()
    shutil.rmtree(run, ignore_errors=True)
    return elapsed


async def fork_batch(rt: Runtime, tag: str, n: int, measure_memory: bool = False) -> tuple[float, dict]:
    started = time.monotonic()
    sbs = await rt.spawn(tag, n)
    elapsed = time.monotonic() - started
    mem = {}
    if measure_memory:
        pairs = [pss_rss_kib(sb.pid) for sb in sbs if sb.pid]
        mem = {"children": n, "pss_mib_per_child": round(sum(p for p, _ in pairs) / 1024 / n, 1),
               "rss_mib_per_child": round(sum(r for _, r in pairs) / 1024 / n, 1)}
    await asyncio.gather(*(rt.kill(sb.id) for sb in sbs))
    return elapsed, mem


async def pooled_batch(rt: Runtime, tag: str, n: int) -> float:
    """Fill a pool of ``n``, wait until it is full, then fork ``n`` children (all claimed)."""
    await rt.set_pool(tag, n)
    deadline = time.monotonic() + 600
    while rt.get_pool(tag)["ready"] < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the pool did not fill: {rt.get_pool(tag)}")
        await asyncio.sleep(0.2)
    await asyncio.sleep(1)  # let the last member's restore settle, as an idle pool would
    claims = rt.get_pool(tag)["claims"]
    started = time.monotonic()
    sbs = await rt.spawn(tag, n)
    elapsed = time.monotonic() - started
    await rt.set_pool(tag, 0)  # no refill competes with the kills or the next run
    assert rt.get_pool(tag)["claims"] == claims + n, "not every child came from the pool"
    await asyncio.gather(*(rt.kill(sb.id) for sb in sbs))
    return elapsed


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each measurement (default 3)")
    ap.add_argument("--sizes", default="10,50", help="batch sizes to fork (default 10,50)")
    ap.add_argument("--pooled-sizes", default="1,10", help="batch sizes forked from a full warm pool")
    ap.add_argument("--no-cold-boot", action="store_true", help="skip the cold boots")
    ap.add_argument("--out", default=str(RESULTS / "fork_vs_boot.json"))
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x]
    pooled_sizes = [int(x) for x in args.pooled_sizes.split(",") if x]

    data = DataDir.scratch("forkd-bench-")
    root = data.root
    rt = await Runtime.open(data)
    results: dict = {"host": {"cpus": os.cpu_count(), "kernel": platform.release()}}
    try:
        snap = await rt.create_snapshot(SnapshotSpec(tag="bench"))
        meta = SnapshotDir(Path(snap.dir)).read_meta()
        results["accel"] = meta["config"]["accel"]
        results["guest"] = {"mem_mib": meta["config"]["mem_mib"], "numpy": meta["numpy_version"]}
        print(f"accelerator: {results['accel']}  guest: 512 MiB, numpy {meta['numpy_version']}", flush=True)

        if not args.no_cold_boot:
            boots = [await cold_boot(rt, root) for _ in range(args.repeat)]
            results["cold_boot_s"] = summary(boots)
            print(f"cold boot -> agent ready      p50 {statistics.median(boots):7.3f} s", flush=True)

        ones = [(await fork_batch(rt, "bench", 1))[0] for _ in range(max(args.repeat, 5))]
        results["fork_1_s"] = summary(ones)
        print(f"fork 1 child -> agent ready   p50 {statistics.median(ones):7.3f} s", flush=True)

        for n in sizes:
            runs, mem = [], {}
            for i in range(args.repeat if n <= 10 else 1):
                elapsed, m = await fork_batch(rt, "bench", n, measure_memory=(i == 0))
                runs.append(elapsed)
                mem = mem or m
            results[f"fork_{n}_s"] = summary(runs)
            if mem:
                results[f"fork_{n}_memory"] = mem
            print(f"fork {n:3d} children -> all ready p50 {statistics.median(runs):7.3f} s"
                  f"  ({statistics.median(runs) / n * 1000:.0f} ms/child; PSS {mem.get('pss_mib_per_child')} "
                  f"MiB vs RSS {mem.get('rss_mib_per_child')} MiB per child)", flush=True)
        for n in pooled_sizes:
            runs = [await pooled_batch(rt, "bench", n) for _ in range(args.repeat)]
            results[f"pooled_fork_{n}_s"] = summary(runs)
            print(f"fork {n:3d} from a full pool      p50 {statistics.median(runs):7.3f} s"
                  f"  ({statistics.median(runs) / n * 1000:.0f} ms/child)", flush=True)
        if "cold_boot_s" in results:
            speedup = results["cold_boot_s"]["p50"] / results["fork_1_s"]["p50"]
            results["speedup_fork1_vs_cold_boot"] = round(speedup, 1)
            print(f"fork of one child is {speedup:.0f}x faster than a cold boot", flush=True)
    finally:
        await rt.close()
        shutil.rmtree(root, ignore_errors=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results["measured_at_unix"] = int(time.time())
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
