"""A daemon's scratch files live under its data dir and a start collects what a crash left (issue 38,
item 17): nothing of the daemon's goes to the host's shared /tmp."""

from __future__ import annotations

import ast
from pathlib import Path

from forkd.config import DataDir
from forkd.store.datalock import DataDirLock
from forkd.vmm import branching

SRC = Path(__file__).resolve().parents[2] / "src" / "forkd"
# Not the daemon: the guest's own /tmp, and the CLI's files on the client's machine.
NOT_DAEMON = ("guest", "cli")


def _left_by_a_crash(data: DataDir) -> list[Path]:
    data.ensure()
    build = data.tmp / "build-x1y2"
    (build / "ctx").mkdir(parents=True)
    (build / "ctx" / "Dockerfile").write_text("FROM default\n")
    probe = data.tmp / "probe-abc"
    probe.mkdir()
    (probe / "console.log").write_text("boot")
    stray = data.tmp / "partial.bin"
    stray.write_bytes(b"x")
    return [build, probe, stray]


def test_a_start_alone_on_its_data_dir_collects_the_scratch_a_crash_left(tmp_path: Path) -> None:
    data = DataDir(tmp_path / "data")
    left = _left_by_a_crash(data)
    lock = DataDirLock.shared(data, when_alone=data.clear_tmp)  # what Runtime.open takes
    try:
        assert not any(p.exists() for p in left)
        assert data.tmp.is_dir() and oct(data.tmp.stat().st_mode & 0o777) == "0o700"
        # It holds the dir shared afterwards: another Runtime may open it, an offline pack may not.
        DataDirLock.shared(data).release()
    finally:
        lock.release()


def test_a_second_runtime_on_the_same_dir_leaves_the_first_ones_scratch_alone(tmp_path: Path) -> None:
    data = DataDir(tmp_path / "data")
    first = DataDirLock.shared(data)  # a live daemon, mid-build
    left = _left_by_a_crash(data)
    second = DataDirLock.shared(data, when_alone=data.clear_tmp)
    try:
        assert all(p.exists() for p in left)
    finally:
        second.release()
        first.release()


def test_a_branch_streams_error_file_is_beside_its_stream_not_in_tmp(tmp_path: Path) -> None:
    stream = tmp_path / "snapshots" / ".staging-x" / "stream"
    uri = branching.stream_uri(stream)
    assert "/tmp/" not in uri.replace(str(tmp_path), "<data>")
    assert f"2> {stream.parent}/stream.err" in uri


def _tmp_uses(path: Path) -> list[str]:
    """Calls that would put a file in the host's /tmp: tempfile without ``dir=``, gettempdir,
    or a literal "/tmp" path."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                isinstance(node.func.value, ast.Name) and node.func.value.id == "tempfile" and \
                (node.func.attr == "gettempdir" or not any(k.arg == "dir" for k in node.keywords)):
            found.append(f"{path.name} tempfile.{node.func.attr}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("/tmp"):
            found.append(f"{path.name} {node.value!r}")
    return found


def test_no_daemon_code_path_writes_to_the_hosts_tmp() -> None:
    uses = [u for path in sorted(SRC.rglob("*.py"))
            if path.relative_to(SRC).parts[0] not in NOT_DAEMON for u in _tmp_uses(path)]
    # config.DataDir.scratch: throwaway data dirs for tests and benchmarks, by design under /tmp
    # (QEMU's unix socket paths are limited to 108 bytes); it is no daemon's crash leftover.
    # template_build's is a path inside the guest being built, not the host's; volume_spec's is a
    # guest directory a volume may not be mounted over; diffs' is a guest path a diff leaves out.
    assert uses == ["config.py '/tmp'", "diffs.py '/tmp'", "template_build.py '/tmp/.forkd-copy-'",
                    "volume_spec.py '/tmp'"], uses
