"""What `pip install forkd` and its extras give, in fresh virtualenvs (real pip installs, from the index).

`pip install forkd` is the SDK and the `forkd` command alone: no FastAPI, uvicorn, qemu.qmp,
boto3, e2b or mcp. `forkd[daemon]` runs the daemon; `forkd[fleet]` and `forkd[mcp]` import the
gateway and the MCP server. Each install uses constraints.txt, as `make setup` does. One wheel is
built from a copy of the tree (never in it, so parallel runs do not share build/), and one venv is
made per set of extras and reused by the tests that need it. Slow-ish (pip installs, ~1-2 min with
a warm pip cache); not a VM test.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "constraints.txt"
DAEMON_ONLY = ("fastapi", "starlette", "uvicorn", "qemu.qmp", "prometheus_client", "boto3", "e2b",
               "connectrpc", "mcp", "zstandard")  # pydantic: typer needs it too


def _run(*args: str | Path, timeout: float = 600, env: dict[str, str] | None = None,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                         env=env, cwd="/")
    if check and out.returncode != 0:
        raise AssertionError(f"{args} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


def _clean_env() -> dict[str, str]:
    """No PYTHONPATH (it would put this checkout's src/ in front of what pip installed)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = tmp_path_factory.mktemp("forkd-tree")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
    dist = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
         "-w", dist, tree, env=_clean_env())
    (built,) = dist.glob("forkd-*.whl")
    return built


def _venv(where: Path, wheel: Path, extras: str) -> Path:
    _run(sys.executable, "-m", "venv", where, env=_clean_env())
    requirement = f"forkd[{extras}] @ {wheel.as_uri()}" if extras else str(wheel)
    _run(where / "bin" / "pip", "install", "-q", "--disable-pip-version-check", "-c", CONSTRAINTS,
         requirement, env=_clean_env())
    return where / "bin"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    return _venv(tmp_path_factory.mktemp("venv-base"), wheel, "")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    return _venv(tmp_path_factory.mktemp("venv-daemon"), wheel, "daemon")


def _python(bin_dir: Path, code: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(bin_dir / "python", "-c", code, env=_clean_env(), check=check)


def test_pip_install_forkd_is_the_sdk_and_cli_alone(base: Path) -> None:
    _python(base, "from forkd import Controller, Sandbox, AsyncController; import forkd.sdk")
    tops = [m.split(".")[0] for m in DAEMON_ONLY]
    present = _python(base, "import importlib.util, json; print(json.dumps("
                      f"[m for m in {tops!r} if importlib.util.find_spec(m)]))")
    assert json.loads(present.stdout) == [], "the base install pulled in daemon packages"
    assert _python(base, "import fastapi", check=False).returncode != 0
    # The whole CLI loads (every command's module), and the daemon's options are there.
    assert "daemon" in _run(base / "forkd", "--help", env=_clean_env()).stdout
    assert "--data-dir" in _run(base / "forkd", "daemon", "--help", env=_clean_env()).stdout
    # Without the extra the daemon says what to install, instead of a traceback.
    out = _run(base / "forkd", "daemon", "--data-dir", "/nonexistent-forkd", env=_clean_env(), check=False)
    assert out.returncode == 1 and "forkd[daemon]" in out.stderr, out.stderr


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "data"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_forkd_daemon_extra_runs_the_daemon(daemon: Path, data_dir: Path) -> None:
    assert "--data-dir" in _run(daemon / "python", "-m", "forkd.api", "--help", env=_clean_env()).stdout
    port = _free_port()
    env = {**_clean_env(), "FORKD_DATA_DIR": str(data_dir)}
    proc = subprocess.Popen([str(daemon / "forkd"), "daemon", "--json", "--bind", f"127.0.0.1:{port}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd="/")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once it listens
        assert line, proc.stderr.read() if proc.stderr else ""
        url = json.loads(line)["url"]
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=5) as r:
                    assert r.status == 200
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        with urllib.request.urlopen(f"{url}/v1/snapshots", timeout=10) as r:
            assert json.loads(r.read()) == []
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_the_fleet_and_mcp_extras_load_the_gateway_and_the_mcp_server(
    tmp_path_factory: pytest.TempPathFactory, wheel: Path,
) -> None:
    bin_dir = _venv(tmp_path_factory.mktemp("venv-fleet-mcp"), wheel, "fleet,mcp")
    _python(bin_dir, "import forkd.gateway, forkd.mcp.server")
    assert _python(bin_dir, "import qemu.qmp", check=False).returncode != 0  # the VMM stays out
