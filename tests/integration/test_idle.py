"""Idle pauses with real VMs: a child spawned with ``idle_pause_secs`` is paused (QEMU
stopped) once idle, answers its next request with the right time, and is never paused
while a request runs. Forks from the session's ``py`` snapshot."""

from __future__ import annotations

import asyncio
import time

import pytest

from forkd.controller.options import SpawnOptions
from forkd.controller.runtime import Runtime

from .conftest import Loop

pytestmark = pytest.mark.vm

IDLE_SECS = 1.0


def wait_paused(loop: Loop, rt: Runtime, sandbox_id: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while rt.get_sandbox(sandbox_id).info()["state"] != "paused":
        assert time.monotonic() < deadline, "the idle child was never paused"
        loop.run(asyncio.sleep(0.2))


def qemu_status(loop: Loop, rt: Runtime, sandbox_id: str) -> str:
    vm = rt.sandboxes.vm(sandbox_id)
    assert vm is not None
    return loop.run(vm.qmp.status())


def test_an_idle_child_pauses_and_answers_its_next_request_with_the_right_time(
        loop: Loop, runtime: Runtime, snapshot: str) -> None:
    [child] = loop.run(runtime.spawn(snapshot, 1, SpawnOptions(idle_pause_secs=IDLE_SECS)))
    [other] = loop.run(runtime.spawn(snapshot, 1))  # no policy: never paused
    try:
        assert child.info()["state"] == "running" and child.info()["idle_pause_secs"] == IDLE_SECS
        wait_paused(loop, runtime, child.id)
        assert qemu_status(loop, runtime, child.id) == "paused"
        loop.run(asyncio.sleep(2))  # the guest's clock stands still meanwhile
        assert qemu_status(loop, runtime, child.id) == "paused"
        before = time.time()
        res = loop.run(runtime.eval(child.id, "import time; time.time()"))
        after = time.time()
        assert res["exit_code"] == 0, res
        guest = float(res["result"])
        # Resumed transparently, its clock stepped to the host's first.
        assert before - 1 <= guest <= after + 1, (before, guest, after)
        assert runtime.get_sandbox(child.id).info()["state"] == "running"
        assert [sb.info()["state"] for sb in runtime.list_sandboxes() if sb.id == other.id] == ["running"]
        assert qemu_status(loop, runtime, other.id) == "running"
        # Paused again once idle; an exec resumes it as well.
        wait_paused(loop, runtime, child.id)
        out = loop.run(runtime.exec(child.id, ["python3", "-c", "import time; print(time.time())"]))
        assert out["exit_code"] == 0 and abs(float(out["stdout"]) - time.time()) < 1.5, out
    finally:
        loop.gather(runtime.kill(child.id), runtime.kill(other.id))


def test_a_request_longer_than_the_idle_limit_is_not_paused(loop: Loop, runtime: Runtime,
                                                            snapshot: str) -> None:
    [child] = loop.run(runtime.spawn(snapshot, 1, SpawnOptions(idle_pause_secs=IDLE_SECS)))
    try:
        started = time.monotonic()
        out = loop.run(runtime.exec(child.id, ["sh", "-c", "sleep 3; echo done"]))
        assert out["stdout"] == "done\n" and time.monotonic() - started >= 3
        # A branch of a paused child resumes it first.
        wait_paused(loop, runtime, child.id)
        resumes = runtime.idle.counts()["resumes"]
        snap = loop.run(runtime.branch(child.id, mode="diff"))
        assert snap.status == "ready" and runtime.idle.counts()["resumes"] == resumes + 1
        # (It may be paused again by now: the branch's conversion outlasts the idle limit.)
        assert loop.run(runtime.ping(child.id))["pong"] is True
        loop.run(runtime.delete_snapshot(snap.tag))
    finally:
        loop.run(runtime.kill(child.id))
