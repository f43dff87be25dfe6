#!/usr/bin/env python3
"""``make bench``: every benchmark in one run, then docs/PERFORMANCE.md regenerated.

Each part runs as its own process under its own time limit, inside one scratch
directory (``FORKD_BENCH_SCRATCH``) that every part's data dirs live in. A part
that fails or runs out of time is stopped (SIGTERM, its own clean-up, then
SIGKILL), and whatever VM it left is killed by that directory's path alone (never
another user's VMs); the run goes on with the next part, and the report is made
from every result there is. The whole run stays under ``--budget-minutes``.

Usage: .venv/bin/python bench/run_all.py [--only fanout,density] [--budget-minutes 16.5]
                                         [--capacity]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import RESULTS, kill_qemus_under
from forkd.host.shm import ShmMemory

HERE = Path(__file__).resolve().parent
# name, arguments, time limit in seconds (what it needs on a quiet 2-core host, with room).
PARTS: list[tuple[str, list[str], float]] = [
    ("fanout", [], 330),
    ("density", [], 240),
    ("latency", [], 150),
    ("branch", ["--repeat", "3", "--dirty", "0,200", "--consecutive", "4"], 240),
    ("fork_running", ["--repeat", "2"], 150),
    ("travel", [], 150),
    ("network_setup", ["--children", "100"], 150),
    ("control_plane", [], 240),  # three daemons side by side (parser, fast path)
    ("control_plane_rows", [], 150),
]
# The reserve leaves other users of a shared host room; on a dedicated host lower it
# (bench/density.py --capacity --reserve-mib 1024).
CAPACITY = ("density", ["--sizes", "10", "--no-knobs", "--capacity", "--capacity-minutes", "10",
                        "--reserve-mib", "4096", "--out", str(RESULTS / "density_capacity_run.json")], 720)


def hibernation_capacity(n: int) -> tuple[str, list[str], float]:
    """The capacity probe's second part: ``n`` sandboxes held, all but 100 hibernated (about a
    second each on a 2-core TCG host, so the limit grows with ``n``)."""
    return ("hibernate_scale", ["--n", str(n), "--running", str(min(100, n))], 600 + 3 * n)
GRACE_S = 60  # after SIGTERM, for a part's own clean-up (it kills its VMs and removes its files)
REPORT_S = 60


def run_part(name: str, args: list[str], limit: float, scratch: Path) -> dict[str, object]:
    env = {**os.environ, "FORKD_BENCH_SCRATCH": str(scratch), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, str(HERE / f"{name}.py"), *args]
    print(f"\n=== {name} (at most {limit:.0f} s): {' '.join(argv[1:])}", flush=True)
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=HERE.parent, start_new_session=True)
    status = "ok"
    try:
        code = proc.wait(timeout=limit)
        if code != 0:
            status = f"failed (exit {code})"
    except subprocess.TimeoutExpired:
        status = f"stopped after {limit:.0f} s"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    except BaseException:  # Ctrl-C of the runner: the part goes too, then the clean-up below
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=GRACE_S)
        raise
    finally:
        leftovers = clean(scratch)
        if leftovers:
            print(f"killed {len(leftovers)} QEMU(s) {name} left behind", flush=True)
    seconds = time.monotonic() - started
    print(f"=== {name}: {status} in {seconds:.0f} s", flush=True)
    return {"part": name, "status": status, "seconds": round(seconds, 1)}


def clean(scratch: Path) -> list[int]:
    """Kill every QEMU under ``scratch`` and remove what the parts left there and on /dev/shm."""
    killed = kill_qemus_under(scratch)
    for sub in scratch.iterdir() if scratch.is_dir() else []:
        shm = ShmMemory(sub).dir
        if shm.exists():
            killed += kill_qemus_under(shm)
            shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(sub, ignore_errors=True)
    return killed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated parts (default: all)")
    ap.add_argument("--budget-minutes", type=float, default=16.5, help="the whole run's bound (default 16.5)")
    ap.add_argument("--capacity", action="store_true",
                    help="only the opt-in capacity probes, then the report: idle children held (up to 1000; "
                    "~12 min), then --hibernate-n sandboxes held, all but 100 hibernated")
    ap.add_argument("--hibernate-n", type=int, default=1000,
                    help="sandboxes the hibernation probe holds (default 1000, about 20 min; 10000 takes "
                    "hours)")
    args = ap.parse_args()
    only = [x for x in args.only.split(",") if x]
    capacity = [CAPACITY, hibernation_capacity(args.hibernate_n)]
    parts = capacity if args.capacity else [p for p in PARTS if not only or p[0] in only]
    budget = args.budget_minutes * 60 if not args.capacity else sum(p[2] for p in capacity) + REPORT_S
    deadline = time.monotonic() + budget
    scratch = Path(tempfile.mkdtemp(prefix="fkb-", dir="/tmp"))  # short: QEMU's socket paths
    record: list[dict[str, object]] = []
    try:
        for name, part_args, limit in parts:
            left = deadline - time.monotonic() - REPORT_S
            if left < 30:
                record.append({"part": name, "status": "skipped (no time left in the budget)", "seconds": 0})
                continue
            record.append(run_part(name, part_args, min(limit, left), scratch))
    finally:
        ran = list(record)
        clean(scratch)
        shutil.rmtree(scratch, ignore_errors=True)
        if args.capacity:
            with contextlib.suppress(OSError):
                (RESULTS / "density_capacity_run.json").unlink()
        else:
            RESULTS.mkdir(parents=True, exist_ok=True)
            # A partial run (--only) keeps the earlier run's record of the other parts.
            if only:
                with contextlib.suppress(OSError, ValueError):
                    done = {r["part"] for r in record}
                    earlier = json.loads((RESULTS / "run.json").read_text()).get("parts", [])
                    record = [r for r in earlier if r["part"] not in done] + record
            run = {"parts": record, "budget_s": budget, "measured_at_unix": int(time.time())}
            (RESULTS / "run.json").write_text(json.dumps(run, indent=2) + "\n")
    report = subprocess.run([sys.executable, str(HERE / "report.py")], cwd=HERE.parent)
    failed = [r for r in ran if r["status"] != "ok"]
    for r in failed:
        print(f"part {r['part']}: {r['status']}", file=sys.stderr)
    return 1 if failed or report.returncode else 0


if __name__ == "__main__":
    sys.exit(main())
