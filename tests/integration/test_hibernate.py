"""Hibernation with real VMs, through a real daemon: to disk and back, on request, when idle,
at an E2B ``autoPause`` timeout, and across a daemon ``kill -9``.

One daemon of its own (it is killed and restarted) serves the module, with the session's
template with a NIC (booted once, so that every child has a network of its own to release and
make again) registered as ``base`` before it starts.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import Seeder, qemu_processes_of, soak
from .daemon_fixture import (
    Daemon,
    evaluate,
    kill_leftover_sandboxes,
    new_daemon,
    ok,
    pid_alive,
    shutdown_and_check,
    start_or_clean_up,
)

pytestmark = pytest.mark.vm

ROOT = Path(__file__).resolve().parents[2]
CLIENTS_PYTHON = ROOT / ".venv-clients" / "bin" / "python"
EGRESS = {"allow_out": [], "deny_out": ["192.0.2.7/32"]}  # within the host: no forwarding needed
# A server in the guest's warm interpreter: it answers each connection with a line.
GUEST_PORT = 8123
GUEST_SERVER = f"""
import socket, threading
_srv = socket.socket(); _srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
_srv.bind(("0.0.0.0", {GUEST_PORT})); _srv.listen(8)
def _serve(s):
    while True:
        c, _ = s.accept(); c.sendall(b"still here\\n"); c.close()
threading.Thread(target=_serve, args=(_srv,), daemon=True).start()
"""
# A background process that counts, twice a second, into a file.
COUNTER = ["sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.5; done"]


@pytest.fixture(scope="module")
def daemon(nic_snapshot: str, seed: Seeder) -> Iterator[Daemon]:
    d = new_daemon("fkh-")
    seed(d.root, base=nic_snapshot)
    start_or_clean_up(d)
    try:
        yield d
    finally:
        shutdown_and_check(d)


@pytest.fixture
def http(daemon: Daemon) -> Iterator[httpx.Client]:
    with daemon.client() as c:
        yield c
    kill_leftover_sandboxes(daemon)


def spawn(c: httpx.Client, **options: Any) -> dict[str, Any]:
    r = c.post("/v1/sandboxes", json={"snapshot_tag": "base", "network": EGRESS, **options}, timeout=300)
    assert r.status_code == 201, r.text
    [sb] = r.json()
    return dict(sb)


def run(c: httpx.Client, sb_id: str, *args: str) -> str:
    out = ok(c.post(f"/v1/sandboxes/{sb_id}/exec", json={"args": list(args)}))
    assert out["exit_code"] == 0, out
    return str(out["stdout"])


def metric(c: httpx.Client, name: str) -> float:
    text = c.get("/metrics").text
    found = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


def host_fetch(ip: str) -> str:
    """A line from the guest's server, reached from the host at the sandbox's own address."""
    with socket.create_connection((ip, GUEST_PORT), timeout=10) as s:
        return s.recv(100).decode().strip()


def netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def hibernate(c: httpx.Client, sb_id: str) -> dict[str, Any]:
    info = ok(c.post(f"/v1/sandboxes/{sb_id}/hibernate"))
    assert info["state"] == "hibernated" and "pid" not in info, info
    return dict(info)


def test_hibernate_and_wake_keep_memory_files_processes_and_network(http: httpx.Client,
                                                                   daemon: Daemon) -> None:
    sb = spawn(http)
    sb_id, run_dir = sb["id"], daemon.root / "sandboxes" / sb["id"]
    assert evaluate(http, sb_id, "import numpy as np; x = 41; arr = np.arange(1000); x") == "41"
    ok(http.put(f"/v1/sandboxes/{sb_id}/files", params={"path": "/root/note.txt"}, content=b"kept"))
    proc = ok(http.post(f"/v1/sandboxes/{sb_id}/processes", json={"args": COUNTER}))
    evaluate(http, sb_id, GUEST_SERVER + "'serving'")
    before = ok(http.get(f"/v1/sandboxes/{sb_id}"))
    assert before["ip"] and before["netns"] and netns_exists(before["netns"])
    assert host_fetch(before["ip"]) == "still here"

    info = hibernate(http, sb_id)
    hib = info["hibernation"]
    print(f"\nhibernated: {hib['pages']} pages, {hib['disk_mib']:.2f} MiB on disk, {hib['pause_ms']:.0f} ms "
          "stopped")
    assert 0 < hib["memory_bytes"] < 4 << 20 and hib["devices_bytes"] > 0
    assert (run_dir / "hibernation" / "memory.diff").stat().st_size == hib["memory_bytes"]
    assert not pid_alive(before["pid"]) and not netns_exists(before["netns"])
    assert [s["state"] for s in ok(http.get("/v1/sandboxes")) if s["id"] == sb_id] == ["hibernated"]
    assert metric(http, "forkd_sandboxes_hibernated") == 1
    assert http.post(f"/v1/sandboxes/{sb_id}/hibernate").status_code == 409  # already
    time.sleep(2)  # the guest's clock stands still meanwhile

    # Its next request wakes it; the clock was stepped, and everything is as it was.
    started = time.monotonic()
    assert evaluate(http, sb_id, "x + 1, int(arr.sum())") == "(42, 499500)"
    print(f"wake to first answer: {(time.monotonic() - started) * 1000:.0f} ms")
    assert abs(float(evaluate(http, sb_id, "import time; time.time()")) - time.time()) < 1.5
    assert run(http, sb_id, "cat", "/root/note.txt") == "kept"
    count = int(run(http, sb_id, "cat", "/tmp/count"))
    time.sleep(1.2)
    assert int(run(http, sb_id, "cat", "/tmp/count")) > count  # it went on counting
    assert [p["pid"] for p in ok(http.get(f"/v1/sandboxes/{sb_id}/processes"))] == [proc["pid"]]
    after = ok(http.get(f"/v1/sandboxes/{sb_id}"))
    assert after["state"] == "running" and after["pid"] != before["pid"] and "hibernation" not in after
    for key in ("ip", "netns", "network"):  # the same address and egress policy
        assert after[key] == before[key], key
    assert netns_exists(after["netns"]) and not (run_dir / "hibernation").exists()
    assert host_fetch(after["ip"]) == "still here"  # its server, at the same address, through its network

    # Killed while hibernated: its files go with it.
    hibernate(http, sb_id)
    assert http.delete(f"/v1/sandboxes/{sb_id}").status_code == 204
    assert not run_dir.exists()
    assert http.get(f"/v1/sandboxes/{sb_id}").status_code == 404


def test_a_flipped_byte_in_a_hibernation_file_refuses_the_wake_and_loses_nothing(
        http: httpx.Client, daemon: Daemon) -> None:
    """Each saved file is checked against the digest taken as it was written: a changed one is a
    500 naming it, the sandbox stays hibernated with its files, and once the file is whole again
    it wakes with its memory."""
    sb = spawn(http)
    sb_id, run_dir = sb["id"], daemon.root / "sandboxes" / sb["id"]
    assert evaluate(http, sb_id, "y = 1234; y") == "1234"
    hibernate(http, sb_id)
    diff = run_dir / "hibernation" / "memory.diff"
    whole = diff.read_bytes()
    at = len(whole) // 2  # in the compressed pages, past the header and the run table
    diff.write_bytes(whole[:at] + bytes([whole[at] ^ 0x01]) + whole[at + 1:])

    refused = http.post(f"/v1/sandboxes/{sb_id}/eval", json={"code": "y"})
    assert refused.status_code == 500, refused.text
    assert str(diff) in refused.json()["error"] and "digest" in refused.json()["error"]
    assert ok(http.get(f"/v1/sandboxes/{sb_id}"))["state"] == "hibernated"
    assert not [p for p in qemu_processes_of(daemon.root) if sb_id in p] and diff.exists()

    diff.write_bytes(whole)
    assert evaluate(http, sb_id, "y + 1") == "1235"
    assert http.delete(f"/v1/sandboxes/{sb_id}").status_code == 204


def test_concurrent_requests_share_one_wake(http: httpx.Client) -> None:
    sb = spawn(http)
    sb_id = sb["id"]
    evaluate(http, sb_id, "y = 'one wake'")
    hibernate(http, sb_id)
    wakes = metric(http, "forkd_hibernation_wakes")
    answers: list[str] = []

    def ask(code: str) -> None:
        answers.append(evaluate(http, sb_id, code))

    threads = [threading.Thread(target=ask, args=(f"y + ' {i}'",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(answers) == [f"'one wake {i}'" for i in range(3)]
    assert metric(http, "forkd_hibernation_wakes") == wakes + 1


def test_a_branched_sandbox_hibernates_wakes_and_branches_again(http: httpx.Client) -> None:
    """Its disk is a chain of layers by then (the woken QEMU opens the top one under a new node
    name), and a branch of the woken sandbox is a snapshot like any other."""
    sb = spawn(http)
    run(http, sb["id"], "sh", "-c", "echo one > /root/a; sync")
    first = ok(http.post(f"/v1/sandboxes/{sb['id']}/branch", json={"mode": "diff"}, timeout=300))
    run(http, sb["id"], "sh", "-c", "echo two > /root/b; sync")
    evaluate(http, sb["id"], "v = 'after the branch'")
    hibernate(http, sb["id"])
    assert run(http, sb["id"], "cat", "/root/a", "/root/b") == "one\ntwo\n"
    second = ok(http.post(f"/v1/sandboxes/{sb['id']}/branch", json={"mode": "full"}, timeout=300))
    child = ok(http.post("/v1/sandboxes", json={"snapshot_tag": second["tag"]}, timeout=300))[0]
    assert evaluate(http, child["id"], "v") == "'after the branch'"
    assert run(http, child["id"], "cat", "/root/b") == "two\n"
    for sb_id in (child["id"], sb["id"]):
        assert http.delete(f"/v1/sandboxes/{sb_id}").status_code == 204
    for snap in (second, first):
        assert http.delete(f"/v1/snapshots/{snap['tag']}").status_code == 204


def test_a_hibernated_sandbox_forks_without_waking(http: httpx.Client) -> None:
    """fork-tree of a hibernated sandbox: the children start from its saved memory and disk (a
    chain of layers by then), each on its own, and it stays hibernated; woken later, it is as
    it was."""
    sb = spawn(http)
    run(http, sb["id"], "sh", "-c", "echo one > /root/a; sync")
    first = ok(http.post(f"/v1/sandboxes/{sb['id']}/branch", json={"mode": "diff"}, timeout=300))
    run(http, sb["id"], "sh", "-c", "echo two > /root/b")  # in its page cache when it sleeps
    evaluate(http, sb["id"], "v = 'asleep'")
    hibernate(http, sb["id"])
    wakes = metric(http, "forkd_hibernation_wakes")

    r = http.post(f"/v1/sandboxes/{sb['id']}/fork-tree", json={"count": 2, "network": EGRESS}, timeout=600)
    assert r.status_code == 201, r.text
    forked = r.json()
    assert forked["errors"] == [] and forked["pause_ms"] == 0, forked
    children = [child["id"] for child in forked["children"]]
    listed = {s["id"]: s["state"] for s in ok(http.get("/v1/sandboxes"))}
    assert listed[sb["id"]] == "hibernated"
    assert metric(http, "forkd_hibernation_wakes") == wakes  # nothing woke it
    for i, child in enumerate(children):
        assert listed[child] == "running"
        assert evaluate(http, child, "v") == "'asleep'"
        assert run(http, child, "cat", "/root/a", "/root/b") == "one\ntwo\n"
        run(http, child, "sh", "-c", f"echo child{i} > /root/a; sync")
    assert run(http, children[1], "cat", "/root/a") == "child1\n"  # each child's disk is its own

    # The source wakes on its next request, from its own files, untouched by the fork.
    assert evaluate(http, sb["id"], "v") == "'asleep'"
    assert run(http, sb["id"], "cat", "/root/a", "/root/b") == "one\ntwo\n"
    assert metric(http, "forkd_hibernation_wakes") == wakes + 1
    for sb_id in (*children, sb["id"]):
        assert http.delete(f"/v1/sandboxes/{sb_id}").status_code == 204
    assert http.delete(f"/v1/snapshots/{first['tag']}").status_code == 204


def test_an_idle_sandbox_hibernates_and_wakes_on_its_next_request(http: httpx.Client) -> None:
    sb = spawn(http, idle_hibernate_secs=1)
    evaluate(http, sb["id"], "z = 7")
    deadline = time.monotonic() + 60
    while ok(http.get(f"/v1/sandboxes/{sb['id']}"))["state"] != "hibernated":
        assert time.monotonic() < deadline, "the idle sandbox was never hibernated"
        time.sleep(0.3)
    assert evaluate(http, sb["id"], "z * 6") == "42"
    assert ok(http.get(f"/v1/sandboxes/{sb['id']}"))["idle_hibernate_secs"] == 1


def test_live_fork_sandboxes_are_refused_with_the_reason(http: httpx.Client) -> None:
    r = http.post("/v1/sandboxes", json={"snapshot_tag": "base", "live_fork": True,
                                         "idle_hibernate_secs": 5})
    assert r.status_code == 409 and "live_fork" in r.json()["error"], r.text


@pytest.mark.skipif(not CLIENTS_PYTHON.exists(), reason="no .venv-clients (make clients)")
def test_e2b_auto_pause_hibernates_at_the_timeout_and_connect_wakes_it(http: httpx.Client,
                                                                         daemon: Daemon) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FORKD_", "E2B_"))}
    env.update({"E2B_API_URL": daemon.url, "E2B_SANDBOX_URL": daemon.url, "E2B_API_KEY": daemon.token})
    proc = subprocess.run([str(CLIENTS_PYTHON), str(ROOT / "tests/clients/e2b/auto_pause.py")], env=env,
                          capture_output=True, text=True, timeout=300, cwd="/tmp")
    assert proc.returncode == 0, f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    assert proc.stdout.strip().endswith("auto_pause ok"), proc.stdout


def test_a_daemon_restart_keeps_a_hibernated_sandbox_and_it_wakes_after(daemon: Daemon) -> None:
    """SIGTERM stops the running sandboxes, as ever; a hibernated one stays, files untouched."""
    with daemon.client() as c:
        sb = spawn(c)
        evaluate(c, sb["id"], "kept = 'across a restart'")
        info = hibernate(c, sb["id"])
        saved = daemon.root / "sandboxes" / sb["id"] / "hibernation"
        stamps = {p.name: p.stat().st_mtime_ns for p in saved.iterdir()}
    assert daemon.stop() in (0, -signal.SIGTERM)
    daemon.start()
    with daemon.client() as c:
        again = ok(c.get(f"/v1/sandboxes/{sb['id']}"))
        assert again["state"] == "hibernated" and again["hibernation"] == info["hibernation"]
        assert {p.name: p.stat().st_mtime_ns for p in saved.iterdir()} == stamps
        assert metric(c, "forkd_sandboxes_hibernated") == 1
        assert evaluate(c, sb["id"], "kept") == "'across a restart'"
        assert c.delete(f"/v1/sandboxes/{sb['id']}").status_code == 204


# How long after the request each cut lands: one point in make test, two in make stress.
CUT_DELAYS = soak((0.05,), (0.02, 0.08))


@pytest.mark.soak
def test_kill9_while_hibernating_or_waking_loses_nothing_and_leaves_no_qemu(daemon: Daemon) -> None:
    """Runs last: it kills the module's daemon with SIGKILL (1 + 2 per CUT_DELAYS) and restarts it."""
    with daemon.client() as c:
        asleep, cut_hibernating, cut_waking = (spawn(c) for _ in range(3))
        for sb in (asleep, cut_hibernating, cut_waking):
            evaluate(c, sb["id"], f"mark = {sb['id']!r}")
        hibernate(c, asleep["id"])
        hibernate(c, cut_waking["id"])
        saved = sorted(p.name for p in (daemon.root / "sandboxes" / asleep["id"] / "hibernation").iterdir())

    def crash_during(method: str, path: str, body: dict[str, Any] | None, after: float,
                     frozen: int | None = None) -> None:
        def send() -> None:
            try:
                with daemon.client(timeout=30) as c:
                    c.request(method, path, json=body)
            except httpx.HTTPError:
                pass  # the daemon died under it
        t = threading.Thread(target=send)
        t.start()
        time.sleep(after)
        daemon.kill9()
        if frozen is not None:
            os.kill(frozen, signal.SIGCONT)
        t.join(30)
        daemon.start()

    def check_qemus() -> None:
        with daemon.client() as c:
            listed = ok(c.get("/v1/sandboxes"))
        running = [s for s in listed if s["state"] != "hibernated"]
        # Exactly one QEMU per sandbox that is not hibernated, none for the others.
        qemus = qemu_processes_of(daemon.root)
        assert len(qemus) == len(running), (qemus, listed)
        assert all(pid_alive(s["pid"]) for s in running)

    # Deterministically mid-hibernation: its QEMU frozen, the hibernation waits on its QMP stop
    # (the command sits in the socket, and a thawed QEMU runs it) when the daemon dies.
    with daemon.client() as c:
        pid = ok(c.get(f"/v1/sandboxes/{cut_hibernating['id']}"))["pid"]
    os.kill(pid, signal.SIGSTOP)
    crash_during("POST", f"/v1/sandboxes/{cut_hibernating['id']}/hibernate", None, 0.5, frozen=pid)
    with daemon.client() as c:
        info = ok(c.get(f"/v1/sandboxes/{cut_hibernating['id']}"))
        assert info["state"] == "running" and info["pid"] == pid  # re-adopted, and running again
        assert evaluate(c, cut_hibernating["id"], "mark") == repr(cut_hibernating["id"])
    assert not (daemon.root / "sandboxes" / cut_hibernating["id"] / "hibernation.tmp").exists()
    check_qemus()

    # A hibernation cut short, and a wake cut short, at a few points each.
    for delay in CUT_DELAYS:
        with daemon.client() as c:
            evaluate(c, cut_hibernating["id"], "mark")  # running (woken if it was hibernated)
        crash_during("POST", f"/v1/sandboxes/{cut_hibernating['id']}/hibernate", None, delay)
        check_qemus()
        with daemon.client() as c:
            if ok(c.get(f"/v1/sandboxes/{cut_waking['id']}"))["state"] != "hibernated":
                hibernate(c, cut_waking["id"])
        crash_during("POST", f"/v1/sandboxes/{cut_waking['id']}/eval", {"code": "mark"}, delay)
        check_qemus()
    with daemon.client() as c:
        listed = {s["id"]: s for s in ok(c.get("/v1/sandboxes"))}
        assert set(listed) == {asleep["id"], cut_hibernating["id"], cut_waking["id"]}
        # The one nobody touched is as it was: hibernated, its files untouched.
        assert listed[asleep["id"]]["state"] == "hibernated"
        assert sorted(p.name for p in (daemon.root / "sandboxes" / asleep["id"] / "hibernation").iterdir()) \
            == saved
        for sb in (asleep, cut_hibernating, cut_waking):  # every one answers with its own memory
            assert evaluate(c, sb["id"], "mark") == repr(sb["id"])
        for sb in (asleep, cut_hibernating, cut_waking):
            assert c.delete(f"/v1/sandboxes/{sb['id']}").status_code == 204
    assert not qemu_processes_of(daemon.root)


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def test_a_disk_only_hibernation_cold_boots_its_disk_under_the_same_id_and_network(
        http: httpx.Client, daemon: Daemon) -> None:
    """``memory: false``: the guest syncs, its QEMU goes, only its disk overlay stays. Its next
    request cold-boots the template's kernel on that disk: files kept, a new boot_id, no process
    of before, the same address and egress; exec and eval work; and it can hibernate (with its
    memory) and wake again like any sandbox."""
    sb = spawn(http)
    sb_id, run_dir = sb["id"], daemon.root / "sandboxes" / sb["id"]
    run(http, sb_id, "sh", "-c", "echo persisted > /home/user/fs-only-marker.txt")
    boot_before = run(http, sb_id, "cat", BOOT_ID).strip()
    ok(http.post(f"/v1/sandboxes/{sb_id}/processes", json={"args": COUNTER}))
    before = ok(http.get(f"/v1/sandboxes/{sb_id}"))

    started = time.monotonic()
    info = ok(http.post(f"/v1/sandboxes/{sb_id}/hibernate", json={"memory": False}))
    pause_s = time.monotonic() - started
    hib = info["hibernation"]
    assert info["state"] == "hibernated" and hib["memory"] is False and hib["pages"] == 0, info
    assert not (run_dir / "hibernation").exists() and not (run_dir / "hibernation.tmp").exists()
    assert not pid_alive(before["pid"]) and not netns_exists(before["netns"])
    assert not qemu_processes_of(run_dir)
    listed = [s for s in ok(http.get("/v1/sandboxes")) if s["id"] == sb_id]
    assert listed[0]["state"] == "hibernated" and listed[0]["hibernation"]["memory"] is False

    started = time.monotonic()
    assert run(http, sb_id, "cat", "/home/user/fs-only-marker.txt").strip() == "persisted"
    wake_s = time.monotonic() - started
    print(f"\ndisk-only hibernation: {pause_s * 1000:.0f} ms ({hib['pause_ms']:.0f} ms stopped); "
          f"cold boot to first answer: {wake_s:.1f} s")
    boot_after = run(http, sb_id, "cat", BOOT_ID).strip()
    assert boot_after and boot_after != boot_before
    assert ok(http.get(f"/v1/sandboxes/{sb_id}/processes")) == []  # a fresh boot: none of before
    assert evaluate(http, sb_id, "6 * 7") == "42"
    assert abs(float(evaluate(http, sb_id, "import time; time.time()")) - time.time()) < 1.5
    after = ok(http.get(f"/v1/sandboxes/{sb_id}"))
    assert after["state"] == "running" and after["pid"] != before["pid"] and "hibernation" not in after
    for key in ("ip", "netns", "network"):
        assert after[key] == before[key], key
    evaluate(http, sb_id, GUEST_SERVER + "'serving'")
    assert host_fetch(after["ip"]) == "still here"  # its network, made again at the same address

    # A cold-booted sandbox hibernates with its memory and wakes as any other.
    evaluate(http, sb_id, "kept = 'in memory'")
    assert hibernate(http, sb_id)["hibernation"]["memory"] is True
    assert evaluate(http, sb_id, "kept") == "'in memory'"
    assert run(http, sb_id, "cat", BOOT_ID).strip() == boot_after
    assert http.delete(f"/v1/sandboxes/{sb_id}").status_code == 204


def test_a_failed_cold_boot_leaves_it_hibernated_with_its_disk_and_no_qemu(http: httpx.Client,
                                                                             daemon: Daemon) -> None:
    """The template's kernel made unbootable after the hibernation: the wake fails with
    ``{"error": ...}``, no QEMU of it is left, it stays hibernated with its disk; once the kernel
    is back, the next request boots it with its files."""
    sb = spawn(http)
    sb_id, run_dir = sb["id"], daemon.root / "sandboxes" / sb["id"]
    run(http, sb_id, "sh", "-c", "echo kept > /home/user/kept.txt")
    ok(http.post(f"/v1/sandboxes/{sb_id}/hibernate", json={"memory": False}))
    meta_path = daemon.root / "snapshots" / "base" / "snapshot.json"
    original = meta_path.read_text()
    junk = daemon.root / "not-a-kernel"
    junk.write_bytes(b"\0" * 4096)
    try:
        meta_path.write_text(original.replace('"kernel": "', f'"kernel": "{junk}", "was": "', 1))
        r = http.post(f"/v1/sandboxes/{sb_id}/exec", json={"args": ["true"]}, timeout=300)
        assert r.status_code >= 500 and set(r.json()) == {"error"}, r.text
        assert not qemu_processes_of(run_dir)
        info = ok(http.get(f"/v1/sandboxes/{sb_id}"))
        assert info["state"] == "hibernated" and info["hibernation"]["memory"] is False
        assert list(run_dir.glob("disk*.qcow2"))
    finally:
        meta_path.write_text(original)
    assert run(http, sb_id, "cat", "/home/user/kept.txt").strip() == "kept"
    assert metric(http, "forkd_hibernation_wake_failures") >= 1
    assert http.delete(f"/v1/sandboxes/{sb_id}").status_code == 204


@pytest.mark.skipif(not CLIENTS_PYTHON.exists(), reason="no .venv-clients (make clients)")
def test_e2b_filesystem_only_pause_cold_boots_on_connect(http: httpx.Client, daemon: Daemon) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FORKD_", "E2B_"))}
    env.update({"E2B_API_URL": daemon.url, "E2B_SANDBOX_URL": daemon.url, "E2B_API_KEY": daemon.token})
    proc = subprocess.run([str(CLIENTS_PYTHON), str(ROOT / "tests/clients/e2b/fs_pause.py")], env=env,
                          capture_output=True, text=True, timeout=600, cwd="/tmp")
    assert proc.returncode == 0, f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    print("\n" + proc.stdout.strip().splitlines()[-1])
    assert "fs_pause ok" in proc.stdout, proc.stdout


@pytest.mark.skipif(not CLIENTS_PYTHON.exists(), reason="no .venv-clients (make clients)")
def test_e2b_filesystem_only_pause_at_the_timeout_cold_boots_on_connect(http: httpx.Client,
                                                                        daemon: Daemon) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FORKD_", "E2B_"))}
    env.update({"E2B_API_URL": daemon.url, "E2B_SANDBOX_URL": daemon.url, "E2B_API_KEY": daemon.token})
    proc = subprocess.run([str(CLIENTS_PYTHON), str(ROOT / "tests/clients/e2b/fs_auto_pause.py")], env=env,
                          capture_output=True, text=True, timeout=600, cwd="/tmp")
    assert proc.returncode == 0, f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    print("\n" + proc.stdout.strip().splitlines()[-1])
    assert "fs_auto_pause ok" in proc.stdout, proc.stdout
