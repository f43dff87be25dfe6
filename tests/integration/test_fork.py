"""Fork N children copy-on-write from one warm snapshot; they must be isolated VMs."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

from forkd.controller.runtime import Runtime
from forkd.guest import capabilities
from forkd.guest.capabilities import AGENT_VERSION
from forkd.store.layout import SnapshotDir

from .conftest import Loop

pytestmark = pytest.mark.vm


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def smaps_rollup(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        out[key] = int(value.split()[0])  # kB
    return out


@pytest.fixture(scope="module")
def ten(loop: Loop, runtime: Runtime, snapshot: str):
    sbs = loop.run(runtime.spawn(snapshot, 10))
    yield sbs
    loop.gather(*(runtime.kill(sb.id) for sb in sbs if sb.id in runtime.sandboxes))


def test_ten_children_answer_ping_with_numpy(loop: Loop, runtime: Runtime, ten) -> None:
    assert len({sb.id for sb in ten}) == 10
    assert len({sb.pid for sb in ten}) == 10
    pings = loop.gather(*(runtime.ping(sb.id) for sb in ten))
    for ping in pings:
        assert ping["pong"] is True
        assert ping["pid"] == 1
        assert ping["numpy_version"] and ping["numpy_version"][0].isdigit()
        assert ping["restores"] == 1  # the host told it about its restore
        # What it can do, by name: the host refuses more (forkd.guest.client.require).
        assert dict(ping).get("capabilities") == capabilities.capabilities_since(int(AGENT_VERSION))
    for sb in ten:  # where each fork's time went, phase by phase
        t = sb.info()["timings"]
        assert 0 < t["qemu_up_s"] <= t["restored_s"] <= t["ready_s"], t
        assert runtime.get_sandbox(sb.id).timings == sb.timings  # kept in the registry


def test_children_share_memory(runtime: Runtime, ten) -> None:
    # Runs before the tests that make children allocate (exec, eval): fresh forks.
    stats = [smaps_rollup(sb.pid) for sb in ten]
    pss = sum(s["Pss"] for s in stats)
    rss = sum(s["Rss"] for s in stats)
    print(f"\n10 children: summed PSS {pss / 1024:.1f} MiB vs summed RSS {rss / 1024:.1f} MiB "
          f"(per child PSS {pss / 10240:.1f} MiB, RSS {rss / 10240:.1f} MiB)")
    assert pss < 0.5 * rss, "children do not share their snapshot pages"


def test_exec_and_eval(loop: Loop, runtime: Runtime, ten) -> None:
    sb = ten[0]
    res = loop.run(runtime.exec(sb.id, ["python3", "-c", "print(2+2)"]))
    assert res["stdout"] == "4\n"
    assert res["exit_code"] == 0
    ev = loop.run(runtime.eval(sb.id, "numpy.zeros(5).sum()"))
    assert ev == {"result": "0.0", "error": None, "exit_code": 0}


def test_memory_isolation(loop: Loop, runtime: Runtime, ten) -> None:
    a, b = ten[1], ten[2]
    assert loop.run(runtime.eval(a.id, "forkd_marker = 'only in A'"))["exit_code"] == 0
    assert loop.run(runtime.eval(a.id, "forkd_marker"))["result"] == "'only in A'"
    assert loop.run(runtime.eval(b.id, "'forkd_marker' in globals()"))["result"] == "False"


def test_disk_isolation_and_snapshot_unchanged(loop: Loop, runtime: Runtime, snapshot: str, ten) -> None:
    sdir = SnapshotDir(Path(runtime.get_snapshot(snapshot).dir))
    before = {p.name: file_digest(p) for p in (sdir.mem, sdir.state, sdir.disk)}
    a, b = ten[3], ten[4]
    res = loop.run(runtime.exec(a.id, ["sh", "-c", "echo from-A > /root/a.txt && sync && cat /root/a.txt"]))
    assert res["stdout"] == "from-A\n", res
    check = ["test", "-e", "/root/a.txt"]
    assert loop.run(runtime.exec(b.id, check))["exit_code"] == 1
    fresh = loop.run(runtime.spawn(snapshot, 1))[0]
    try:
        assert loop.run(runtime.exec(fresh.id, check))["exit_code"] == 1
    finally:
        loop.run(runtime.kill(fresh.id))
    after = {p.name: file_digest(p) for p in (sdir.mem, sdir.state, sdir.disk)}
    assert after == before


def test_children_have_distinct_randomness_and_fresh_clock(loop: Loop, runtime: Runtime, ten) -> None:
    cmd = ["python3", "-c", "import os; print(os.urandom(16).hex())"]
    outs = loop.gather(*(runtime.exec(sb.id, cmd) for sb in ten[5:8]))
    values = [o["stdout"].strip() for o in outs]
    assert all(len(v) == 32 for v in values)
    assert len(set(values)) == 3, values
    # The warm interpreter's own PRNG was reseeded too, not only the kernel's.
    py = loop.gather(*(runtime.eval(sb.id, "__import__('random').random()") for sb in ten[5:8]))
    assert len({p["result"] for p in py}) == 3
    guest_now = float(loop.run(runtime.eval(ten[5].id, "__import__('time').time()"))["result"])
    assert abs(guest_now - time.time()) < 30, "guest clock was not stepped to host time after restore"


def test_kill_removes_process_and_files(loop: Loop, runtime: Runtime, snapshot: str) -> None:
    sb = loop.run(runtime.spawn(snapshot, 1))[0]
    run_dir = Path(sb.dir)
    assert (run_dir / "agent.sock").exists()
    loop.run(runtime.kill(sb.id))
    assert not run_dir.exists()
    assert not Path(f"/proc/{sb.pid}").exists() or "qemu" not in Path(f"/proc/{sb.pid}/cmdline").read_text()
    assert sb.id not in {s.id for s in runtime.list_sandboxes()}
