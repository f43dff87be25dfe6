"""Warm pools with real VMs: claimed children are their own machines, resizes and
deletions leave no QEMU behind, and a daemon killed with a full pool re-adopts it.

The first two tests drive the session's Runtime (its ``py`` snapshot); the last
one runs a real ``forkd daemon`` with ``--pool`` (``FORKD_POOLS``) and kills it
with SIGKILL.
"""

from __future__ import annotations

import ast
import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from forkd.controller.options import SpawnOptions
from forkd.controller.runtime import Runtime
from forkd.errors import NotFound

from .conftest import Loop, qemu_processes_of
from .daemon_fixture import Daemon, new_daemon, pid_alive, shutdown_and_check, start_or_clean_up

pytestmark = pytest.mark.vm

FILL_TIMEOUT = 180.0
# What each child reports: its own random bytes, numpy's next draw and its clock.
PROBE = "import os, time; (os.urandom(16).hex(), float(numpy.random.random()), time.time())"


def wait_until(loop: Loop, cond: Callable[[], bool], what: str, timeout: float = FILL_TIMEOUT) -> None:
    """Poll ``cond`` while the runtime's loop (and so its refill task) runs."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        loop.run(asyncio.sleep(0.2))


def members(rt: Runtime, tag: str) -> list[Any]:
    return [sb for sb in rt.registry.sandboxes.all() if sb.pooled and sb.snapshot_tag == tag]


def probe(loop: Loop, rt: Runtime, sandbox_id: str) -> tuple[str, float, float, float, float]:
    """(urandom hex, numpy draw, guest clock, host clock before, host clock after)."""
    before = time.time()
    res = loop.run(rt.eval(sandbox_id, PROBE))
    after = time.time()
    assert res["exit_code"] == 0, res
    rnd, draw, clock = ast.literal_eval(res["result"])
    return rnd, draw, clock, before, after


@pytest.fixture
def py_pool(loop: Loop, runtime: Runtime, snapshot: str) -> Iterator[str]:
    """The session's ``py`` snapshot, with its pool drained again afterwards."""
    yield snapshot
    loop.run(runtime.pools.configure(snapshot, 0))
    assert members(runtime, snapshot) == []


def test_pooled_children_are_their_own_machines(loop: Loop, runtime: Runtime, py_pool: str) -> None:
    info = loop.run(runtime.pools.configure(py_pool, 2))
    assert info["size"] == 2
    wait_until(loop, lambda: runtime.pools.get(py_pool)["ready"] == 2, "the pool to fill")
    pooled = members(runtime, py_pool)
    assert len(pooled) == 2
    for sb in pooled:
        # Hidden until claimed, and paused (no CPU).
        assert sb.id not in {s.id for s in runtime.list_sandboxes()}
        with pytest.raises(NotFound):
            runtime.get_sandbox(sb.id)
        with pytest.raises(NotFound):
            loop.run(runtime.ping(sb.id))
        vm = runtime.sandboxes.vm(sb.id)
        assert vm is not None and loop.run(vm.qmp.status()) == "paused"

    claimed = loop.run(runtime.spawn(py_pool, 2,
                                     SpawnOptions(env={"ROLE": "pooled"}, metadata={"who": "pool"})))
    assert {c.id for c in claimed} == {sb.id for sb in pooled}, "the spawn did not draw from the pool"
    for c in claimed:
        assert "claimed_s" in c.timings and c.metadata == {"who": "pool"}
        assert runtime.get_sandbox(c.id).metadata == {"who": "pool"}
        res = loop.run(runtime.eval(c.id, "__import__('os').environ.get('ROLE')"))
        assert res["result"] == repr("pooled")
    assert runtime.pools.get(py_pool)["claims"] == 2

    # A fresh child, restored as without a pool.
    loop.run(runtime.pools.configure(py_pool, 0))
    [fresh] = loop.run(runtime.spawn(py_pool, 1))
    assert "claimed_s" not in fresh.timings
    try:
        seen = [probe(loop, runtime, sb.id) for sb in (*claimed, fresh)]
        # Siblings restored from one snapshot and reseeded at claim: no shared streams.
        assert len({s[0] for s in seen}) == 3, seen
        assert len({s[1] for s in seen}) == 3, seen
        for _, _, clock, before, after in seen:
            assert before - 1 <= clock <= after + 1, (clock, before, after)
    finally:
        loop.gather(*(runtime.kill(sb.id) for sb in (*claimed, fresh)))


def test_a_spawn_with_other_options_does_not_draw(loop: Loop, runtime: Runtime, py_pool: str) -> None:
    loop.run(runtime.pools.configure(py_pool, 1))
    wait_until(loop, lambda: runtime.pools.get(py_pool)["ready"] == 1, "the pool to fill")
    [member] = members(runtime, py_pool)
    misses = runtime.pools.get(py_pool)["misses"]
    [other] = loop.run(runtime.spawn(py_pool, 1, SpawnOptions(live_fork=True)))
    try:
        assert other.id != member.id and "claimed_s" not in other.timings
        assert [sb.id for sb in members(runtime, py_pool)] == [member.id]
        assert runtime.pools.get(py_pool)["misses"] == misses + 1
    finally:
        loop.run(runtime.kill(other.id))


def test_resizing_and_deleting_leave_no_qemu_behind(loop: Loop, runtime: Runtime, snapshot: str,
                                                    data_dir: Any) -> None:
    # A snapshot of its own, so that deleting it leaves the session's py alone.
    [src] = loop.run(runtime.spawn(snapshot, 1))
    try:
        loop.run(runtime.branch(src.id, tag="pool-rm", mode="full"))
    finally:
        loop.run(runtime.kill(src.id))
    before = set(qemu_processes_of(data_dir.root))

    loop.run(runtime.pools.configure("pool-rm", 3))
    wait_until(loop, lambda: runtime.pools.get("pool-rm")["ready"] == 3, "the pool to fill")
    first = members(runtime, "pool-rm")
    assert len(first) == 3 and all(pid_alive(sb.pid or 0) for sb in first)

    loop.run(runtime.pools.configure("pool-rm", 1))
    kept = members(runtime, "pool-rm")
    assert len(kept) == 1 and runtime.pools.get("pool-rm")["ready"] == 1
    gone = [sb for sb in first if sb.id != kept[0].id]
    for sb in gone:
        assert not pid_alive(sb.pid or 0), f"{sb.id} outlived the shrink"
        assert not Path(sb.dir).exists()

    loop.run(runtime.pools.configure("pool-rm", 2))
    wait_until(loop, lambda: runtime.pools.get("pool-rm")["ready"] == 2, "the pool to grow again")
    last = members(runtime, "pool-rm")

    loop.run(runtime.delete_snapshot("pool-rm"))
    assert members(runtime, "pool-rm") == []
    for sb in last:
        assert not pid_alive(sb.pid or 0), f"{sb.id} outlived its snapshot"
        assert not Path(sb.dir).exists()
    with pytest.raises(NotFound):
        runtime.pools.get("pool-rm")
    assert set(qemu_processes_of(data_dir.root)) == before


# ------------------------------------------------------------------ daemon kill -9


@pytest.fixture
def pool_daemon() -> Iterator[Daemon]:
    # The start-up option names a tag that does not exist yet: it fills once it does.
    d = new_daemon("fkp-", extra_env={"FORKD_POOLS": "py=2"})
    start_or_clean_up(d)
    yield d
    shutdown_and_check(d)


def qemu_pids(root: Path) -> set[int]:
    return {int(line.split()[0]) for line in qemu_processes_of(root)}


def test_kill9_with_a_full_pool_leaves_no_orphan(pool_daemon: Daemon) -> None:
    d = pool_daemon
    with d.client(timeout=300) as c:
        pending = c.get("/v1/snapshots/py/pool").json()  # no snapshot yet: the target waits
        assert (pending["size"], pending["ready"]) == (2, 0), pending
        r = c.post("/v1/snapshots", json={"tag": "py", "boot_wait_secs": 180})
        assert r.status_code == 201, r.text
        deadline = time.monotonic() + FILL_TIMEOUT
        while c.get("/v1/snapshots/py/pool").json()["ready"] < 2:
            assert time.monotonic() < deadline, c.get("/v1/snapshots/py/pool").text
            time.sleep(0.3)
        assert c.get("/v1/sandboxes").json() == []  # members are not sandboxes yet
        assert 'forkd_pool_ready{tag="py"} 2.0' in c.get("/metrics").text
    pooled = qemu_pids(d.root)
    assert len(pooled) == 2

    d.kill9()
    assert all(pid_alive(pid) for pid in pooled), "pool members died with the daemon"
    d.start()  # same data dir and FORKD_POOLS: re-adopts the paused members

    with d.client(timeout=300) as c:
        info = c.get("/v1/snapshots/py/pool").json()
        assert (info["size"], info["ready"]) == (2, 2), info
        assert qemu_pids(d.root) == pooled, "members were restored again instead of re-adopted"
        r = c.post("/v1/sandboxes", json={"snapshot_tag": "py", "n": 1, "env": {"K": "v"}})
        assert r.status_code == 201, r.text
        [child] = r.json()
        assert child["pid"] in pooled and "claimed_s" in child["timings"]
        code = "__import__('os').environ['K']"
        res = c.post(f"/v1/sandboxes/{child['id']}/eval", json={"code": code}).json()
        assert res["result"] == repr("v")
        # Drain: only the claimed child's QEMU is left.
        r = c.put("/v1/snapshots/py/pool", json={"size": 0})
        assert r.status_code == 200 and r.json()["ready"] == 0, r.text
        assert qemu_pids(d.root) == {child["pid"]}
        d.left_for_shutdown.append(child["id"])
