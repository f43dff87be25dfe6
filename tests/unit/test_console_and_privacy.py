"""A hostile guest's console cannot fill the host's disk; forkd's files are private."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from forkd.config import DataDir
from forkd.controller.console_warden import ConsoleWarden, console_logs
from forkd.store.registry import Registry
from forkd.vmm import console


def test_cap_cuts_an_appended_log_and_keeps_its_tail(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    # QEMU's chardev file with append=on: O_APPEND, so writes after a cut land at 0.
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for i in range(3000):
            os.write(fd, f"line {i:05d} {'x' * 1000}\n".encode())
        assert console.cap(log, max_bytes=1 << 20, keep=64 << 10)
        assert log.stat().st_size == 0
        prev = console.previous(log).read_bytes()
        assert len(prev) == 64 << 10 and prev.endswith(b"line 02999 " + b"x" * 1000 + b"\n")
        os.write(fd, b"after the cut\n")
    finally:
        os.close(fd)
    assert log.read_bytes() == b"after the cut\n"  # not at the old offset: no sparse growth
    assert not console.cap(log, max_bytes=1 << 20)
    tail = console.read_tail(log, 2)
    assert tail.splitlines()[0].startswith("line 02999") and tail.endswith("after the cut")


def test_the_warden_finds_every_vms_log(tmp_path: Path) -> None:
    data = DataDir(tmp_path / "data").ensure()
    logs = [data.sandboxes / "sb-abcdef-0000" / "console.log",
            data.snapshots / ".py.tmp-1234" / "console.log",
            data.snapshots / ".b1.tmp-5678" / "helper" / "console.log"]
    for log in logs:
        log.parent.mkdir(parents=True)
        log.write_bytes(b"x" * 2048)
    (data.snapshots / "py").mkdir()
    (data.snapshots / "py" / "console.log").write_bytes(b"x" * 2048)  # published: no VM writes it
    assert sorted(console_logs(data)) == sorted(logs)
    assert ConsoleWarden(data, max_bytes=1024).sweep() == 3
    assert all(log.stat().st_size == 0 for log in logs)


def test_state_is_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        data = DataDir(tmp_path / "data").ensure()
        registry = Registry(data.registry)
        registry.close()
    finally:
        os.umask(old)
    for path in (data.snapshots, data.sandboxes):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    assert stat.S_IMODE(data.registry.stat().st_mode) == 0o600
