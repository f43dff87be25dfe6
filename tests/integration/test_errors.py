"""Bad input gets a clear error, never hangs, and leaks no process or file."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from forkd.controller.runtime import Runtime, SnapshotSpec
from forkd.errors import BootTimeout, Conflict, InvalidRequest, NotFound, VMError

from .conftest import Loop, qemu_processes_of

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def child(loop: Loop, runtime: Runtime, snapshot: str):
    sb = loop.run(runtime.spawn(snapshot, 1))[0]
    yield sb
    loop.run(runtime.kill(sb.id))


def test_unknown_snapshot(loop: Loop, runtime: Runtime) -> None:
    with pytest.raises(NotFound, match="no-such-tag"):
        loop.run(runtime.spawn("no-such-tag", 1))


@pytest.mark.parametrize("n", [0, 1001])
def test_n_out_of_range(loop: Loop, runtime: Runtime, snapshot: str, n: int) -> None:
    with pytest.raises(InvalidRequest, match="n must be between"):
        loop.run(runtime.spawn(snapshot, n))


@pytest.mark.parametrize("tag", ["../etc", "-x", "", "a" * 65, "a/b"])
def test_bad_tags(loop: Loop, runtime: Runtime, tag: str) -> None:
    with pytest.raises(InvalidRequest, match="invalid tag"):
        loop.run(runtime.spawn(tag, 1))


def test_duplicate_tag(loop: Loop, runtime: Runtime, snapshot: str) -> None:
    with pytest.raises(Conflict, match="already exists"):
        loop.run(runtime.create_snapshot(SnapshotSpec(tag=snapshot)))


def test_exec_missing_binary(loop: Loop, runtime: Runtime, child) -> None:
    res = loop.run(runtime.exec(child.id, ["definitely-not-installed"]))
    assert res["exit_code"] == 127
    assert "executable not found: definitely-not-installed" in res["error"]


def test_eval_that_raises(loop: Loop, runtime: Runtime, child) -> None:
    res = loop.run(runtime.eval(child.id, "1/0"))
    assert res["result"] is None
    assert res["exit_code"] == 1
    assert res["error"].startswith("ZeroDivisionError")
    # The interpreter survives it.
    assert loop.run(runtime.eval(child.id, "6*7"))["result"] == "42"


def test_exec_timeout_kills_process_group(loop: Loop, runtime: Runtime, child) -> None:
    started = time.monotonic()
    res = loop.run(runtime.exec(child.id, ["sh", "-c", "sleep 60 & sleep 60"], timeout_secs=1))
    assert time.monotonic() - started < 20
    assert res["timed_out"] is True
    assert res["exit_code"] == 124
    assert "timed out" in res["error"]
    left = loop.run(runtime.exec(child.id, ["sh", "-c", "ps -eo comm | grep -c '^sleep' || true"]))
    assert left["stdout"].strip() == "0"


def test_unknown_sandbox(loop: Loop, runtime: Runtime) -> None:
    with pytest.raises(NotFound):
        loop.run(runtime.ping("sb-000000-0000"))
    with pytest.raises(InvalidRequest):
        loop.run(runtime.ping("../../etc/passwd"))


def _assert_nothing_left(runtime: Runtime, tag: str) -> None:
    assert not runtime.registry.snapshots.has(tag)
    assert not (runtime.data.snapshots / tag).exists()
    assert [p for p in runtime.data.snapshots.iterdir() if p.name.startswith(f".{tag}.")] == []
    assert qemu_processes_of(runtime.data.snapshots / f".{tag}.tmp-") == []


def test_broken_image_fails_fast_with_guest_console(loop: Loop, runtime: Runtime, tmp_path: Path) -> None:
    garbage = tmp_path / "broken.ext4"
    garbage.write_bytes(b"\xde\xad\xbe\xef" * (16 << 18))  # 64 MiB, no filesystem
    started = time.monotonic()
    with pytest.raises(VMError, match="cannot mount"):
        loop.run(runtime.create_snapshot(SnapshotSpec(tag="broken", rootfs=str(garbage), boot_wait_secs=120)))
    assert time.monotonic() - started < 90
    _assert_nothing_left(runtime, "broken")


def test_guest_that_does_not_boot_in_time(loop: Loop, runtime: Runtime) -> None:
    with pytest.raises(BootTimeout, match="timed out after 1s"):
        loop.run(runtime.create_snapshot(SnapshotSpec(tag="too-slow", boot_wait_secs=1)))
    _assert_nothing_left(runtime, "too-slow")


def test_failing_setup_command(loop: Loop, runtime: Runtime) -> None:
    spec = SnapshotSpec(tag="bad-setup", setup=[["sh", "-c", "echo oops >&2; exit 3"]])
    with pytest.raises(InvalidRequest, match="exit code 3: oops"):
        loop.run(runtime.create_snapshot(spec))
    _assert_nothing_left(runtime, "bad-setup")
