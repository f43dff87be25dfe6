#!/usr/bin/env python3
"""Diff: how fast a child's changes are found from its disk layers on a big tree.

A parent fills its disk with a tree (``--files`` files, ``--mib`` MiB in all, on the guest's
2 GiB root disk), is forked, and the child changes three files (one edited, one added, one
deleted). Then ``--n`` diffs of the child against its snapshot are timed (the guest's freeze, the
layer map, the exports and debugfs included), and one against a sibling, plus the patch.

Prints, and writes bench/results/diff.json.

Usage: .venv/bin/python bench/diff.py [--files 3000] [--mib 300] [--n 5] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from common import host_facts, scratch_runtime, summary, write_result
from forkd.controller.options import ForkOptions
from forkd.controller.runtime import Runtime, SnapshotSpec

FILL = ("import os\nfor d in range({dirs}):\n    os.makedirs(f'/data/d{{d}}', exist_ok=True)\n"
        "    for f in range({per_dir}):\n        with open(f'/data/d{{d}}/f{{f}}', 'wb') as out:\n"
        "            out.write(os.urandom({size}))\nos.sync()\nprint('ok')\n")
CHANGE = "echo edit >> /data/d0/f0 && echo new > /data/d1/new.txt && rm /data/d2/f1 && sync"


async def measure(rt: Runtime, files: int, mib: int, n: int) -> dict[str, Any]:
    await rt.create_snapshot(SnapshotSpec(tag="bench", boot_wait_secs=240))
    [parent] = await rt.spawn("bench", 1)
    dirs = max(1, files // 100)
    fill = FILL.format(dirs=dirs, per_dir=files // dirs, size=(mib << 20) // files)
    out = await rt.exec(parent.id, ["python3", "-c", fill], timeout_secs=900)
    assert out["exit_code"] == 0, out
    report = await rt.fork(parent.id, 2, ForkOptions())
    child, sibling = (c.id for c in report.children)
    out = await rt.exec(child, ["sh", "-c", CHANGE])
    assert out["exit_code"] == 0, out
    parent_ms, sibling_ms = [], []
    for _ in range(n):
        started = time.monotonic()
        diff = await rt.diffs.diff(child)
        parent_ms.append((time.monotonic() - started) * 1000)
        found = sorted(c["path"] for c in diff["added"] + diff["modified"] + diff["deleted"])
        assert found == ["/data/d0/f0", "/data/d1/new.txt", "/data/d2/f1"], diff
    for _ in range(n):
        started = time.monotonic()
        await rt.diffs.diff(child, f"sandbox:{sibling}")
        sibling_ms.append((time.monotonic() - started) * 1000)
    started = time.monotonic()
    patch = await rt.diffs.render(child, "parent", "patch")
    patch_ms = (time.monotonic() - started) * 1000
    for sandbox_id in (child, sibling, parent.id):
        await rt.kill(sandbox_id)
    return {"files": files, "mib": mib, "changed_files": 3, "n": n,
            "diff_against_parent_ms": summary(parent_ms, 1),
            "diff_against_sibling_ms": summary(sibling_ms, 1),
            "patch_ms": round(patch_ms, 1), "patch_bytes": len(patch)}


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--mib", type=int, default=300)
    parser.add_argument("--n", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    facts = host_facts()
    async with scratch_runtime("forkd-bench-diff-") as rt:
        results = await measure(rt, args.files, args.mib, args.n)
    results = {"host": facts, **results}
    print(f"{results['files']} files, {results['mib']} MiB; 3 changed: diff against the snapshot p50 "
          f"{results['diff_against_parent_ms']['p50']} ms, against a sibling p50 "
          f"{results['diff_against_sibling_ms']['p50']} ms, patch {results['patch_ms']} ms")
    write_result("diff", results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
