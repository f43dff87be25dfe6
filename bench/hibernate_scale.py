#!/usr/bin/env python3
"""Many sandboxes held at once: most hibernated, a few running, every one listed, a sample woken.

``--n`` children of a warm numpy template are made in batches of ``--batch``. Each runs an
eval that leaves its own state behind (its id and a number only it has), and all but the
last ``--running`` are then hibernated (their QEMU, cgroup and network namespace released).
Every ``--every`` sandboxes it records what the host holds:

  held              sandboxes alive (hibernated + running), all of them listed
  host memory used  MemTotal - MemAvailable (/proc/meminfo), MiB
  disk              the data dir's sandboxes (their disk layers and saved state), MiB
  daemon RSS        this process's (the Runtime runs in it), MiB

At the end: a list of every sandbox (its count must be ``--n``), the first page of 100
(``limit=100``), and ``--sample`` random hibernated sandboxes woken, each by an eval that
reads its own earlier state (wake to first answer, p50 and p99).

Long: about a second per sandbox on a 2-core TCG host, so 10,000 take hours (``make
bench-capacity HIBERNATE_N=10000``); its disk use is about 2 MiB per sandbox. Prints and
writes bench/results/hibernate_scale.json; bench/report.py charts it in docs/PERFORMANCE.md.

Usage: .venv/bin/python bench/hibernate_scale.py [--n 1000] [--running 100] [--sample 100]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from common import host_facts, scratch_runtime, summary, write_result
from forkd.controller.runtime import Runtime, SnapshotSpec

TAG = "scale"
MARK = "import numpy as np; mark = ({sid!r}, {secret}); a = np.arange(1000) * {secret}; int(a.sum())"


def used_memory_mib() -> float:
    fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    kib = int(fields["MemTotal"].split()[0]) - int(fields["MemAvailable"].split()[0])
    return kib / 1024


def disk_mib(root: Path) -> float:
    """Allocated bytes under ``root`` (sparse files count what they hold), MiB."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):  # removed meanwhile
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total / (1 << 20)


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # peak, KiB on Linux


async def fill(rt: Runtime, n: int, running: int, batch: int,
               every: int) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Make the ``n`` sandboxes; their secrets by id, and the host's figures every ``every``."""
    secrets: dict[str, int] = {}
    points: list[dict[str, Any]] = []
    rng = random.Random(11)
    started = time.monotonic()
    columns = (TextColumn("[bold]sandboxes"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns) as progress:
        task = progress.add_task("held", total=n)
        while len(secrets) < n:
            for sb in await rt.spawn(TAG, min(batch, n - len(secrets))):
                secret = rng.randrange(1, 1 << 30)
                out = await rt.eval(sb.id, MARK.format(sid=sb.id, secret=secret))
                assert out["exit_code"] == 0, out
                if len(secrets) < n - running:
                    await rt.hibernation.hibernate(sb.id)
                secrets[sb.id] = secret
                progress.advance(task)
                if len(secrets) % every == 0 or len(secrets) == n:
                    points.append({"held": len(secrets), "seconds": round(time.monotonic() - started, 1),
                                   "memory_used_mib": round(used_memory_mib(), 1),
                                   "disk_mib": round(disk_mib(rt.data.sandboxes), 1),
                                   "daemon_rss_peak_mib": round(rss_mib(), 1)})
    return secrets, points


async def measure(rt: Runtime, n: int, running: int, sample: int, batch: int, every: int) -> dict[str, Any]:
    await rt.create_snapshot(SnapshotSpec(tag=TAG, boot_wait_secs=240))
    before = {"memory_used_mib": round(used_memory_mib(), 1),
              "disk_mib": round(disk_mib(rt.data.sandboxes), 1)}
    secrets, points = await fill(rt, n, running, batch, every)
    listed = rt.list_sandboxes()
    assert len(listed) == n, f"{len(listed)} sandboxes listed, {n} made"
    states = {state: sum(1 for sb in listed if sb.state == state) for state in ("running", "hibernated")}
    page_ms = []
    for _ in range(20):
        t = time.perf_counter()
        assert len(rt.list_sandboxes(limit=100)) == min(100, n)
        page_ms.append((time.perf_counter() - t) * 1000)
    asleep = [sb.id for sb in listed if sb.state == "hibernated"]
    chosen = random.Random(5).sample(asleep, min(sample, len(asleep)))
    wake_ms = []
    for sb_id in chosen:
        t = time.monotonic()
        out = await rt.eval(sb_id, "mark, int(a.sum())")
        wake_ms.append((time.monotonic() - t) * 1000)
        secret = secrets[sb_id]
        assert out["exit_code"] == 0 and out["result"] == repr(((sb_id, secret), 499500 * secret)), out
        await rt.hibernation.hibernate(sb_id)  # back to sleep: the host holds what it held
    return {"n": n, "running": running, "states": states, "before": before, "points": points,
            "disk_mib_per_sandbox": round((points[-1]["disk_mib"] - before["disk_mib"]) / n, 3),
            "list_page_ms": summary(page_ms, 2), "sample": len(chosen),
            "wake_to_first_answer_ms": summary(wake_ms, 1) if wake_ms else None}


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000, help="sandboxes to hold (default 1000)")
    parser.add_argument("--running", type=int, default=100, help="of those, left running (default 100)")
    parser.add_argument("--sample", type=int, default=100,
                        help="hibernated ones woken at the end (default 100)")
    parser.add_argument("--batch", type=int, default=10, help="children per spawn call (default 10)")
    parser.add_argument("--every", type=int, default=0, help="record the host every this many (default n/20)")
    parser.add_argument("--out")
    args = parser.parse_args()
    if not 0 <= args.running <= args.n:
        parser.error("--running must be between 0 and --n")
    every = args.every or max(1, args.n // 20)
    facts = host_facts()
    async with scratch_runtime("forkd-bench-scale-") as rt:
        results = await measure(rt, args.n, args.running, args.sample, args.batch, every)
    results = {"host": facts, **results}
    last = results["points"][-1]
    wake = results["wake_to_first_answer_ms"] or {}
    print(f"held {results['n']} ({results['states']}) in {last['seconds']} s; host memory used "
          f"{last['memory_used_mib']} MiB (was {results['before']['memory_used_mib']}), disk "
          f"{results['disk_mib_per_sandbox']} MiB per sandbox; list page p50 "
          f"{results['list_page_ms']['p50']} ms; {results['sample']} woken: wake to first answer p50 "
          f"{wake.get('p50')} ms, p99 {wake.get('p99')} ms")
    write_result("hibernate_scale", results, args.out)  # bench/report.py draws its chart
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
