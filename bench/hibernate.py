#!/usr/bin/env python3
"""Hibernation: how long a sandbox is stopped, what it takes on disk, how fast it wakes.

``--n`` children (default 20) of a warm numpy template each run a small eval that
leaves state behind (a variable, a numpy array), then are hibernated one after
another, then woken one after another by an eval that reads that state back:

  pause ms               from the VM's stop to its state on disk (the Hibernator's
                         own measure, ``hibernation.pause_ms``), and the whole
                         ``hibernate`` call
  disk per sandbox       its changed pages compressed plus its device state (the
                         run directory's ``hibernation/``; its disk layers are not
                         counted: they are there whether or not it hibernates)
  wake to first answer   from the eval's call to its answer, the wake included

Prints, and writes bench/results/hibernate.json.

Usage: .venv/bin/python bench/hibernate.py [--n 20] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from common import host_facts, scratch_runtime, summary, write_result
from forkd.controller.runtime import Runtime, SnapshotSpec

SMALL_EVAL = "import numpy as np; mark = {mark!r}; a = np.arange(100_000); total = int(a.sum()); total"


async def measure(rt: Runtime, n: int) -> dict[str, Any]:
    await rt.create_snapshot(SnapshotSpec(tag="bench", boot_wait_secs=240))
    ids: list[str] = []
    for start in range(0, n, 10):  # in batches: restoring is CPU-bound on 2 cores
        ids += [sb.id for sb in await rt.spawn("bench", min(10, n - start))]
    for sb_id in ids:
        out = await rt.eval(sb_id, SMALL_EVAL.format(mark=sb_id))
        assert out["exit_code"] == 0, out
    pause_ms, call_ms, disk_mib, pages = [], [], [], []
    for sb_id in ids:
        started = time.monotonic()
        record = await rt.hibernation.hibernate(sb_id)
        call_ms.append((time.monotonic() - started) * 1000)
        assert record.hibernation is not None
        pause_ms.append(record.hibernation.pause_ms)
        pages.append(float(record.hibernation.pages))
        saved = Path(record.dir) / "hibernation"
        disk_mib.append(sum(p.stat().st_blocks * 512 for p in saved.iterdir()) / (1 << 20))
    wake_ms = []
    for sb_id in ids:
        started = time.monotonic()
        out = await rt.eval(sb_id, "mark, total")
        wake_ms.append((time.monotonic() - started) * 1000)
        assert out["exit_code"] == 0 and out["result"] == repr((sb_id, 4999950000)), out
    timings = [rt.get_sandbox(i).timings for i in ids]
    ready_ms = [t["wake_ready_s"] * 1000 for t in timings if "wake_ready_s" in t]
    return {
        "n": n,
        "pause_ms": summary(pause_ms, 1), "hibernate_call_ms": summary(call_ms, 1),
        "disk_mib_per_sandbox": summary(disk_mib, 3), "changed_pages": summary(pages, 0),
        "wake_to_first_answer_ms": summary(wake_ms, 1),
        "wake_ready_ms": summary(ready_ms, 1) if ready_ms else None,
    }


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--out")
    args = parser.parse_args()
    facts = host_facts()
    async with scratch_runtime("forkd-bench-hib-") as rt:
        results = await measure(rt, args.n)
    results = {"host": facts, **results}
    wake = results["wake_to_first_answer_ms"]
    print(f"n={results['n']}: pause {results['pause_ms']['p50']} ms p50 (the call "
          f"{results['hibernate_call_ms']['p50']} ms), disk {results['disk_mib_per_sandbox']['p50']} MiB "
          f"median per sandbox ({results['changed_pages']['p50']:.0f} changed pages), wake to first answer "
          f"p50 {wake['p50']} ms, p99 {wake['p99']} ms")
    write_result("hibernate", results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
