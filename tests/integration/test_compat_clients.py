"""The clients users already have, unchanged, against a real daemon and real VMs (issue 11).

* the published ``forkd`` 0.5.3 SDK through every ``Controller`` method;
* ``forkd-mcp`` 0.2.1, driven by an MCP client over stdio;
* programs written the way an E2B user writes them, on ``e2b`` 2.63.0 and
  ``e2b-code-interpreter`` 2.11.5, and on E2B's JavaScript SDK (npm ``e2b`` 2.51.0),
  with only ``E2B_API_URL``, ``E2B_SANDBOX_URL`` and ``E2B_API_KEY`` set (and ``E2B_VOLUME_API_URL``
  for volumes' files);
* forkd 0.5's compact and workspaces (suspend/resume), over plain HTTP, and through
  our own CLI (``forkd compact``, ``forkd workspace``) and SDK.

The clients run as programs (tests/clients/) in their own virtualenv
(``.venv-clients``, pinned in tests/clients/requirements.txt, made by
``make clients``; the published SDK's distribution is also named ``forkd``).
One daemon of its own serves the whole module (the clients list every snapshot): ``base`` is
the session's template (booted once, registered before the daemon starts),
``code-interpreter-v1`` (the code interpreter's default template) is a
compaction of it, which costs no boot. The daemon's docker.io mirror is a docker-registry on
loopback that the module starts first, for E2B's ``from_image`` and ``from_dockerfile``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import Seeder, images_dir
from .daemon_fixture import Daemon, kill_leftover_sandboxes, new_daemon, shutdown_and_check, start_or_clean_up
from .oci_material import Registry, debian_layout, registry

pytestmark = pytest.mark.vm

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ROOT / "tests" / "clients"
CLIENTS_VENV = ROOT / ".venv-clients"
PROGRAM_TIMEOUT = 600


@pytest.fixture(scope="module")
def clients_python() -> Path:
    """The clients' interpreter; the venv is made (or refreshed) the way `make test` makes it."""
    subprocess.run(["bash", str(ROOT / "scripts" / "clients-venv.sh")], check=True, cwd=ROOT, timeout=900)
    return CLIENTS_VENV / "bin" / "python"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A registry on loopback that the daemon's docker.io mirror points at (E2B's from_image)."""
    with registry(tmp_path_factory.mktemp("hub") / "registry") as reg:
        yield reg


@pytest.fixture(scope="module")
def daemon(snapshot: str, seed: Seeder, hub: Registry) -> Iterator[Daemon]:
    d = new_daemon("fkc-", extra_args=["--registry-mirror", f"docker.io=http://{hub.host}"])
    seed(d.root, base=snapshot)  # the session's template: no boot of its own
    start_or_clean_up(d)
    try:
        with d.client(timeout=600) as c:
            flat = c.post("/v1/snapshots/base/compact", json={"to": "code-interpreter-v1"})
            assert flat.status_code == 201, flat.text
        yield d
    finally:
        shutdown_and_check(d)


@pytest.fixture
def clean(daemon: Daemon) -> Iterator[Daemon]:
    """Each test starts and ends with no sandbox running (a failing program may leave some)."""
    yield daemon
    kill_leftover_sandboxes(daemon)


def run_program(python: Path, program: Path, env: dict[str, str], *args: str) -> str:
    """Run a client program as its user would; its stdout, or the failure with both streams."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FORKD_", "E2B_"))}
    proc = subprocess.run([str(python), str(program), *args], env={**base, **env}, capture_output=True,
                          text=True, timeout=PROGRAM_TIMEOUT, cwd="/tmp")
    assert proc.returncode == 0, (f"{program.name} exited with {proc.returncode}\n--- stdout\n"
                                  f"{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-8000:]}")
    return proc.stdout


def forkd_env(daemon: Daemon) -> dict[str, str]:
    return {"FORKD_URL": daemon.url, "FORKD_TOKEN": daemon.token}


def e2b_env(daemon: Daemon) -> dict[str, str]:
    """All an E2B user changes: where the API and the sandboxes are, and the key."""
    # E2B_VOLUME_API_URL: where a volume's files are (E2B's own host for them, forkd's daemon here).
    return {"E2B_API_URL": daemon.url, "E2B_SANDBOX_URL": daemon.url, "E2B_API_KEY": daemon.token,
            "E2B_VOLUME_API_URL": daemon.url}


# ------------------------------------------------------------------ forkd 0.5.3


def test_published_forkd_sdk_drives_every_controller_method(clients_python: Path, clean: Daemon) -> None:
    out: dict[str, Any] = json.loads(run_program(clients_python, CLIENTS / "forkd05" / "sdk.py",
                                                 forkd_env(clean), "base"))
    plain, warm = out["spawned"]
    assert out["snapshots"] == ["base", "code-interpreter-v1"]
    assert out["listed"] == sorted([plain, warm]) and out["got"] == plain
    assert out["ping"]["pong"] is True
    assert (out["exec"]["stdout"], out["exec"]["stderr"], out["exec"]["exit_code"]) == ("hi\n", "oops\n", 3)
    assert out["eval"] == {"result": "42", "error": None, "exit_code": 0}
    for name in ("branch_full", "branch_diff", "branch_measured", "branch_live"):
        assert out[name]["branched_from"] in (plain, warm) and out[name]["pause_ms"] >= 0, out[name]
    measured = out["branch_measured"]
    # What a dirty-page diff would have saved: the pages the child wrote, a part of its RAM.
    assert 0 < measured["diff_physical_bytes"] < measured["diff_logical_bytes"] == 512 << 20
    assert 0 <= measured["diff_ms"] <= measured["pause_ms"]
    assert out["branch_live"]["status"] in ("writing", "ready")
    assert out["live_status"] == "ready", f"the live branch ended {out['live_status']}: {out['live_error']}"
    assert out["grandchild_marker"] == "kept\n"
    assert out["errors"]["unknown_sandbox"][0] == 404 and out["errors"]["unknown_kill"][0] == 404
    assert out["errors"]["both_modes"][0] == 400 and out["errors"]["taken_tag"][0] == 409
    assert out["after_kill"] == [] and out["snapshots_after"] == ["base", "code-interpreter-v1"]


def test_forkd_mcp_spawns_execs_evals_branches_and_kills(clients_python: Path, clean: Daemon) -> None:
    out: dict[str, Any] = json.loads(run_program(clients_python, CLIENTS / "forkd05" / "mcp_session.py",
                                                 forkd_env(clean), "base"))
    wanted = {"spawn_sandboxes", "exec_command", "eval_code", "branch_sandbox", "kill_sandbox"}
    assert wanted <= set(out["tools"])
    [child] = out["spawned"]
    # forkd-mcp always sends prewarm and a 256 MiB limit: the limit is applied.
    assert child["memory_limit_mib"] == 256
    assert out["exec"]["stdout"] == "42\n" and out["exec"]["exit_code"] == 0
    assert out["eval"]["result"] == "45"
    assert out["branch"]["tag"] == "mcp-branch" and out["branch"]["branched_from"] == child["id"]
    assert out["ping"]["pong"] is True and out["listed"] == [child["id"]]
    assert out["kill"] == {"id": child["id"], "killed": True} and out["after_kill"] == []
    assert "mcp-branch" in out["snapshots"]
    with clean.client() as c:
        assert c.delete("/v1/snapshots/mcp-branch").status_code == 204


# ------------------------------------------------------------------ E2B


@pytest.mark.parametrize("program", ["commands", "files", "lifecycle", "interpreter", "semantics", "users",
                                     "watch", "snapshots", "pty", "metadata", "volumes"])
def test_e2b_program_runs_unchanged(clients_python: Path, clean: Daemon, program: str) -> None:
    out = run_program(clients_python, CLIENTS / "e2b" / f"{program}.py", e2b_env(clean))
    assert out.strip().endswith(f"{program} ok"), out
    with clean.client() as c:
        assert c.get("/v1/sandboxes").json() == []  # each program killed what it made
        left = [s["tag"] for s in c.get("/v1/snapshots").json()]
    # Pause states and fork snapshots go with their last sandbox.
    assert left == ["base", "code-interpreter-v1"], left


@pytest.mark.parametrize("program", ["sandbox", "volumes"])
def test_e2b_js_program_runs_unchanged(clean: Daemon, program: str) -> None:
    """E2B's JavaScript SDK (npm ``e2b``, locked in tests/clients/e2b-js, installed by
    ``make node-deps``), in a program run by node as its user would: create, streamed and
    background commands, files, pause and connect, fork and kill (sandbox.mjs); a volume made,
    written from outside, mounted in two sandboxes that see each other's writes, and destroyed
    once unused (volumes.mjs)."""
    js = CLIENTS / "e2b-js"
    assert (js / "node_modules" / "e2b").is_dir(), "run `make node-deps` first"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FORKD_", "E2B_"))}
    started = time.monotonic()
    proc = subprocess.run(["node", f"{program}.mjs"], env={**base, **e2b_env(clean)}, capture_output=True,
                          text=True, timeout=PROGRAM_TIMEOUT, cwd=js)
    print(f"\nE2B JS SDK program {program}: {time.monotonic() - started:.1f} s")
    assert proc.returncode == 0 and proc.stdout.strip().endswith(f"{program} ok"), (
        f"node {program}.mjs exited with {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    with clean.client() as c:
        assert c.get("/v1/sandboxes").json() == []
        assert [s["tag"] for s in c.get("/v1/snapshots").json()] == ["base", "code-interpreter-v1"]


def test_e2b_template_build_runs_unchanged(clients_python: Path, clean: Daemon) -> None:
    """Template.build (copy, run_cmd as user and as root, set_envs), Sandbox.create from it, a
    rebuild from the layer cache; no network (no apt or pip installs: CI has no registry)."""
    out = run_program(clients_python, CLIENTS / "e2b" / "templates.py", e2b_env(clean))
    assert out.strip().endswith("templates ok"), out
    with clean.client() as c:
        layers = [s["tag"] for s in c.get("/v1/snapshots").json() if s["tag"].startswith("layer-")]
        assert layers, "the build's layers are forkd snapshots"
        # The cache is dropped as a whole by deleting its base layer with what builds on it.
        roots = [t for t in layers if c.get(f"/v1/snapshots/{t}").json().get("parent_tag") is None]
        for root in roots:
            assert c.delete(f"/v1/snapshots/{root}?cascade=true").status_code == 204
        assert [s["tag"] for s in c.get("/v1/snapshots").json()] == ["base", "code-interpreter-v1"]


def test_e2b_from_image_and_from_dockerfile_build_from_a_registry(clients_python: Path, clean: Daemon,
                                                                   hub: Registry, tmp_path: Path) -> None:
    """Template().from_image(REF) and from_dockerfile's FROM REF, REF a Hub short name that the
    daemon's mirror sends to the loopback registry: each builds, and the published SDK starts a
    sandbox from it that has the image's files and its own Python module (issue 33)."""
    layout = debian_layout(images_dir(), tmp_path, {
        "usr/lib/python3/dist-packages/forkd_e2b_only.py": b"ANSWER = \"only in the registry's image\"\n",
        "srv/app/hello.txt": b"hello from the registry\n"})
    hub.push(layout, "t", "forkd-test/e2b-debian:1")
    try:
        out = run_program(clients_python, CLIENTS / "e2b" / "from_image.py", e2b_env(clean),
                          "forkd-test/e2b-debian:1")
        assert out.strip().endswith("from_image ok"), out
        with clean.client() as c:
            pulled = {i["oci"]["ref"] for i in c.get("/v1/images").json() if "oci" in i}
            assert "docker.io/forkd-test/e2b-debian:1" in pulled, pulled
    finally:
        with clean.client() as c:  # the builds' layers: dropped with their base, as a user would
            for snap in c.get("/v1/snapshots").json():
                if snap["tag"].startswith("layer-") and snap.get("parent_tag") is None:
                    c.delete(f"/v1/snapshots/{snap['tag']}?cascade=true")
        shutil.rmtree(images_dir() / "e2b-debian-1", ignore_errors=True)


def test_v1_runs_as_root_unless_a_user_is_named(clean: Daemon) -> None:
    """forkd's own routes: root by default (as before), ``user`` honoured on exec, processes and
    files, an unknown user a 400 with the guest's words (issue 20)."""
    with clean.client() as c:
        made = c.post("/v1/sandboxes", json={"snapshot_tag": "base"})
        assert made.status_code == 201, made.text
        sid = made.json()[0]["id"]
        try:
            probe = ["sh", "-c", "echo $(id -u) $HOME $(pwd)"]
            as_root = c.post(f"/v1/sandboxes/{sid}/exec", json={"args": probe}).json()
            assert as_root["stdout"] == "0 / /root\n", as_root  # HOME=/ as the kernel gave PID 1
            as_user = c.post(f"/v1/sandboxes/{sid}/exec", json={"args": probe, "user": "user"}).json()
            assert as_user["stdout"] == "1000 /home/user /home/user\n", as_user
            started = c.post(f"/v1/sandboxes/{sid}/processes", json={"args": ["sleep", "30"], "user": "user"})
            assert started.status_code == 201 and started.json()["user"] == "user", started.text
            c.delete(f"/v1/sandboxes/{sid}/processes/{started.json()['pid']}")
            put = c.put(f"/v1/sandboxes/{sid}/files", params={"path": "/home/user/f.txt", "user": "user"},
                        content=b"x", headers={"Content-Type": "application/octet-stream"})
            assert put.status_code == 200 and put.json()["owner"] == "user", put.text
            stat = c.get(f"/v1/sandboxes/{sid}/files/stat", params={"path": "/home/user/f.txt"}).json()
            assert (stat["owner"], stat["group"]) == ("user", "user"), stat
            unknown = c.post(f"/v1/sandboxes/{sid}/exec", json={"args": ["id"], "user": "nobody-here"})
            assert unknown.status_code == 400, unknown.text
            assert unknown.json() == {"error": "unknown user 'nobody-here' in the sandbox"}
        finally:
            c.delete(f"/v1/sandboxes/{sid}")


# ------------------------------------------------------------------ compact, workspaces


def test_compact_makes_a_chain_standalone(clean: Daemon) -> None:
    with clean.client(timeout=600) as c:
        [src] = c.post("/v1/sandboxes", json={"snapshot_tag": "base", "prewarm": True}).json()
        sb = src["id"]
        for i, tag in enumerate(("chain-1", "chain-2")):
            wrote = c.post(f"/v1/sandboxes/{sb}/exec", json={"args": ["sh", "-c", f"echo {i} >> /root/log"]})
            assert wrote.json()["exit_code"] == 0
            assert c.post(f"/v1/sandboxes/{sb}/branch", json={"tag": tag, "parent_tag": "base" if i == 0
                                                              else "chain-1"}).status_code == 201
        assert c.get("/v1/snapshots/chain-2").json()["ancestors"] == ["chain-1", "base"]
        flat = forkd_cli(clean, "compact", "chain-2", "chain-flat", "--json")
        assert flat["tag"] == "chain-flat" and flat["compacted_from"] == "chain-2"
        detail = c.get("/v1/snapshots/chain-flat").json()
        assert detail["ancestors"] == [] and detail.get("parent_tag") is None
        # The chain can go now; the compacted snapshot stands alone.
        assert c.delete(f"/v1/sandboxes/{sb}").status_code == 204
        assert c.delete("/v1/snapshots/chain-1?cascade=true").status_code == 204
        [child] = c.post("/v1/sandboxes", json={"snapshot_tag": "chain-flat"}).json()
        log = c.post(f"/v1/sandboxes/{child['id']}/exec", json={"args": ["cat", "/root/log"]}).json()
        assert log["stdout"] == "0\n1\n"
        assert c.delete(f"/v1/sandboxes/{child['id']}").status_code == 204
        assert c.delete("/v1/snapshots/chain-flat").status_code == 204


def forkd_cli(daemon: Daemon, *args: str) -> Any:
    """Our own CLI, as its user runs it; its JSON output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORKD_")}
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "forkd"), *args], capture_output=True, text=True,
                          env={**env, **forkd_env(daemon)}, timeout=PROGRAM_TIMEOUT)
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return json.loads(proc.stdout)


def test_workspace_through_our_sdk_and_cli(clean: Daemon) -> None:
    from forkd.sdk import Controller

    with Controller(clean.url, clean.token) as ctrl:
        made = ctrl.create_workspace("ws2", "base")
        sb = made["live_sandbox_id"]
        assert made["status"] == "running" and made["name"] == "ws2"
        assert ctrl.eval(sb, "kept = 6 * 7")["exit_code"] == 0

        suspended = forkd_cli(clean, "workspace", "suspend", "ws2", "--json")
        assert suspended["status"] == "suspended" and suspended["current_state_tag"]
        [listed] = forkd_cli(clean, "workspace", "ls", "--json")
        assert (listed["name"], listed["status"]) == ("ws2", "suspended")

        resumed = ctrl.resume_workspace("ws2")
        assert resumed["live_sandbox_id"] == sb and ctrl.eval(sb, "kept")["result"] == "42"
        assert ctrl.get_workspace("ws2")["status"] == "running"
        assert forkd_cli(clean, "workspace", "rm", "ws2", "--json") == {"deleted": "ws2"}
        assert ctrl.list_workspaces() == []


def test_workspace_suspends_and_resumes_under_the_same_id(clean: Daemon) -> None:
    with clean.client(timeout=600) as c:
        made = c.post("/v1/workspaces", json={"name": "ws1", "snapshot_tag": "base"})
        assert made.status_code == 201, made.text
        sb = made.json()["live_sandbox_id"]
        kept = c.post(f"/v1/sandboxes/{sb}/eval", json={"code": "kept = 'in memory'"}).json()
        assert kept["exit_code"] == 0
        c.post(f"/v1/sandboxes/{sb}/exec", json={"args": ["sh", "-c", "echo on disk > /root/kept"]})

        suspended = c.post("/v1/workspaces/ws1/suspend").json()
        assert suspended["status"] == "suspended" and suspended["current_state_tag"].startswith("paused-")
        assert c.get(f"/v1/sandboxes/{sb}").status_code == 404  # stopped: no VM, no memory
        assert not any(s["id"] == sb for s in c.get("/v1/sandboxes").json())

        resumed = c.post("/v1/workspaces/ws1/resume").json()
        assert resumed["status"] == "running" and resumed["live_sandbox_id"] == sb
        assert c.post(f"/v1/sandboxes/{sb}/eval", json={"code": "kept"}).json()["result"] == "'in memory'"
        disk = c.post(f"/v1/sandboxes/{sb}/exec", json={"args": ["cat", "/root/kept"]}).json()
        assert disk["stdout"] == "on disk\n"

        # Suspended once more, then deleted: the state snapshots go too.
        assert c.post("/v1/workspaces/ws1/suspend", json={"diff": True}).json()["status"] == "suspended"
        assert c.delete("/v1/workspaces/ws1").status_code == 204
        assert c.get("/v1/workspaces/ws1").status_code == 404
        deadline = time.monotonic() + 30
        while [s["tag"] for s in c.get("/v1/snapshots").json()] != ["base", "code-interpreter-v1"]:
            assert time.monotonic() < deadline, c.get("/v1/snapshots").json()
            time.sleep(0.2)


def test_a_paused_sandbox_outlives_a_daemon_restart(clients_python: Path, clean: Daemon) -> None:
    """Last in the module: it restarts the shared daemon. A pause holds no VM, only a state
    snapshot and a registry row, so a new daemon resumes it (E2B's connect) under its id."""
    with clean.client(timeout=600) as c:
        made = c.post("/v2/sandboxes", json={"templateID": "base", "metadata": {"k": "v"}},
                      headers={"X-API-KEY": clean.token})
        assert made.status_code == 201, made.text
        sb = made.json()["sandboxID"]
        assert c.post(f"/v1/sandboxes/{sb}/eval", json={"code": "survivor = 7"}).json()["exit_code"] == 0
        assert c.post(f"/sandboxes/{sb}/pause", headers={"X-API-KEY": clean.token}).status_code == 204
    clean.stop()
    clean.start()
    with clean.client(timeout=600) as c:
        key = {"X-API-KEY": clean.token}
        info = c.get(f"/sandboxes/{sb}", headers=key).json()
        assert info["state"] == "paused" and info["metadata"] == {"k": "v"}, info
        resumed = c.post(f"/v2/sandboxes/{sb}/connect", json={"timeout": 120}, headers=key)
        assert resumed.status_code == 201 and resumed.json()["sandboxID"] == sb, resumed.text
        assert c.post(f"/v1/sandboxes/{sb}/eval", json={"code": "survivor"}).json()["result"] == "7"
        assert c.delete(f"/sandboxes/{sb}", headers=key).status_code == 204
        assert c.delete(f"/sandboxes/{sb}", headers=key).status_code == 404
