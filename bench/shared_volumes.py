#!/usr/bin/env python3
"""What a shared (hostdir) volume costs a guest's file work, side by side with the guest's own
root disk and an ext4 (copy) volume, in one run.

One template of the default image with an ext4 volume at /mnt/disk; one sandbox of it that also
mounts a hostdir volume at /mnt/shared at its spawn. In the guest, timed by the guest itself
(``date +%s%N`` around each step, so the exec's own round trip does not count), in each of three
places (the root disk's /root, the ext4 volume, the shared volume):

* **write**: ``dd`` of 16 MiB in 1 MiB writes, then ``sync``;
* **read**: ``dd`` of the same 16 MiB back (the page cache holds it where there is one: a shared
  volume has none, every read goes to the host);
* **small files**: 200 files of 100 bytes made by a shell loop;
* **appends**: 500 lines appended by a shell loop (``>>``, each its own open, write and close).

The median over ``--repeat`` rounds is printed per place and written to
bench/results/shared_volumes.json. Every shared-volume operation is a round trip from the guest's
FUSE server through the agent's port to the daemon (docs/BRANCHING.md#shared-volumes), so the
small-file and append figures show that round trip; under TCG on a 2-core host it is the guest's
own CPU that dominates.

Usage: .venv/bin/python bench/shared_volumes.py [--repeat 3] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from typing import Any

from common import host_facts, scratch_runtime, write_result
from forkd.controller.options import SpawnOptions
from forkd.controller.runtime import Runtime, SnapshotSpec
from forkd.store.volume_spec import VolumeMount

PLACES = {"root_disk": "/root/bench", "ext4_volume": "/mnt/disk/bench", "shared_volume": "/mnt/shared/bench"}
MIB = 16
FILES = 200
LINES = 500
BOOT_WAIT_SECS = 300

# Each step prints its name and its milliseconds, timed in the guest.
SCRIPT = r"""
set -e
d="$1"; rm -rf "$d"; mkdir -p "$d"; cd "$d"
t() { s=$(date +%s%N); "$@" >/dev/null 2>&1; e=$(date +%s%N); echo "$name $(( (e - s) / 1000000 ))"; }
name=write; t sh -c "dd if=/dev/zero of=blob bs=1M count=MIB conv=fsync"
name=read; t dd if=blob of=/dev/null bs=1M
name=small_files; t sh -c 'i=0; while [ $i -lt FILES ]; do printf "%0100d" $i > f$i; i=$((i+1)); done'
name=appends; t sh -c 'i=0; while [ $i -lt LINES ]; do echo "line $i" >> log; i=$((i+1)); done'
cd /; rm -rf "$d"
""".replace("MIB", str(MIB)).replace("FILES", str(FILES)).replace("LINES", str(LINES))


async def _round(rt: Runtime, sb_id: str) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for place, path in PLACES.items():
        res = await rt.exec(sb_id, ["sh", "-c", SCRIPT, "bench", path], timeout_secs=600)
        if res["exit_code"] != 0:
            raise RuntimeError(f"{place}: {res['stderr'][-500:]}")
        out[place] = {line.split()[0]: float(line.split()[1]) for line in res["stdout"].splitlines() if line}
    return out


async def run(repeat: int) -> dict[str, Any]:
    async with scratch_runtime("forkd-bench-shared-") as rt:
        await rt.volumes.create("benchdisk", size_mib=256)
        await rt.volumes.create("benchshared", size_mib=256, fs="hostdir")
        print("template: booting with an ext4 volume at /mnt/disk", flush=True)
        await rt.create_snapshot(SnapshotSpec(tag="bench-shared", boot_wait_secs=BOOT_WAIT_SECS,
                                              volumes=[VolumeMount(mount="/mnt/disk", name="benchdisk")]))
        opts = SpawnOptions(volumes=[VolumeMount(mount="/mnt/shared", name="benchshared")])
        [sb] = await rt.spawn("bench-shared", 1, opts)
        rounds: list[dict[str, dict[str, float]]] = []
        for i in range(repeat):
            figures = await _round(rt, sb.id)
            rounds.append(figures)
            for place, steps in figures.items():
                print(f"round {i + 1} {place:13} " + "  ".join(f"{k} {v:7.0f} ms" for k, v in steps.items()),
                      flush=True)
    medians = {place: {step: statistics.median(r[place][step] for r in rounds) for step in rounds[0][place]}
               for place in PLACES}
    print(f"\nmedians over {repeat} rounds (ms; write/read {MIB} MiB, {FILES} small files, {LINES} appends):")
    print(f"{'':15}" + "".join(f"{step:>13}" for step in medians["root_disk"]))
    for place, steps in medians.items():
        print(f"{place:15}" + "".join(f"{v:13.0f}" for v in steps.values()))
    return {"repeat": repeat, "mib": MIB, "files": FILES, "lines": LINES, "median_ms": medians,
            "rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()
    figures = asyncio.run(run(args.repeat))
    write_result("shared_volumes", {"host": host_facts(), **figures}, args.out)


if __name__ == "__main__":
    main()
