"""The other ways in, against one real daemon with real VMs: the TypeScript SDK
(node's test runner), the MCP server (the ``mcp`` package's client, over stdio and
streamable HTTP) and the web console (headless Chromium driven by Playwright).

One daemon and one template boot (the seed's ``pyagent`` snapshot) serve the whole
module; every test kills what it made, and the module teardown stops the daemon
with SIGTERM and checks that none of its QEMUs is left.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .daemon_fixture import Daemon, kill_qemus_of, new_daemon, shutdown_and_check

pytestmark = pytest.mark.vm

ROOT = Path(__file__).resolve().parents[2]
TS_SDK = ROOT / "sdk" / "typescript"
NETNS_SETUP = ROOT / "scripts" / "netns-setup.sh"
TAG = "pyagent"  # seed 002's snapshot tag, used verbatim by its TypeScript snippet


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = new_daemon("fkw-")
    try:
        d.start()
    except BaseException:
        d.stop()
        kill_qemus_of(d.root)
        raise
    yield d
    shutdown_and_check(d)


@pytest.fixture(scope="module")
def http(daemon: Daemon) -> Iterator[httpx.Client]:
    with daemon.client() as client:
        yield client


@pytest.fixture(scope="module")
def pyagent(http: httpx.Client) -> str:
    """The module's one template boot."""
    started = time.monotonic()
    r = http.post("/v1/snapshots", json={"tag": TAG}, timeout=600)
    assert r.status_code == 201, r.text
    print(f"\ntemplate boot + snapshot '{TAG}': {time.monotonic() - started:.1f} s")
    return TAG


@pytest.fixture(autouse=True)
def no_sandboxes_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "daemon" not in request.fixturenames:
        return
    d: Daemon = request.getfixturevalue("daemon")
    with d.client() as c:
        left = [sb["id"] for sb in c.get("/v1/sandboxes").json()]
        for sb_id in left:
            c.delete(f"/v1/sandboxes/{sb_id}")
    assert not left, f"test left sandboxes running: {left}"


@pytest.fixture(scope="module")
def netns_zero() -> Iterator[str]:
    """The namespace ``forkd-child-0`` seed 002's ``perChildNetns: true`` child runs in.

    Made with ``scripts/netns-setup.sh 1`` if the host lacks it, and removed
    afterwards only then (another test run may be using an existing one).
    """
    if os.geteuid() != 0:
        pytest.skip("per_child_netns needs root (network namespaces)")
    existing = Path("/run/netns/forkd-child-0").exists()
    if not existing:
        out = subprocess.run([str(NETNS_SETUP), "1"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    yield "forkd-child-0"
    if not existing:
        out = subprocess.run([str(NETNS_SETUP), "1", "--teardown"], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr


def node_env(daemon: Daemon) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORKD_")}
    env.update(FORKD_URL=daemon.url, FORKD_TOKEN=daemon.token, FORKD_TEST_TAG=TAG)
    return env


# ------------------------------------------------------------ TypeScript SDK


def test_typescript_sdk(daemon: Daemon, pyagent: str, netns_zero: str) -> None:
    """``npm test`` in sdk/typescript: tsc (strict) builds the SDK and its tests,
    then node's test runner runs seed 002's snippet and the SDK's surface."""
    assert (TS_SDK / "node_modules").is_dir(), "run `make node-deps` (npm ci) first; `make test` does"
    npm = shutil.which("npm")
    assert npm, "npm is not installed; scripts/install-deps.sh installs it"
    started = time.monotonic()
    out = subprocess.run(
        [npm, "test", "--silent"], cwd=TS_SDK, env=node_env(daemon),
        capture_output=True, text=True, timeout=900,
    )
    report = out.stdout + out.stderr
    print(f"\nnode --test against the daemon: {time.monotonic() - started:.1f} s\n{report[-3000:]}")
    assert out.returncode == 0, report[-12000:] + "\n" + daemon.log_tail()
    # The runner's closing lines: every test passed, and there were some.
    assert "# fail 0" in report
    passed = int(report.rsplit("# pass ", 1)[1].split()[0])
    assert passed >= 15, report[-3000:]
