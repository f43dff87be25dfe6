#!/usr/bin/env python3
"""The per-child cost of a sandbox's network: making and removing it, and what it adds to a fork.

Two measurements, in one run:

  set-up alone     ``Networks.acquire`` / ``release`` of ``--children`` networks (namespace,
                   tap, veth pair, addresses, route, nftables table; no VM), one at a time
                   and ``--parallel`` at a time (as a spawn makes them), for each egress
                   policy: denied (the default) and an allow-list of 16 entries
  fork with a NIC  ``spawn(n=1)`` from a snapshot without a NIC and from one with a NIC
                   (``--repeat`` each): the whole fork's time, and its network part

Nothing here sends a packet anywhere: the policies open only addresses of this host.
Needs root. Prints a table and writes bench/results/network_setup.json.

Usage: .venv/bin/python bench/network_setup.py [--children 200] [--parallel 8] [--repeat 5] [--no-vms]
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
from typing import Any

from common import scratch_data
from forkd.controller.network import NetRequest, Networks
from forkd.controller.runtime import Runtime, SnapshotSpec
from forkd.host import childnet, netplan
from forkd.host.egress import EgressPolicy
from forkd.host.netplan import ChildNet

RESULTS = Path(__file__).resolve().parent / "results"
POLICIES = {
    "denied (default)": EgressPolicy(),
    # Ports of the host itself (the gateway): nothing beyond the host, so no IP forwarding needed.
    "allow_out, 16 entries": EgressPolicy.from_request(None, {"allow_out": [
        f"10.201.0.1:{8000 + i}" for i in range(16)]}),
}


def ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50_ms": round(statistics.median(ordered) * 1000, 2),
            "p95_ms": round(ordered[max(0, int(len(ordered) * 0.95) - 1)] * 1000, 2),
            "max_ms": round(ordered[-1] * 1000, 2)}


async def timed(coro: Any) -> tuple[Any, float]:
    t = time.perf_counter()
    out = await coro
    return out, time.perf_counter() - t


async def setup_alone(networks: Networks, req: NetRequest, children: int, parallel: int) -> dict[str, Any]:
    """Acquire ``children`` networks ``parallel`` at a time, then release them the same way."""
    gate = asyncio.Semaphore(parallel)
    made: list[ChildNet] = []

    async def make(i: int) -> float:
        async with gate:
            net, secs = await timed(networks.acquire(f"sb-bench0-{i:04d}", req))
            made.append(net)
            return secs

    async def drop(net: ChildNet) -> float:
        async with gate:
            return (await timed(networks.release(net)))[1]

    started = time.perf_counter()
    up = list(await asyncio.gather(*(make(i) for i in range(children))))
    wall_up = time.perf_counter() - started
    started = time.perf_counter()
    down = list(await asyncio.gather(*(drop(n) for n in made)))
    wall_down = time.perf_counter() - started
    assert networks.owners() == [], networks.owners()
    return {"children": children, "parallel": parallel,
            "setup": ms(up), "teardown": ms(down),
            "setup_wall_s": round(wall_up, 3), "teardown_wall_s": round(wall_down, 3),
            "setup_per_child_wall_ms": round(wall_up / children * 1000, 2)}


async def forks(rt: Runtime, repeat: int) -> list[dict[str, Any]]:
    rows = []
    for tag, nic in (("bench-plain", False), ("bench-nic", True)):
        await rt.create_snapshot(SnapshotSpec(tag=tag, nic=nic, boot_wait_secs=300))
        totals, readies = [], []
        for _ in range(repeat):
            [sb], secs = await timed(rt.spawn(tag, 1))
            totals.append(secs)
            readies.append(sb.timings.get("ready_s", 0.0))
            await rt.kill(sb.id)
        rows.append({"snapshot": tag, "nic": nic, "runs": repeat, "spawn": ms(totals),
                     "restore_ready": ms(readies)})
    base, with_nic = rows
    rows.append({"snapshot": "difference", "nic": True, "runs": repeat,
                 "spawn_p50_added_ms": round(with_nic["spawn"]["p50_ms"] - base["spawn"]["p50_ms"], 2),
                 "outside_restore_p50_added_ms": round(
                     (with_nic["spawn"]["p50_ms"] - with_nic["restore_ready"]["p50_ms"])
                     - (base["spawn"]["p50_ms"] - base["restore_ready"]["p50_ms"]), 2)})
    return rows


def table(alone: list[dict[str, Any]], fork_rows: list[dict[str, Any]]) -> str:
    lines = [f"{'network set-up alone':32} {'children':>8} {'par':>4} {'up p50':>8} {'up p95':>8} "
             f"{'down p50':>9} {'wall/child':>10}"]
    for r in alone:
        lines.append(f"{r['policy']:32} {r['children']:>8} {r['parallel']:>4} {r['setup']['p50_ms']:>6} ms "
                     f"{r['setup']['p95_ms']:>6} ms {r['teardown']['p50_ms']:>7} ms "
                     f"{r['setup_per_child_wall_ms']:>7} ms")
    if fork_rows:
        lines.append("")
        lines.append(f"{'fork (spawn n=1)':32} {'runs':>8} {'p50':>10} {'p95':>10}")
        for r in fork_rows[:2]:
            lines.append(f"{r['snapshot'] + (' (NIC)' if r['nic'] else ''):32} {r['runs']:>8} "
                         f"{r['spawn']['p50_ms']:>7} ms {r['spawn']['p95_ms']:>7} ms")
        lines.append(f"{'a NIC adds (p50)':32} {'':>8} {fork_rows[2]['spawn_p50_added_ms']:>7} ms")
    return "\n".join(lines)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--children", type=int, default=200)
    ap.add_argument("--parallel", type=int, default=8, help="as many as a spawn restores at once")
    ap.add_argument("--repeat", type=int, default=5, help="forks per snapshot")
    ap.add_argument("--no-vms", action="store_true", help="only the set-up alone (no template boots)")
    ap.add_argument("--out", type=Path, default=RESULTS / "network_setup.json")
    args = ap.parse_args()
    if missing := childnet.missing_prerequisites():
        sys.exit(f"host networking is missing: {'; '.join(missing)}")
    data = scratch_data("forkd-bench-net-")
    rt = await Runtime.open(data)
    alone: list[dict[str, Any]] = []
    fork_rows: list[dict[str, Any]] = []
    try:
        for name, policy in POLICIES.items():
            req = await rt.networks.prepare(tap=netplan.DEFAULT_TAP, dns=("10.0.0.2",), egress=policy,
                                            per_child_netns=False, what="bench")
            assert req is not None
            for parallel in (1, args.parallel):
                row = await setup_alone(rt.networks, req, args.children, parallel)
                alone.append({"policy": name, **row})
                print(f"  {name}, {parallel} at a time: {row['setup']['p50_ms']} ms p50", flush=True)
        if not args.no_vms:
            fork_rows = await forks(rt, args.repeat)
    finally:
        await rt.close()
        shutil.rmtree(data.root, ignore_errors=True)
    result = {
        "what": "per-child network set-up (namespace, tap, veth, addresses, route, nftables) and its "
                "share of a fork",
        "host": {"machine": platform.machine(), "kernel": platform.release(), "cpus": os.cpu_count(),
                 "accel": os.environ.get("FORKD_ACCEL", "probed"),
                 "note": "shared, busy 2-core host: figures are noisy"},
        "setup_alone": alone, "forks": fork_rows,
        "measured_at_unix": int(time.time()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(alone, fork_rows))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
