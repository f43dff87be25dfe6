"""The /dev/shm directory of live_fork memory is the daemon's own (issue 24 #4).

Its name (``forkd-<hash of the data dir>``) is predictable and /dev/shm is
world-writable, so another user can make it first. Checked on real tmpfs
directories under /dev/shm (a temporary parent of the test's own), with
``chown`` to ``nobody`` standing in for the other user.
"""

from __future__ import annotations

import asyncio
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from forkd.errors import Conflict
from forkd.host import shm

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


@pytest.fixture
def shm_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    parent = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    root = Path(tempfile.mkdtemp(prefix="fkd-shmtest-", dir=parent))
    monkeypatch.setattr(shm, "SHM_ROOT", root)
    yield root
    for p in sorted(root.rglob("*"), reverse=True):
        if p.is_dir() and not p.is_symlink():
            p.rmdir()
        else:
            p.unlink()
    root.rmdir()


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_memory_goes_to_a_directory_made_0700_and_files_made_0600(shm_root: Path, tmp_path: Path) -> None:
    source = tmp_path / "mem"
    source.write_bytes(b"guest ram " * 1000)
    source.chmod(0o644)
    mem = shm.ShmMemory(tmp_path)
    assert mem.dir.parent == shm_root and mem.dir == shm.shm_dir_of(tmp_path)
    old = os.umask(0o022)
    try:
        target = asyncio.run(mem.ensure("py", source))
    finally:
        os.umask(old)
    assert target.read_bytes() == source.read_bytes()
    assert _mode(mem.dir) == 0o700 and _mode(target) == 0o600
    assert asyncio.run(mem.ensure("py", source)) == target  # made once, then reused (it is ours)


@needs_root
def test_a_directory_someone_else_made_first_is_refused_and_left_alone(
        shm_root: Path, tmp_path: Path) -> None:
    source = tmp_path / "mem"
    source.write_bytes(b"secret" * 100)
    mem = shm.ShmMemory(tmp_path)
    mem.dir.mkdir(mode=0o777)  # nobody was there first, as in the report
    os.chown(mem.dir, NOBODY, NOBODY)
    mem.dir.chmod(0o777)
    planted = mem.dir / "py.mem"
    planted.write_bytes(b"nobody's bytes")
    os.chown(planted, NOBODY, NOBODY)
    with pytest.raises(Conflict) as err:
        asyncio.run(mem.ensure("py", source))
    msg = str(err.value)
    assert str(mem.dir) in msg and f"owned by uid {NOBODY}" in msg and f"rm -rf {mem.dir}" in msg
    assert sorted(p.name for p in mem.dir.iterdir()) == ["py.mem"]  # nothing of ours went in
    assert planted.read_bytes() == b"nobody's bytes"
    mem.prune(keep=set())  # nor is anything in it deleted as if it were ours
    assert planted.exists()


@pytest.mark.parametrize("make", ["loose mode", "symlink", "file"])
def test_an_existing_path_that_is_not_a_private_directory_is_refused(
        shm_root: Path, tmp_path: Path, make: str) -> None:
    mem = shm.ShmMemory(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    if make == "loose mode":
        mem.dir.mkdir()
        mem.dir.chmod(0o755)
    elif make == "symlink":
        mem.dir.symlink_to(elsewhere)  # a link to a private directory is still not ours to use
    else:
        mem.dir.write_bytes(b"")
    source = tmp_path / "mem"
    source.write_bytes(b"x" * 100)
    with pytest.raises(Conflict, match=str(mem.dir)):
        asyncio.run(mem.ensure("py", source))
    assert list(elsewhere.iterdir()) == []


def test_a_private_directory_of_ours_is_reused(shm_root: Path, tmp_path: Path) -> None:
    d = shm_root / "forkd-0123456789"
    d.mkdir(mode=0o700)
    assert shm.private_dir(d) == d
