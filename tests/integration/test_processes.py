"""Processes in real sandboxes, through a real daemon: streaming exec, background processes,
stdin, kill, re-attach, eval timeout and cancel, and a slow client that must not grow the daemon.

The session's shared daemon and its "py" template; each test forks its own child.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from forkd.sdk import Controller, Sandbox

from .daemon_fixture import Daemon, SharedDaemons

pytestmark = pytest.mark.vm

MIB = 1 << 20


@pytest.fixture(scope="module")
def daemon(shared_daemons: SharedDaemons) -> Iterator[Daemon]:
    with shared_daemons.lend() as d:
        shared_daemons.template(d, "py", boot_wait_secs=180)
        yield d


@pytest.fixture
def http(daemon: Daemon) -> Iterator[httpx.Client]:
    with daemon.client(timeout=120) as client:
        yield client


@pytest.fixture
def sandbox(http: httpx.Client) -> Iterator[str]:
    r = http.post("/v1/sandboxes", json={"snapshot_tag": "py"})
    assert r.status_code == 201, r.text
    sandbox_id = r.json()[0]["id"]
    yield sandbox_id
    http.delete(f"/v1/sandboxes/{sandbox_id}")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def listed(http: httpx.Client, sandbox_id: str) -> list[int]:
    return [p["pid"] for p in http.get(f"/v1/sandboxes/{sandbox_id}/processes").json()]


def test_a_line_reaches_the_streaming_client_before_the_command_ends(http: httpx.Client,
                                                                     sandbox: str) -> None:
    body = {"args": ["sh", "-c", "echo first; sleep 5; echo second"]}
    started = time.monotonic()
    arrivals: dict[str, float] = {}
    events: list[dict[str, Any]] = []
    with http.stream("POST", f"/v1/sandboxes/{sandbox}/exec/stream", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/x-ndjson"
        for line in r.iter_lines():
            event = json.loads(line)
            events.append(event)
            if event["type"] == "stdout":
                arrivals[event["data"]] = time.monotonic() - started
                if event["data"] == "first\n":
                    # The command is still running when its first line is here.
                    info = http.get(f"/v1/sandboxes/{sandbox}/processes/{events[0]['pid']}").json()
                    assert info["running"] is True
    first, second = arrivals["first\n"], arrivals["second\n"]
    print(f"\nfirst line after {first:.2f} s, second after {second:.2f} s")
    assert [e["type"] for e in events] == ["start", "stdout", "stdout", "exit"]
    assert events[-1]["exit_code"] == 0
    assert first < second


def test_eval_timeout_interrupts_and_the_next_eval_answers_at_once(http: httpx.Client, sandbox: str) -> None:
    started = time.monotonic()
    r = http.post(f"/v1/sandboxes/{sandbox}/eval", json={"code": "while True: pass", "timeout_secs": 2})
    took = time.monotonic() - started
    assert r.status_code == 200
    assert r.json() == {"result": None, "error": "TimeoutError: eval exceeded 2 s", "exit_code": 1}
    started = time.monotonic()
    nxt = http.post(f"/v1/sandboxes/{sandbox}/eval", json={"code": "6 * 7"}).json()
    answered = time.monotonic() - started
    print(f"\nthe loop was answered after {took:.2f} s; the next eval in {answered * 1000:.1f} ms")
    assert nxt == {"result": "42", "error": None, "exit_code": 0}
    assert answered < 5  # not waiting behind the loop (which would hold it for ever)


def test_a_running_eval_can_be_cancelled(daemon: Daemon, http: httpx.Client, sandbox: str) -> None:
    answer: dict[str, Any] = {}

    def long_eval() -> None:
        with daemon.client(timeout=120) as other:
            answer.update(other.post(f"/v1/sandboxes/{sandbox}/eval",
                                     json={"code": "while True: pass", "timeout_secs": 60}).json())

    worker = threading.Thread(target=long_eval)
    worker.start()
    deadline = time.monotonic() + 30
    while not http.post(f"/v1/sandboxes/{sandbox}/eval/cancel").json()["cancelled"]:
        assert time.monotonic() < deadline, "the eval never ran"
        time.sleep(0.2)
    worker.join(30)
    assert answer == {"result": None, "error": "CancelledError: eval cancelled", "exit_code": 1}
    assert http.post(f"/v1/sandboxes/{sandbox}/eval", json={"code": "1"}).json()["result"] == "1"


def test_background_process_killed_leaves_the_list(http: httpx.Client, sandbox: str) -> None:
    r = http.post(f"/v1/sandboxes/{sandbox}/processes", json={"args": ["sleep", "300"], "tag": "sleeper"})
    assert r.status_code == 201, r.text
    pid = r.json()["pid"]
    assert pid in listed(http, sandbox)
    assert http.delete(f"/v1/sandboxes/{sandbox}/processes/{pid}").status_code == 204
    assert pid not in listed(http, sandbox)
    ended = http.get(f"/v1/sandboxes/{sandbox}/processes/{pid}").json()
    assert ended["running"] is False and ended["signal"] == 9
    assert http.delete(f"/v1/sandboxes/{sandbox}/processes/{pid}").status_code == 404
    # And in the guest: no such process any more.
    out = http.post(f"/v1/sandboxes/{sandbox}/exec", json={"args": ["sh", "-c", f"kill -0 {pid}"]}).json()
    assert out["exit_code"] != 0


def test_stdin_reaches_the_process(http: httpx.Client, sandbox: str) -> None:
    r = http.post(f"/v1/sandboxes/{sandbox}/processes", json={"args": ["cat"], "stdin_open": True})
    pid = r.json()["pid"]
    for piece in ({"data": "hello "}, {"data": base64.b64encode(b"world\n").decode(), "encoding": "base64"}):
        assert http.post(f"/v1/sandboxes/{sandbox}/processes/{pid}/stdin", json=piece).status_code == 200
    assert http.post(f"/v1/sandboxes/{sandbox}/processes/{pid}/stdin", json={"eof": True}).status_code == 200
    with http.stream("GET", f"/v1/sandboxes/{sandbox}/processes/{pid}/stream") as stream:
        events = [json.loads(line) for line in stream.iter_lines()]
    assert "".join(e["data"] for e in events if e["type"] == "stdout") == "hello world\n"
    assert events[-1]["type"] == "exit" and events[-1]["exit_code"] == 0


def test_reattaching_gives_the_earlier_output(http: httpx.Client, sandbox: str) -> None:
    script = "for i in 1 2 3; do echo line $i; done; echo to-stderr >&2; sleep 300"
    pid = http.post(f"/v1/sandboxes/{sandbox}/processes", json={"args": ["sh", "-c", script]}).json()["pid"]

    def watch_until_all_written() -> tuple[str, str, dict[str, Any]]:
        """Attach, read until the script's whole output is there, leave (it keeps running)."""
        out = err = ""
        first: dict[str, Any] = {}
        with http.stream("GET", f"/v1/sandboxes/{sandbox}/processes/{pid}/stream") as s:
            for line in s.iter_lines():
                event = json.loads(line)
                first = first or event
                out += event["data"] if event["type"] == "stdout" else ""
                err += event["data"] if event["type"] == "stderr" else ""
                if "line 3" in out and err:
                    break
        return out, err, first

    watch_until_all_written()  # the first watcher, live
    out, err, first = watch_until_all_written()  # a second one, after all was written
    assert first == {"type": "start", "pid": pid}
    assert (out, err) == ("line 1\nline 2\nline 3\n", "to-stderr\n")
    assert pid in listed(http, sandbox)
    assert http.delete(f"/v1/sandboxes/{sandbox}/processes/{pid}").status_code == 204


def test_a_client_that_leaves_kills_its_streamed_command(http: httpx.Client, sandbox: str) -> None:
    with http.stream("POST", f"/v1/sandboxes/{sandbox}/exec/stream",
                     json={"args": ["sleep", "300"], "tag": "left"}) as r:
        # Keep the line iterator alive: a dropped one is closed whenever the garbage
        # collector gets to it, and httpx then closes the connection (the client "leaves").
        lines = r.iter_lines()
        pid = json.loads(next(lines))["pid"]
        assert pid in listed(http, sandbox)
    deadline = time.monotonic() + 30
    while pid in listed(http, sandbox):
        assert time.monotonic() < deadline, "the command outlived the client that streamed it"
        time.sleep(0.2)


def test_a_slow_client_holds_the_command_back_not_the_daemon_memory(daemon: Daemon, http: httpx.Client,
                                                                    sandbox: str) -> None:
    total = 48 * MIB
    assert daemon.proc is not None
    before = rss_kib(daemon.proc.pid)
    received = 0
    peak = before
    with http.stream("POST", f"/v1/sandboxes/{sandbox}/exec/stream",
                     json={"args": ["head", "-c", str(total), "/dev/zero"], "encoding": "base64"}) as r:
        lines = r.iter_lines()
        pid = json.loads(next(lines))["pid"]
        time.sleep(5)  # not reading: the guest must hold the command back
        assert http.get(f"/v1/sandboxes/{sandbox}/processes/{pid}").json()["running"] is True
        peak = max(peak, rss_kib(daemon.proc.pid))
        for line in lines:
            event = json.loads(line)
            if event["type"] == "stdout":
                received += len(base64.b64decode(event["data"]))
                if received % (8 * MIB) < 65536:
                    peak = max(peak, rss_kib(daemon.proc.pid))
            elif event["type"] == "exit":
                assert event["exit_code"] == 0
    print(f"\ndaemon RSS {before / 1024:.1f} MiB before, {peak / 1024:.1f} MiB at most while "
          f"{total // MIB} MiB streamed through a stalled, then slow client")
    assert received == total
    assert peak - before < 32 * 1024


def test_the_sdk_and_cli_against_the_daemon(daemon: Daemon, sandbox: str) -> None:
    with Controller(url=daemon.url, token=daemon.token) as controller:
        sb = Sandbox(sandbox_id=sandbox, controller=controller)
        seen: list[str] = []
        result = sb.commands.run("for i in 1 2; do echo $i; done", on_stdout=seen.append)
        assert "".join(seen) == "1\n2\n" and result.exit_code == 0
        handle = sb.commands.run(["cat"], background=True, stdin_open=True)
        handle.send_stdin("via the sdk\n")
        handle.close_stdin()
        assert handle.wait().stdout == "via the sdk\n"
        assert sb.commands.list() == []
        timed = sb.eval("while True: pass", timeout=2)
        assert timed.error == "TimeoutError: eval exceeded 2 s"


def test_a_background_process_outlives_a_daemon_restart(daemon: Daemon, sandbox: str) -> None:
    """kill -9 the daemon, start it again: it re-adopts the sandbox, whose agent (told by the
    port's SIGIO that a host is back) answers at once, its background process still running."""
    with daemon.client() as http:
        pid = http.post(f"/v1/sandboxes/{sandbox}/processes", json={"args": ["sleep", "300"]}).json()["pid"]
    daemon.kill9()
    time.sleep(2)  # the guest sees no host for a while
    daemon.start()
    with daemon.client() as http:
        started = time.monotonic()
        assert http.post(f"/v1/sandboxes/{sandbox}/ping").json()["pong"] is True
        answered = time.monotonic() - started
        print(f"\nfirst ping after the restart: {answered * 1000:.1f} ms")
        assert pid in listed(http, sandbox)
        assert http.delete(f"/v1/sandboxes/{sandbox}/processes/{pid}").status_code == 204
