"""What snapshot travel writes is private to the daemon's user (issue 24 #5): the staging of
an unpack (guest memory), an export's disk copies and the archive itself were 0644 under the
default umask. Checked with umask 022, as a daemon started from a login shell has."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from forkd.config import DataDir
from forkd.controller.travel import SnapshotTravel
from forkd.store import archive, sparse
from tests.unit.test_travel_store import packed


@pytest.fixture(autouse=True)
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_an_archive_and_what_it_unpacks_are_0600(tmp_path: Path) -> None:
    m, blobs = packed(tmp_path)
    out = tmp_path / "a.forkd"
    archive.write(out, m, blobs)
    assert _mode(out) == 0o600
    staging = tmp_path / "staging"
    staging.mkdir(mode=0o700)
    _, extracted = archive.read(out, staging, lambda manifest, omitted: set(manifest.blobs()))
    assert extracted and {p: _mode(p) for p in extracted.values()} == {p: 0o600 for p in extracted.values()}


def test_a_sparse_copy_is_0600(tmp_path: Path) -> None:
    src = tmp_path / "disk.qcow2"
    src.write_bytes(b"q" * 10_000)
    src.chmod(0o644)
    sparse.copy(src, tmp_path / "copy")
    assert _mode(tmp_path / "copy") == 0o600


def test_travel_staging_directories_are_0700(tmp_path: Path) -> None:
    data = DataDir(tmp_path / "data", tmp_path / "images")
    data.travel.mkdir(parents=True, mode=0o755)  # as an older forkd left it
    data.travel.chmod(0o755)
    none: Any = None
    travel = SnapshotTravel(data, none, none, none)
    work = travel.workdir("unpack")
    assert work.parent == data.travel and work.name.startswith(".unpack-")
    assert _mode(data.travel) == 0o700 and _mode(work) == 0o700
