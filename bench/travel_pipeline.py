#!/usr/bin/env python3
"""The travel pipeline alone, no VM: pack, unpack, push and pull of snapshot-like files.

The files: this host's guest image root filesystem as the base (2 GiB logical,
its data extents only), and ``--mems`` memory-like files of ``--mem-mib``
logical size each holding ``--data-mib`` of data in scattered runs (half
random, half compressible, as a guest's RAM is). They go through the same calls
the daemon makes (``archive.write``/``read``, ``ObjectStore.put_blob``/
``get_blob``) against moto's S3 server on loopback. ``--profile`` adds
cProfile's top functions per step.

``--baseline REV`` runs the same steps with the forkd source of git revision REV
(``git archive`` into a temporary directory, in a child process) first, and
prints both side by side. What bench/travel.py measures with real VMs, in
seconds instead of minutes.

Usage: .venv/bin/python bench/travel_pipeline.py [--baseline main] [--profile] [--out PATH]
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import importlib
import io
import json
import os
import platform
import pstats
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
MIB = 1 << 20


def make_mem(path: Path, logical_mib: int, data_mib: int, seed: int) -> None:
    """Runs of 64 KiB to 2 MiB at random places; every other run random bytes, the rest text."""
    rng = random.Random(seed)
    text = (b"forkd guest page " * 4096)[: 2 * MIB]
    with open(path, "wb") as f:
        f.truncate(logical_mib * MIB)
        left = data_mib * MIB
        while left > 0:
            n = min(left, rng.choice((64 << 10, 256 << 10, MIB, 2 * MIB)))
            f.seek(rng.randrange(0, logical_mib * MIB - n) & ~0xFFF)
            f.write(os.urandom(n) if rng.random() < 0.5 else text[:n])
            left -= n


def base_image() -> Path:
    images = Path(os.environ.get("FORKD_IMAGES", Path.home() / ".local/share/forkd/images"))
    return images / "default" / "rootfs.ext4"


def profiled(enabled: bool, into: dict[str, Any], step: str, fn: Callable[[], Any]) -> Any:
    started = time.perf_counter()
    prof = cProfile.Profile() if enabled else None
    if prof:
        prof.enable()
    try:
        return fn()
    finally:
        if prof:
            prof.disable()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
            into.setdefault("profile", {})[step] = out.getvalue()
        into[f"{step}_s"] = round(time.perf_counter() - started, 3)


def measure(work: Path, files: dict[str, Path], profile: bool) -> dict[str, Any]:
    """The four steps with whatever forkd is importable (this tree, or the baseline's)."""
    import boto3
    from moto.server import ThreadedMotoServer

    from forkd.host.accel import Accel
    from forkd.store import archive
    from forkd.store.manifest import Backing, BaseEntry, FileEntry, Manifest, SnapshotEntry
    from forkd.store.objectstore import ObjectStore

    # The digest that names a blob in whichever forkd runs: the chunked one, or, before it
    # (a baseline), the plain sha256 of the logical content.
    try:
        digest: Callable[[Path], tuple[str, Any]] = importlib.import_module("forkd.store.chunked").digest
    except ImportError:
        digest = importlib.import_module("forkd.store.sparse").digest
    out: dict[str, Any] = {}
    shas: dict[str, str] = {}

    def digests() -> None:
        for name, path in files.items():
            shas[name] = digest(path)[0]

    profiled(profile, out, "digest", digests)
    sizes = {n: p.stat().st_size for n, p in files.items()}
    mems = [n for n in files if n != "base"]
    snaps = []
    for i, name in enumerate(mems):
        tag = f"s{i}"
        disk = FileEntry("disk.qcow2", shas["base"], sizes["base"], Backing(None, "", "raw"))
        snaps.append(SnapshotEntry(tag, f"s{i - 1}" if i else None, 1, (
            FileEntry("mem", shas[name], sizes[name]), FileEntry("state", shas[name], sizes[name]), disk)))
    manifest = Manifest(snaps[-1].tag, 1, "0", "QEMU emulator version 7.2", Accel.tcg(),
                        BaseEntry(shas["base"], sizes["base"], "raw"), tuple(snaps))
    blobs = {shas[n]: p for n, p in files.items()}
    logical = sum(sizes.values())
    out["logical_mib"] = logical // MIB

    packed = work / "a.forkd"
    profiled(profile, out, "pack", lambda: archive.write(packed, manifest, blobs))
    out["archive_mib"] = round(packed.stat().st_size / MIB, 1)
    staging = work / "unpacked"
    staging.mkdir()
    profiled(profile, out, "unpack", lambda: archive.read(packed, staging, lambda m, o: set(m.blobs())))
    shutil.rmtree(staging)

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(AWS_ENDPOINT_URL=f"http://{host}:{port}", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1")
    try:
        boto3.client("s3").create_bucket(Bucket="bench")
        store = ObjectStore("s3://bench/pipeline")
        profiled(profile, out, "push", lambda: [store.put_blob(shas[n], p) for n, p in files.items()])
        pulled = work / "pulled"
        pulled.mkdir()
        profiled(profile, out, "pull", lambda: [store.get_blob(shas[n], pulled / n, sizes[n]) for n in files])
        out["pull_mib"] = round(store.stats.snapshot()["bytes_downloaded"] / MIB, 1)
        for n in files:  # what came back is what went up
            assert digest(pulled / n)[0] == shas[n], n
    finally:
        server.stop()
    for step in ("unpack", "pull"):
        out[f"{step}_mib_per_s"] = round(out["archive_mib"] / out[f"{step}_s"], 1)
    return out


def baseline(rev: str, work: Path, files: dict[str, Path], profile: bool) -> dict[str, Any]:
    src = work / f"baseline-{rev.replace('/', '_')}"
    src.mkdir()
    archived = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], check=True,
                              capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archived)) as tar:
        tar.extractall(src, filter="data")
    child_work = work / "baseline-work"
    child_work.mkdir()
    cmd = [sys.executable, __file__, "--child", str(child_work),
           "--files", json.dumps({k: str(v) for k, v in files.items()})]
    if profile:
        cmd.append("--profile")
    env = {**os.environ, "PYTHONPATH": str(src / "src")}
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mems", type=int, default=3)
    parser.add_argument("--mem-mib", type=int, default=512)
    parser.add_argument("--data-mib", type=int, default=192)
    parser.add_argument("--baseline", help="a git revision to measure first, side by side")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "travel_pipeline.json")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--files", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # the baseline's run: print its figures for the parent
        files = {k: Path(v) for k, v in json.loads(args.files).items()}
        print(json.dumps(measure(args.child, files, args.profile)))
        return

    with tempfile.TemporaryDirectory(prefix="fkp-", dir=os.environ.get("FORKD_BENCH_TMP")) as tmp:
        work = Path(tmp)
        files = {"base": base_image()}
        for i in range(args.mems):
            files[f"mem{i}"] = work / f"mem{i}"
            make_mem(files[f"mem{i}"], args.mem_mib, args.data_mib, seed=i)
        runs: dict[str, Any] = {}
        if args.baseline:
            runs[f"baseline ({args.baseline})"] = baseline(args.baseline, work, files, args.profile)
        (work / "now").mkdir()
        runs["this tree"] = measure(work / "now", files, args.profile)
    for name, figures in runs.items():
        for step, text in figures.pop("profile", {}).items():
            print(f"--- {name}: {step}\n{text}")
    keys = [k for k in next(iter(runs.values())) if k != "profile"]
    print(f"{'':22}" + "".join(f"{name:>22}" for name in runs))
    for k in keys:
        print(f"{k:22}" + "".join(f"{r.get(k)!s:>22}" for r in runs.values()))
    result = {"when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "host": platform.node(), "cpus": os.cpu_count(), "mems": args.mems, "mem_mib": args.mem_mib,
              "data_mib": args.data_mib, "note": "no VM; moto S3 server on loopback; a shared 2-core machine",
              "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
