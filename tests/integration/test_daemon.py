"""A real ``forkd daemon`` process with real VMs, driven over HTTP, the SDK, curl and the CLI.

One daemon (and one template boot, the ``py`` snapshot) serves the module;
every test forks its own children from ``py`` and kills them when done, so the
sandbox list is empty between tests. The last test kills the daemon with
SIGKILL and restarts it on the same data dir; the module teardown then stops
it with SIGTERM and checks that no QEMU of its data dir is left running.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from forkd import Controller, Sandbox
from forkd.config import VERSION
from forkd.sdk import ConflictError, NotFoundError, Unauthorized

from .conftest import qemu_processes_of
from .daemon_fixture import (
    FORKD,
    Daemon,
    kill_leftover_sandboxes,
    new_daemon,
    pid_alive,
    shutdown_and_check,
    start_or_clean_up,
)

pytestmark = pytest.mark.vm

SANDBOX_ID_RE = re.compile(r"^sb-[0-9a-f]{6}-[0-9]{4}$")
UNKNOWN_SB = "sb-000000-0000"
UNAUTHORIZED = {"error": "missing or invalid bearer token"}

# docs/API.md's example body for POST /v1/snapshots (the seed's kernel/rootfs/tap
# paths are Firecracker host paths; forkd boots its own built image by default).
SNAPSHOT_BODY = {"tag": "py", "mem_mib": 512, "setup": [["python3", "-c", "import json"]]}


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = new_daemon()
    start_or_clean_up(d)
    yield d
    shutdown_and_check(d)


@pytest.fixture(scope="module")
def http(daemon: Daemon) -> Iterator[httpx.Client]:
    with daemon.client() as client:
        yield client


@pytest.fixture(scope="module")
def snapshot(http: httpx.Client) -> str:
    """The one template boot of the module: the warm ``py`` snapshot."""
    started = time.monotonic()
    r = http.post("/v1/snapshots", json=SNAPSHOT_BODY, timeout=300)
    assert r.status_code == 201, r.text
    print(f"\ntemplate boot + snapshot through the daemon: {time.monotonic() - started:.1f} s")
    info = r.json()
    assert info["tag"] == "py"
    assert info["status"] == "ready"
    assert isinstance(info["created_at_unix"], int)
    assert Path(info["dir"]).is_dir()
    assert "branched_from" not in info and "pause_ms" not in info
    return "py"


@pytest.fixture(autouse=True)
def no_sandboxes_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test kills what it spawned, so the kill -9 test can count exactly."""
    yield
    if "daemon" not in request.fixturenames:
        return
    d: Daemon = request.getfixturevalue("daemon")
    left = kill_leftover_sandboxes(d, keep=d.left_for_shutdown)
    assert not left, f"test left sandboxes running: {left}"


def spawn(http: httpx.Client, n: int) -> list[dict[str, Any]]:
    r = http.post("/v1/sandboxes", json={"snapshot_tag": "py", "n": n}, timeout=300)
    assert r.status_code == 201, r.text
    return r.json()


def kill_all(http: httpx.Client, sandboxes: list[dict[str, Any]]) -> None:
    for sb in sandboxes:
        r = http.delete(f"/v1/sandboxes/{sb['id']}")
        assert r.status_code in (204, 404), r.text


def assert_error(r: httpx.Response, status: int, *needles: str) -> str:
    """``r`` is ``status`` with exactly ``{"error": "<non-empty message>"}`` naming the problem."""
    assert r.status_code == status, f"expected {status}, got {r.status_code}: {r.text}"
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert list(body) == ["error"], body
    message = body["error"]
    assert isinstance(message, str) and message.strip(), body
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    return message


def qemu_pids(root: Path) -> set[int]:
    return {int(line.split()[0]) for line in qemu_processes_of(root)}


def wait_dead(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not pid_alive(pid)


# ------------------------------------------------------------ status & auth


def test_status_routes(http: httpx.Client, daemon: Daemon) -> None:
    assert httpx.get(f"{daemon.url}/healthz").json() == {"ok": True}
    assert http.get("/version").json() == {"version": VERSION, "api": "v1"}
    metrics = http.get("/metrics")
    assert metrics.status_code == 200
    assert "text/plain" in metrics.headers["content-type"]
    for name in ("forkd_snapshots_total", "forkd_sandboxes_active", "forkd_build_info",
                 "forkd_spawn_seconds", "forkd_exec_seconds"):
        assert name in metrics.text
    assert f'forkd_build_info{{version="{VERSION}"}} 1.0' in metrics.text
    openapi = http.get("/openapi.json").json()
    assert "/v1/sandboxes/{id}/exec" in openapi["paths"]


PROTECTED = [
    ("GET", "/version"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/v1/snapshots"),
    ("POST", "/v1/snapshots"),
    ("GET", "/v1/snapshots/py"),
    ("DELETE", "/v1/snapshots/py"),
    ("GET", "/v1/sandboxes"),
    ("POST", "/v1/sandboxes"),
    ("GET", f"/v1/sandboxes/{UNKNOWN_SB}"),
    ("DELETE", f"/v1/sandboxes/{UNKNOWN_SB}"),
    ("POST", f"/v1/sandboxes/{UNKNOWN_SB}/ping"),
    ("POST", f"/v1/sandboxes/{UNKNOWN_SB}/exec"),
    ("POST", f"/v1/sandboxes/{UNKNOWN_SB}/eval"),
    ("POST", f"/v1/sandboxes/{UNKNOWN_SB}/branch"),
    ("GET", "/no/such/route"),
]


def test_auth_missing_or_wrong_token_is_401(daemon: Daemon, snapshot: str) -> None:
    wrong_tokens: list[dict[str, str]] = [
        {},  # no Authorization header at all
        {"Authorization": "Bearer " + "0" * 31 + "1"},  # same length, wrong value
        {"Authorization": f"Bearer {daemon.token[:-1]}"},  # a prefix of the real one
        {"Authorization": f"Bearer {daemon.token}x"},
        {"Authorization": f"Basic {daemon.token}"},  # right secret, wrong scheme
        {"Authorization": "Bearer"},
        {"Authorization": daemon.token},
    ]
    with httpx.Client(base_url=daemon.url, timeout=30) as c:
        for method, path in PROTECTED:
            for headers in wrong_tokens:
                # A valid body, so that only the token can be the reason for refusing.
                body = {"snapshot_tag": "py"} if method == "POST" else None
                r = c.request(method, path, headers=headers, json=body)
                assert r.status_code == 401, (method, path, headers, r.status_code, r.text)
                assert r.json() == UNAUTHORIZED
                assert r.headers["www-authenticate"] == 'Bearer realm="forkd"'
        # Nothing was created by the refused POSTs.
        r = c.get("/v1/sandboxes", headers=daemon.auth)
        assert r.status_code == 200 and r.json() == []
        # /healthz is open, with or without (even a wrong) token.
        for headers in wrong_tokens:
            r = c.get("/healthz", headers=headers)
            assert r.status_code == 200 and r.json() == {"ok": True}
    # Refused requests are audited, and the audit log never holds the token.
    audit = (daemon.root / "audit.log").read_text()
    assert '"status":401' in audit
    assert daemon.token not in audit
    assert (daemon.root / "audit.log").stat().st_mode & 0o777 == 0o600


def test_sdk_with_wrong_token_raises_unauthorized(daemon: Daemon, snapshot: str) -> None:
    with Controller(url=daemon.url, token="f" * 16 + "0123456789abcdef") as c:
        assert c.healthz() == {"ok": True}
        with pytest.raises(Unauthorized, match="missing or invalid bearer token"):
            c.list_snapshots()


# ------------------------------------------------------------ error statuses


BAD_REQUESTS: list[tuple[str, str, dict[str, Any], tuple[str, ...]]] = [
    # (method, path, httpx request kwargs, substrings the message must contain)
    ("POST", "/v1/sandboxes", {"json": {"snapshot_tag": "py", "n": 0}},
     ("n:", "greater than or equal to 1")),
    ("POST", "/v1/sandboxes", {"json": {"snapshot_tag": "py", "n": 1001}},
     ("n:", "less than or equal to 1000")),
    ("POST", "/v1/sandboxes", {"json": {"snapshot_tag": "py", "n": "5"}}, ("n:",)),
    ("POST", "/v1/sandboxes", {"json": {"snapshot_tag": "../etc", "n": 1}},
     ("snapshot_tag", "must match")),
    ("POST", "/v1/sandboxes", {"json": {"snapshot_tag": "py", "n": 1, "nn": 2}},
     ("unknown field 'nn'",)),
    ("POST", "/v1/sandboxes", {"json": {"snapshot-tag": "py"}},
     ("unknown field 'snapshot-tag'", "snapshot_tag")),
    ("POST", "/v1/sandboxes",
     {"content": b'{"snapshot_tag": "py", "n": ', "headers": {"Content-Type": "application/json"}},
     ("not valid JSON",)),
    ("POST", "/v1/sandboxes", {"content": b'{"snapshot_tag": "py"}'}, ("Content-Type: application/json",)),
    ("POST", "/v1/sandboxes", {"json": ["py"]}, ("JSON object",)),
    ("POST", "/v1/snapshots", {"json": {"tag": "bad/tag"}}, ("tag", "must match")),
    ("POST", "/v1/snapshots", {"json": {"tag": "ok", "mem_mib": 64}}, ("mem_mib",)),
    ("POST", "/v1/snapshots", {"json": {"tag": "ok", "kernal": "/boot/vmlinux"}},
     ("unknown field 'kernal'",)),
    ("GET", "/v1/snapshots/-bad", {}, ("must match",)),
    ("DELETE", "/v1/snapshots/-bad", {}, ("must match",)),
    # Ids are relaxed (forkd 0.5 clients send their own shapes; well-formed unknown ids are 404),
    # but a character that no id may hold is still 400.
    ("GET", "/v1/sandboxes/-leading-dash", {}, ("invalid sandbox id",)),
    ("DELETE", "/v1/sandboxes/sb%20XYZ", {}, ("invalid sandbox id",)),
    ("POST", f"/v1/sandboxes/sb-{'0' * 200}/ping", {}, ("invalid sandbox id",)),
    ("POST", f"/v1/sandboxes/{UNKNOWN_SB}/exec", {"json": {"args": []}}, ("args",)),
    ("POST", f"/v1/sandboxes/{UNKNOWN_SB}/exec", {"json": {"args": ["true"], "timeout_secs": 0}},
     ("timeout_secs",)),
    ("POST", f"/v1/sandboxes/{UNKNOWN_SB}/exec", {"json": {"argv": ["true"]}}, ("unknown field 'argv'",)),
    ("POST", f"/v1/sandboxes/{UNKNOWN_SB}/eval", {"json": {"code": ""}}, ("code",)),
    ("POST", f"/v1/sandboxes/{UNKNOWN_SB}/eval", {"json": {"code": 42}}, ("code",)),
]


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "needles"),
    BAD_REQUESTS,
    ids=[f"{m} {p} {k.get('json', k.get('content'))!r}"[:80] for m, p, k, _ in BAD_REQUESTS],
)
def test_400(http: httpx.Client, snapshot: str, method: str, path: str, kwargs: dict[str, Any],
             needles: tuple[str, ...]) -> None:
    message = assert_error(http.request(method, path, **kwargs), 400, *needles)
    assert message.startswith("invalid request: ")


def test_404(http: httpx.Client, snapshot: str) -> None:
    assert_error(http.post("/v1/sandboxes", json={"snapshot_tag": "nope", "n": 1}), 404,
                 "snapshot 'nope' is not registered")
    assert_error(http.get("/v1/snapshots/nope"), 404, "'nope'")
    assert_error(http.delete("/v1/snapshots/nope"), 404, "snapshot 'nope' is not registered")
    for method, suffix, body in [
        ("GET", "", None),
        ("DELETE", "", None),
        ("POST", "/ping", None),
        ("POST", "/exec", {"args": ["true"]}),
        ("POST", "/eval", {"code": "1"}),
    ]:
        for unknown in (UNKNOWN_SB, "not-a-sandbox", "sb-1234567-0000"):
            r = http.request(method, f"/v1/sandboxes/{unknown}{suffix}", json=body)
            assert_error(r, 404, f"sandbox '{unknown}' is not alive")
    assert_error(http.get("/v9/sandboxes"), 404, "no such route: GET /v9/sandboxes")
    # Nothing was spawned by the failed requests.
    assert http.get("/v1/sandboxes").json() == []


def test_409_existing_tag(http: httpx.Client, snapshot: str) -> None:
    started = time.monotonic()
    r = http.post("/v1/snapshots", json={"tag": snapshot})
    assert_error(r, 409, f"snapshot '{snapshot}' already exists")
    print(f"\n409 for an existing tag answered in {(time.monotonic() - started) * 1000:.0f} ms (no boot)")
    assert [s["tag"] for s in http.get("/v1/snapshots").json()] == [snapshot]


def test_405_and_413(http: httpx.Client, snapshot: str) -> None:
    r = http.put("/v1/snapshots", json={"tag": "x"})
    assert_error(r, 405, "PUT", "/v1/snapshots")
    assert set(r.headers["allow"].replace(" ", "").split(",")) == {"GET", "POST"}
    huge = {"code": "x" * (1024 * 1024 + 1)}
    assert_error(http.post(f"/v1/sandboxes/{UNKNOWN_SB}/eval", json=huge), 413)


def test_502_when_the_sandbox_qemu_died(http: httpx.Client, daemon: Daemon, snapshot: str) -> None:
    sb = spawn(http, 1)[0]
    try:
        os.kill(sb["pid"], signal.SIGKILL)
        assert wait_dead(sb["pid"])
        assert_error(http.post(f"/v1/sandboxes/{sb['id']}/ping"), 502, sb["id"], "died")
        assert_error(http.post(f"/v1/sandboxes/{sb['id']}/eval", json={"code": "1"}), 502, "died")
        # Still listed until killed; DELETE cleans up the dead one.
        assert sb["id"] in {s["id"] for s in http.get("/v1/sandboxes").json()}
        assert http.delete(f"/v1/sandboxes/{sb['id']}").status_code == 204
        assert_error(http.get(f"/v1/sandboxes/{sb['id']}"), 404)
        assert not (daemon.root / "sandboxes" / sb["id"]).exists()
    finally:
        kill_all(http, [sb])


def test_504_and_500_from_failed_snapshot_builds(http: httpx.Client, daemon: Daemon, snapshot: str) -> None:
    r = http.post("/v1/snapshots", json={"tag": "too-slow", "boot_wait_secs": 1}, timeout=120)
    assert_error(r, 504, "timed out after 1s")
    garbage = daemon.root / "garbage.ext4"
    garbage.write_bytes(b"\xde\xad\xbe\xef" * (16 << 18))  # 64 MiB, no filesystem
    try:
        r = http.post("/v1/snapshots", json={"tag": "broken", "rootfs": str(garbage)}, timeout=300)
        assert_error(r, 500, "cannot mount")
    finally:
        garbage.unlink()
    # Nothing half-made is registered or left on disk, and no template VM survives.
    assert [s["tag"] for s in http.get("/v1/snapshots").json()] == [snapshot]
    for tag in ("too-slow", "broken"):
        assert_error(http.get(f"/v1/snapshots/{tag}"), 404)
        assert not list((daemon.root / "snapshots").glob(f"*{tag}*"))
    assert qemu_processes_of(daemon.root / "snapshots") == []


# ------------------------------------------------------------ full lifecycle (SDK)


def test_full_lifecycle_with_the_sdk(sdk_env: Daemon, http: httpx.Client, snapshot: str) -> None:
    daemon = sdk_env
    with Controller() as c:
        assert c.healthz() == {"ok": True}
        assert c.version()["api"] == "v1"

        # Create: a second template with its own setup, so the whole life of a
        # snapshot (create -> fork -> use -> delete) happens here.
        started = time.monotonic()
        snap = c.create_snapshot("life", warm_imports=["numpy", "json"],
                                 setup=["echo from-setup > /root/setup.txt"])
        print(f"\nSDK create_snapshot: {time.monotonic() - started:.1f} s")
        assert snap["tag"] == "life" and snap["status"] == "ready"
        assert {s["tag"] for s in c.list_snapshots()} == {"py", "life"}
        with pytest.raises(ConflictError, match="already exists"):
            c.create_snapshot("life")

        # Fork.
        started = time.monotonic()
        kids = c.spawn_sandboxes("life", n=3)
        print(f"SDK spawn_sandboxes(n=3): {time.monotonic() - started:.2f} s")
        ids = [k["id"] for k in kids]
        assert len(set(ids)) == 3 and all(SANDBOX_ID_RE.match(i) for i in ids)
        assert len({i[:9] for i in ids}) == 1  # one batch prefix
        for k in kids:
            assert k["snapshot_tag"] == "life"
            assert k["netns"] is None
            assert k["guest_addr"].startswith("unix:") and k["guest_addr"].endswith("/agent.sock")
            assert isinstance(k["created_at_unix"], int)
            assert k["live_fork"] is False
            assert "memory_limit_mib" not in k
            assert pid_alive(k["pid"])
        assert qemu_pids(daemon.root) >= {k["pid"] for k in kids}
        assert {s["id"] for s in c.list_sandboxes()} == set(ids)
        assert same_record(dict(c.get_sandbox(ids[0])), dict(kids[0]))  # but for the measured disk use
        detail = c.get_snapshot("life")
        assert detail["ancestors"] == [] and detail["dependents"] == []
        assert sorted(detail["sandboxes"]) == sorted(ids)
        assert "forkd_sandboxes_active 3.0" in c.metrics()

        # Use.
        ping = c.ping(ids[0])
        assert ping["pong"] is True and ping["pid"] == 1 and ping["numpy_version"]
        res = c.exec(ids[0], ["cat", "/root/setup.txt"])
        assert res["stdout"] == "from-setup\n" and res["exit_code"] == 0
        res = c.exec(ids[0], "echo $FOO; pwd; cat", env={"FOO": "bar"}, cwd="/tmp", stdin="piped")
        assert res["stdout"] == "bar\n/tmp\npiped" and res["exit_code"] == 0, res
        res = c.exec(ids[0], ["sh", "-c", "echo err >&2; exit 7"])
        assert (res["exit_code"], res["stderr"]) == (7, "err\n")
        res = c.exec(ids[0], ["sleep", "30"], timeout_secs=1)
        assert res["timed_out"] is True
        assert c.eval(ids[1], "json.dumps({'a': 1})") == {"result": '\'{"a": 1}\'', "error": None,
                                                           "exit_code": 0}
        err = c.eval(ids[1], "1/0")
        assert err["result"] is None and err["exit_code"] != 0 and "ZeroDivisionError" in err["error"]
        # State lives on in PID 1, per sandbox.
        assert c.eval(ids[1], "counter = 41")["exit_code"] == 0
        assert c.eval(ids[1], "counter + 1")["result"] == "42"
        assert c.eval(ids[2], "'counter' in globals()")["result"] == "False"

        # Object-style layer on the same sandboxes.
        sb = Sandbox(sandbox_id=ids[2])
        assert sb.owned is False
        assert sb.commands.run(["python3", "-c", "print(6*7)"]).stdout == "42\n"
        assert sb.eval("numpy.arange(4).sum()").result == "6"
        sb.close()  # attached, not owned: must not kill it
        assert c.get_sandbox(ids[2])["id"] == ids[2]

        # A snapshot in use cannot be deleted without force.
        with pytest.raises(ConflictError, match="running from 'life'"):
            c.delete_snapshot("life")

        # Kill.
        pids = {k["pid"] for k in kids}
        run_dirs = [daemon.root / "sandboxes" / i for i in ids]
        assert all(d.is_dir() for d in run_dirs)
        c.kill_sandbox(ids[0])
        with pytest.raises(NotFoundError, match=ids[0]):
            c.get_sandbox(ids[0])
        with pytest.raises(NotFoundError):
            c.kill_sandbox(ids[0])
        with pytest.raises(NotFoundError):
            c.ping(ids[0])
        c.delete_snapshot("life", force=True)  # kills the two still running from it
        assert c.list_sandboxes() == []
        for pid in pids:
            assert wait_dead(pid), f"QEMU {pid} still running after kill"
        assert not any(d.exists() for d in run_dirs)

        # Delete.
        with pytest.raises(NotFoundError, match="'life'"):
            c.get_snapshot("life")
        assert not (daemon.root / "snapshots" / "life").exists()
        assert [s["tag"] for s in c.list_snapshots()] == ["py"]
        with pytest.raises(NotFoundError):
            c.spawn_sandboxes("life")
    assert "forkd_sandboxes_active 0.0" in http.get("/metrics").text


# ------------------------------------------------------------ seed examples


def run_seed_shell(daemon: Daemon, script: str, timeout: float = 120) -> str:
    """Run a seed's shell snippet against our daemon.

    Only the daemon's address and token file differ from the seed text: the
    test daemon listens on a free port and keeps its token in its data dir.
    """
    script = script.replace("http://127.0.0.1:8889", daemon.url)
    script = script.replace("/etc/forkd/token", str(daemon.token_file))
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, f"{script}\n--- stderr ---\n{out.stderr}"
    return out.stdout


def test_seed_curl_examples(daemon: Daemon, snapshot: str) -> None:
    token = "TOKEN=$(cat /etc/forkd/token)\n"
    curl = 'curl -s -H "Authorization: Bearer $TOKEN" '

    assert json.loads(run_seed_shell(daemon, "curl -s http://127.0.0.1:8889/healthz")) == {"ok": True}
    version = json.loads(run_seed_shell(daemon, token + curl + "http://127.0.0.1:8889/version"))
    assert version == {"version": VERSION, "api": "v1"}
    metrics = run_seed_shell(daemon, token + curl + "http://127.0.0.1:8889/metrics")
    assert "forkd_snapshots_total 1.0" in metrics

    # Seed 004's POST /v1/sandboxes body, minus per_child_netns / memory_limit_mib /
    # live_fork: another change is implementing those on QEMU right now; add them
    # back here once it lands.
    spawned = json.loads(run_seed_shell(daemon, token + curl + """\
-H 'Content-Type: application/json' \\
  -X POST http://127.0.0.1:8889/v1/sandboxes \\
  -d '{ "snapshot_tag": "py", "n": 10 }'"""))
    assert isinstance(spawned, list) and len(spawned) == 10, spawned
    try:
        ids = [sb["id"] for sb in spawned]
        assert all(SANDBOX_ID_RE.match(i) for i in ids)
        listed = json.loads(run_seed_shell(daemon, token + curl + "http://127.0.0.1:8889/v1/sandboxes"))
        assert {sb["id"] for sb in listed} == set(ids)
        one = json.loads(run_seed_shell(daemon, token + curl + f"http://127.0.0.1:8889/v1/sandboxes/{ids[0]}"))
        assert same_record(one, spawned[0])  # but for the measured disk use

        sb_url = f"http://127.0.0.1:8889/v1/sandboxes/{ids[3]}"
        ping = json.loads(run_seed_shell(daemon, token + curl + f"-X POST {sb_url}/ping"))
        assert ping["pong"] is True and ping["pid"] == 1
        assert re.match(r"^\d+\.\d+", ping["numpy_version"])  # the seed shows 1.26.4; this guest has its own

        exec_out = json.loads(run_seed_shell(daemon, token + curl + f"""\
-H 'Content-Type: application/json' \\
  -X POST {sb_url}/exec \\
  -d '{{ "args": ["python3", "-c", "print(2+2)"], "timeout_secs": 30 }}'"""))
        assert {k: exec_out[k] for k in ("stdout", "stderr", "exit_code")} == {
            "stdout": "4\n", "stderr": "", "exit_code": 0}

        eval_out = json.loads(run_seed_shell(daemon, token + curl + f"""\
-H 'Content-Type: application/json' \\
  -X POST {sb_url}/eval \\
  -d '{{ "code": "numpy.zeros(5).sum()" }}'"""))
        assert eval_out == {"result": "0.0", "error": None, "exit_code": 0}

        # Seed 002's polling loop, with its tag renamed: py is ready, so it ends at once.
        out = run_seed_shell(daemon, """\
TOKEN=$(cat /etc/forkd/token)
while true; do
  STATUS=$(curl -s -H "Authorization: Bearer $TOKEN" \\
    http://127.0.0.1:8889/v1/snapshots | \\
    jq -r '.[] | select(.tag=="py") | .status')
  echo "status: $STATUS"
  [ "$STATUS" = "ready" ] && break
  sleep 0.5
done""", timeout=60)
        assert out == "status: ready\n"

        # DELETE answers 204 with no body.
        out = run_seed_shell(daemon, token + curl + f"-o /dev/null -w '%{{http_code}}' -X DELETE {sb_url}")
        assert out == "204"
    finally:
        with daemon.client() as c:
            kill_all(c, spawned)


def test_seed_sdk_examples(sdk_env: Daemon, snapshot: str) -> None:
    # Seed 000: the Sandbox context manager (its BRANCH part left out). The seed's
    # risky command is `apt install -y something-risky`, which fails here (no
    # network) after ~12 s of apt under TCG; a destructive rm is as risky and cheap.
    with Sandbox(tag="py") as sb:
        assert sb.commands.run("test -d /usr/share/doc").ok
        res = sb.commands.run("rm -rf /usr/share/doc")
        assert res.ok, res
        res = sb.commands.run("ls /usr/share/doc")
        assert res.exit_code != 0 and not res.ok and "No such file" in res.stderr
        inner_id = sb.id
        assert Controller().get_sandbox(inner_id)["id"] == inner_id
    with pytest.raises(NotFoundError):  # the with block killed it
        Controller().get_sandbox(inner_id)

    # Seeds 002: Controller() reads FORKD_URL and FORKD_TOKEN from the environment.
    c = Controller()
    # live_fork=True is left out: another change is implementing it on QEMU now.
    parent = c.spawn_sandboxes("py", n=1)[0]
    children = c.spawn_sandboxes("py", n=5)
    try:
        snaps = c.list_snapshots()
        snap = next((s for s in snaps if s["tag"] == "py"), None)
        assert snap and snap.get("status") == "ready"

        sb = Sandbox(sandbox_id=parent["id"])
        assert sb.eval("plan = 'Plan a 3-day trip to Kyoto'").ok
        hints = ["Focus on budget options", "Include nature experiences", "Prioritize cultural sites"]
        for child, hint in zip(children, hints, strict=False):
            Sandbox(sandbox_id=child["id"]).eval(f"hint = '{hint}'")
        assert sb.eval("plan").result == "'Plan a 3-day trip to Kyoto'"
        for child, hint in zip(children, hints, strict=False):
            assert c.eval(child["id"], "hint")["result"] == repr(hint)
        assert c.eval(children[4]["id"], "'hint' in globals()")["result"] == "False"

        res = c.exec(parent["id"], ["python3", "-c", "print(2+2)"], timeout_secs=30)
        assert res["stdout"] == "4\n" and res["exit_code"] == 0
        # The rm -rf above happened in another sandbox: this one's disk is untouched.
        assert c.exec(parent["id"], "test -d /usr/share/doc")["exit_code"] == 0
        assert c.eval(parent["id"], "numpy.zeros(5).sum()") == {"result": "0.0", "error": None,
                                                                 "exit_code": 0}
        assert {parent["id"], *(ch["id"] for ch in children)} == {s["id"] for s in c.list_sandboxes()}
    finally:
        for sb_info in [parent, *children]:
            c.kill_sandbox(sb_info["id"])
        c.close()
    assert Controller().list_sandboxes() == []


# ------------------------------------------------------------ CLI


def run_cli(daemon: Daemon, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORKD_")}
    env.update(FORKD_URL=daemon.url, FORKD_TOKEN=token or daemon.token, COLUMNS="200", NO_COLOR="1")
    return subprocess.run([str(FORKD), *args], capture_output=True, text=True, env=env, timeout=300)


def test_cli_smoke(daemon: Daemon, snapshot: str) -> None:
    out = run_cli(daemon, "--json", "ls")
    assert out.returncode == 0, out.stderr
    listing = json.loads(out.stdout)
    assert listing["sandboxes"] == []
    assert [s["tag"] for s in listing["snapshots"]] == ["py"]

    out = run_cli(daemon, "fork", "--tag", "py", "-n", "2")
    assert out.returncode == 0, out.stderr
    assert "forked 2" in out.stdout
    listed = json.loads(run_cli(daemon, "--json", "ls", "--sandboxes").stdout)
    ids = [sb["id"] for sb in listed]
    assert len(ids) == 2
    for sb_id in ids:
        assert sb_id in out.stdout  # the table names them

    try:
        out = run_cli(daemon, "exec", ids[0], "--", "python3", "-c", "print(2+2)")
        assert (out.returncode, out.stdout) == (0, "4\n"), out.stderr
        out = run_cli(daemon, "exec", ids[0], "--", "sh", "-c", "echo oops >&2; exit 3")
        assert (out.returncode, out.stderr) == (3, "oops\n")
        out = run_cli(daemon, "eval", ids[1], "numpy.zeros(5).sum()")
        assert (out.returncode, out.stdout) == (0, "0.0\n"), out.stderr
        out = run_cli(daemon, "eval", ids[1], "1/0")
        assert out.returncode == 1 and "ZeroDivisionError" in out.stderr
        out = run_cli(daemon, "--json", "ping", ids[1])
        assert out.returncode == 0 and json.loads(out.stdout)["pong"] is True
        out = run_cli(daemon, "ls", token="0123456789abcdef0123456789abcdef")
        assert out.returncode == 1 and "missing or invalid bearer token" in out.stderr
    finally:
        out = run_cli(daemon, "kill", *ids)
    assert out.returncode == 0, out.stderr
    assert all(f"killed {i}" in out.stdout for i in ids)
    out = run_cli(daemon, "kill", ids[0])
    assert out.returncode == 1 and "not alive" in out.stderr
    assert json.loads(run_cli(daemon, "--json", "ls", "--sandboxes").stdout) == []


# ------------------------------------------------------------ concurrency


def test_200_concurrent_exec_and_eval_over_10_sandboxes(http: httpx.Client, daemon: Daemon,
                                                          snapshot: str) -> None:
    sandboxes = spawn(http, 10)
    ids = [sb["id"] for sb in sandboxes]
    try:
        # Give each sandbox an identity in its memory and on its disk, so every
        # answer can be traced to the sandbox it must have come from.
        for sb_id in ids:
            r = http.post(f"/v1/sandboxes/{sb_id}/eval", json={"code": f"me = {sb_id!r}"})
            assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
            r = http.post(f"/v1/sandboxes/{sb_id}/exec",
                          json={"args": ["sh", "-c", f"echo -n {sb_id} > /me"]})
            assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text

        def request(i: int) -> tuple[str, dict[str, Any], Any]:
            sb_id = ids[i % 10]
            if i % 2 == 0:
                code = f"print({i}*2, open('/me').read())"
                # -S (no site import) halves a Python start-up under TCG; still a fresh process.
                body = {"args": ["python3", "-S", "-c", code], "timeout_secs": 300}
                return f"/v1/sandboxes/{sb_id}/exec", body, f"{i * 2} {sb_id}\n"
            return f"/v1/sandboxes/{sb_id}/eval", {"code": f"({i}*3, me)"}, repr((i * 3, sb_id))

        plan = [request(i) for i in range(200)]

        async def fire() -> tuple[list[httpx.Response | BaseException], float]:
            limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
            async with httpx.AsyncClient(base_url=daemon.url, headers=daemon.auth, timeout=600,
                                         limits=limits, verify=daemon.verify()) as client:
                started = time.perf_counter()
                replies = await asyncio.gather(
                    *(client.post(path, json=body) for path, body, _ in plan), return_exceptions=True
                )
                return replies, time.perf_counter() - started

        replies, elapsed = asyncio.run(fire())
        errors = [(i, r) for i, r in enumerate(replies) if isinstance(r, BaseException)]
        assert not errors, errors[:5]
        wrong = []
        for i, ((_path, _body, expected), reply) in enumerate(zip(plan, replies, strict=True)):
            assert isinstance(reply, httpx.Response)
            body = reply.json() if reply.status_code == 200 else reply.text
            got = None
            if reply.status_code == 200:
                got = body["stdout"] if i % 2 == 0 else body["result"]
                if i % 2 == 0 and body["exit_code"] != 0:
                    got = body
            if got != expected:
                wrong.append((i, reply.status_code, expected, body))
        execs = [r for i, r in enumerate(replies) if i % 2 == 0 and isinstance(r, httpx.Response)]
        exec_ms = sorted(r.json()["duration_ms"] for r in execs if "duration_ms" in r.json())
        print(f"\n200 concurrent requests (100 exec + 100 eval) over 10 sandboxes: {elapsed:.1f} s total, "
              f"{200 / elapsed:.1f} req/s"
              + (f"; in-guest exec median {exec_ms[len(exec_ms) // 2]:.0f} ms" if exec_ms else ""))
        assert not wrong, f"{len(wrong)} wrong answers, first: {wrong[:3]}"
        # Every sandbox is still healthy afterwards.
        for sb_id in ids:
            pong = http.post(f"/v1/sandboxes/{sb_id}/ping")
            assert pong.json().get("pong") is True, pong.text
    finally:
        kill_all(http, sandboxes)


# ------------------------------------------------------------ TLS


def make_cert(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-days", "1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


def test_tls_round_trip() -> None:
    # Started the way docs/API.md shows for HTTPS: python -m forkd.api --tls-cert/--tls-key.
    d = new_daemon(prefix="fkd-tls-", entry="module")
    d.tls_cert, d.tls_key = make_cert(d.root)
    try:
        d.start()
        assert d.url.startswith("https://")
        with d.client() as c:  # verifies against the self-signed certificate
            assert c.get("/healthz").json() == {"ok": True}
            assert c.get("/v1/snapshots").json() == []
            assert c.get("/v1/sandboxes").json() == []
            assert c.get("/version").json() == {"version": VERSION, "api": "v1"}
        with d.client(token="0123456789abcdef0123456789abcdef") as c:
            assert_error(c.get("/v1/snapshots"), 401)
        # The SDK and the CLI, trusting the certificate explicitly.
        with Controller(url=d.url, token=d.token, verify=str(d.tls_cert)) as ctl:
            assert ctl.list_snapshots() == []
        env = {k: v for k, v in os.environ.items() if not k.startswith("FORKD_")}
        env.update(FORKD_URL=d.url, FORKD_TOKEN=d.token, FORKD_CA_CERT=str(d.tls_cert))
        out = subprocess.run([str(FORKD), "--json", "ls"], capture_output=True, text=True, env=env,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == {"sandboxes": [], "snapshots": []}
        # Without trusting the certificate, the client refuses the connection.
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{d.url}/healthz", timeout=10)
        # Plain HTTP to the TLS port gets no HTTP answer.
        plain = d.url.replace("https://", "http://")
        try:
            r = httpx.get(f"{plain}/healthz", timeout=10)
        except httpx.HTTPError:
            pass
        else:
            pytest.fail(f"plain HTTP to the TLS port answered {r.status_code}: {r.text!r}")
        # And the daemon is still serving TLS after the garbage.
        with d.client() as c:
            assert c.get("/healthz").json() == {"ok": True}
    finally:
        shutdown_and_check(d)


# ------------------------------------------------------------ kill -9 and restart


def same_record(now: dict[str, Any], then: dict[str, Any]) -> bool:
    """The same SandboxInfo but for ``disk_used_mib``, which is measured each time (the guest
    goes on writing its disk)."""
    return {k: v for k, v in now.items() if k != "disk_used_mib"} == {
        k: v for k, v in then.items() if k != "disk_used_mib"}


def test_kill9_restart_readopts_live_sandboxes_and_reaps_dead_ones(daemon: Daemon, snapshot: str) -> None:
    """SIGKILL the daemon, kill one sandbox's QEMU while it is down, restart on the same dir.

    Runs last: it restarts the module's daemon. It leaves two sandboxes running
    (one re-adopted, one spawned after the restart) so that the module's
    SIGTERM teardown has to stop both.
    """
    with daemon.client() as c:
        sbs = spawn(c, 3)
        keep, stay, dead = sbs
        for sb in sbs:
            code = f"state = 'before crash in {sb['id']}'"
            r = c.post(f"/v1/sandboxes/{sb['id']}/eval", json={"code": code})
            assert r.json()["exit_code"] == 0
        before = {sb["id"]: sb for sb in c.get("/v1/sandboxes").json()}
        assert set(before) == {sb["id"] for sb in sbs}

    old_pid = daemon.proc.pid if daemon.proc else None
    try:
        daemon.kill9()
        assert not pid_alive(old_pid or 0)
        # The VMs run in their own sessions: the daemon's death does not take them along.
        for sb in sbs:
            assert pid_alive(sb["pid"]), f"{sb['id']} died with the daemon"
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{daemon.url}/healthz", timeout=5)
        # One VM dies while nobody is watching.
        os.kill(dead["pid"], signal.SIGKILL)
        assert wait_dead(dead["pid"])
        # A QEMU of this data dir that no row owns: what a crash mid-fork leaves (a child
        # restored before its row was written). The next daemon must not leave it running.
        stray = subprocess.Popen(
            ["qemu-system-x86_64", "-machine", "none", "-S", "-nodefaults", "-display", "none",
             "-name", "stray", "-pidfile", str(daemon.root / "stray.pid")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        started = time.monotonic()
    finally:
        daemon.start()  # same data dir, token and port
    restart_s = time.monotonic() - started
    print(f"\nrestart after kill -9 (re-adopting 2, reaping 1): {restart_s:.2f} s to healthy")

    with daemon.client() as c:
        listed = c.get("/v1/sandboxes").json()
        assert sorted(sb["id"] for sb in listed) == sorted([keep["id"], stay["id"]])
        for sb in listed:  # the same records as before the crash, same QEMU
            assert same_record(sb, before[sb["id"]])
        for sb in (keep, stay):
            assert same_record(c.get(f"/v1/sandboxes/{sb['id']}").json(), before[sb["id"]])
            ping = c.post(f"/v1/sandboxes/{sb['id']}/ping").json()
            assert ping["pong"] is True and ping["pid"] == 1
            # In-memory state set before the crash is still there: it is the same VM.
            r = c.post(f"/v1/sandboxes/{sb['id']}/eval", json={"code": "state"})
            assert r.json()["result"] == repr(f"before crash in {sb['id']}")
            r = c.post(f"/v1/sandboxes/{sb['id']}/exec", json={"args": ["python3", "-c", "print(2+2)"]})
            assert r.json()["stdout"] == "4\n"
        assert "forkd_sandboxes_active 2.0" in c.get("/metrics").text

        # The dead one is gone everywhere: API, registry, run dir, process table.
        for method, suffix in (("GET", ""), ("POST", "/ping"), ("DELETE", "")):
            assert_error(c.request(method, f"/v1/sandboxes/{dead['id']}{suffix}"), 404, dead["id"])
        assert not (daemon.root / "sandboxes" / dead["id"]).exists()
        assert not pid_alive(dead["pid"])
        assert stray.wait(10) == -signal.SIGKILL, "the stray QEMU of this data dir was left running"
        assert qemu_pids(daemon.root) == {keep["pid"], stay["pid"]}
        assert c.get("/v1/snapshots/py").json()["sandboxes"] == sorted([keep["id"], stay["id"]])

        # A re-adopted sandbox can be killed through the API like any other.
        assert c.delete(f"/v1/sandboxes/{keep['id']}").status_code == 204
        assert wait_dead(keep["pid"])
        assert not (daemon.root / "sandboxes" / keep["id"]).exists()

        # The snapshot survived the crash and still forks.
        fresh = spawn(c, 1)[0]
        assert c.post(f"/v1/sandboxes/{fresh['id']}/eval", json={"code": "'state' in globals()"}
                      ).json()["result"] == "False"
        assert {sb["id"] for sb in c.get("/v1/sandboxes").json()} == {stay["id"], fresh["id"]}
        assert qemu_pids(daemon.root) == {stay["pid"], fresh["pid"]}

    # Left running on purpose: the module teardown's SIGTERM must stop the
    # re-adopted `stay` and the new `fresh` (and asserts no QEMU is left).
    daemon.left_for_shutdown = [stay["id"], fresh["id"]]


def test_kill9_keeps_what_a_guest_fsynced_to_its_volume(daemon: Daemon, http: httpx.Client) -> None:
    """A sandbox with a copy volume, whose guest wrote and fsync'ed a file there (the write was
    acknowledged), outlives a kill -9 of the daemon: the restarted daemon re-adopts it with its
    volume, the file is there, the volume still takes writes, and a BRANCH after the restart
    carries both to a child. A hostdir volume it mounted at its spawn (shared) is served again by
    the restarted daemon: what the guest wrote there before is on the host, and it writes again.
    Runs after the first kill -9 test, on the same module daemon."""

    def sh(c: httpx.Client, sb_id: str, script: str) -> str:
        r = c.post(f"/v1/sandboxes/{sb_id}/exec", json={"args": ["sh", "-c", script]}, timeout=120)
        assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
        return str(r.json()["stdout"]).strip()

    fsync = ("import os, sys; f = open(sys.argv[1], 'a'); f.write(sys.argv[2] + '\\n'); f.flush(); "
             "os.fsync(f.fileno())")
    assert http.post("/v1/volumes", json={"name": "k9vol", "size_mib": 16}).status_code == 201
    r = http.post("/v1/volumes", json={"name": "k9team", "size_mib": 16, "fs": "hostdir"})
    assert r.status_code == 201 and r.json()["fs"] == "hostdir", r.text
    r = http.post("/v1/snapshots", json={"tag": "pyvol", "mem_mib": 512,
                                         "volumes": [{"name": "k9vol", "mount": "/mnt/v"}]}, timeout=300)
    assert r.status_code == 201, r.text
    r = http.post("/v1/sandboxes", json={"snapshot_tag": "pyvol",
                                         "volumes": [{"name": "k9team", "mount": "/mnt/t"}]}, timeout=300)
    assert r.status_code == 201, r.text
    [sb] = r.json()
    sh(http, sb["id"], f"python3 -c \"{fsync}\" /mnt/v/log before-the-crash")
    sh(http, sb["id"], f"python3 -c \"{fsync}\" /mnt/t/log before-the-crash")

    daemon.kill9()
    assert pid_alive(sb["pid"]), "the sandbox died with the daemon"
    daemon.start()

    with daemon.client() as c:
        info = c.get(f"/v1/sandboxes/{sb['id']}").json()
        assert [v["mount"] for v in info["volumes"]] == ["/mnt/v", "/mnt/t"] and info["pid"] == sb["pid"]
        assert sh(c, sb["id"], "cat /mnt/v/log") == "before-the-crash"
        sh(c, sb["id"], f"python3 -c \"{fsync}\" /mnt/v/log after-the-restart")
        assert sh(c, sb["id"], "cat /mnt/t/log") == "before-the-crash"  # served by the new daemon
        sh(c, sb["id"], f"python3 -c \"{fsync}\" /mnt/t/log after-the-restart")
        r = c.post(f"/v1/sandboxes/{sb['id']}/branch", json={"tag": "pyvol-k9", "mode": "full"}, timeout=300)
        assert r.status_code == 201, r.text
        [child] = c.post("/v1/sandboxes", json={"snapshot_tag": "pyvol-k9"}, timeout=300).json()
        assert sh(c, child["id"], "cat /mnt/v/log") == "before-the-crash\nafter-the-restart"
        # The branch carried the shared mount: its child writes the same files.
        sh(c, child["id"], "echo from-the-child >> /mnt/t/log")
        assert sh(c, sb["id"], "cat /mnt/t/log") == "before-the-crash\nafter-the-restart\nfrom-the-child"
        assert c.delete("/v1/volumes/k9team").status_code == 409  # mounted by both
        for sb_id in (child["id"], sb["id"]):
            assert c.delete(f"/v1/sandboxes/{sb_id}").status_code == 204
        for tag in ("pyvol-k9", "pyvol"):
            r = c.delete(f"/v1/snapshots/{tag}")
            assert r.status_code in (200, 204), r.text
        assert c.delete("/v1/volumes/k9vol").status_code in (200, 204)
        assert c.delete("/v1/volumes/k9team").status_code in (200, 204)
