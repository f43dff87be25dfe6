#!/usr/bin/env python3
"""Control-plane throughput: many concurrent clients against one daemon, and what each
request costs the daemon in CPU.

A real ``forkd daemon`` process on loopback with 8 children of one snapshot. ``wrk``
(Debian's) drives it with ``--connections`` keep-alive connections from 2 threads for
``--seconds``, each request a ``POST …/eval {"code": "1+1"}`` (or ``…/ping``) sent
round-robin to the 8 children. Reported side by side, per call:

  req/s, p50 and p99 latency     wrk's own figures (``--latency``)
  daemon CPU per request         the daemon process's user + system time over the run
                                 (from /proc), divided by the requests wrk completed
  daemon cores                   that CPU time over the wall time

plus one client's sequential eval p50 (one keep-alive httpx connection), for scale.

Side by side, once per daemon configuration (``--daemons``), each a daemon of its own over the
same snapshot: the default (httptools, with the fast path for plain JSON routes), the same with
``--no-fast-path`` (every request through FastAPI's routing), and h11 (the pure-Python parser).

Prints a table and writes ``bench/results/control_plane.json`` (the first configuration's figures
at the top level, every one's under ``by_daemon``).

Usage: .venv/bin/python bench/control_plane.py [--seconds 20] [--connections 64] [--children 8]
                                               [--daemons httptools,httptools:no-fast-path,h11]
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from common import cpu_ms, forkd_daemon, host_facts, kill_qemus_under, scratch_data, write_result
from forkd.config import DataDir

TAG = "cp"
CALLS = {"eval": '{"code": "1+1"}', "ping": ""}

LUA = """
local paths = {%(paths)s}
local i = 0
request = function()
  i = i %% #paths + 1
  return wrk.format("POST", paths[i], nil, %(body)s)
end
"""


def wrk_ms(text: str) -> float:
    """wrk's latency cell (``812.00us``, ``1.20ms``, ``2.01s``) in ms."""
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    if not m:
        raise ValueError(f"unexpected wrk latency {text!r}")
    return float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[m.group(2)]


def run_wrk(url: str, token: str, paths: list[str], body: str, seconds: int, connections: int,
            pid: int, scratch: Path) -> dict[str, Any]:
    script = scratch / "round_robin.lua"
    script.write_text(LUA % {"paths": ", ".join(json.dumps(p) for p in paths),
                             "body": json.dumps(body) if body else "nil"})
    argv = ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script),
            "-H", f"Authorization: Bearer {token}", "-H", "Content-Type: application/json", url]
    cpu_before, wall_before = cpu_ms(pid), time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
    cpu_used, wall = cpu_ms(pid) - cpu_before, time.monotonic() - wall_before
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    latency = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", out, re.M))
    return {
        "requests": requests, "non_2xx": int(errors.group(1)) if errors else 0,
        "req_per_s": round(requests / seconds, 1),
        "p50_ms": round(wrk_ms(latency["50"]), 2), "p99_ms": round(wrk_ms(latency["99"]), 2),
        "daemon_cpu_ms_per_request": round(cpu_used / max(1, requests), 3),
        "daemon_cores": round(cpu_used / 1000 / wall, 2),
    }


def one_client_eval_p50(client: httpx.Client, sandbox_id: str, samples: int = 200) -> float:
    times: list[float] = []
    for _ in range(samples + 20):
        started = time.perf_counter()
        r = client.post(f"/v1/sandboxes/{sandbox_id}/eval", json={"code": "1+1"})
        r.raise_for_status()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times[20:]), 3)


def daemon_args(config: str) -> tuple[str, ...]:
    """``httptools`` or ``h11``, optionally ``:no-fast-path``: the daemon's flags for it."""
    parser, _, option = config.partition(":")
    return ("--http-parser", parser, *(("--no-fast-path",) if option == "no-fast-path" else ()))


def one_daemon(data: DataDir, scratch: Path, token: str, config: str,
               args: argparse.Namespace) -> dict[str, Any]:
    """A daemon of ``config``: its children, wrk's figures per call, one client's p50."""
    with forkd_daemon(data, scratch / "token", scratch / f"daemon-{config}.log", timeout_s=90,
                      extra_args=daemon_args(config)) as daemon, \
            httpx.Client(base_url=daemon.url, headers={"Authorization": f"Bearer {token}"},
                         timeout=300) as c:
        if c.get(f"/v1/snapshots/{TAG}").status_code == 404:  # made by the first daemon only
            c.post("/v1/snapshots", json={"tag": TAG, "boot_wait_secs": 240}).raise_for_status()
        kids = c.post("/v1/sandboxes", json={"snapshot_tag": TAG, "n": args.children}).json()
        ids = [k["id"] for k in kids]
        for sb in ids:  # warm each child's request path (TCG translates on first use)
            for _ in range(5):
                c.post(f"/v1/sandboxes/{sb}/eval", json={"code": "1+1"}).raise_for_status()
        figures: dict[str, Any] = {}
        for name, body in CALLS.items():
            paths = [f"/v1/sandboxes/{sb}/{name}" for sb in ids]
            figures[name] = run_wrk(daemon.url, token, paths, body, args.seconds, args.connections,
                                    daemon.process.pid, scratch)
        figures["one_client_eval_p50_ms"] = one_client_eval_p50(c, ids[0])
        for sb in ids:
            c.delete(f"/v1/sandboxes/{sb}")
        return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--children", type=int, default=8)
    ap.add_argument("--daemons", default="httptools,httptools:no-fast-path,h11",
                    help="daemon configurations to compare, the default's first: an --http-parser "
                    "value, with ':no-fast-path' for --no-fast-path")
    ap.add_argument("--out")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        print("wrk is not installed: apt-get install wrk (make bench installs it)", file=sys.stderr)
        return 2
    data = scratch_data("fkd-cp-")
    scratch = Path(tempfile.mkdtemp(prefix="fkd-cp-wrk-"))
    token = secrets.token_hex(16)
    (scratch / "token").write_text(token)
    (scratch / "token").chmod(0o600)
    configs = [c for c in args.daemons.split(",") if c]
    results: dict[str, Any] = {"seconds": args.seconds, "connections": args.connections,
                               "children": args.children, "host": host_facts(), "by_daemon": {}}
    try:
        for config in configs:
            results["by_daemon"][config] = one_daemon(data, scratch, token, config, args)
    finally:
        kill_qemus_under(data.root)
        shutil.rmtree(data.root, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
    results.update(results["by_daemon"][configs[0]])  # the default's figures where report.py reads them
    print(f"\ncontrol plane: wrk -t2 -c{args.connections} -d{args.seconds}s, round-robin over "
          f"{args.children} children")
    print(f"{'daemon':<24} {'call':<6} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'daemon ms CPU/req':>18} "
          f"{'daemon cores':>13}")
    for config, figures in results["by_daemon"].items():
        for name in CALLS:
            r = figures[name]
            print(f"{config:<24} {name:<6} {r['req_per_s']:>8} {r['p50_ms']:>8} {r['p99_ms']:>8} "
                  f"{r['daemon_cpu_ms_per_request']:>18} {r['daemon_cores']:>13}")
        print(f"{config:<24} one client's sequential eval p50: {figures['one_client_eval_p50_ms']} ms")
    write_result("control_plane", results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
