"""BRANCH through a real ``forkd daemon``: the seeds' REST, CLI and SDK examples, unchanged.

Seeds 000/001/002/004 show BRANCH (``POST /v1/sandboxes/{id}/branch``), the
``forkd snapshot --from-sandbox`` / ``forkd branch`` commands, the SDK's
``Controller.branch_sandbox`` and ``Sandbox.branch() -> Snapshot.fork()``, and
seed 004's full ``POST /v1/sandboxes`` body (per-child netns, memory limit,
live_fork). Each is run here against a daemon process with real VMs; only the
daemon's address, its token file, sandbox ids and (where two examples would
collide) tag names differ from the seed text.

The session's shared daemon and its ``py`` template serve the module; the 503
test starts a daemon of its own with ``FORKD_BRANCH_CONCURRENCY=1``. Every test
kills what it spawned; snapshots other than the shared templates are removed
between tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from forkd import Controller, Sandbox, Snapshot
from forkd.sdk import NotFoundError

from .conftest import Seeder, child_netns_turn
from .daemon_fixture import (
    Daemon,
    SharedDaemons,
    new_daemon,
    pid_alive,
    shutdown_and_check,
)
from .test_daemon import assert_error, run_cli, run_seed_shell, same_record

pytestmark = pytest.mark.vm

SETUP = Path(__file__).resolve().parents[2] / "scripts" / "netns-setup.sh"
SNAPSHOT_INFO_KEYS = {"tag", "dir", "created_at_unix", "status"}
BRANCH_INFO_KEYS = SNAPSHOT_INFO_KEYS | {"branched_from", "pause_ms"}

# Seed 002, "REST API BRANCH" (the source id is the seed's example id).
SEED_002_BRANCH_CURL = """\
TOKEN=$(cat /etc/forkd/token)
curl -s -H "Authorization: Bearer $TOKEN" \\
  -H 'Content-Type: application/json' \\
  -X POST http://127.0.0.1:8889/v1/sandboxes/sb-67a1b3-0000/branch \\
  -d '{"tag":"checkpoint-1","mode":"live","wait":false}'
"""

# Seed 002, "wait: false fire-and-forget semantics".
SEED_002_POLL = """\
TOKEN=$(cat /etc/forkd/token)
while true; do
  STATUS=$(curl -s -H "Authorization: Bearer $TOKEN" \\
    http://127.0.0.1:8889/v1/snapshots | \\
    jq -r '.[] | select(.tag=="checkpoint-1") | .status')
  echo "status: $STATUS"
  [ "$STATUS" = "ready" ] && break
  sleep 0.5
done
"""

# Seed 004, POST /v1/sandboxes request body, byte for byte.
SEED_004_SPAWN_BODY = (
    '{ "snapshot_tag": "py", "n": 10, "per_child_netns": true, "memory_limit_mib": 256, '
    '"live_fork": true }'
)


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def daemon(shared_daemons: SharedDaemons) -> Iterator[Daemon]:
    """The session's shared daemon (its shutdown checks that no live_fork memory stays on /dev/shm)."""
    with shared_daemons.lend() as d:
        yield d


@pytest.fixture(scope="module")
def http(daemon: Daemon) -> Iterator[httpx.Client]:
    with daemon.client(timeout=300) as client:
        yield client


@pytest.fixture(scope="module")
def py(daemon: Daemon, shared_daemons: SharedDaemons) -> str:
    """The session's template (booted once, by the runtime, and seeded in the shared daemon)."""
    info = shared_daemons.template(daemon, "py", boot_wait_secs=180)
    # Seed 004: branched_from / pause_ms are omitted for templates (SnapshotInfo, as POST
    # /v1/snapshots answers it too).
    assert set(info) == SNAPSHOT_INFO_KEYS, info
    return "py"


def only_templates_left(http: httpx.Client, daemon: Daemon, shared_daemons: SharedDaemons) -> None:
    """No snapshot but the shared daemon's templates (other modules' among them) is listed."""
    assert {s["tag"] for s in http.get("/v1/snapshots").json()} == shared_daemons.templates_of(daemon)


@pytest.fixture(autouse=True)
def clean_between_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves sandboxes running; drop its snapshots so tags can be reused."""
    yield
    if "daemon" not in request.fixturenames:
        return
    d: Daemon = request.getfixturevalue("daemon")
    if d.proc is None or d.proc.poll() is not None:
        return
    templates = request.getfixturevalue("shared_daemons").templates_of(d)
    with d.client(timeout=300) as c:
        left = [sb["id"] for sb in c.get("/v1/sandboxes").json()]
        for sb_id in left:
            c.delete(f"/v1/sandboxes/{sb_id}")
        for snap in c.get("/v1/snapshots").json():
            if snap["tag"] not in templates:
                wait_ready(c, snap["tag"], check=False)
                r = c.delete(f"/v1/snapshots/{snap['tag']}", params={"cascade": "true", "force": "true"})
                assert r.status_code in (204, 404), r.text
    assert not left, f"test left sandboxes running: {left}"


def forkd_netns() -> list[str]:
    return sorted(p.name for p in Path("/run/netns").glob("forkd-child-*"))


@pytest.fixture
def netns(request: pytest.FixtureRequest) -> Callable[..., list[str]]:
    """``netns(n)`` runs ``scripts/netns-setup.sh n [--tap T]``; the finalizer ``... n --teardown``."""

    def provision(n: int, tap: str | None = None) -> list[str]:
        if os.geteuid() != 0:
            pytest.skip("per_child_netns needs root (network namespaces, taps)")
        turn = contextlib.ExitStack()
        turn.enter_context(child_netns_turn())
        request.addfinalizer(turn.close)  # finalizers run last-in first: after the teardown below
        if forkd_netns():
            pytest.skip(f"forkd-child-* namespaces already exist on this host: {forkd_netns()}")

        def teardown() -> None:
            out = subprocess.run([str(SETUP), str(n), "--teardown"], capture_output=True, text=True)
            assert out.returncode == 0, out.stderr
            assert forkd_netns() == [], f"namespaces left behind: {forkd_netns()}"

        request.addfinalizer(teardown)
        argv = [str(SETUP), str(n), *(["--tap", tap] if tap else [])]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        names = [f"forkd-child-{i}" for i in range(n)]
        assert forkd_netns() == sorted(names)
        return names

    return provision


# ---------------------------------------------------------------- helpers


def spawn(http: httpx.Client, tag: str = "py", n: int = 1, **options: Any) -> list[dict[str, Any]]:
    r = http.post("/v1/sandboxes", json={"snapshot_tag": tag, "n": n, **options})
    assert r.status_code == 201, r.text
    return r.json()


def kill_all(http: httpx.Client, sandboxes: list[dict[str, Any]]) -> None:
    for sb in sandboxes:
        r = http.delete(f"/v1/sandboxes/{sb['id']}")
        assert r.status_code in (204, 404), r.text


def branch(http: httpx.Client, sb_id: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    r = http.post(f"/v1/sandboxes/{sb_id}/branch", json=body if body is not None else {})
    assert r.status_code == 201, r.text
    return r.json()


def evaluate(http: httpx.Client, sb_id: str, code: str) -> str | None:
    r = http.post(f"/v1/sandboxes/{sb_id}/eval", json={"code": code})
    assert r.status_code == 200, r.text
    assert r.json()["exit_code"] == 0, r.json()
    return r.json()["result"]


def wait_ready(http: httpx.Client, tag: str, timeout: float = 300, *, check: bool = True) -> dict[str, Any]:
    """Poll until ``tag`` is no longer writing; with ``check``, it must be ready."""
    deadline = time.monotonic() + timeout
    while True:
        r = http.get(f"/v1/snapshots/{tag}")
        if r.status_code == 404:
            return {}
        info = r.json()
        if info["status"] != "writing":
            assert not check or info["status"] == "ready", json.dumps(info)
            return info
        assert time.monotonic() < deadline, f"{tag} still writing after {timeout}s"
        time.sleep(0.1)


def snapshot_mode(info: dict[str, Any]) -> str:
    """The BRANCH mode recorded in the snapshot's own snapshot.json."""
    return json.loads((Path(info["dir"]) / "snapshot.json").read_text())["mode"]


def audited(daemon: Daemon, method: str, path: str, expect: int = 1) -> list[int]:
    """Statuses the audit log recorded for ``method path``, oldest first.

    The audit line is written once the response has been sent, so the client can
    see the response a moment before the line exists: wait (bounded) for ``expect``.
    """
    deadline = time.monotonic() + 10
    while True:
        lines = (daemon.root / "audit.log").read_text().splitlines()
        entries = [json.loads(line) for line in lines if line.strip()]
        found = [e["status"] for e in entries if e["method"] == method and e["path"] == path]
        if len(found) >= expect or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def concurrently(daemon: Daemon, requests: list[tuple[str, dict[str, Any]]]) -> list[httpx.Response]:
    """POST all ``(path, body)`` at once, each on its own connection."""

    async def fire() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=daemon.url, headers=daemon.auth, timeout=300,
                                     verify=daemon.verify()) as client:
            return list(await asyncio.gather(*(client.post(p, json=b) for p, b in requests)))

    return asyncio.run(fire())


def netns_inode(path: str) -> int:
    return os.stat(path).st_ino


def memory_cgroup(pid: int) -> tuple[Path, int]:
    """The memory cgroup ``pid`` runs in (v1 or v2) and its limit in bytes."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        hid, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # v1 (or hybrid: v1 owns memory)
            cg = Path(f"/sys/fs/cgroup/memory{path}")
            return cg, int((cg / "memory.limit_in_bytes").read_text())
        if hid == "0" and Path(f"/sys/fs/cgroup{path}/memory.max").exists():
            cg = Path(f"/sys/fs/cgroup{path}")
            return cg, int((cg / "memory.max").read_text())
    raise AssertionError(f"QEMU {pid} is in no memory cgroup")


def wait_dead(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not pid_alive(pid)


def cli_ok(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    out = run_cli(daemon, *args)
    assert out.returncode == 0, f"forkd {' '.join(args)}: exit {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out


# ---------------------------------------------------------------- 1. seed 002, REST


def test_seed002_rest_live_no_wait_branch_poll_with_jq_then_fork(daemon: Daemon, http: httpx.Client,
                                                                  py: str) -> None:
    [src] = spawn(http, py, 1, live_fork=True)
    kids: list[dict[str, Any]] = []
    try:
        assert src["live_fork"] is True
        evaluate(http, src["id"], "note = 'mid-thought'")
        path = f"/v1/sandboxes/{src['id']}/branch"

        started = time.monotonic()
        out = run_seed_shell(daemon, SEED_002_BRANCH_CURL.replace("sb-67a1b3-0000", src["id"]))
        returned_s = time.monotonic() - started
        info = json.loads(out)
        assert audited(daemon, "POST", path) == [201]
        # Seed 002's response: exactly these fields.
        # (plus how long the live branch froze the source's filesystem)
        assert set(info) == BRANCH_INFO_KEYS | {"fs_freeze_ms"}, info
        assert info["tag"] == "checkpoint-1"
        assert info["dir"] == str(daemon.root / "snapshots" / "checkpoint-1")
        assert isinstance(info["created_at_unix"], int)
        assert info["branched_from"] == src["id"]
        assert isinstance(info["pause_ms"], int | float) and info["pause_ms"] > 0
        assert info["status"] == "writing"
        print(f"\nlive no-wait branch: curl returned in {returned_s * 1000:.0f} ms, "
              f"source paused {info['pause_ms']:.1f} ms")

        # While it is writing it cannot be forked, and the source runs on meanwhile.
        r = http.post("/v1/sandboxes", json={"snapshot_tag": "checkpoint-1", "n": 1})
        if r.status_code == 201:  # the copy finished in between: nothing to refuse
            kids += r.json()
            assert http.get("/v1/snapshots/checkpoint-1").json()["status"] == "ready"
            print("checkpoint-1 was ready before the 409 check could run")
        else:
            assert_error(r, 409, "'checkpoint-1' is still being written")
        evaluate(http, src["id"], "note = 'after the branch'")

        started = time.monotonic()
        polled = run_seed_shell(daemon, SEED_002_POLL, timeout=300).splitlines()
        print(f"seed 002 jq loop saw ready after {time.monotonic() - started:.1f} s: {polled}")
        assert polled[-1] == "status: ready"
        assert set(polled[:-1]) <= {"status: writing"}
        ready = http.get("/v1/snapshots/checkpoint-1").json()
        assert ready["status"] == "ready"
        assert (ready["branched_from"], ready["pause_ms"]) == (src["id"], info["pause_ms"])
        assert ready["ancestors"] == ["py"] and ready["parent_tag"] == "py"
        assert snapshot_mode(info) == "live"

        # Fork grandchildren from it: they start from the state as of the request.
        kids += spawn(http, "checkpoint-1", 3)
        assert {k["snapshot_tag"] for k in kids} == {"checkpoint-1"}
        for kid in kids:
            assert evaluate(http, kid["id"], "note") == "'mid-thought'"
        assert evaluate(http, src["id"], "note") == "'after the branch'"
        assert sorted(http.get("/v1/snapshots/checkpoint-1").json()["sandboxes"]) == sorted(
            k["id"] for k in kids)
    finally:
        kill_all(http, [*kids, src])
    assert http.delete("/v1/snapshots/checkpoint-1").status_code == 204
    assert not (daemon.root / "snapshots" / "checkpoint-1").exists()


def test_a_kill_right_after_a_live_no_wait_branch_keeps_the_snapshot(daemon: Daemon, http: httpx.Client,
                                                                     py: str) -> None:
    """Killing the source while its live wait:false branch still copies RAM must not lose
    the snapshot the user asked for: the kill waits (bounded) for the copy to finish."""
    [src] = spawn(http, py, 1, live_fork=True)
    try:
        evaluate(http, src["id"], "before_kill = 'kept across the kill'")
        made = branch(http, src["id"], {"tag": "killed-mid-copy", "mode": "live", "wait": False})
        assert made["status"] == "writing", made
    finally:
        r = http.delete(f"/v1/sandboxes/{src['id']}")  # at once: the copy is still running
    assert r.status_code == 204, r.text
    info = http.get("/v1/snapshots/killed-mid-copy").json()
    assert info["status"] == "ready", info.get("error", info)
    assert http.get(f"/v1/sandboxes/{src['id']}").status_code == 404
    [kid] = spawn(http, "killed-mid-copy", 1)
    try:
        assert evaluate(http, kid["id"], "before_kill") == "'kept across the kill'"
    finally:
        kill_all(http, [kid])
    assert http.delete("/v1/snapshots/killed-mid-copy").status_code == 204


# ---------------------------------------------------------------- 2. seed 004, spawn body


def test_seed004_spawn_body_netns_memory_limit_live_fork(daemon: Daemon, http: httpx.Client, py: str,
                                                         netns: Callable[..., list[str]]) -> None:
    names = netns(10)
    started = time.monotonic()
    r = http.post("/v1/sandboxes", content=SEED_004_SPAWN_BODY,
                  headers={"Content-Type": "application/json"})
    assert r.status_code == 201, r.text
    sbs = r.json()
    print(f"\nseed 004 spawn of 10 (netns + 256 MiB cgroup + live_fork): {time.monotonic() - started:.2f} s")
    cgroup_dirs: list[Path] = []
    try:
        assert len(sbs) == 10
        assert sorted(sb["netns"] for sb in sbs) == sorted(names)
        for sb in sbs:
            # The seeds' fields, plus forkd's per-phase restore timings and the disk quota.
            assert set(sb) == {"id", "snapshot_tag", "netns", "guest_addr", "created_at_unix", "pid",
                               "memory_limit_mib", "live_fork", "timings", "state", "disk_quota_mib",
                               "disk_used_mib"}, sb
            assert sb["state"] == "running"
            assert sb["snapshot_tag"] == "py"
            assert sb["memory_limit_mib"] == 256
            assert sb["live_fork"] is True
            # disk_used_mib is measured on each GET, and the guest goes on writing its disk.
            assert same_record(http.get(f"/v1/sandboxes/{sb['id']}").json(), sb)
            # The QEMU really is in that namespace and under that limit.
            assert netns_inode(f"/proc/{sb['pid']}/ns/net") == netns_inode(f"/run/netns/{sb['netns']}")
            cgroup, limit = memory_cgroup(sb["pid"])
            assert limit == 256 << 20
            cgroup_dirs.append(cgroup)
        assert len({netns_inode(f"/proc/{sb['pid']}/ns/net") for sb in sbs}) == 10

        replies = concurrently(daemon, [(f"/v1/sandboxes/{sb['id']}/ping", {}) for sb in sbs])
        for sb, reply in zip(sbs, replies, strict=True):
            assert reply.status_code == 200, (sb["id"], reply.text)
            assert reply.json()["pong"] is True and reply.json()["pid"] == 1

        # A live branch of a child that runs in a namespace under a cgroup; its
        # grandchild takes the namespace a killed sibling freed (the lowest free one).
        source = next(sb for sb in sbs if sb["netns"] == "forkd-child-3")
        evaluate(http, source["id"], "where = 'forkd-child-3'")
        made = branch(http, source["id"], {"tag": "in-netns", "mode": "live"})
        assert made["status"] == "ready" and made["branched_from"] == source["id"]
        gone = next(sb for sb in sbs if sb["netns"] == "forkd-child-7")
        assert http.delete(f"/v1/sandboxes/{gone['id']}").status_code == 204
        [grandchild] = spawn(http, "in-netns", 1, per_child_netns=True, memory_limit_mib=256)
        sbs.append(grandchild)
        assert grandchild["netns"] == "forkd-child-7"
        assert netns_inode(f"/proc/{grandchild['pid']}/ns/net") == netns_inode("/run/netns/forkd-child-7")
        cgroup, limit = memory_cgroup(grandchild["pid"])
        assert limit == 256 << 20
        cgroup_dirs.append(cgroup)
        assert evaluate(http, grandchild["id"], "where") == "'forkd-child-3'"
        assert http.post(f"/v1/sandboxes/{source['id']}/ping").json()["pong"] is True
    finally:
        kill_all(http, sbs)
    for sb in sbs:
        assert wait_dead(sb["pid"]), sb
    assert not [d for d in cgroup_dirs if d.exists()], "cgroups left after kill"


TAP = "fkd-br-tap0"


def test_branch_of_a_sandbox_with_a_nic(daemon: Daemon, http: httpx.Client, py: str,
                                        netns: Callable[..., list[str]]) -> None:
    """Seed 004's snapshot body (rw, tap) + seed 002's TypeScript flow (perChildNetns, liveFork, live).

    No host tap exists: the template boots in a namespace the daemon makes with one. The children
    use the namespaces the seeds' script provisioned (with that tap), as they are."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    host_tap = TAP
    assert not Path(f"/sys/class/net/{TAP}").exists()
    # The seed's kernel/rootfs are Firecracker host paths; forkd boots its own image.
    r = http.post("/v1/snapshots", json={"tag": "py-nic", "rw": True, "tap": host_tap,
                                         "boot_wait_secs": 180})
    assert r.status_code == 201, r.text
    names = netns(4, tap=host_tap)
    sbs: list[dict[str, Any]] = []
    try:
        [parent] = sbs = spawn(http, "py-nic", 1, per_child_netns=True, live_fork=True)
        assert parent["netns"] == names[0]
        evaluate(http, parent["id"], "state = 'parent state'")
        made = branch(http, parent["id"], {"mode": "live", "wait": False})
        assert made["status"] == "writing"
        wait_ready(http, made["tag"])
        kids = spawn(http, made["tag"], 3, per_child_netns=True)
        sbs += kids
        assert sorted(k["netns"] for k in kids) == names[1:]
        for kid in kids:
            assert kid["ip"] and kid["network"]["guest_ip"] == "172.16.0.2"  # the branch keeps eth0's set-up
            assert evaluate(http, kid["id"], "state") == "'parent state'"
            r = http.post(f"/v1/sandboxes/{kid['id']}/exec", json={"args": ["cat", "/proc/net/dev"]})
            assert "eth0:" in r.json()["stdout"], r.json()
            link = subprocess.run(["ip", "-netns", kid["netns"], "-oneline", "link", "show", "dev", host_tap],
                                  capture_output=True, text=True).stdout
            assert "LOWER_UP" in link and "NO-CARRIER" not in link, link
        meta = json.loads((Path(made["dir"]) / "snapshot.json").read_text())
        assert meta["tap"] == host_tap
    finally:
        kill_all(http, sbs)
    assert http.delete("/v1/snapshots/py-nic", params={"cascade": "true"}).status_code == 204


# ---------------------------------------------------------------- 3. seed 002, CLI


def test_seed002_cli_branch_examples(daemon: Daemon, http: httpx.Client, py: str,
                                     netns: Callable[..., list[str]]) -> None:
    out = cli_ok(daemon, "fork", "--tag", "py", "-n", "1", "--live-fork")
    [src] = json.loads(cli_ok(daemon, "--json", "ls", "--sandboxes").stdout)
    sb_id = src["id"]
    assert sb_id in out.stdout and src["live_fork"] is True
    kids: list[dict[str, Any]] = []
    try:
        # The four spellings of seed 002 (tags renamed so that they can all exist at once).
        examples = [
            ("checkpoint-1", [], "full", "ready"),
            ("checkpoint-2", ["--diff"], "diff", "ready"),
            ("checkpoint-3", ["--live"], "live", "ready"),
            ("checkpoint-4", ["--live", "--no-wait"], "live", "writing"),
        ]
        for tag, flags, mode, status in examples:
            evaluate(http, sb_id, f"last = {tag!r}")
            out = cli_ok(daemon, "snapshot", "--from-sandbox", sb_id, "--tag", tag, *flags)
            assert re.search(rf"branched {sb_id} → {tag} in .*, source paused \d+ ms, status {status}",
                             out.stdout), out.stdout
            if status == "writing":
                assert f"forkd snapshot-info {tag}" in out.stdout
            info = wait_ready(http, tag)
            assert info["branched_from"] == sb_id
            assert snapshot_mode(info) == mode
            shown = " ".join(flags) or "(full)"
            print(f"\nforkd snapshot --from-sandbox {shown}: pause {info['pause_ms']} ms")

        # Usage errors: exit 2 and a clear message, before anything reaches the daemon.
        before = http.get("/v1/snapshots").json()
        for flags, message in [
            (["--diff", "--live"], "--diff and --live are mutually exclusive"),
            (["--no-wait"], "--no-wait requires --live"),
            (["--diff", "--no-wait"], "--no-wait requires --live"),
        ]:
            bad = run_cli(daemon, "snapshot", "--from-sandbox", sb_id, "--tag", "nope", *flags)
            assert bad.returncode == 2, (flags, bad.stdout, bad.stderr)
            assert message in bad.stderr and "Usage:" in bad.stderr, bad.stderr
        bad = run_cli(daemon, "branch", "--from-sandbox", sb_id, "-n", "1", "--diff", "--live")
        assert bad.returncode == 2 and "--diff and --live are mutually exclusive" in bad.stderr
        assert http.get("/v1/snapshots").json() == before

        # forkd fork --tag checkpoint-1 -n 5 --per-child-netns
        names = netns(5)
        out = cli_ok(daemon, "fork", "--tag", "checkpoint-1", "-n", "5", "--per-child-netns")
        assert "forked 5" in out.stdout
        kids = [sb for sb in json.loads(cli_ok(daemon, "--json", "ls", "--sandboxes").stdout)
                if sb["id"] != sb_id]
        assert sorted(k["netns"] for k in kids) == names
        for kid in kids:
            assert kid["snapshot_tag"] == "checkpoint-1"
            assert evaluate(http, kid["id"], "last") == "'checkpoint-1'"
        kill_all(http, kids)

        # forkd branch --from-sandbox <id> -n 5: a fifth branch, and 5 children of it.
        evaluate(http, sb_id, "last = 'one-shot'")
        out = cli_ok(daemon, "--json", "branch", "--from-sandbox", sb_id, "-n", "5")
        result = json.loads(out.stdout)
        snap, kids = result["snapshot"], result["sandboxes"]
        assert snap["tag"] == f"branch-{sb_id}-5" and snap["branched_from"] == sb_id
        assert snap["status"] == "ready" and snapshot_mode(snap) == "full"
        assert len(kids) == 5 and {k["snapshot_tag"] for k in kids} == {snap["tag"]}
        for kid in kids:
            assert evaluate(http, kid["id"], "last") == "'one-shot'"
        kill_all(http, kids)
        out = cli_ok(daemon, "branch", "--from-sandbox", sb_id, "-n", "1", "--tag", "one-more", "--live")
        assert f"branched {sb_id} → one-more" in out.stdout and "forked 1" in out.stdout
        kids = [sb for sb in http.get("/v1/sandboxes").json() if sb["id"] != sb_id]
        assert [k["snapshot_tag"] for k in kids] == ["one-more"]

        # Branches of one source form a chain; snapshot-info shows it both ways.
        out = cli_ok(daemon, "snapshot-info", "checkpoint-2")
        chain = f"checkpoint-2 ← checkpoint-1 ← {py}"
        assert chain in out.stdout, out.stdout
        dependents = ["checkpoint-3", "checkpoint-4", f"branch-{sb_id}-5", "one-more"]
        assert ", ".join(dependents) in out.stdout, out.stdout
        detail = json.loads(cli_ok(daemon, "--json", "snapshot-info", "checkpoint-2").stdout)
        assert detail["ancestors"] == ["checkpoint-1", py]
        assert detail["dependents"] == dependents
        assert detail["parent_tag"] == "checkpoint-1" and detail["branched_from"] == sb_id
        out = cli_ok(daemon, "snapshot-info", py)
        assert "dependents  checkpoint-1, checkpoint-2," in out.stdout, out.stdout
    finally:
        kill_all(http, [*kids, src])


# ---------------------------------------------------------------- 4. seeds 002 and 000, SDK


def test_seed002_sdk_branch_examples(sdk_env: Daemon, py: str) -> None:
    c = Controller()  # reads FORKD_URL and FORKD_TOKEN from env
    spawned: list[dict[str, Any]] = []
    try:
        parent = c.spawn_sandboxes("py", n=1, live_fork=True)[0]
        spawned.append(parent)
        assert c.eval(parent["id"], "turns = 3")["exit_code"] == 0
        # Diff BRANCH, synchronous.
        branch = c.branch_sandbox(parent["id"], tag="checkpoint-diff", mode="diff")
        assert branch["tag"] == "checkpoint-diff" and branch["status"] == "ready"
        assert branch["branched_from"] == parent["id"]
        grandchildren = c.spawn_sandboxes(branch["tag"], n=5)
        spawned += grandchildren
        assert all(c.eval(g["id"], "turns")["result"] == "3" for g in grandchildren)

        # Live BRANCH, fire-and-forget.
        assert c.eval(parent["id"], "turns = 4")["exit_code"] == 0
        started = time.monotonic()
        branch = c.branch_sandbox(parent["id"], mode="live", wait=False)
        returned_ms = (time.monotonic() - started) * 1000
        assert branch["status"] == "writing"
        assert branch["tag"] == f"branch-{parent['id']}-2"  # branch-<source-id>-<seq>
        # Poll until the background copy finishes (seed 002's loop, with a deadline added).
        deadline = time.monotonic() + 300
        while True:
            snaps = c.list_snapshots()
            snap = next((s for s in snaps if s["tag"] == branch["tag"]), None)
            if snap and snap.get("status") == "ready":
                break
            assert time.monotonic() < deadline and snap and snap.get("status") == "writing", snap
            time.sleep(0.5)
        print(f"\nSDK live wait=False: returned in {returned_ms:.0f} ms, ready after "
              f"{time.monotonic() - started:.1f} s")
        grandchildren = c.spawn_sandboxes(branch["tag"], n=5)
        spawned += grandchildren
        assert all(c.eval(g["id"], "turns")["result"] == "4" for g in grandchildren)
    finally:
        for sb in spawned:
            c.kill_sandbox(sb["id"])
        c.close()


def test_seed000_sdk_sandbox_branch_fork(sdk_env: Daemon, py: str) -> None:
    grandchildren: list[Sandbox] = []
    try:
        with Sandbox(tag="py") as sb:
            res = sb.commands.run("rm -rf /usr/share/doc && echo risky > /root/step.txt")
            assert res.ok, res
            branch = sb.branch()  # POST /v1/sandboxes/{sb.id}/branch
            assert isinstance(branch, Snapshot)
            assert branch.tag == f"branch-{sb.id}-1"
            assert branch.branched_from == sb.id and branch.status == "ready"
            assert isinstance(branch.pause_ms, int | float)
            source_id = sb.id
        # The with block killed the source; the branch is a snapshot on disk and forks.
        with Controller() as c, pytest.raises(NotFoundError, match="not alive"):
            c.get_sandbox(source_id)
        grandchildren = branch.fork(n=5)  # spawns from the new snapshot
        assert len(grandchildren) == 5 and all(g.owned for g in grandchildren)
        for g in grandchildren:
            res = g.commands.run("cat /root/step.txt; test -d /usr/share/doc || echo doc-gone")
            assert res.stdout == "risky\ndoc-gone\n", res
        for g in grandchildren:
            g.kill()

        # Snapshot.wait_ready() on a live fire-and-forget branch.
        with Sandbox(tag="py", live_fork=True) as sb:
            sb.eval("x = 42")
            snap = sb.branch(tag="sdk-live", mode="live", wait=False)
            assert snap.status == "writing"
            assert snap.wait_ready(timeout=300) is snap
            assert snap.status == "ready" and snap.refresh().status == "ready"
            [g] = grandchildren = snap.fork(n=1)
            assert g.eval("x").result == "42"
            g.kill()
        snap.delete()
        with pytest.raises(NotFoundError, match="not registered"):
            Snapshot.from_tag("sdk-live")
    finally:
        for g in grandchildren:
            g.close()


# ---------------------------------------------------------------- 5. error statuses


def test_branch_error_statuses(daemon: Daemon, shared_daemons: SharedDaemons, http: httpx.Client,
                               py: str) -> None:
    [plain, other] = spawn(http, py, 2)
    try:
        url = f"/v1/sandboxes/{plain['id']}/branch"
        # 400: the two cross-field rules, before anything is looked up.
        for body, message in [
            ({"mode": "diff", "diff": True},
             "invalid request: 'mode' and the legacy 'diff'/'live' are mutually exclusive; send only 'mode'"),
            ({"mode": "full", "diff": False},
             "invalid request: 'mode' and the legacy 'diff'/'live' are mutually exclusive; send only 'mode'"),
            ({"wait": False}, "invalid request: 'wait': false is only meaningful with 'mode': 'live'"),
            ({"tag": "x", "mode": "diff", "wait": False},
             "invalid request: 'wait': false is only meaningful with 'mode': 'live'"),
        ]:
            r = http.post(url, json=body)
            assert (r.status_code, r.json()) == (400, {"error": message}), (body, r.text)
        # 404: unknown source.
        r = http.post("/v1/sandboxes/sb-000000-0000/branch", json={"tag": "ghost"})
        assert (r.status_code, r.json()) == (404, {"error": "sandbox 'sb-000000-0000' is not alive"})
        # 409: the tag exists.
        r = http.post(url, json={"tag": py})
        assert (r.status_code, r.json()) == (
            409, {"error": f"snapshot '{py}' already exists; delete it first (forkd rmi {py})"})
        # 409: live on a sandbox not spawned with live_fork.
        r = http.post(url, json={"tag": "no-live", "mode": "live"})
        assert (r.status_code, r.json()) == (409, {"error": (
            f"sandbox {plain['id']} was not spawned with live_fork: true, which mode \"live\" needs "
            "(its RAM must be on shared memory); use mode \"diff\" or \"full\", or spawn with "
            "live_fork: true")})
        only_templates_left(http, daemon, shared_daemons)

        # 409: two concurrent branches to the same tag (of two sources): one wins.
        replies = concurrently(daemon, [(url, {"tag": "race"}),
                                        (f"/v1/sandboxes/{other['id']}/branch", {"tag": "race"})])
        statuses = sorted(r.status_code for r in replies)
        assert statuses == [201, 409], [r.text for r in replies]
        loser = next(r for r in replies if r.status_code == 409)
        assert loser.json() == {"error": "a branch to tag 'race' is already in flight"}
        winner = next(r for r in replies if r.status_code == 201).json()
        assert winner["tag"] == "race" and winner["status"] == "ready"

        # Legacy {"diff": true} is mode diff.
        legacy = branch(http, other["id"], {"tag": "legacy", "diff": True})
        assert snapshot_mode(legacy) == "diff" and legacy["status"] == "ready"
        # No body at all: a full branch with a generated tag.
        r = http.post(url)
        assert r.status_code == 201, r.text
        assert r.json()["tag"].startswith(f"branch-{plain['id']}-") and snapshot_mode(r.json()) == "full"
    finally:
        kill_all(http, [plain, other])


def test_branch_lineage_delete_and_source_lifecycle(daemon: Daemon, shared_daemons: SharedDaemons,
                                                    http: httpx.Client, py: str) -> None:
    [src] = spawn(http, py, 1)
    kids: list[dict[str, Any]] = []
    try:
        evaluate(http, src["id"], "gen = 'A'")
        a = branch(http, src["id"], {"tag": "gen-a"})
        evaluate(http, src["id"], "gen = 'B'")
        b = branch(http, src["id"], {"tag": "gen-b", "mode": "diff"})
        assert http.get("/v1/snapshots/gen-b").json()["ancestors"] == ["gen-a", py]
        assert http.get("/v1/snapshots/gen-a").json()["dependents"] == ["gen-b"]

        # The source is killed; both branches stay valid and fork.
        assert http.delete(f"/v1/sandboxes/{src['id']}").status_code == 204
        assert wait_dead(src["pid"])
        kids = spawn(http, "gen-a", 1) + spawn(http, "gen-b", 1)
        assert [evaluate(http, k["id"], "gen") for k in kids] == ["'A'", "'B'"]
        kill_all(http, kids)

        # A snapshot others depend on: 409 naming them; cascade deletes the subtree.
        r = http.delete("/v1/snapshots/gen-a")
        assert (r.status_code, r.json()) == (409, {"error": (
            "snapshot 'gen-a' has dependent snapshots ['gen-b']: delete them first, "
            "or pass cascade=true to delete the subtree (force=true alone does not: the "
            "dependents could no longer be forked)")})
        # force kills sandboxes, but does not orphan dependents either.
        r = http.delete("/v1/snapshots/gen-a", params={"force": "true"})
        assert r.status_code == 409 and "force=true alone does not" in r.json()["error"], r.text
        r = http.delete("/v1/snapshots/gen-a", params={"cascade": "true"})
        assert r.status_code == 204, r.text
        for info in (a, b):
            assert_error(http.get(f"/v1/snapshots/{info['tag']}"), 404)
            assert not Path(info["dir"]).exists()
        only_templates_left(http, daemon, shared_daemons)
    finally:
        kill_all(http, [*kids, src])


def test_503_at_the_branch_concurrency_cap(snapshot: str, seed: Seeder) -> None:
    d = new_daemon(prefix="fkd-cap-", extra_env={"FORKD_BRANCH_CONCURRENCY": "1"})
    seed(d.root, py=snapshot)  # the session's template: no boot of its own
    try:
        d.start()
        with d.client(timeout=300) as c:
            sbs = spawn(c, "py", 3)
            requests = [(f"/v1/sandboxes/{sb['id']}/branch", {"tag": f"cap-{i}"})
                        for i, sb in enumerate(sbs)]
            replies = concurrently(d, requests)
            statuses = [r.status_code for r in replies]
            assert set(statuses) == {201, 503} and statuses.count(201) >= 1, [r.text for r in replies]
            for (path, body), reply in zip(requests, replies, strict=True):
                if reply.status_code == 503:
                    assert reply.json() == {
                        "error": "daemon is at its branch concurrency cap (1); retry after a short delay"}
                    # Nothing was registered for it, and a retry goes through.
                    assert_error(c.get(f"/v1/snapshots/{body['tag']}"), 404)
                    retry = c.post(path, json=body)
                    assert retry.status_code == 201, retry.text
                else:
                    assert reply.json()["tag"] == body["tag"]
            tags = sorted(s["tag"] for s in c.get("/v1/snapshots").json())
            assert tags == ["cap-0", "cap-1", "cap-2", "py"]
            print(f"\ncap 1, 3 concurrent branches: {statuses}")
    finally:
        shutdown_and_check(d)


# ---------------------------------------------------------------- 6. SnapshotInfo fields


def test_snapshot_list_fields_for_branches_and_builds(daemon: Daemon, shared_daemons: SharedDaemons,
                                                     http: httpx.Client, py: str) -> None:
    [src] = spawn(http, py, 1)
    try:
        made = branch(http, src["id"], {"tag": "listed", "mode": "full"})
    finally:
        kill_all(http, [src])
    listing = {s["tag"]: s for s in http.get("/v1/snapshots").json()}
    assert set(listing) == {*shared_daemons.templates_of(daemon), "listed"}  # py among them
    # Built by POST /v1/snapshots: no branched_from, no pause_ms.
    assert set(listing[py]) == SNAPSHOT_INFO_KEYS and listing[py]["status"] == "ready"
    # Made by BRANCH: both, plus the status.
    entry = listing["listed"]
    assert set(entry) == BRANCH_INFO_KEYS, entry
    assert entry == made
    assert entry["branched_from"] == src["id"] and entry["status"] == "ready"
    assert isinstance(entry["pause_ms"], int | float) and entry["pause_ms"] > 0


# ---------------------------------------------------------------- fork of a running sandbox


def test_sdk_explore_best_of_n_through_the_daemon(sdk_env: Daemon, py: str) -> None:
    """sb.explore: a fork-tree, one candidate fix per child (its hint in child_env), run in
    parallel, scored, the winner promoted and the losers gone, through a real daemon."""
    fixes = ["return x / 0", "return x * 2", "return x + 1"]
    with Sandbox(tag="py") as sb:
        sb.eval("attempts = []")
        assert sb.commands.run("echo 'def f(x): return x / 0' > /root/buggy.py").ok

        def run(child: Sandbox, fix: str) -> str:
            hint = child.eval("__import__('os').environ['FIX']").result
            assert hint == repr(fix)
            child.commands.run(f"sed -i 's|return x / 0|{fix}|' /root/buggy.py")
            out = child.commands.run("python3 -c 'import sys; sys.path.insert(0, \"/root\"); "
                                     "import buggy; print(buggy.f(20))'")
            if not out.ok:
                raise RuntimeError(out.stderr.strip().splitlines()[-1])
            return out.stdout.strip()

        result = sb.explore(fixes, run, lambda _c, _f, out: float(out),
                            child_env=[{"FIX": f} for f in fixes])
        assert [o.ok for o in result.outcomes] == [False, True, True]
        assert "ZeroDivisionError" in (result.outcomes[0].error or "")
        assert result.best is not None and result.best.candidate == "return x * 2"
        # What each branch cost, read from the host: at the fork (by child id), and once it ran.
        assert set(result.fork.memory) == {c.id for c in result.fork.children}
        for outcome in result.outcomes:
            assert outcome.memory is not None and outcome.sandbox_id == outcome.memory["sandbox_id"]
            assert outcome.memory["shared_bytes"] > 0 and outcome.memory["private_bytes"] > 0
            assert outcome.memory["private_bytes"] >= result.fork.memory[outcome.memory["sandbox_id"]][
                "private_bytes"]  # it only grows while the child runs
        winner = result.winner
        assert winner is not None
        with Controller() as c:
            alive = {s["id"] for s in c.list_sandboxes()}
            assert alive == {sb.id, winner.id}  # the losers were killed by promote
        assert winner.eval("attempts").result == "[]"  # it started from the source's state
        winner.close()
        # The source still has the bug.
        assert "x / 0" in sb.commands.run("cat /root/buggy.py").stdout


def test_cli_fork_from_sandbox_promote_and_checkpoints(daemon: Daemon, http: httpx.Client, py: str) -> None:
    [src] = http.post("/v1/sandboxes", json={"snapshot_tag": "py", "n": 1}).json()
    out = run_cli(daemon, "--json", "fork", "--from-sandbox", src["id"], "-n", "2", "--tree",
                  "-e", "ROLE=explorer")
    assert out.returncode == 0, out.stderr
    forked = json.loads(out.stdout)
    kids = [c["id"] for c in forked["children"]]
    assert len(kids) == 2 and forked["tree_id"].startswith("ft-")
    env = http.post(f"/v1/sandboxes/{kids[1]}/exec", json={"args": ["sh", "-c", "echo $ROLE"]}).json()
    assert env["stdout"] == "explorer\n"
    out = run_cli(daemon, "--json", "promote", kids[1], "--replace-parent")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["replaced_parent"] == src["id"]
    assert [s["id"] for s in http.get("/v1/sandboxes").json()] == [kids[1]]
    assert http.get(f"/v1/sandboxes/{src['id']}").json()["id"] == kids[1]  # the alias

    out = run_cli(daemon, "--json", "checkpoints", kids[1], "--every", "1", "--keep", "1")
    assert out.returncode == 0, out.stderr
    for i in range(2):
        http.post(f"/v1/sandboxes/{kids[1]}/eval", json={"code": f"turn = {i}"})
    deadline = time.monotonic() + 180
    while True:
        listed = json.loads(run_cli(daemon, "--json", "checkpoints", kids[1]).stdout)["checkpoints"]
        if len(listed) == 1 and listed[0]["status"] == "ready":
            break
        assert time.monotonic() < deadline, listed
        time.sleep(0.5)
    [child] = http.post("/v1/sandboxes", json={"snapshot_tag": listed[0]["tag"], "n": 1}).json()
    assert http.post(f"/v1/sandboxes/{child['id']}/eval", json={"code": "turn"}).json()["result"] == "1"
    for sb_id in (child["id"], kids[1]):
        assert http.delete(f"/v1/sandboxes/{sb_id}").status_code == 204
