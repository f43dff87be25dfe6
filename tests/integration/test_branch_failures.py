"""BRANCH failures after the capture, with real VMs: the steps that run once the source has resumed.

After the source runs again, a branch still has to copy the source's frozen
disk overlay into the new snapshot and have a helper QEMU turn the memory
stream into a forkable snapshot. These tests break each step for real (the
helper QEMU is fed a corrupt stream; the copy hits ENOSPC) and check what
docs/BRANCHING.md promises: the error names the phase, nothing is registered
(or, for ``wait: false``, the entry stays as ``failed``), no files or QEMU
processes are left, the source keeps running, and its next branch is whole
and outlives it. (The capture-time failures are in test_branch.py.)
"""

from __future__ import annotations

import errno
import time
from pathlib import Path
from typing import Any

import pytest

from forkd.controller.options import SpawnOptions
from forkd.controller.runtime import Runtime
from forkd.errors import Conflict, NotFound, VMError
from forkd.store.registry import SandboxRecord
from forkd.vmm import branching
from forkd.vmm import disk as disk_mod

from .conftest import Loop, qemu_processes_of

pytestmark = pytest.mark.vm

MARK = ["sh", "-c", "echo {0} > /root/mark-{0}; sync"]
READ_MARKS = ["sh", "-c", "cat /root/mark-*"]


def counter_running(loop: Loop, rt: Runtime, sb_id: str) -> None:
    """The source's guest runs: a counter thread started before the branch keeps advancing."""
    first = int(loop.run(rt.eval(sb_id, "counter[0]"))["result"])
    deadline = time.monotonic() + 30
    while int(loop.run(rt.eval(sb_id, "counter[0]"))["result"]) <= first:
        assert time.monotonic() < deadline, "the source's counter stopped advancing"
        time.sleep(0.1)


def start_source(loop: Loop, rt: Runtime, tag: str, *, live_fork: bool = False) -> SandboxRecord:
    sb = loop.run(rt.spawn(tag, 1, SpawnOptions(live_fork=live_fork)))[0]
    code = ("import threading, time\ncounter = [0]\nmemo = 'before'\n"
            "def _tick():\n    while True:\n        counter[0] += 1\n        time.sleep(0.005)\n"
            "threading.Thread(target=_tick, daemon=True).start()")
    assert loop.run(rt.eval(sb.id, code))["exit_code"] == 0
    assert loop.run(rt.exec(sb.id, [a.format("before") for a in MARK]))["exit_code"] == 0
    return sb


def snapshots_dir_entries(rt: Runtime) -> set[str]:
    return {p.name for p in rt.data.snapshots.iterdir()}


def assert_no_trace(rt: Runtime, tag: str, entries_before: set[str], qemus_before: set[str]) -> None:
    """No files for ``tag`` (final or staging) and no QEMU other than those running before."""
    assert snapshots_dir_entries(rt) == entries_before
    assert not (rt.data.snapshots / tag).exists()
    assert set(qemu_processes_of(rt.data.root)) == qemus_before


def assert_source_usable(loop: Loop, rt: Runtime, sb_id: str) -> None:
    counter_running(loop, rt, sb_id)
    assert loop.run(rt.ping(sb_id))["pong"] is True
    assert loop.run(rt.exec(sb_id, READ_MARKS))["stdout"].split() == ["before"]


def next_branch_is_whole_and_outlives_the_source(loop: Loop, rt: Runtime, sb: SandboxRecord,
                                                  tag: str | None = None) -> None:
    """A later branch carries the disk written before *and* after the failed one, without its source."""
    loop.run(rt.exec(sb.id, [a.format("after") for a in MARK]))
    loop.run(rt.eval(sb.id, "memo = 'after'"))
    good = loop.run(rt.branch(sb.id, tag=tag or f"{sb.id}-good", mode="diff"))
    assert good.status == "ready"
    loop.run(rt.kill(sb.id))
    kid = loop.run(rt.spawn(good.tag, 1))[0]
    try:
        assert loop.run(rt.exec(kid.id, READ_MARKS))["stdout"].split() == ["after", "before"]
        assert loop.run(rt.eval(kid.id, "memo"))["result"] == "'after'"
    finally:
        loop.run(rt.kill(kid.id))
        loop.run(rt.delete_snapshot(good.tag))


def loading_the_stream(message: str) -> bool:
    """The error says the helper QEMU failed loading the stream (QEMU's exit or its migration state)."""
    return "while waiting for the branch stream to load" in message or "migrat" in message


def corrupt_stream_then_convert(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Make the helper QEMU load garbage: overwrite the capture's stream just before conversion."""
    real = branching.stream_to_snapshot
    corrupted: list[Path] = []

    async def corrupt(run_dir: Path, config: Any, *, stream: Path, **kwargs: Any) -> float:
        size = stream.stat().st_size
        with open(stream, "r+b") as f:
            f.write(b"not a QEMU migration stream\n" * 64)
        assert stream.stat().st_size == size > 0
        corrupted.append(stream)
        return await real(run_dir, config, stream=stream, **kwargs)

    monkeypatch.setattr(branching, "stream_to_snapshot", corrupt)
    return corrupted


def test_conversion_failure_registers_nothing_and_the_source_carries_on(
    loop: Loop, runtime: Runtime, snapshot: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sb = start_source(loop, runtime, snapshot)
    try:
        entries, qemus = snapshots_dir_entries(runtime), set(qemu_processes_of(runtime.data.root))
        corrupted = corrupt_stream_then_convert(monkeypatch)
        with pytest.raises(VMError) as failure:
            loop.run(runtime.branch(sb.id, tag="convert-fails", mode="full"))
        monkeypatch.undo()
        assert corrupted, "the conversion step was never reached"
        message = str(failure.value)
        # The phase: after the capture, while the helper QEMU loaded the stream.
        assert "branch convert-fails failed after the source resumed" in message, message
        assert "converting the stream into a snapshot failed" in message, message
        assert loading_the_stream(message), message
        with pytest.raises(NotFound):
            runtime.get_snapshot("convert-fails")
        assert "convert-fails" not in {s.tag for s in runtime.list_snapshots()}
        assert_no_trace(runtime, "convert-fails", entries, qemus)
        assert_source_usable(loop, runtime, sb.id)
        # The tag is free again: the next branch takes it.
        next_branch_is_whole_and_outlives_the_source(loop, runtime, sb, tag="convert-fails")
    finally:
        if sb.id in {s.id for s in runtime.list_sandboxes()}:
            loop.run(runtime.kill(sb.id))


def test_live_no_wait_conversion_failure_leaves_a_failed_entry(
    loop: Loop, runtime: Runtime, snapshot: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sb = start_source(loop, runtime, snapshot, live_fork=True)
    try:
        entries, qemus = snapshots_dir_entries(runtime), set(qemu_processes_of(runtime.data.root))
        corrupted = corrupt_stream_then_convert(monkeypatch)
        snap = loop.run(runtime.branch(sb.id, tag="live-convert-fails", mode="live", wait=False))
        assert snap.status == "writing"
        deadline = time.monotonic() + 300
        while runtime.get_snapshot("live-convert-fails").status == "writing":
            assert time.monotonic() < deadline, "the background branch never finished"
            loop.run(_sleep(0.1))
        monkeypatch.undo()
        assert corrupted, "the conversion step was never reached"
        # wait: false: the entry stays, failed, so that whoever polls sees why.
        failed = runtime.get_snapshot("live-convert-fails")
        info = failed.info()
        assert info["status"] == "failed"
        assert loading_the_stream(info["error"]), info
        assert "converting the stream into a snapshot failed" in info["error"], info
        assert "live-convert-fails" in {s.tag for s in runtime.list_snapshots()}
        with pytest.raises(Conflict, match="failed and cannot be forked"):
            loop.run(runtime.spawn("live-convert-fails", 1))
        # It holds no files and no process.
        assert_no_trace(runtime, "live-convert-fails", entries, qemus)
        assert_source_usable(loop, runtime, sb.id)
        # The tag is taken until the entry is deleted; then it can be used again.
        with pytest.raises(Conflict, match="already exists"):
            loop.run(runtime.branch(sb.id, tag="live-convert-fails", mode="live"))
        loop.run(runtime.delete_snapshot("live-convert-fails"))
        with pytest.raises(NotFound):
            runtime.get_snapshot("live-convert-fails")
        next_branch_is_whole_and_outlives_the_source(loop, runtime, sb)
    finally:
        if sb.id in {s.id for s in runtime.list_sandboxes()}:
            loop.run(runtime.kill(sb.id))


def test_disk_copy_failure_registers_nothing_and_the_next_branch_carries_the_layer(
    loop: Loop, runtime: Runtime, snapshot: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sb = start_source(loop, runtime, snapshot)
    try:
        entries, qemus = snapshots_dir_entries(runtime), set(qemu_processes_of(runtime.data.root))

        def no_room(*args: Any, **kwargs: Any) -> list[Path]:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")

        monkeypatch.setattr(disk_mod, "copy_layers", no_room)
        with pytest.raises(VMError, match=r"failed copying its disk: .*No space left on device"):
            loop.run(runtime.branch(sb.id, tag="copy-fails", mode="diff"))
        monkeypatch.undo()
        with pytest.raises(NotFound):
            runtime.get_snapshot("copy-fails")
        assert_no_trace(runtime, "copy-fails", entries, qemus)
        assert_source_usable(loop, runtime, sb.id)
        # The overlay frozen by the failed branch is copied by the next one.
        next_branch_is_whole_and_outlives_the_source(loop, runtime, sb)
    finally:
        if sb.id in {s.id for s in runtime.list_sandboxes()}:
            loop.run(runtime.kill(sb.id))


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)
