#!/usr/bin/env python3
"""Cells on the IPython kernel: the first cell in a fresh child, and a warm cell's round trip.

Builds (or reuses) the ``code-interpreter`` image, makes one snapshot of it (the
template starts and warms its kernel before the snapshot), then, in process
through ``forkd.controller.runtime.Runtime``:

  first cell      ``1 + 1`` in each of ``children`` fresh children, timed from
                  the request to the cell's ``end`` (the child's kernel is the
                  template's, restored with it: no kernel start)
  warm cell       ``1 + 1`` again in one child, ``samples`` times
  eval 1+1        the plain ``eval`` round trip in the same child, for comparison

Prints a table and writes ``bench/results/code_cells.json``. Not part of
``run_all.py``'s default parts: the first image build takes minutes.

Usage: .venv/bin/python bench/code_cells.py [--children 5] [--samples 50] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import shutil
import time
from pathlib import Path
from typing import Any

from common import scratch_data
from forkd.controller.runtime import Runtime, SnapshotSpec
from forkd.image.builder import build_image, recipe_for

RESULTS = Path(__file__).resolve().parent / "results"
TAG = "code-cells"


def percentiles(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    return {"p50_ms": round(ordered[len(ordered) // 2], 1),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1),
            "n": len(ordered)}


async def cell_ms(rt: Runtime, sandbox_id: str, code: str) -> float:
    started = time.perf_counter()
    events = await rt.kernels.run(sandbox_id, code)
    async for event in events:
        if event["type"] == "end":
            break
    return (time.perf_counter() - started) * 1000


async def measure(children: int, samples: int) -> dict[str, Any]:
    data = scratch_data("forkd-cells-")
    build_image(data, recipe_for("code-interpreter"))
    rt = await Runtime.open(data)
    try:
        started = time.monotonic()
        await rt.create_snapshot(SnapshotSpec(tag=TAG, image="code-interpreter", mem_mib=1024,
                                              boot_wait_secs=300))
        template_s = time.monotonic() - started
        first = []
        for _ in range(children):
            [sb] = await rt.spawn(TAG, 1)
            first.append(await cell_ms(rt, sb.id, "1 + 1"))
            await rt.kill(sb.id)
        [sb] = await rt.spawn(TAG, 1)
        await cell_ms(rt, sb.id, "1 + 1")
        warm = [await cell_ms(rt, sb.id, "1 + 1") for _ in range(samples)]
        evals = []
        for _ in range(samples):
            t = time.perf_counter()
            await rt.eval(sb.id, "1 + 1")
            evals.append((time.perf_counter() - t) * 1000)
    finally:
        await rt.close()
        shutil.rmtree(data.root, ignore_errors=True)
    return {"template_s": round(template_s, 1), "first_cell": percentiles(first),
            "warm_cell": percentiles(warm), "eval": percentiles(evals),
            "host": platform.node(), "measured_at_unix": int(time.time())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--children", type=int, default=5)
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--out", type=Path, default=RESULTS / "code_cells.json")
    args = ap.parse_args()
    result = asyncio.run(measure(args.children, args.samples))
    for name in ("first_cell", "warm_cell", "eval"):
        print(f"  {name:12} {result[name]}")
    print(f"  template (boot + kernel warm-up) {result['template_s']} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
