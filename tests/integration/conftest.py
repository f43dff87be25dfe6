"""Shared fixtures for tests that boot real QEMU microVMs (TCG on our CI hosts).

One template boot is shared by the whole session: booting costs seconds under
TCG, forking costs milliseconds, so tests fork from the ``py`` snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from forkd.config import DataDir, default_data_dir
from forkd.controller.runtime import Runtime, SnapshotSpec
from forkd.image.builder import load_image
from forkd.store.layout import SnapshotDir
from forkd.store.records import SnapshotRecord
from forkd.vmm import console

T = TypeVar("T")

# The long floods and soaks (a minute of console flood, 20 s on the agent port, 200 networked
# children, 100 MiB transfers) run in a short form in `make test`, with the same checks, and in
# full in `make stress`, which sets FORKD_FULL_SOAKS=1 and selects them by the "soak" marker.
FULL_SOAKS = os.environ.get("FORKD_FULL_SOAKS") == "1"


def soak(short: T, full: T) -> T:
    """``full`` under `make stress`, ``short`` in `make test`."""
    return full if FULL_SOAKS else short


# A failed VM test keeps the consoles of the VMs that ran during it: the sandboxes it killed (copied
# aside by the runtime or daemon as their run directories go: forkd.vmm.console.keep_for_debugging)
# and the ones still running, with the tail of each daemon log written meanwhile, under
# test-artifacts/<test>/ (or $FORKD_TEST_ARTIFACTS), named in the report.
ARTIFACTS = Path(os.environ.get("FORKD_TEST_ARTIFACTS") or Path(__file__).parents[2] / "test-artifacts")
_KEPT_CONSOLES = Path(tempfile.mkdtemp(prefix="forkd-consoles-"))
os.environ[console.KEEP_DIR_ENV] = str(_KEPT_CONSOLES)  # daemons this session starts inherit it
_SESSION_START = time.time()
DAEMON_LOG_TAIL = 1 << 20  # the end of a daemon's log is what tells about the failure


def _consoles_since(started: float) -> list[Path]:
    kept = [p for p in _KEPT_CONSOLES.glob("*.console.log") if p.stat().st_mtime >= started]
    # Running sandboxes of this session's data dirs (scratch ones under /tmp, made since it began).
    live = [p for p in Path("/tmp").glob("*/sandboxes/*/console.log")
            if p.parents[2].stat().st_ctime >= _SESSION_START and p.stat().st_mtime >= started]
    return kept + live


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """The container test runs last, its image built in the background meanwhile (container_image.py):
    the build's minutes overlap the other VM tests."""
    container = [item for item in items if item.path.name == "test_container.py"]
    if not container:
        return
    items[:] = [item for item in items if item.path.name != "test_container.py"] + container
    from . import container_image

    if container_image.PODMAN is None or container_image.BUILD is not None:
        return
    # One build per session, in a folder every xdist worker of the session names alike: the first
    # worker starts it, the one that draws the container test waits for it (container_image.py).
    run = getattr(config, "workerinput", {}).get("testrunuid") or f"{os.getpid()}"
    container_image.BUILD = container_image.ImageBuild(images_dir(), Path(tempfile.gettempdir())
                                                       / f"forkd-ctr-{run[:16]}")
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0":
        container_image.BUILD.start()


def _daemon_logs_since(started: float) -> list[Path]:
    """The logs of this session's daemons (their data dirs are scratch ones under /tmp) written
    during the test: what the daemon said about the VMs it ran for it."""
    return [p for p in Path("/tmp").glob("*/daemon.log")
            if p.parent.stat().st_ctime >= _SESSION_START and p.stat().st_mtime >= started]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "setup":
        item.stash[_STARTED] = time.time()
        # Consoles of tests that passed are not needed: keep the kept directory small.
        for old in _KEPT_CONSOLES.glob("*.console.log"):
            with contextlib.suppress(OSError):
                old.unlink()
    if not report.failed or item.get_closest_marker("vm") is None:
        return
    dest = ARTIFACTS / item.nodeid.replace("/", "_").replace("::", "__")[:200]
    copied = 0
    for log in _consoles_since(item.stash.get(_STARTED, _SESSION_START)):
        with contextlib.suppress(OSError):
            dest.mkdir(parents=True, exist_ok=True)
            name = log.name if log.parent == _KEPT_CONSOLES else f"{log.parent.name}.console.log"
            shutil.copyfile(log, dest / name)
            copied += 1
    for log in _daemon_logs_since(item.stash.get(_STARTED, _SESSION_START)):
        with contextlib.suppress(OSError), log.open("rb") as f:
            dest.mkdir(parents=True, exist_ok=True)
            f.seek(max(0, log.stat().st_size - DAEMON_LOG_TAIL))
            (dest / f"{log.parent.name}.daemon.log").write_bytes(f.read())
            copied += 1
    if copied:
        report.sections.append(("VM consoles", f"{copied} console and daemon log(s) kept in {dest}"))


_STARTED = pytest.StashKey[float]()


def pytest_sessionfinish(session: pytest.Session) -> None:
    shutil.rmtree(_KEPT_CONSOLES, ignore_errors=True)
    from . import container_image

    if container_image.BUILD is not None:
        container_image.BUILD.stop()  # a session that ended before its container test


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


# The host's forkd-child-<i> namespaces are one set of names for every daemon on it. The tests that
# provision, make or count them live in several modules, which run on parallel workers: they take
# turns here, so that none meets another worker's namespaces (and skips, or fails counting them).
# A forkd that is not this run's still makes them skip.
CHILD_NETNS_LOCK = Path(tempfile.gettempdir()) / "forkd-tests-child-netns.lock"
_child_netns_held: list[int] = []  # this process's lock file while it holds the turn (re-entered)


@contextlib.contextmanager
def child_netns_turn() -> Iterator[None]:
    """This worker's turn with the host's forkd-child-<i> names; re-entrant within the worker
    (a module's fixture holds it across tests that take it again)."""
    if _child_netns_held:
        _child_netns_held.append(_child_netns_held[-1])
        try:
            yield
        finally:
            _child_netns_held.pop()
        return
    fd = os.open(CHILD_NETNS_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _child_netns_held.append(fd)
        try:
            yield
        finally:
            _child_netns_held.pop()
    finally:
        os.close(fd)  # the lock goes with it


@pytest.fixture
def child_netns() -> Iterator[None]:
    """The test's turn with the host's forkd-child-<i> names (``child_netns_turn``)."""
    with child_netns_turn():
        yield


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


# The session's template: what the daemon tests ask their shared daemon for as "py", too.
SNAPSHOT_RECIPE: dict[str, Any] = {"boot_wait_secs": 180}


@pytest.fixture(scope="session")
def snapshot(loop: Loop, runtime: Runtime) -> str:
    """The warm parent every fork test starts from."""
    loop.run(runtime.create_snapshot(SnapshotSpec(tag="py", **SNAPSHOT_RECIPE)))
    return "py"


# The session's template with a NIC: what the network tests fork from, and what a daemon of their
# own (hibernation, two daemons, the other ways in) starts with under the tag it asks for. A guest's
# address inside its namespace is the same on every daemon, so such a template moves between data dirs.
NIC_RECIPE: dict[str, Any] = {"nic": True, "boot_wait_secs": 240}


@pytest.fixture(scope="session")
def nic_snapshot(loop: Loop, runtime: Runtime) -> str:
    """The session's one boot of a template with a NIC (``py-nic``)."""
    loop.run(runtime.create_snapshot(SnapshotSpec(tag="py-nic", **NIC_RECIPE)))
    return "py-nic"


def seed_template(loop: Loop, runtime: Runtime, tag: str, root: Path, as_tag: str | None = None) -> None:
    """Register ``runtime``'s template ``tag`` in the data dir ``root`` (as ``as_tag``), hard-linked
    (a template's files are never written in place), before a runtime or daemon opens it there: it
    forks the template without a boot. Only its snapshot.json, which names the tag, is written anew."""
    as_tag = as_tag or tag
    data = DataDir(root, images_dir())
    rt = loop.run(Runtime.open(data))
    try:
        src = runtime.get_snapshot(tag)
        dst = data.snapshots / as_tag
        shutil.copytree(src.dir, dst, copy_function=os.link)
        if as_tag != tag:
            snap = SnapshotDir(dst)
            meta = json.loads(snap.meta_path.read_text())
            snap.write_meta({**meta, "tag": as_tag})  # a new file: the link is replaced
        rt.registry.snapshots.insert(SnapshotRecord(tag=as_tag, dir=str(dst),
                                                    created_at_unix=src.created_at_unix))
    finally:
        loop.run(rt.close())


Seeder = Callable[..., None]


@pytest.fixture(scope="session")
def seed(loop: Loop, runtime: Runtime) -> Seeder:
    """``seed(root, base="py", pynet="py-nic")``: the session's templates (booted by their
    fixtures, which the caller requests) registered in the data dir ``root`` under the tags its
    tests use, before its daemon starts. For modules with a daemon of their own."""
    def _seed(root: Path, **tags: str) -> None:
        for as_tag, tag in tags.items():
            seed_template(loop, runtime, tag, root, as_tag)

    return _seed


@pytest.fixture(scope="session")
def shared_daemons(loop: Loop, runtime: Runtime, snapshot: str) -> Iterator[Any]:
    """Real ``forkd daemon`` processes shared by the modules that do not test the daemon's own
    lifecycle, and their templates, booted once a session by tag (daemon_fixture.SharedDaemons).
    Each starts with the session's ``py`` template (the ``snapshot`` fixture's boot) in its data dir."""
    from .daemon_fixture import SharedDaemons  # it imports this module

    shared = SharedDaemons(seed=lambda root: seed_template(loop, runtime, snapshot, root),
                           seeded={snapshot: SNAPSHOT_RECIPE})
    yield shared
    shared.close()


# Snapshots that travel (test_travel.py, test_travel_lazy.py): one object store, one source runtime
# and one branch chain for both modules, built once a session (test_travel.py has the helpers).
@pytest.fixture(scope="session")
def travel_s3() -> Iterator[Any]:
    """moto's S3 server, its variables set for the rest of the session (runtimes read them)."""
    from .services import environ, s3_server

    with s3_server() as server, environ(server.env):
        yield server


@pytest.fixture(scope="session")
def travel_source(loop: Loop, travel_s3: Any, snapshot: str, seed: Seeder) -> Iterator[Runtime]:
    """A runtime with an object store, started with the session's template as ``tv-py``."""
    from .test_travel import TEMPLATE, close_runtime, open_runtime, scratch

    data = scratch()
    seed(data.root, **{TEMPLATE: snapshot})  # no boot of its own
    rt = open_runtime(loop, travel_s3, data=data)
    yield rt
    close_runtime(loop, rt)


@pytest.fixture(scope="session")
def travel_chain(loop: Loop, travel_source: Runtime) -> dict[str, Any]:
    """tv-py -> tv-b1 -> tv-b2 -> tv-b3 on ``travel_source`` (test_travel.build_chain)."""
    from .test_travel import build_chain

    return loop.run(build_chain(travel_source), timeout=900)


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
