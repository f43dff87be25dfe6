#!/usr/bin/env python3
"""Round-trip latency of a warm child: eval vs exec, p50 and p99, in-process and over HTTP.

  in-process   the Runtime's own calls (what the daemon does for each request, minus HTTP)
  HTTP         a real ``forkd daemon`` on loopback, through the Python SDK (bearer token,
               JSON, uvicorn): what a client sees

Per path, after a warm-up, sequentially: ``ping``, ``eval`` of ``1 + 1``, ``exec`` of
``true`` (the cheapest subprocess) and ``exec`` of ``python3 -c "print(1)"`` (a new
interpreter in the guest, the way a user would run a one-liner without eval).

Usage: .venv/bin/python bench/roundtrip.py [--samples 300] [--exec-samples 100]
                                           [--python-samples 30] [--no-http] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from common import host_facts, kill_qemus_under, scratch_data, scratch_runtime, summary, write_result
from forkd.controller.runtime import SnapshotSpec
from forkd.sdk import Controller

WARMUP = 20
FORKD = Path(sys.executable).with_name("forkd")
PY_ONE_LINER = ["python3", "-c", "print(1)"]


async def timed(call: Callable[[], Awaitable[Any]], n: int) -> list[float]:
    for _ in range(min(WARMUP, n)):
        await call()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - t0) * 1000)
    return samples


async def in_process(args: argparse.Namespace) -> dict[str, Any]:
    async with scratch_runtime("forkd-bench-rt-") as rt:
        await rt.create_snapshot(SnapshotSpec(tag="rt"))
        [sb] = await rt.spawn("rt", 1)
        out = {
            "ping": await timed(lambda: rt.ping(sb.id), args.samples),
            "eval": await timed(lambda: rt.eval(sb.id, "1 + 1"), args.samples),
            "exec true": await timed(lambda: rt.exec(sb.id, ["true"]), args.exec_samples),
            "exec python3 -c": await timed(lambda: rt.exec(sb.id, PY_ONE_LINER), args.python_samples),
        }
    return {k: summary(v, 3) for k, v in out.items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def over_http(args: argparse.Namespace) -> dict[str, Any]:
    data = scratch_data("fkd-rt-")
    token = secrets.token_hex(16)
    (data.root / "token").write_text(token + "\n")
    (data.root / "token").chmod(0o600)
    port = free_port()
    env = {**os.environ, "FORKD_IMAGES_DIR": str(data.images)}
    argv = [str(FORKD), "daemon", "--bind", f"127.0.0.1:{port}", "--data-dir", str(data.root),
            "--token-file", str(data.root / "token"), "--log-level", "warning"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the daemon did not start: {proc.stderr.read().decode()[-2000:]}"
                                   if proc.stderr else "the daemon did not start")
            time.sleep(0.2)
        with Controller(url, token=token) as c:
            c.create_snapshot("rt")
            [sb] = c.spawn_sandboxes("rt")

            def sync_timed(call: Callable[[], Any], n: int) -> list[float]:
                for _ in range(min(WARMUP, n)):
                    call()
                samples = []
                for _ in range(n):
                    t0 = time.perf_counter()
                    call()
                    samples.append((time.perf_counter() - t0) * 1000)
                return samples

            sid = sb["id"]
            out = {
                "ping": sync_timed(lambda: c.ping(sid), args.samples),
                "eval": sync_timed(lambda: c.eval(sid, "1 + 1"), args.samples),
                "exec true": sync_timed(lambda: c.exec(sid, ["true"]), args.exec_samples),
                "exec python3 -c": sync_timed(lambda: c.exec(sid, PY_ONE_LINER), args.python_samples),
            }
            c.kill_sandbox(sid)
        return {k: summary(v, 3) for k, v in out.items()}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        kill_qemus_under(data.root)
        shutil.rmtree(data.root, ignore_errors=True)


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=300, help="ping and eval samples per path (default 300)")
    ap.add_argument("--exec-samples", type=int, default=100, help="exec true samples (default 100)")
    ap.add_argument("--python-samples", type=int, default=30, help="exec python3 -c samples (default 30)")
    ap.add_argument("--no-http", action="store_true", help="skip the HTTP path")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    results: dict[str, Any] = {"host": host_facts(), "unit": "ms", "paths": {}}
    results["paths"]["in-process"] = await in_process(args)
    print(f"in-process: {results['paths']['in-process']}", flush=True)
    if not args.no_http:
        results["paths"]["HTTP"] = await asyncio.to_thread(over_http, args)
        print(f"HTTP: {results['paths']['HTTP']}", flush=True)
    write_result("roundtrip", results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
