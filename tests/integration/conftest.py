"""Shared fixtures for tests that boot real QEMU microVMs (TCG on our CI hosts).

One template boot is shared by the whole session: booting costs seconds under
TCG, forking costs milliseconds, so tests fork from the ``py`` snapshot.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from forkd.config import DataDir, default_data_dir
from forkd.controller.runtime import Runtime, SnapshotSpec
from forkd.image.builder import load_image

T = TypeVar("T")


class Loop:
    """Runs coroutines on one event loop that lives as long as the session's Runtime."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 600) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def gather(self, *coros: Coroutine[Any, Any, T], timeout: float = 600) -> list[T]:
        async def _all() -> list[T]:
            return list(await asyncio.gather(*coros))

        return self.run(_all(), timeout)

    def close(self) -> None:
        self.loop.close()


def images_dir() -> Path:
    """The guest image `make test` built (shared cache), not the throwaway data dir's."""
    return Path(os.environ.get("FORKD_IMAGES_DIR") or default_data_dir() / "images")


@pytest.fixture(scope="session")
def data_dir() -> Iterator[DataDir]:
    try:
        load_image(DataDir(Path("/nonexistent"), images_dir()))
    except Exception as exc:
        pytest.fail(f"no guest image ({exc}); run `make test`, which builds it first")
    data = DataDir.scratch("forkd-test-")
    yield DataDir(data.root, images_dir())
    shutil.rmtree(data.root, ignore_errors=True)


@pytest.fixture(scope="session")
def loop() -> Iterator[Loop]:
    lp = Loop()
    yield lp
    lp.close()


@pytest.fixture(scope="session")
def runtime(loop: Loop, data_dir: DataDir) -> Iterator[Runtime]:
    rt = loop.run(Runtime.open(data_dir))
    yield rt
    loop.run(rt.close())
    leftover = qemu_processes_of(data_dir.root)
    assert not leftover, f"QEMU processes left behind: {leftover}"


@pytest.fixture(scope="session")
def snapshot(loop: Loop, runtime: Runtime) -> str:
    """The warm parent every fork test starts from."""
    loop.run(runtime.create_snapshot(SnapshotSpec(tag="py", boot_wait_secs=180)))
    return "py"


def qemu_processes_of(root: Path) -> list[str]:
    out = subprocess.run(["pgrep", "-af", "qemu-system"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(root) in line]


@pytest.fixture
def sdk_env(daemon, monkeypatch: pytest.MonkeyPatch):
    """FORKD_URL / FORKD_TOKEN for ``Controller()`` and ``Sandbox()`` without arguments.

    ``daemon`` is the module's own daemon fixture (test_daemon*.py).
    """
    for name in ("FORKD_TOKEN_FILE", "FORKD_CA_CERT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FORKD_URL", daemon.url)
    monkeypatch.setenv("FORKD_TOKEN", daemon.token)
    return daemon
