#!/usr/bin/env python3
"""A fork spread over a fleet against the same fork on one host, and what the gateway adds.

A fleet on this machine: etcd and moto's S3 server (the services the tests start), three
``forkd daemon`` hosts with their own data dirs, registered under leases, and one
``forkd gateway``. A template is booted on h1 and a source sandbox spawned from it makes a
64 MiB numpy array. Then, side by side, each until every child has answered an eval that
reads every page of that array (so no lazily missing page can hide):

* **one host**: ``fork(count)`` through the gateway, every child on the source's host;
* **spread**: ``fork(count, spread=true)``: the source's host branches and takes its share,
  the branch is pushed to the store, and the other hosts start theirs lazily from it.

All three hosts share this machine's cores, so a spread fork cannot be faster here: what this
measures is what spreading costs (the push, the lazy starts), not the capacity it adds on
separate machines. Also the gateway's added latency, ``--calls`` times through the gateway and
straight to the host, p50 and p99: forkd's ``eval`` of ``1 + 1``, and E2B's published Python SDK's
``commands.run("true")`` (in .venv-clients, as the tests use it; left out if that is missing),
in a sandbox of a ``base`` template on h1. And a named volume's lookup: ``GET /v1/volumes/{name}``
of a volume on h1, through the gateway (which finds h1 in the hosts' records) and direct, and of
a name no host holds (the gateway asks every host before the first one answers its 404).

Prints, and writes bench/results/fleet.json.

Usage: .venv/bin/python bench/fleet.py [--count 20] [--calls 50] [--out PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from common import (
    forkd_daemon,
    forkd_process,
    free_port,
    host_facts,
    kill_qemus_under,
    scratch_data,
    summary,
    write_result,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.integration.services import environ, etcd_server, s3_server  # noqa: E402

HOSTS = ("h1", "h2", "h3")
ARRAY = "import numpy as np; arr = np.arange(8 << 20, dtype=np.int64)"  # 64 MiB, made before the fork
READ_IT = "int(arr.sum())"  # touches every page of it
EXPECTED = str((8 << 20) * ((8 << 20) - 1) // 2)


@contextlib.contextmanager
def gateway(etcd: str, token_file: Path, log: Path) -> Iterator[str]:
    port = free_port()
    with forkd_process(["gateway", "--etcd", etcd, "--bind", f"127.0.0.1:{port}",
                        "--token-file", str(token_file)], f"http://127.0.0.1:{port}", log) as served:
        yield served.url


def ok(response: httpx.Response) -> Any:
    if response.status_code >= 300:
        raise RuntimeError(f"{response.request.method} {response.request.url.path}: "
                           f"{response.status_code} {response.text[:500]}")
    return response.json()


def fork_until_answered(c: httpx.Client, source: str, count: int, *, spread: bool) -> dict[str, Any]:
    """Fork ``count`` children of ``source`` and wait until each has read the inherited array."""
    started = time.perf_counter()
    report = ok(c.post(f"/v1/sandboxes/{source}/fork", json={"count": count, "spread": spread},
                       timeout=1800))
    forked_s = time.perf_counter() - started
    children = [child["id"] for child in report["children"]]

    def answer(child: str) -> bool:
        return bool(ok(c.post(f"/v1/sandboxes/{child}/eval", json={"code": READ_IT},
                              timeout=900))["result"] == EXPECTED)

    with ThreadPoolExecutor(max_workers=min(len(children), 20) or 1) as pool:
        answered = sum(pool.map(answer, children))
    total_s = time.perf_counter() - started
    hosts: dict[str, int] = {}
    for child in children:
        host = child.split("-")[1]
        hosts[host] = hosts.get(host, 0) + 1
    for child in children:
        c.delete(f"/v1/sandboxes/{child}", timeout=120)
    with contextlib.suppress(httpx.HTTPError):
        c.delete(f"/v1/snapshots/{report['snapshot_tag']}", timeout=120)
    return {"fork_s": round(forked_s, 3), "all_answered_s": round(total_s, 3), "children": len(children),
            "answered": answered, "failed": len(report["errors"]), "per_host": hosts,
            "errors": [e["error"][:200] for e in report["errors"][:3]]}


def eval_latency(url: str, token: str, sandbox: str, calls: int) -> dict[str, Any]:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
        ok(c.post(f"/v1/sandboxes/{sandbox}/eval", json={"code": "1 + 1"}))  # warm the connection
        samples = []
        for _ in range(calls):
            t0 = time.perf_counter()
            ok(c.post(f"/v1/sandboxes/{sandbox}/eval", json={"code": "1 + 1"}))
            samples.append((time.perf_counter() - t0) * 1000)
    return summary(samples, 3)


def get_latency(url: str, token: str, path: str, calls: int, status: int = 200) -> dict[str, Any]:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
        c.get(path)  # warm the connection
        samples = []
        for _ in range(calls):
            t0 = time.perf_counter()
            answer = c.get(path)
            samples.append((time.perf_counter() - t0) * 1000)
            if answer.status_code != status:
                raise RuntimeError(f"GET {path}: {answer.status_code} {answer.text[:300]}")
    return summary(samples, 3)


def volume_latency(c: httpx.Client, gw: str, direct: str, token: str, calls: int) -> dict[str, Any]:
    """A hostdir volume made on h1 through the gateway, looked up once h1's record names it."""
    ok(c.post("/v1/volumes", json={"name": "bench-vol", "fs": "hostdir", "size_mib": 16},
              headers={"X-Forkd-Host": "h1"}))
    try:
        deadline = time.monotonic() + 30
        while "bench-vol" not in next(h for h in ok(c.get("/v1/fleet")) if h["host_id"] == "h1")["volumes"]:
            if time.monotonic() > deadline:
                raise RuntimeError("h1's record did not name its volume")
            time.sleep(0.2)
        return {
            "through_gateway": get_latency(gw, token, "/v1/volumes/bench-vol", calls),
            "direct": get_latency(direct, token, "/v1/volumes/bench-vol", calls),
            "unknown_through_gateway": get_latency(gw, token, "/v1/volumes/no-such-vol", calls, 404),
            "unknown_direct": get_latency(direct, token, "/v1/volumes/no-such-vol", calls, 404),
        }
    finally:
        c.delete("/v1/volumes/bench-vol")


CLIENTS_PYTHON = ROOT / ".venv-clients" / "bin" / "python"
E2B_RUNS = """
import json, os, time
from e2b import Sandbox
with Sandbox.create() as sbx:
    sbx.commands.run("true")
    samples = []
    for _ in range(int(os.environ["CALLS"])):
        t0 = time.perf_counter()
        sbx.commands.run("true")
        samples.append((time.perf_counter() - t0) * 1000)
print(json.dumps(samples))
"""


def e2b_run_latency(url: str, token: str, calls: int) -> dict[str, Any]:
    """E2B's SDK pointed at ``url`` (a gateway or a host), ``commands.run("true")`` ``calls`` times."""
    env = {**os.environ, "E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": token,
           "CALLS": str(calls)}
    out = subprocess.run([str(CLIENTS_PYTHON), "-c", E2B_RUNS], env=env, capture_output=True, text=True,
                         timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"the E2B program failed: {out.stderr[-2000:]}")
    return summary(json.loads(out.stdout.strip().splitlines()[-1]), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=20, help="children per fork (default 20)")
    ap.add_argument("--calls", type=int, default=50, help="evals per latency series (default 50)")
    ap.add_argument("--out", help="where to write the JSON (default bench/results/fleet.json)")
    args = ap.parse_args()

    datas = {h: scratch_data(f"fkb-{h}-") for h in HOSTS}
    shared = scratch_data("fkb-gw-").root
    token = secrets.token_hex(32)
    token_file = shared / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    results: dict[str, Any] = {"host": host_facts(), "count": args.count}
    try:
        with etcd_server() as etcd, s3_server() as s3, environ(s3.env), contextlib.ExitStack() as stack:
            urls = {}
            for h in HOSTS:
                daemon = stack.enter_context(forkd_daemon(
                    datas[h], token_file, shared / f"{h}.log",
                    extra_args=("--host-id", h, "--etcd", etcd.url, "--store", s3.url("bench"),
                                "--lease-ttl", "10")))
                urls[h] = daemon.url
            gw = stack.enter_context(gateway(etcd.url, token_file, shared / "gateway.log"))
            with httpx.Client(base_url=gw, headers={"Authorization": f"Bearer {token}"}, timeout=600) as c:
                deadline = time.monotonic() + 60
                while {h["host_id"] for h in ok(c.get("/v1/fleet"))} != set(HOSTS):
                    if time.monotonic() > deadline:
                        raise RuntimeError("the three hosts did not all join the fleet")
                    time.sleep(0.5)
                print("booting the template on h1 ...", flush=True)
                ok(c.post("/v1/snapshots", json={"tag": "fleet-py", "boot_wait_secs": 180},
                          headers={"X-Forkd-Host": "h1"}))
                [source] = ok(c.post("/v1/sandboxes", json={"snapshot_tag": "fleet-py"}))
                ok(c.post(f"/v1/sandboxes/{source['id']}/eval", json={"code": f"exec({ARRAY!r})"}))
                for name, spread in (("one_host", False), ("spread", True)):
                    print(f"fork({args.count}) {name} ...", flush=True)
                    results[name] = fork_until_answered(c, source["id"], args.count, spread=spread)
                    print(f"  {results[name]}", flush=True)
                results["eval_ms"] = {
                    "through_gateway": eval_latency(gw, token, source["id"], args.calls),
                    "direct": eval_latency(urls["h1"], token, source["id"], args.calls),
                }
                print("volume lookups ...", flush=True)
                results["volume_get_ms"] = volume_latency(c, gw, urls["h1"], token, args.calls)
                if CLIENTS_PYTHON.exists():
                    ok(c.post("/v1/snapshots", json={"tag": "base", "boot_wait_secs": 180},
                              headers={"X-Forkd-Host": "h1"}))
                    results["e2b_commands_run_ms"] = {
                        "through_gateway": e2b_run_latency(gw, token, args.calls),
                        "direct": e2b_run_latency(urls["h1"], token, args.calls),
                    }
    finally:
        for data in (*datas.values(),):
            kill_qemus_under(data.root)
            shutil.rmtree(data.root, ignore_errors=True)
        shutil.rmtree(shared, ignore_errors=True)

    print(f"\n{'':28}{'one host':>12}{'spread':>12}")
    for key, label in (("fork_s", "fork answered (s)"), ("all_answered_s", "every child read (s)"),
                       ("failed", "children failed")):
        print(f"{label:28}{results['one_host'][key]:>12}{results['spread'][key]:>12}")
    print(f"{'children per host':28}{results['one_host']['per_host']!s:>12} "
          f"{results['spread']['per_host']!s:>12}")
    gw_ms, direct_ms = results["eval_ms"]["through_gateway"], results["eval_ms"]["direct"]
    print(f"\neval 1+1 (ms)    p50 {gw_ms['p50']:.2f} through the gateway, {direct_ms['p50']:.2f} direct; "
          f"p99 {gw_ms['p99']:.2f} / {direct_ms['p99']:.2f}")
    vol = {k: v["p50"] for k, v in results["volume_get_ms"].items()}
    print(f"GET a volume (ms)  p50 {vol['through_gateway']:.2f} through the gateway (its host in the "
          f"records), {vol['direct']:.2f} direct; a name no host holds "
          f"{vol['unknown_through_gateway']:.2f} (every host asked) / {vol['unknown_direct']:.2f}")
    if "e2b_commands_run_ms" in results:
        gw_ms, direct_ms = (results["e2b_commands_run_ms"]["through_gateway"],
                            results["e2b_commands_run_ms"]["direct"])
        print(f"E2B commands.run (ms)  p50 {gw_ms['p50']:.2f} through the gateway, {direct_ms['p50']:.2f} "
              f"direct; p99 {gw_ms['p99']:.2f} / {direct_ms['p99']:.2f}")
    write_result("fleet", results, args.out)


if __name__ == "__main__":
    main()
