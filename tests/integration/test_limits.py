"""CPU and pids limits with real VMs (root, cgroup cpu and pids controllers).

A CPU limit is measured: the QEMU of a child limited to half a core, busy in
the guest, uses about half a core of host CPU time (wide bounds: a
measurement, not a latency threshold). A pids limit bounds the host tasks of
the child's QEMU (its threads); guest processes are not host tasks, so a guest
fork bomb is contained by the VM itself (its memory and CPU limits), and the
test checks that a sibling still answers meanwhile.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from forkd.controller.options import SpawnOptions
from forkd.controller.runtime import Runtime
from forkd.host import cgroups

from .conftest import Loop

pytestmark = [
    pytest.mark.vm,
    pytest.mark.skipif(os.geteuid() != 0, reason="cgroups need root"),
    pytest.mark.skipif("none" in (cgroups.detect_controller("cpu"), cgroups.detect_controller("pids")),
                       reason="no cgroup cpu or pids controller"),
]

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def test_half_a_core_is_about_half_a_core(loop: Loop, runtime: Runtime, snapshot: str) -> None:
    [sb] = loop.run(runtime.spawn(snapshot, 1, SpawnOptions(cpu_limit=0.5)))
    try:
        assert sb.info()["cpu_limit"] == 0.5
        handle = cgroups.handle_for(sb.cgroup or "", tuple(sb.cgroup_extra))
        assert handle.cpu_limit() == 0.5 and sb.pid in handle.pids()
        before, started = cpu_seconds(sb.pid or 0), time.monotonic()
        reply = loop.run(runtime.eval(sb.id, "import time\nt=time.time()\nwhile time.time()-t<3: pass\n1",
                                      timeout_secs=30))
        used, wall = cpu_seconds(sb.pid or 0) - before, time.monotonic() - started
        share = used / wall
        print(f"\ncpu_limit 0.5: QEMU used {used:.2f} CPU-s in {wall:.2f} s = {share:.2f} cores ({reply})")
        assert 0.25 < share < 0.75
    finally:
        loop.run(runtime.kill(sb.id))
    assert not any(Path(p).exists() for p in (sb.cgroup or "", *sb.cgroup_extra) if p)


def test_pids_limit_bounds_qemu_and_a_guest_fork_bomb_spares_its_sibling(
    loop: Loop, runtime: Runtime, snapshot: str
) -> None:
    bomb, sibling = loop.run(runtime.spawn(snapshot, 2, SpawnOptions(pids_limit=64, cpu_limit=0.5,
                                                                     memory_limit_mib=512)))
    try:
        handle = cgroups.handle_for(bomb.cgroup or "", tuple(bomb.cgroup_extra))
        assert handle.pids_limit() == 64 and bomb.info()["pids_limit"] == 64
        pids_dir = next(d for d in handle.paths if (d / "pids.max").exists())
        threads = int((pids_dir / "pids.current").read_text())
        assert bomb.pid in [int(p) for p in (pids_dir / "cgroup.procs").read_text().split()]
        print(f"\nQEMU runs {threads} tasks under pids.max 64")
        assert 0 < threads <= 64
        # A fork bomb in the guest: forks until the guest kernel refuses (guest processes, not host ones).
        bomb_code = ("import os, subprocess\n"
                     "subprocess.Popen(['/bin/sh', '-c', 'b() { b | b & }; b'], start_new_session=True)\n"
                     "'lit'")
        loop.run(runtime.eval(bomb.id, bomb_code, timeout_secs=30))
        started = time.monotonic()
        answer = loop.run(runtime.eval(sibling.id, "6*7", timeout_secs=60))
        print(f"sibling answered in {time.monotonic() - started:.2f} s while the bomb ran: {answer}")
        assert "42" in str(answer)
        assert int((pids_dir / "pids.current").read_text()) <= 64  # the host side stayed within its limit
    finally:
        loop.gather(runtime.kill(bomb.id), runtime.kill(sibling.id))
    for sb in (bomb, sibling):
        assert not any(Path(p).exists() for p in (sb.cgroup or "", *sb.cgroup_extra) if p)
