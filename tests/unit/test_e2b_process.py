"""envd's process service (E2B's commands) over Connect, on the real Runtime and the scripted
guest's processes.

The SDK itself runs its commands against a real daemon in
tests/integration/test_compat_clients.py (tests/clients/e2b/commands.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from forkd.api.e2b import process as process_mod
from forkd.api.e2b.tokens import AccessTokens
from forkd.controller.processes import ProcessEvent
from tests.fakes.app import TOKEN, Daemon, daemon_app


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with daemon_app(tmp_path, snapshots=("base",)) as d:
        yield d


@pytest.fixture
def sb(daemon: Daemon) -> str:
    sandbox_id = daemon.sandbox("base").id
    HEADERS.update({"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983",
                    "X-Access-Token": AccessTokens(TOKEN.encode()).envd(sandbox_id)})
    return sandbox_id


HEADERS: dict[str, str] = {}  # the sandbox's (fixture ``sb``)


@pytest.fixture
def client(daemon: Daemon, sb: str) -> TestClient:
    return daemon.client


def started(daemon: Daemon, sb: str) -> dict[str, Any]:
    """The last process the guest was asked to start."""
    return daemon.guest_requests(sb, "proc_start")[-1]


def stream(client: TestClient, method: str, body: dict[str, Any],
           headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """A Connect server-streaming call with the JSON codec; its messages, then its end frame."""
    payload = json.dumps(body).encode()
    resp = client.post(f"/process.Process/{method}", content=struct.pack(">BI", 0, len(payload)) + payload,
                       headers={**HEADERS, "Content-Type": "application/connect+json", **(headers or {})})
    assert resp.status_code == 200, resp.text
    data, out = resp.content, []
    while data:
        flags, size = struct.unpack(">BI", data[:5])
        out.append({"end" if flags & 2 else "message": json.loads(data[5:5 + size])})
        data = data[5 + size:]
    return out


def unary(client: TestClient, method: str, body: dict[str, Any]) -> Any:
    return client.post(f"/process.Process/{method}", json=body, headers=HEADERS)


def test_start_streams_start_output_and_end(client: TestClient, daemon: Daemon, sb: str) -> None:
    frames = stream(client, "Start", {"process": {"cmd": "echo", "args": ["hi"], "envs": {"A": "b"}}})
    events = [f["message"]["event"] for f in frames if "message" in f]
    pid = events[0]["start"]["pid"]
    assert daemon.run(daemon.runtime.processes.get, sb, pid)["args"] == ["echo", "hi"]
    assert base64.b64decode(events[1]["data"]["stdout"]) == b"hi\n"
    assert events[2]["end"]["status"] == "exit status 0"
    assert frames[-1] == {"end": {}}
    call = started(daemon, sb)
    assert call["args"] == ["echo", "hi"] and call["env"] == {"A": "b"}
    # E2B's default user, in its home (the agent's default for a user: no cwd sent).
    assert "cwd" not in call and call["user"] == "user"


def test_start_acts_as_the_user_the_sdk_names(client: TestClient, daemon: Daemon, sb: str) -> None:
    """``commands.run(..., user="root", cwd="rel")``: a Basic header names root; relative cwds are
    under that user's home."""
    root = {"Authorization": "Basic " + base64.b64encode(b"root:").decode()}
    stream(client, "Start", {"process": {"cmd": "pwd", "cwd": "work"}}, headers=root)
    call = started(daemon, sb)
    assert call["user"] == "root" and call["cwd"] == "/root/work"
    stream(client, "Start", {"process": {"cmd": "pwd", "cwd": "work"}})
    call = started(daemon, sb)
    assert call["user"] == "user" and call["cwd"] == "/home/user/work"


def test_a_failing_command_ends_with_its_code(client: TestClient) -> None:
    frames = stream(client, "Start", {"process": {"cmd": "err", "args": ["oops"]}})
    end = [f["message"]["event"]["end"] for f in frames if "end" in f.get("message", {}).get("event", {})]
    assert end == [{"exitCode": 1, "exited": True, "status": "exit status 1"}]


def test_background_processes_list_input_and_signals(client: TestClient, daemon: Daemon, sb: str) -> None:
    processes = daemon.runtime.processes
    daemon.run(processes.start, sb, ["cat"], stdin_open=True, tag="t1")
    [proc] = unary(client, "List", {}).json()["processes"]
    assert proc["config"]["cmd"] == "cat" and proc["tag"] == "t1"
    pid = proc["pid"]
    typed = {"process": {"pid": pid}, "input": {"stdin": base64.b64encode(b"x").decode()}}
    assert unary(client, "SendInput", typed).status_code == 200
    assert unary(client, "CloseStdin", {"process": {"tag": "t1"}}).status_code == 200
    writes = daemon.guest_requests(sb, "proc_input")
    assert [(base64.b64decode(w["data"]), w.get("eof", False)) for w in writes] == [(b"x", False),
                                                                                    (b"", True)]
    sleeper = daemon.run(processes.start, sb, ["sleep", "60"])["pid"]
    assert unary(client, "SendSignal", {"process": {"pid": sleeper},
                                        "signal": "SIGNAL_SIGKILL"}).status_code == 200
    missing = unary(client, "SendSignal", {"process": {"pid": 4321}, "signal": "SIGNAL_SIGKILL"})
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"  # the SDK: kill -> False
    untagged = unary(client, "CloseStdin", {"process": {"tag": "nope"}})
    assert untagged.json()["code"] == "not_found"


def test_the_connect_timeout_ends_the_stream_and_kills_the_process(client: TestClient, daemon: Daemon,
                                                                   sb: str) -> None:
    """``Connect-Timeout-Ms`` (the SDK's ``commands.run(timeout=...)``): at the deadline the stream
    ends with ``deadline_exceeded`` and a started process is killed, as envd does (issue 20)."""
    started = time.monotonic()
    frames = stream(client, "Start", {"process": {"cmd": "sleep", "args": ["60"]}},
                    headers={"Connect-Timeout-Ms": "300"})
    assert time.monotonic() - started < 5
    assert "start" in frames[0]["message"]["event"]
    assert frames[-1]["end"]["error"]["code"] == "deadline_exceeded", frames
    proc = daemon.run(daemon.runtime.processes.get, sb, frames[0]["message"]["event"]["start"]["pid"])
    assert proc["running"] is False and proc["signal"] == 9
    # Connect (watching a running process) ends the same way, but leaves the process running.
    sleeper = daemon.run(daemon.runtime.processes.start, sb, ["sleep", "60"])["pid"]
    frames = stream(client, "Connect", {"process": {"pid": sleeper}}, headers={"Connect-Timeout-Ms": "200"})
    assert frames[-1]["end"]["error"]["code"] == "deadline_exceeded", frames
    assert daemon.run(daemon.runtime.processes.get, sb, sleeper)["running"] is True
    # No header: no deadline (the echo ends on its own).
    assert stream(client, "Start", {"process": {"cmd": "echo", "args": ["hi"]}})[-1] == {"end": {}}


@pytest.mark.parametrize("ending", ["killed", "powered off"])
def test_a_stream_cut_by_its_sandboxs_end_is_unavailable(client: TestClient, daemon: Daemon, sb: str,
                                                         ending: str) -> None:
    """A sandbox killed mid-command (or whose VM goes away) ends the stream ``unavailable``, worded
    so that the SDK probes the sandbox (not "was not found"), finds it gone and raises
    SandboxNotRunningException (issue 20)."""
    if ending == "killed":
        def kill_once_started() -> None:
            while not daemon.guest_requests(sb, "proc_start"):
                time.sleep(0.01)
            daemon.run(daemon.runtime.kill, sb)

        killer = threading.Thread(target=kill_once_started)
        killer.start()
        frames = stream(client, "Start", {"process": {"cmd": "sleep", "args": ["60"]}})
        killer.join()
    else:  # the scripted guest's "poweroff": the VM's process exits, as QEMU does (-no-reboot)
        frames = stream(client, "Start", {"process": {"cmd": "poweroff"}})
    error = frames[-1]["end"]["error"]
    assert error["code"] == "unavailable" and "was not found" not in error["message"], frames


def test_terminals_stream_pty_output_take_input_and_resize(client: TestClient, daemon: Daemon,
                                                           sb: str) -> None:
    """``pty.create``: Start with a size runs the process on a terminal (stdin kept open) and its
    output is ``pty`` data; pty input is typed into it; ``Update`` resizes it (``pty.resize``)."""
    frames = stream(client, "Start", {"process": {"cmd": "echo", "args": ["hi"]},
                                      "pty": {"size": {"cols": 80, "rows": 24}}})
    events = [f["message"]["event"] for f in frames if "message" in f]
    assert base64.b64decode(events[1]["data"]["pty"]) == b"hi\n" and "stdout" not in events[1]["data"]
    call = started(daemon, sb)
    assert call["pty"] == {"cols": 80, "rows": 24} and call["stdin"] is True
    shell = daemon.run(daemon.runtime.processes.run, sb, ["cat"], stdin_open=True, pty=(80, 24),
                       kill_on_close=False)
    pid = daemon.run(shell.__anext__).pid  # its start event
    typed = {"process": {"pid": pid}, "input": {"pty": base64.b64encode(b"ls\n").decode()}}
    assert unary(client, "SendInput", typed).status_code == 200
    assert [base64.b64decode(w["data"]) for w in daemon.guest_requests(sb, "proc_input")] == [b"ls\n"]
    resized = unary(client, "Update", {"process": {"pid": pid}, "pty": {"size": {"cols": 100, "rows": 30}}})
    assert resized.status_code == 200, resized.text
    assert daemon.run(daemon.runtime.processes.get, sb, pid)["pty"] == {"cols": 100, "rows": 30}
    # Refusals, in Connect's codes: no size, a size out of bounds, a process without a terminal.
    assert unary(client, "Update", {"process": {"pid": pid}}).json()["code"] == "invalid_argument"
    huge = unary(client, "Update", {"process": {"pid": pid}, "pty": {"size": {"cols": 100000, "rows": 1}}})
    assert huge.json()["code"] == "invalid_argument" and "cols" in huge.json()["message"]
    sleeper = daemon.run(daemon.runtime.processes.start, sb, ["sleep", "60"])["pid"]
    plain = unary(client, "Update", {"process": {"pid": sleeper}, "pty": {"size": {"cols": 9, "rows": 9}}})
    assert plain.json()["code"] == "already_exists", plain.text  # forkd's 409, as the layer maps it
    assert "not started on a terminal" in plain.json()["message"]
    payload = json.dumps({"process": {"cmd": "sh"}, "pty": {}}).encode()
    resp = client.post("/process.Process/Start", content=struct.pack(">BI", 0, len(payload)) + payload,
                       headers={**HEADERS, "Content-Type": "application/connect+json"})
    assert b"invalid_argument" in resp.content and b"pty.size" in resp.content


def test_event_mapping_and_keepalive(monkeypatch: pytest.MonkeyPatch) -> None:
    assert process_mod.event(ProcessEvent("dropped", 7, dropped=10)) is None
    killed = process_mod.event(ProcessEvent("exit", 7, exit_code=-9, signal=9))
    assert killed is not None and killed.event is not None and killed.event.value.status == "signal: 9"
    monkeypatch.setattr(process_mod, "KEEPALIVE_SECS", 0.05)

    class Slow:
        closed = False

        def __init__(self) -> None:
            self.items = [ProcessEvent("start", 7), ProcessEvent("exit", 7, exit_code=0)]

        def __aiter__(self) -> Slow:
            return self

        async def __anext__(self) -> ProcessEvent:
            if not self.items:
                raise StopAsyncIteration
            await asyncio.sleep(0.2 if len(self.items) == 1 else 0)
            return self.items.pop(0)

        async def aclose(self) -> None:
            self.closed = True

    async def collect() -> tuple[list[str], bool]:
        slow = Slow()
        kinds = [e.event.field async for e in process_mod.events_with_keepalive(slow)  # type: ignore[arg-type]
                 if e.event is not None]
        return kinds, slow.closed

    kinds, closed = asyncio.run(collect())
    assert kinds[0] == "start" and kinds[-1] == "end" and "keepalive" in kinds and closed
