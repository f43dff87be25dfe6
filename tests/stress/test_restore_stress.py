"""Branch and restore many times under CPU load; every restored child must answer.

Opt-in (``make stress``): it takes minutes. Each round loads a source, takes a
diff branch of it, restores a grandchild from that, takes a full branch of the
grandchild and restores a great-grandchild: the shape of
``test_depth_three_and_lineage``, where a restored child once stayed silent on
a loaded machine. Two CPU hogs (``stress-ng --cpu 2`` if installed, else busy
Python processes) run beside it. Every failure is reported with the guest's
console; a restore that needed its retry is counted and printed.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from forkd.controller.runtime import Runtime
from tests.integration.conftest import Loop
from tests.integration.test_branch import LOAD  # 50 MiB in memory and on disk, a ticking thread

pytestmark = pytest.mark.stress

ROUNDS = int(os.environ.get("FORKD_STRESS_ROUNDS", "20"))
HOG_SECONDS = 3600  # the hogs stop by themselves even if the run is killed


@pytest.fixture
def cpu_hogs() -> Iterator[None]:
    if shutil.which("stress-ng"):
        procs = [subprocess.Popen(["stress-ng", "--cpu", "2", "--timeout", f"{HOG_SECONDS}s", "--quiet"])]
    else:
        hog = f"import time\nend = time.time() + {HOG_SECONDS}\nwhile time.time() < end: pass\n"
        procs = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(2)]
    try:
        yield
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


def test_branch_and_restore_under_load(loop: Loop, runtime: Runtime, snapshot: str, cpu_hogs: None,
                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="forkd.spawner")
    restores = 0
    started = time.monotonic()
    for i in range(ROUNDS):
        src = loop.run(runtime.spawn(snapshot, 1))[0]
        restores += 1
        loaded = loop.run(runtime.eval(src.id, LOAD + f"\nmarker = 'round {i}'", timeout_secs=300))
        assert loaded["exit_code"] == 0, loaded
        b1 = loop.run(runtime.branch(src.id, tag=f"stress-{i}-a", mode="diff"))
        g = loop.run(runtime.spawn(b1.tag, 1))[0]
        restores += 1
        b2 = loop.run(runtime.branch(g.id, tag=f"stress-{i}-b", mode="full"))
        gg = loop.run(runtime.spawn(b2.tag, 1))[0]
        restores += 1
        assert loop.run(runtime.eval(gg.id, "marker"))["result"] == f"'round {i}'"
        assert int(loop.run(runtime.eval(gg.id, "counter[0]"))["result"]) > 0
        for sb in (gg, g, src):
            loop.run(runtime.kill(sb.id))
        loop.run(runtime.delete_snapshot(b1.tag, cascade=True))
    retried = [r.getMessage() for r in caplog.records if "stayed silent" in r.getMessage()]
    print(f"\n{ROUNDS} rounds, {restores} restores, {ROUNDS * 2} branches in "
          f"{time.monotonic() - started:.0f}s; restores that needed a retry: {len(retried)}")
    for message in retried:
        print(message)
