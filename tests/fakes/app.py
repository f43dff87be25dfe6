"""The daemon's app behind a TestClient, with a token: for REST-layer tests.

``daemon_app`` runs the app on the real ``Runtime`` (opened by the app's own lifespan on a data
dir under ``tmp_path``) over the test double of QEMU (``tests.fakes.vmm``) and a tiny guest
image: every route reaches the real controller, and only the VM's process, its QMP and its
guest agent are stand-ins. ``app_client`` is the same on a runtime given by the test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.types import ASGIApp

from forkd.api.app import create_app
from forkd.api.settings import Settings
from forkd.config import DataDir
from forkd.controller.runtime import Runtime, SnapshotSpec
from forkd.host import cgroups
from forkd.store.registry import SandboxRecord, SnapshotRecord
from tests.fakes import guest, vmm

TOKEN = "0f3c9a7b5e2d4c1a8b6f0e9d7c5a3b1f"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
T = TypeVar("T")

# A sandbox's memory limit is a cgroup the daemon makes: a test of one needs a host that lets it.
needs_memory_cgroups = pytest.mark.skipif(
    os.geteuid() != 0 or cgroups.detect() == "none",
    reason="memory limits need root and a memory cgroup hierarchy (the daemon makes one per sandbox)")


def guest_image(images: Path, name: str = "default") -> Path:
    """A guest image the test double of QEMU can "boot": its files exist, nothing in them runs."""
    image = images / name
    image.mkdir(parents=True, exist_ok=True)
    (image / "image.json").write_text(json.dumps({"name": name, "key": "test-double"}))
    (image / "vmlinux").write_bytes(b"\x7fELF")
    (image / "initramfs.img").write_bytes(b"")
    subprocess.run(["qemu-img", "create", "-q", "-f", "raw", str(image / "rootfs.ext4"), "64M"], check=True)
    return image


@contextmanager
def fake_qemu(tmp_path: Path) -> Iterator[None]:
    """The test double of QEMU first on PATH (and no accelerator probe) while the block runs."""
    bin_dir = vmm.install(tmp_path / "bin").parent
    saved = {k: os.environ.get(k) for k in ("PATH", "FORKD_ACCEL")}
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ["FORKD_ACCEL"] = "tcg"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@asynccontextmanager
async def open_runtime(tmp_path: Path, snapshots: tuple[str, ...] = ("py",)) -> AsyncIterator[Runtime]:
    """A real runtime over the QEMU double, opened on the running loop (for an app the test drives
    through ``httpx.ASGITransport``), with the snapshots ``snapshots`` made."""
    data = Path(tempfile.mkdtemp(prefix="fkt-", dir="/tmp"))  # short: see daemon_app
    guest_image(data / "images")
    try:
        with fake_qemu(tmp_path):
            async with await Runtime.open(DataDir(data)) as rt:
                for tag in snapshots:
                    await rt.create_snapshot(SnapshotSpec(tag=tag))
                yield rt
    finally:
        shutil.rmtree(data, ignore_errors=True)


@dataclass
class Daemon:
    """The app, its client and its real runtime; ``run`` calls the runtime on the app's loop."""

    client: TestClient
    app: FastAPI
    data: Path

    @property
    def runtime(self) -> Runtime:
        rt = self.app.state.runtime
        assert isinstance(rt, Runtime)
        return rt

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        portal = self.client.portal
        assert portal is not None, "only inside the client's context"

        async def call() -> T:
            return await fn(*args, **kwargs)

        return portal.call(call)

    def guest_requests(self, sandbox_id: str, action: str | None = None) -> list[dict[str, Any]]:
        """What the sandbox's guest has been asked so far (only ``action``'s, if given)."""
        run_dir = Path(self.runtime.get_sandbox(sandbox_id).dir)
        return [r for r in guest.requests(run_dir) if action is None or r.get("action") == action]

    def snapshot(self, tag: str = "py") -> SnapshotRecord:
        return self.run(self.runtime.create_snapshot, SnapshotSpec(tag=tag))

    def sandbox(self, tag: str = "py") -> SandboxRecord:
        return self.run(self.runtime.spawn, tag)[0]


@contextmanager
def daemon_app(tmp_path: Path, *, headers: dict[str, str] | None = None, snapshots: tuple[str, ...] = ("py",),
               token: bool = True, wrap: Callable[[FastAPI], ASGIApp] | None = None,
               **settings: Any) -> Iterator[Daemon]:
    """The app on a real runtime over the QEMU double, with the snapshots ``snapshots`` made
    (token ``TOKEN`` unless not ``token``; ``headers`` on every request; the client calls
    ``wrap(app)`` if given, e.g. a middleware of the test's)."""
    # Short: a VM's sockets live under it, and a unix socket's path has at most 107 bytes.
    data = Path(tempfile.mkdtemp(prefix="fkt-", dir="/tmp"))
    guest_image(data / "images")
    if token:
        (tmp_path / "token").write_text(TOKEN)
        settings.setdefault("token_file", tmp_path / "token")
    config = Settings(data_dir=data, audit_log=tmp_path / "audit.log", **settings)
    app = create_app(config)
    try:
        with fake_qemu(tmp_path), TestClient(wrap(app) if wrap else app, raise_server_exceptions=False,
                                             headers=headers or {}) as client:
            daemon = Daemon(client, app, data)
            for tag in snapshots:
                daemon.snapshot(tag)
            yield daemon
    finally:
        shutil.rmtree(data, ignore_errors=True)


@contextmanager
def app_client(tmp_path: Path, runtime: Runtime, *, headers: dict[str, str] | None = None,
               **settings: Any) -> Iterator[TestClient]:
    """A client of the app on ``runtime`` (token ``TOKEN``, data under ``tmp_path``)."""
    (tmp_path / "token").write_text(TOKEN)
    config = Settings(token_file=tmp_path / "token", data_dir=tmp_path / "data",
                      audit_log=tmp_path / "audit.log", **settings)
    with TestClient(create_app(config, runtime=runtime), raise_server_exceptions=False,
                    headers=headers or {}) as client:
        yield client
