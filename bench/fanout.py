#!/usr/bin/env python3
"""Fan-out: N children, each answering a ping, four ways side by side in one run.

  unpooled   POST /v1/sandboxes with n=N (Runtime.spawn): N QEMUs restored from the
             snapshot, each reseeded, then every child pinged
  pooled     the same spawn with a full warm pool of N (restored, reseeded, paused
             children): claimed, resumed, reseeded again, then pinged
  cold boot  the same image booted N times from scratch to "agent answered, numpy
             imported", at most as many at once as the host has cores (each VM is
             stopped once it answered: N cold guests do not fit in memory at once)
  floor      N host processes of ``python3 -c "import numpy"`` started at once: what
             the same work costs with no sandbox at all

Also, for single children: where a fork's time goes (the phases QEMU reports and the
guest's own timing of its post-restore steps), the QEMU CPU time per child until it
answered, and how much guest code QEMU translated for it (TCG's ``info jit``).

Cold boots of 50 and 100 take minutes on 2 cores (about 2.5 s of CPU each); by
default they are measured up to N=10 and larger N are estimated from that rate
(marked ``estimated``); ``--cold-sizes 1,10,50,100`` measures them all.

Usage: .venv/bin/python bench/fanout.py [--sizes 1,10,50,100] [--cold-sizes 1,10]
                                        [--repeat 3] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shlex
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from common import cpu_ms, host_facts, scratch_runtime, summary, write_result
from forkd.controller.runtime import Runtime, SnapshotSpec
from forkd.host.accel import VMConfig
from forkd.image.builder import load_image
from forkd.store.layout import SnapshotDir
from forkd.vmm.cmdline import kernel_cmdline
from forkd.vmm.disk import create_overlay
from forkd.vmm.machine import VM

POOL_FILL_TIMEOUT_S = 600
COLD_BOOT_TIMEOUT_S = 300


async def ping_all(rt: Runtime, ids: list[str]) -> None:
    replies = await asyncio.gather(*(rt.ping(i) for i in ids))
    assert all(r.get("pong") for r in replies), replies


async def unpooled(rt: Runtime, tag: str, n: int, detail: bool = False) -> tuple[float, dict[str, Any]]:
    started = time.monotonic()
    sbs = await rt.spawn(tag, n)
    await ping_all(rt, [sb.id for sb in sbs])
    elapsed = time.monotonic() - started
    info: dict[str, Any] = {}
    try:
        if detail:
            cpu = [cpu_ms(sb.pid) for sb in sbs if sb.pid]
            info["qemu_cpu_ms_per_child"] = round(statistics.mean(cpu), 1) if cpu else None
            phases: dict[str, list[float]] = {}
            steps: dict[str, list[int]] = {}
            for sb in sbs:
                for k, v in sb.timings.items():
                    phases.setdefault(k, []).append(v)
                vm = rt.sandboxes.vm(sb.id)
                for k, us in (vm.guest_steps_us if vm else {}).items():
                    steps.setdefault(k, []).append(us)
            info["phases_s"] = {k: round(statistics.median(v), 4) for k, v in phases.items()}
            info["guest_steps_us"] = {k: int(statistics.median(v)) for k, v in steps.items()}
            info["jit"] = await jit_stats(rt, sbs[0].id)
    finally:
        await asyncio.gather(*(rt.kill(sb.id) for sb in sbs), return_exceptions=True)
    return elapsed, info


async def jit_stats(rt: Runtime, sandbox_id: str) -> dict[str, int]:
    """Translation blocks QEMU has generated for this child so far (TCG only)."""
    vm = rt.sandboxes.vm(sandbox_id)
    if vm is None or vm.config.accel.name != "tcg":
        return {}
    text = await vm.qmp.cmd("human-monitor-command", **{"command-line": "info jit"})
    out = {}
    for key, pattern in (("tbs", r"TB count\s+(\d+)"), ("code_kib", r"gen code size\s+(\d+)")):
        m = re.search(pattern, str(text))
        if m:
            out[key] = int(m.group(1)) // (1024 if key == "code_kib" else 1)
    return out


async def pooled(rt: Runtime, tag: str, n: int) -> float:
    """Fill a pool of ``n``, wait until it is full, then fork ``n`` children (all claimed)."""
    await rt.pools.configure(tag, n)
    deadline = time.monotonic() + POOL_FILL_TIMEOUT_S
    while rt.pools.get(tag)["ready"] < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the pool did not fill: {rt.pools.get(tag)}")
        await asyncio.sleep(0.2)
    await asyncio.sleep(1)  # let the last member's restore settle, as an idle pool would
    claims = rt.pools.get(tag)["claims"]
    started = time.monotonic()
    sbs = await rt.spawn(tag, n)
    await ping_all(rt, [sb.id for sb in sbs])
    elapsed = time.monotonic() - started
    await rt.pools.configure(tag, 0)  # no refill competes with the kills or the next run
    got = rt.pools.get(tag)["claims"] - claims
    await asyncio.gather(*(rt.kill(sb.id) for sb in sbs), return_exceptions=True)
    if got != n:
        raise RuntimeError(f"only {got} of {n} children came from the pool")
    return elapsed


async def cold_boots(rt: Runtime, workdir: Path, n: int, parallel: int) -> float:
    """Boot the image ``n`` times, ``parallel`` at once, each until its agent answered (numpy warm)."""
    image = load_image(rt.data)
    accel = await rt.accel.for_image(image)
    gate = asyncio.Semaphore(parallel)

    async def one(i: int) -> None:
        async with gate:
            run = workdir / f"cold-{i}-{time.monotonic_ns()}"
            run.mkdir()
            try:
                create_overlay(image.rootfs, run / "disk.qcow2", "raw")
                vm, _ = await VM.boot(run, VMConfig.new(512, 1, accel), mem_path=run / "mem",
                                      disk=run / "disk.qcow2", kernel=image.kernel, initrd=image.initrd,
                                      append=kernel_cmdline(["numpy"], accel=accel),
                                      timeout=COLD_BOOT_TIMEOUT_S)
                await vm.destroy()
            finally:
                shutil.rmtree(run, ignore_errors=True)

    started = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(n)))
    return time.monotonic() - started


def floor_python() -> list[str] | None:
    """A host python3 that has numpy: Debian's (the guest's own build) first."""
    for exe in ("/usr/bin/python3", shutil.which("python3")):
        if exe and Path(exe).exists():
            import subprocess
            r = subprocess.run([exe, "-c", "import numpy"], capture_output=True)
            if r.returncode == 0:
                return [exe, "-c", "import numpy"]
    return None


async def floor(argv: list[str], n: int) -> float:
    started = time.monotonic()
    procs = [await asyncio.create_subprocess_exec(*argv) for _ in range(n)]
    codes = await asyncio.gather(*(p.wait() for p in procs))
    elapsed = time.monotonic() - started
    assert not any(codes), codes
    return elapsed


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,10,50,100", help="N values (default 1,10,50,100)")
    ap.add_argument("--cold-sizes", default="1,10", help="N values measured by cold boots (default 1,10)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per way for N <= 10 (default 3; 1 above)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x]
    cold_sizes = [int(x) for x in args.cold_sizes.split(",") if x]
    cores = len(__import__("os").sched_getaffinity(0))
    results: dict[str, Any] = {"host": host_facts(), "sizes": sizes, "ways": {}}
    ways: dict[str, dict[str, Any]] = {w: {} for w in ("unpooled", "pooled", "cold boot", "floor")}
    results["ways"] = ways
    argv = floor_python()
    results["floor_command"] = shlex.join(argv) if argv else None

    async with scratch_runtime("forkd-bench-fanout-") as rt:
        snap = await rt.create_snapshot(SnapshotSpec(tag="fan"))
        meta = SnapshotDir(Path(snap.dir)).read_meta()
        results["guest"] = {"accel": meta["config"]["accel"], "machine": meta["config"].get("machine"),
                            "mem_mib": meta["config"]["mem_mib"], "numpy": meta["numpy_version"]}
        print(f"accelerator {results['guest']['accel']}, {cores} cores; guest numpy {meta['numpy_version']}",
              flush=True)
        await unpooled(rt, "fan", 1)  # warm the host's page cache for the snapshot's files

        singles = [await unpooled(rt, "fan", 1, detail=True) for _ in range(5)]
        results["single_child"] = {
            "ready_s": summary([s for s, _ in singles]),
            "qemu_cpu_ms": statistics.median(i["qemu_cpu_ms_per_child"] for _, i in singles),
            "phases_s": singles[len(singles) // 2][1]["phases_s"],
            "guest_steps_us": singles[len(singles) // 2][1]["guest_steps_us"],
            "jit": singles[len(singles) // 2][1]["jit"],
        }
        print(f"one child: {results['single_child']}", flush=True)

        for n in sizes:
            reps = args.repeat if n <= 10 else 1
            runs: dict[str, list[float]] = {w: [] for w in ways}
            for _ in range(reps):  # round-robin, so host noise falls on every way alike
                runs["unpooled"].append((await unpooled(rt, "fan", n))[0])
                runs["pooled"].append(await pooled(rt, "fan", min(n, 100)))
                if argv:
                    runs["floor"].append(await floor(argv, n))
            if n in cold_sizes:
                runs["cold boot"].append(await cold_boots(rt, rt.data.root, n, cores))
            for way, samples in runs.items():
                if samples:
                    ways[way][str(n)] = summary(samples)
            line = "  ".join(f"{w} {ways[w][str(n)]['p50']:.3f} s" for w in ways if str(n) in ways[w])
            print(f"N={n:4d}: {line}", flush=True)

        # Cold boots beyond what was measured: the measured per-boot rate, times N over the cores.
        measured = [int(k) for k in ways["cold boot"]]
        if measured:
            base = max(measured)
            per_boot = ways["cold boot"][str(base)]["p50"] / -(-base // cores)
            for n in sizes:
                if str(n) not in ways["cold boot"]:
                    estimate = round(per_boot * -(-n // cores), 3)
                    ways["cold boot"][str(n)] = {"p50": estimate, "estimated": True, "from_n": base}
    write_result("fanout", results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
