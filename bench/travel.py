#!/usr/bin/env python3
"""How long a snapshot takes to travel: pack, unpack, push, pull, and a fork from the store.

One template (``--mem-mib``) and a chain of ``--depth`` branches on top of it are
made in a scratch data dir whose runtime has an object store: moto's S3 server
on loopback (the same one the tests use), so the figures are this host's CPU,
disk and loopback HTTP, not a network. Recorded:

* pack of the newest branch (with its base image) and unpack into a fresh data
  dir: seconds, archive size, and bytes read by this process while packing
  (holes are never read);
* push of the chain into an empty store, then a second push of the same chain
  (content-addressed: nothing to send);
* pull into a fresh data dir, and a spawn there of a tag that is only in the
  store (fetched by the spawn itself) until its child answers.
* side by side, each in a fresh data dir and each until the child answers an
  eval that reads inherited memory (the sum of a 64 MiB numpy array made
  before the snapshot, so no lazily missing page can hide): **eager** (the
  whole chain pulled, then the spawn), **lazy** (the spawn starts once the
  small parts are here, memory arriving through FUSE as it is touched), and
  **local** (the next spawn, everything here); with the bytes fetched from the
  store before the first answer.

Each fresh data dir starts with this host's accelerator probe result (probed
once first if it never was, and that time reported as ``accel_probe_s``), as a
host that has run forkd before has: otherwise the first import into each boots
a probe guest, which is what format 1's figures of 25 s mostly were.

Prints, and writes bench/results/travel.json, with MiB/s of archive for
unpack and pull. ``--baseline REV`` first runs the same steps with the forkd
source of git revision REV (``git archive`` into a temporary directory, in a
child process, its own VMs and S3 server), and keeps its figures under
``baseline``: before and after, side by side, from one run on one host.
Timings from a shared, busy machine are noisy: run it a few times.

Usage: .venv/bin/python bench/travel.py [--mem-mib 512] [--depth 2] [--baseline REV] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import boto3
from moto.server import ThreadedMotoServer

from common import scratch_data
from forkd.config import DataDir
from forkd.controller.runtime import Runtime, SnapshotSpec
from forkd.image.builder import load_image
from forkd.store import sparse
from forkd.vmm import probe

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
# Side by side: (key, what).
COMPARED = [("pack_s", "pack (s)"), ("archive_mib", "archive (MiB)"), ("unpack_s", "unpack (s)"),
            ("unpack_mib_per_s", "unpack (MiB/s of archive)"), ("push_s", "push (s)"),
            ("pull_s", "pull (s)"), ("pull_mib", "pulled (MiB)"), ("pull_mib_per_s", "pull (MiB/s)"),
            ("spawn_from_store_s", "spawn from the store (s)"), ("spawn_after_s", "next spawn (s)"),
            ("eager_to_answer_s", "eager pull+spawn to eval (s)"),
            ("lazy_to_answer_s", "lazy spawn to eval (s)"),
            ("local_to_answer_s", "local spawn to eval (s)"), ("eager_fetched_mib", "eager: fetched (MiB)"),
            ("lazy_fetched_mib", "lazy: fetched before answer (MiB)")]
ARRAY = "import numpy as np; arr = np.arange(8 << 20, dtype=np.int64)"  # 64 MiB, made before the snapshot
READ_IT = "int(arr.sum())"  # touches every page of it
EXPECTED = str((8 << 20) * ((8 << 20) - 1) // 2)


def rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def scratch(tag: str) -> DataDir:
    data = scratch_data(f"fkb-{tag}-")
    return DataDir(data.root, data.images)


async def timed(coro: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    result = await coro
    return result, round(time.perf_counter() - started, 3)


async def run(mem_mib: int, depth: int, store: str, workdir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    src = await Runtime.open(scratch("src"), store=store)
    roots = [src.data.root]
    try:
        await src.create_snapshot(SnapshotSpec(tag="bt-py", mem_mib=mem_mib, boot_wait_secs=300))
        tag = "bt-py"
        for i in range(depth):
            [sb] = await src.spawn(tag)
            await src.eval(sb.id, "exec('import os; ballast = os.urandom(32 << 20)')")
            if i == 0:
                await src.eval(sb.id, f"exec({ARRAY!r})")
            await src.branch(sb.id, f"bt-b{i + 1}", mode="diff")
            await src.kill(sb.id)
            tag = f"bt-b{i + 1}"
        out["chain"] = [*(["bt-py"]), *[f"bt-b{i + 1}" for i in range(depth)]]
        mem = src.snapshots.dir(tag).mem
        out["mem_logical_mib"] = mem.stat().st_size >> 20
        out["mem_data_mib"] = sparse.inspect(mem).data_bytes >> 20

        archive = workdir / "chain.forkd"
        before = rchar()
        packed, out["pack_s"] = await timed(src.travel.pack(tag, archive))
        out["pack_read_mib"] = (rchar() - before) >> 20
        out["archive_mib"] = round(packed["bytes"] / 2**20, 1)
        dest = await Runtime.open(scratch("unpack"))
        roots.append(dest.data.root)
        _, out["unpack_s"] = await timed(dest.travel.unpack(archive))
        await dest.close()

        pushed, out["push_s"] = await timed(src.travel.push(tag))
        out["push_mib"] = round(pushed["bytes_uploaded"] / 2**20, 1)
        again, out["push_again_s"] = await timed(src.travel.push(tag))
        out["push_again_blobs"] = again["blobs_uploaded"]

        pull_rt = await Runtime.open(scratch("pull"), store=store)
        roots.append(pull_rt.data.root)
        pulled, out["pull_s"] = await timed(pull_rt.travel.pull(tag))
        out["pull_mib"] = round(pulled["bytes_downloaded"] / 2**20, 1)
        await pull_rt.close()

        fresh = await Runtime.open(scratch("spawn"), store=store)
        roots.append(fresh.data.root)
        [child], out["spawn_from_store_s"] = await timed(fresh.spawn(tag))
        await fresh.ping(child.id)
        [_again], out["spawn_after_s"] = await timed(fresh.spawn(tag))
        await fresh.close()
        out.update(await to_answer(tag, store, roots))
        out["unpack_mib_per_s"] = round(out["archive_mib"] / out["unpack_s"], 1)
        out["pull_mib_per_s"] = round(out["pull_mib"] / out["pull_s"], 1)
    finally:
        await src.close()
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
    return out


async def to_answer(tag: str, store: str, roots: list[Path]) -> dict[str, Any]:
    """Eager, lazy and local spawns of ``tag``, each until its child answers ``READ_IT``."""
    out: dict[str, Any] = {}

    async def answered(rt: Runtime) -> float:
        started = time.perf_counter()
        [child] = await rt.spawn(tag)
        got = await rt.eval(child.id, READ_IT)
        assert got.get("result") == EXPECTED, got
        return round(time.perf_counter() - started, 3)

    for how in ("eager", "lazy"):
        rt = await Runtime.open(scratch(how), store=store)
        roots.append(rt.data.root)
        try:
            rt.travel.lazy = how == "lazy"
            out[f"{how}_to_answer_s"] = await answered(rt)
            assert rt.travel.store is not None
            out[f"{how}_fetched_mib"] = round(rt.travel.store.stats.snapshot()["bytes_downloaded"] / 2**20, 1)
            if how == "lazy":
                lazy = rt.travel.lazily.stats().get(tag)
                # Without FUSE (or with it failing to start) the spawn pulls eagerly: say so, never
                # report that as a lazy figure.
                assert lazy is not None, "the lazy spawn did not arrive lazily (FUSE unavailable?)"
                out["lazy_chunks_fetched_before_answer"] = lazy.get("gets")  # range GETs (a key kept)
                # The background fill takes several adjacent chunks per GET: the chunks they held.
                out["lazy_chunks_here_before_answer"] = len(lazy.get("fetched_by_chunk", {}))
                out["lazy_chunks"] = lazy.get("chunks")
                started = time.perf_counter()
                await rt.travel.lazily.wait(tag, timeout=600)
                out["lazy_complete_after_answer_s"] = round(time.perf_counter() - started, 3)
                out["lazy_total_fetched_mib"] = round(
                    rt.travel.store.stats.snapshot()["bytes_downloaded"] / 2**20, 1)
            else:
                out["local_to_answer_s"] = await answered(rt)  # everything here now
        finally:
            await rt.close()
    return out


def probe_once() -> float | None:
    """Probe this host's accelerator into the real data dir if it never was (seconds; None if it was).

    Every scratch data dir copies that result (``DataDir.scratch``). Without it, the first
    import into each fresh data dir boots a probe guest before anything else (20 s and more
    under TCG on this host), which is what a host does once, not per pull.
    """
    real = DataDir.from_env()
    if real.host_probe.exists():
        return None
    started = time.perf_counter()
    asyncio.run(probe.probe(real, load_image(real).probe_guest()))
    return round(time.perf_counter() - started, 3)


def measure(mem_mib: int, depth: int) -> dict[str, Any]:
    """The figures of whatever forkd is importable, against a fresh moto server."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(AWS_ENDPOINT_URL=f"http://{host}:{port}", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1")
    boto3.client("s3").create_bucket(Bucket="bench")
    try:
        with tempfile.TemporaryDirectory(prefix="fkb-") as tmp:
            return asyncio.run(run(mem_mib, depth, "s3://bench/travel", Path(tmp)))
    finally:
        server.stop()


def baseline(rev: str, mem_mib: int, depth: int) -> dict[str, Any]:
    """The same run with the forkd source of ``rev``, in a child process."""
    with tempfile.TemporaryDirectory(prefix="fkb-src-") as tmp:
        archived = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], check=True,
                                  capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archived)) as tar:
            tar.extractall(tmp, filter="data")
        env = {**os.environ, "PYTHONPATH": str(Path(tmp) / "src")}
        done = subprocess.run([sys.executable, __file__, "--mem-mib", str(mem_mib), "--depth", str(depth),
                               "--figures-only"], check=True, stdout=subprocess.PIPE, text=True, env=env)
    figures: dict[str, Any] = json.loads(done.stdout)
    figures["rev"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True,
                                    capture_output=True, text=True).stdout.strip()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mem-mib", type=int, default=512)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--baseline", help="a git revision to measure first, side by side (e.g. main)")
    parser.add_argument("--out", type=Path, default=RESULTS / "travel.json")
    parser.add_argument("--figures-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.depth < 1:
        parser.error("--depth must be at least 1: the first branch holds the array the evals read")
    if args.figures_only:  # a baseline's child: its figures on stdout, nothing written
        print(json.dumps(measure(args.mem_mib, args.depth)))
        return

    probed = probe_once()
    before = baseline(args.baseline, args.mem_mib, args.depth) if args.baseline else None
    figures = measure(args.mem_mib, args.depth)
    if probed is not None:
        figures["accel_probe_s"] = probed
    result = {"when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "host": platform.node(), "cpus": os.cpu_count(), "qemu": probe.qemu_version(),
              "accel": os.environ.get("FORKD_ACCEL", "auto"), "mem_mib": args.mem_mib, "depth": args.depth,
              "note": "moto S3 server on loopback; a shared, busy 2-core machine: noisy",
              "load_avg_1min_at_end": round(os.getloadavg()[0], 2), **figures}
    if before is not None:
        result["baseline"] = before
    print(json.dumps(result, indent=2))
    if before is not None:
        print(f"\n{'':28}{'before (' + before['rev'] + ')':>16}{'after':>12}")
        for key, what in COMPARED:
            print(f"{what:28}{before.get(key, '-')!s:>16}{figures.get(key, '-')!s:>12}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
