"""Disk quotas with real VMs (issue 24, item 8): a guest that writes past its
``disk_quota_mib`` is stopped by QEMU's write-threshold event, its overlay stays
near the quota, and calls say why; within the quota, and across a BRANCH (which
moves it onto a new overlay), it runs as usual.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from forkd.controller.options import SpawnOptions
from forkd.controller.runtime import Runtime
from forkd.errors import GuestError

from .conftest import Loop

pytestmark = pytest.mark.vm

MIB = 1 << 20
QUOTA = 64


def write_mib(mib: int, name: str) -> list[str]:
    # O_DIRECT: straight to the virtio disk, not into the guest's page cache.
    return ["/bin/sh", "-c", f"dd if=/dev/zero of=/root/{name} bs=1M count={mib} oflag=direct 2>&1; sync"]


def layers_bytes(run_dir: str) -> int:
    return sum(p.stat().st_blocks * 512 for p in Path(run_dir).glob("disk*.qcow2"))


def test_a_sandbox_writing_past_its_quota_is_stopped_and_says_why(
    loop: Loop, runtime: Runtime, snapshot: str
) -> None:
    [sb] = loop.run(runtime.spawn(snapshot, 1, SpawnOptions(disk_quota_mib=QUOTA)))
    try:
        info = runtime.get_sandbox(sb.id).info()
        assert info["disk_quota_mib"] == QUOTA and info["disk_used_mib"] < 8
        with pytest.raises(GuestError) as stopped:
            loop.run(runtime.exec(sb.id, write_mib(200, "big"), timeout_secs=300))
        print(f"\nthe write was cut short: {stopped.value}")
        with pytest.raises(GuestError, match=f"stopped by its disk quota.*disk_quota_mib={QUOTA} MiB"):
            loop.run(runtime.ping(sb.id))
        grown = layers_bytes(sb.dir)
        print(f"its layers take {grown / MIB:.1f} MiB under a quota of {QUOTA} MiB")
        # Stopped about where the quota ran out (the threshold is on the file's end, the
        # size here its allocated blocks), far short of the 200 MiB the guest meant to write.
        assert (QUOTA - 4) * MIB <= grown < 150 * MIB
        assert runtime.get_sandbox(sb.id).info()["disk_used_mib"] == pytest.approx(grown / MIB, abs=0.1)
    finally:
        loop.run(runtime.kill(sb.id))


def test_within_the_quota_and_across_a_branch(loop: Loop, runtime: Runtime, snapshot: str) -> None:
    [sb] = loop.run(runtime.spawn(snapshot, 1, SpawnOptions(disk_quota_mib=QUOTA)))
    try:
        out = loop.run(runtime.exec(sb.id, write_mib(24, "a"), timeout_secs=300))
        assert out["exit_code"] == 0, out
        assert "42" in str(loop.run(runtime.eval(sb.id, "6*7")))
        used = runtime.get_sandbox(sb.id).info()["disk_used_mib"]
        assert 24 <= used < QUOTA, used
        # The branch moves it onto a new overlay; what it froze still counts against the quota.
        loop.run(runtime.branch(sb.id, mode="diff"))
        out = loop.run(runtime.exec(sb.id, write_mib(16, "b"), timeout_secs=300))
        assert out["exit_code"] == 0, out  # 24 + 16 < 64: still within
        with pytest.raises(GuestError):
            loop.run(runtime.exec(sb.id, write_mib(48, "c"), timeout_secs=300))
        with pytest.raises(GuestError, match="stopped by its disk quota"):
            loop.run(runtime.ping(sb.id))
        assert layers_bytes(sb.dir) < (24 + 16 + 48) * MIB  # the last write was cut short
    finally:
        loop.run(runtime.kill(sb.id))
