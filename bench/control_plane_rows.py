#!/usr/bin/env python3
"""The control plane with thousands of sandbox rows: start-up, list pages, GET by id, metrics.

A real ``forkd daemon`` process on loopback over a scratch data dir whose registry
holds ``--rows`` hibernated sandboxes. The rows are **synthetic**: written with the
registry's own API (``SandboxRows.insert``), each with a run directory, but no VM
behind any of them (hibernating 10,000 real ones takes hours on this host). What
this measures is therefore the daemon's own work per row (recovery at start,
registry reads, serialisation), not waking a sandbox: bench/hibernate.py does that.

Reported, side by side for each start (the first start, then a restart):

  serving after start   from the process's spawn to the first 200 of /healthz
  list page p50/p99     GET /v1/sandboxes?limit=100 (first page, and a page from the middle)
  list all              GET /v1/sandboxes, every row
  get p50/p99           GET /v1/sandboxes/{id} of random rows
  metrics p50           GET /metrics

Prints a table and writes ``bench/results/control_plane_rows.json``.

Usage: .venv/bin/python bench/control_plane_rows.py [--rows 10000] [--samples 200]
"""

from __future__ import annotations

import argparse
import random
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from common import forkd_daemon, host_facts, scratch_data, summary, write_result
from forkd.config import DataDir
from forkd.host.accel import Accel, VMConfig
from forkd.store.records import DiskChain, Hibernation, SandboxRecord
from forkd.store.registry import Registry


def write_rows(data: DataDir, n: int) -> list[str]:
    """``n`` hibernated sandbox rows (and their run dirs), 50 per second of creation time."""
    registry = Registry(data.registry)
    data.sandboxes.mkdir(parents=True, exist_ok=True)
    ids = []
    start = int(time.time()) - n // 50 - 1
    for i in range(n):
        sid = f"sb-{i // 10000:06x}-{i % 10000:04d}"
        run_dir = data.sandboxes / sid
        run_dir.mkdir()
        record = SandboxRecord(id=sid, snapshot_tag="py", dir=str(run_dir), created_at_unix=start + i // 50,
                               config=VMConfig(512, 1, Accel.tcg()), disk=DiskChain.fresh(run_dir, "py"),
                               pid=None, metadata={"conversation": str(i)})
        record.hibernation = Hibernation(at_unix=float(start), pages=200, memory_bytes=800_000,
                                         devices_bytes=40_000, pause_ms=30.0)
        registry.sandboxes.insert(record)
        ids.append(sid)
    registry.close()
    return ids


def timed(client: httpx.Client, path: str, samples: int) -> dict[str, Any]:
    times = []
    for _ in range(samples):
        t = time.perf_counter()
        client.get(path).raise_for_status()
        times.append((time.perf_counter() - t) * 1000)
    return summary(times, 2)


def one_start(data: DataDir, scratch: Path, token: str, ids: list[str], samples: int) -> dict[str, Any]:
    with forkd_daemon(data, scratch / "token", scratch / "daemon.log", timeout_s=300) as daemon, \
            httpx.Client(base_url=daemon.url, headers={"Authorization": f"Bearer {token}"}, timeout=300) as c:
        serving_s = daemon.serving_s
        listed = c.get("/v1/sandboxes", params={"limit": 100}).json()
        assert len(listed) == min(100, len(ids)) and listed[0]["state"] == "hibernated", listed[:1]
        middle = ids[len(ids) // 2]
        rng = random.Random(7)
        get_times = []
        for _ in range(samples):
            t = time.perf_counter()
            c.get(f"/v1/sandboxes/{rng.choice(ids)}").raise_for_status()
            get_times.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        every = c.get("/v1/sandboxes").json()
        list_all_ms = (time.perf_counter() - t) * 1000
        assert len(every) == len(ids), len(every)
        return {
            "serving_after_start_s": round(serving_s, 3),
            "list_first_page_ms": timed(c, "/v1/sandboxes?limit=100", samples),
            "list_middle_page_ms": timed(c, f"/v1/sandboxes?limit=100&after={middle}", samples),
            "list_all_ms": round(list_all_ms, 1),
            "get_ms": summary(get_times, 2),
            "metrics_ms": timed(c, "/metrics", max(10, samples // 10)),
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10000)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--out")
    args = ap.parse_args()
    data = scratch_data("fkd-rows-")
    scratch = Path(tempfile.mkdtemp(prefix="fkd-rows-"))
    token = secrets.token_hex(16)
    (scratch / "token").write_text(token)
    (scratch / "token").chmod(0o600)
    try:
        t = time.perf_counter()
        ids = write_rows(data, args.rows)
        print(f"wrote {len(ids)} synthetic hibernated rows in {time.perf_counter() - t:.1f} s", flush=True)
        runs = {"start": one_start(data, scratch, token, ids, args.samples),
                "restart": one_start(data, scratch, token, ids, args.samples)}
    finally:
        shutil.rmtree(data.root, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
    results: dict[str, Any] = {"rows": args.rows, "samples": args.samples, "synthetic_rows": True,
                               "host": host_facts(), **runs}
    print(f"\n{args.rows} hibernated rows (synthetic, no VMs), {args.samples} samples per call")
    print(f"{'':<34} {'start':>10} {'restart':>10}")
    rows: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
            ("serving after start (s)", lambda r: r["serving_after_start_s"]),
            ("GET ?limit=100 first page p50 (ms)", lambda r: r["list_first_page_ms"]["p50"]),
            ("GET ?limit=100 middle page p50 (ms)", lambda r: r["list_middle_page_ms"]["p50"]),
            ("GET ?limit=100 first page p99 (ms)", lambda r: r["list_first_page_ms"]["p99"]),
            ("GET every row (ms)", lambda r: r["list_all_ms"]),
            ("GET /v1/sandboxes/{id} p50 (ms)", lambda r: r["get_ms"]["p50"]),
            ("GET /metrics p50 (ms)", lambda r: r["metrics_ms"]["p50"])]
    for label, pick in rows:
        print(f"{label:<34} {pick(runs['start']):>10} {pick(runs['restart']):>10}")
    write_result("control_plane_rows", results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
