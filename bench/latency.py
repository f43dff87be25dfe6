#!/usr/bin/env python3
"""Round-trip latency of one warm sandbox: ``ping``, ``eval`` and ``exec``, p50 and p99.

Measured on one child of one snapshot, in two ways, in one run:

  in-process   through ``forkd.controller.runtime.Runtime`` (what the daemon's
               routes call), so only the agent channel and the controller count
  over HTTP    through a real ``forkd daemon`` process on loopback (one
               keep-alive httpx connection, bearer token), i.e. what a client pays

The calls, each ``samples`` times after ``warmup`` unmeasured ones:

  ping                   the agent's cheapest request
  eval 1+1               Python in the warm PID 1 interpreter
  exec true              fork/exec of a tiny binary in the guest
  exec python3 -c pass   what a user without eval pays for one line of Python

The in-process runtime makes the snapshot and the child, then leaves the child
running (``close(keep_sandboxes=True)``); the daemon, started on the same data
directory, re-adopts it. So the two ways measure the very same VM, and only one
template boot is paid.

Prints a table and writes ``bench/results/latency.json``.

Usage: .venv/bin/python bench/latency.py [--samples 200] [--warmup 20] [--out PATH]
Importable: ``measure_latency(samples=..., warmup=...)`` returns the same dict.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shutil
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from common import forkd_daemon, scratch_data
from forkd.config import DataDir
from forkd.controller.runtime import Runtime, SnapshotSpec

RESULTS = Path(__file__).resolve().parent / "results"
TAG = "latency"

# name -> (HTTP route suffix, JSON body); the runtime calls are in _runtime_call.
CALLS: dict[str, tuple[str, dict[str, Any] | None]] = {
    "ping": ("ping", None),
    "eval 1+1": ("eval", {"code": "1+1"}),
    "exec true": ("exec", {"args": ["true"]}),
    "exec python3 -c pass": ("exec", {"args": ["python3", "-c", "pass"]}),
}


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)
    p99_index = min(len(ordered) - 1, max(0, round(0.99 * len(ordered)) - 1))
    return {
        "p50_ms": round(statistics.median(ordered), 3),
        "p99_ms": round(ordered[p99_index], 3),
        "min_ms": round(ordered[0], 3),
        "n": len(ordered),
    }


def _runtime_call(rt: Runtime, sandbox_id: str, name: str) -> Callable[[], Awaitable[Any]]:
    _, body = CALLS[name]
    if name == "ping":
        return lambda: rt.ping(sandbox_id)
    if name.startswith("eval"):
        assert body is not None
        return lambda: rt.eval(sandbox_id, body["code"])
    assert body is not None
    return lambda: rt.exec(sandbox_id, body["args"])


async def _time_async(call: Callable[[], Awaitable[Any]], samples: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        await call()
    out = []
    for _ in range(samples):
        started = time.perf_counter()
        await call()
        out.append((time.perf_counter() - started) * 1000)
    return out


def _time_http(http: httpx.Client, path: str, body: dict[str, Any] | None, samples: int,
               warmup: int) -> list[float]:
    def once() -> None:
        r = http.post(path, json=body)
        r.raise_for_status()

    for _ in range(warmup):
        once()
    out = []
    for _ in range(samples):
        started = time.perf_counter()
        once()
        out.append((time.perf_counter() - started) * 1000)
    return out


def _samples_for(name: str, samples: int) -> int:
    # A python3 start costs ~0.1-0.3 s under TCG: fewer samples keep the run short.
    return max(10, samples // 10) if "python3" in name else samples


async def _in_process(data: DataDir, samples: int, warmup: int) -> tuple[str, dict[str, Any]]:
    rt = await Runtime.open(data)
    try:
        await rt.create_snapshot(SnapshotSpec(tag=TAG, boot_wait_secs=300))
        [sb] = await rt.spawn(TAG, 1)
        figures = {}
        for name in CALLS:
            n = _samples_for(name, samples)
            figures[name] = percentiles(await _time_async(_runtime_call(rt, sb.id, name), n, warmup))
            print(f"  in-process {name:22} {figures[name]}", flush=True)
    except BaseException:
        await rt.close()
        raise
    await rt.close(keep_sandboxes=True)
    return sb.id, figures


def _over_http(data: DataDir, sandbox_id: str, samples: int, warmup: int) -> dict[str, Any]:
    token = secrets.token_hex(16)
    token_file = data.root / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    # The daemon kills its sandboxes on the way out.
    with forkd_daemon(data, token_file, data.root / "daemon.log",
                      extra_args=("--log-level", "warning")) as daemon:
        figures = {}
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=daemon.url, headers=headers, timeout=120) as http:
            for name, (route, body) in CALLS.items():
                n = _samples_for(name, samples)
                path = f"/v1/sandboxes/{sandbox_id}/{route}"
                figures[name] = percentiles(_time_http(http, path, body, n, warmup))
                print(f"  over HTTP  {name:22} {figures[name]}", flush=True)
        return figures


def measure_latency(samples: int = 200, warmup: int = 20) -> dict[str, Any]:
    """Boot one template, fork one child, measure both ways; returns the figures (see module doc)."""
    data = scratch_data("forkd-lat-")
    try:
        sandbox_id, in_process = asyncio.run(_in_process(data, samples, warmup))
        over_http = _over_http(data, sandbox_id, samples, warmup)
    finally:
        shutil.rmtree(data.root, ignore_errors=True)
    return {
        "benchmark": "latency",
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                 "accel": os.environ.get("FORKD_ACCEL", "auto"), "python": platform.python_version(),
                 # Other work on the host skews the figures: say how busy it was.
                 "load_average_1m_at_end": round(os.getloadavg()[0], 2)},
        "samples": samples,
        "warmup": warmup,
        "in_process": in_process,
        "over_http": over_http,
        "measured_at_unix": int(time.time()),
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"\n{'call':24} {'in-process p50/p99 ms':>24} {'HTTP p50/p99 ms':>20}")
    for name in CALLS:
        a, b = result["in_process"][name], result["over_http"][name]
        print(f"{name:24} {a['p50_ms']:>11.2f} / {a['p99_ms']:<10.2f} "
              f"{b['p50_ms']:>8.2f} / {b['p99_ms']:<8.2f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200, help="measured calls per figure")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured calls first")
    parser.add_argument("--out", type=Path, default=RESULTS / "latency.json")
    args = parser.parse_args(argv)
    result = measure_latency(args.samples, args.warmup)
    print_table(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
