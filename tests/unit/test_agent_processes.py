"""Unit tests of the agent's processes, eval cancel and bounds, over pipes (``--stdio``) and directly.

The process tests run the agent as the guest does (see test_agent.py); the
module tests drive ``Processes``, ``Ring`` and ``Channel`` directly, with
protocol bounds lowered where a real-size run would be slow.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from forkd.guest import protocol
from forkd.guest.agent.channel import Channel
from forkd.guest.agent.hostwait import HostWait
from forkd.guest.agent.processes import Processes
from forkd.guest.agent.reaper import Reaper
from forkd.guest.agent.ring import Ring
from forkd.guest.agent.spawn import ProcessSpec
from forkd.guest.protocol import RequestError
from forkd.image import rootfs
from tests.unit.test_agent import REPLY_TIMEOUT, AgentProcess, running_agent


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tree with the agent installed as the image builder installs it."""
    root = tmp_path_factory.mktemp("guest-root")
    rootfs.install_agent(root)
    return root


@pytest.fixture
def guest(installed: Path) -> Iterator[AgentProcess]:
    with running_agent(installed) as running:
        yield running


def wait_events(guest: AgentProcess, req_id: Any, predicate: Any,
                timeout: float = REPLY_TIMEOUT) -> list[Any]:
    """The events of ``req_id`` once ``predicate(events)`` holds."""
    deadline = time.monotonic() + timeout
    with guest.cond:
        while not predicate(guest.events.get(req_id, [])):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"events of {req_id}: {guest.events.get(req_id)}")
            guest.cond.wait(remaining)
        return list(guest.events.get(req_id, []))


def has_output(text: bytes, stream: str = "stdout") -> Any:
    def check(events: list[dict[str, Any]]) -> bool:
        return text in b"".join(base64.b64decode(e["data"]) for e in events if e["type"] == stream)
    return check


def output_bytes(events: list[dict[str, Any]]) -> int:
    return sum(len(base64.b64decode(e["data"])) for e in events if e["type"] in ("stdout", "stderr"))


def ack_all(guest: AgentProcess, req_id: Any, acked: int) -> int:
    """Acknowledge what has arrived; returns the new total acknowledged (in window cost)."""
    with guest.cond:
        events = list(guest.events.get(req_id, []))
    cost = sum(protocol.event_cost(len(base64.b64decode(e["data"])) if "data" in e else 0)
               for e in events if e["type"] != "start")
    if cost > acked:
        guest.send_raw(json.dumps({"action": "proc_ack", "stream": req_id, "bytes": cost - acked}).encode()
                       + b"\n")
    return max(cost, acked)


# ------------------------------------------------------------ streamed start


def test_a_streamed_process_delivers_output_before_it_ends(guest: AgentProcess) -> None:
    req = guest.send("proc_start", args=["sh", "-c", "echo one; sleep 1.5; echo two"], stream=True, tag="t")
    events = wait_events(guest, req, has_output(b"one\n"))
    assert events[0]["type"] == "start" and isinstance(events[0]["pid"], int)
    assert not guest.replies.get(req), "the exit came before the first line was delivered"
    reply = guest.wait(req)
    assert reply["result"] == {"type": "exit", "pid": events[0]["pid"], "exit_code": 0, "signal": None,
                               "timed_out": False, "error": None}
    assert has_output(b"one\ntwo\n")(guest.events[req])


def test_stdin_reaches_the_process_and_eof_ends_it(guest: AgentProcess) -> None:
    req = guest.send("proc_start", args=["cat"], stdin=True, stream=True)
    pid = wait_events(guest, req, lambda ev: bool(ev))[0]["pid"]
    written = guest.result("proc_input", pid=pid, data=base64.b64encode(b"hello\n").decode())
    assert written == {"written": 6}
    wait_events(guest, req, has_output(b"hello\n"))
    assert guest.result("proc_info", pid=pid)["stdin_open"] is True
    guest.result("proc_input", pid=pid, data="", eof=True)
    assert guest.wait(req)["result"]["exit_code"] == 0
    refused = guest.request("proc_input", pid=pid, data="eA==")
    assert refused["ok"] is False and refused["kind"] == "conflict"


def test_a_process_on_a_terminal_echoes_input_and_follows_resizes(guest: AgentProcess) -> None:
    """A pty: the shell's stdin, stdout and stderr are the terminal, which echoes what is typed;
    it is the controlling terminal (``tty`` names it, job control works); a resize is seen."""
    req = guest.send("proc_start", args=["sh", "-i"], pty={"cols": 80, "rows": 24}, stream=True,
                     env={"PS1": "$ "})
    pid = wait_events(guest, req, lambda ev: bool(ev))[0]["pid"]
    info = guest.result("proc_info", pid=pid)
    assert info["pty"] == {"cols": 80, "rows": 24} and info["stdin_open"] is True

    def typed(line: bytes) -> None:
        guest.result("proc_input", pid=pid, data=base64.b64encode(line).decode())

    typed(b"stty size; echo err >&2; tty\n")
    wait_events(guest, req, has_output(b"24 80\r\n"))
    wait_events(guest, req, has_output(b"err\r\n"))  # stderr is the terminal too
    wait_events(guest, req, has_output(b"/dev/pts/"))
    assert has_output(b"stty size; echo err >&2; tty")(guest.events[req])  # the echo of the input
    assert guest.result("proc_resize", pid=pid, cols=120, rows=40) == {"resized": True}
    assert guest.result("proc_info", pid=pid)["pty"] == {"cols": 120, "rows": 40}
    typed(b"stty size\n")
    wait_events(guest, req, has_output(b"40 120\r\n"))
    for bad in ({"cols": 0, "rows": 24}, {"cols": 80, "rows": protocol.PTY_MAX_SIZE + 1}, {"cols": "80"}):
        refused = guest.request("proc_resize", pid=pid, **bad)
        assert refused["ok"] is False and refused["kind"] == "invalid", refused
    typed(b"exit 3\n")
    assert guest.wait(req)["result"]["exit_code"] == 3
    gone = guest.request("proc_resize", pid=pid, cols=10, rows=10)
    assert gone["ok"] is False and gone["kind"] == "not_found"
    plain = guest.result("proc_start", args=["sleep", "30"])
    not_a_tty = guest.request("proc_resize", pid=plain["pid"], cols=10, rows=10)
    assert not_a_tty["ok"] is False and not_a_tty["kind"] == "conflict" and plain["pty"] is None
    guest.result("proc_signal", pid=plain["pid"], signal=9, group=True, wait_ms=5000)


def test_a_timeout_kills_the_group(guest: AgentProcess) -> None:
    req = guest.send("proc_start", args=["sh", "-c", "sleep 30 & sleep 30"], stream=True, timeout_secs=0.5)
    result = guest.wait(req)["result"]
    assert result["timed_out"] is True and result["exit_code"] == 124
    assert result["error"] == "timed out after 0.5s; process group killed"


# --------------------------------------------------------- background ones


def test_attach_replays_earlier_output_and_kill_removes_it(guest: AgentProcess) -> None:
    info = guest.result("proc_start", args=["sh", "-c", "echo early; echo warn >&2; sleep 60"], tag="bg")
    pid = info["pid"]
    assert info["running"] is True and info["tag"] == "bg" and info["stdin_open"] is False
    assert [p["pid"] for p in guest.result("proc_list")["processes"]] == [pid]
    time.sleep(0.5)  # the output is in the ring before anyone watches
    watch = guest.send("proc_attach", pid=pid, from_start=True)
    events = wait_events(guest, watch,
                         lambda ev: has_output(b"early\n")(ev) and has_output(b"warn\n", "stderr")(ev))
    assert events[0] == {"type": "start", "pid": pid}
    now = guest.send("proc_attach", pid=pid, from_start=False)
    assert wait_events(guest, now, lambda ev: bool(ev)) == [{"type": "start", "pid": pid}]

    killed = guest.result("proc_signal", pid=pid, signal=9, group=True, wait_ms=5000)
    assert killed == {"signalled": True, "ended": True}
    for stream in (watch, now):
        end = guest.wait(stream)["result"]
        assert end["exit_code"] == -9 and end["signal"] == 9
    assert guest.result("proc_list")["processes"] == []  # gone once the kill answered
    ended = guest.result("proc_info", pid=pid)  # kept a while for its exit code
    assert ended["running"] is False and ended["exit_code"] == -9
    gone = guest.request("proc_signal", pid=pid, signal=15)
    assert gone["ok"] is False and gone["kind"] == "not_found"
    missing = guest.request("proc_info", pid=1 << 30)
    assert missing["ok"] is False and missing["kind"] == "not_found"


def test_a_missing_executable_is_a_bad_request(guest: AgentProcess) -> None:
    reply = guest.request("proc_start", args=["/no/such/binary"])
    assert reply["ok"] is False and reply["kind"] == "invalid"
    assert "executable not found: /no/such/binary" in reply["error"]


# ------------------------------------------------------------- flow control


def test_a_stream_sends_a_window_then_waits_for_acknowledgements(guest: AgentProcess) -> None:
    total = 3 * protocol.PROCESS_RING_BYTES  # more than the ring: the process must be held back
    req = guest.send("proc_start", args=["head", "-c", str(total), "/dev/zero"], stream=True)
    pid = wait_events(guest, req, lambda ev: bool(ev))[0]["pid"]
    time.sleep(1.0)
    with guest.cond:
        sent = output_bytes(guest.events[req])
    assert 0 < sent <= protocol.STREAM_WINDOW
    assert guest.result("proc_info", pid=pid)["running"] is True  # held back, not dropped
    acked = 0
    deadline = time.monotonic() + REPLY_TIMEOUT
    while not guest.replies.get(req):
        assert time.monotonic() < deadline, "the stream did not finish with acknowledgements"
        acked = ack_all(guest, req, acked)
        time.sleep(0.02)
    events = guest.events[req]
    assert output_bytes(events) == total and not [e for e in events if e["type"] == "dropped"]
    assert guest.wait(req)["result"]["exit_code"] == 0


def test_a_late_watcher_is_told_what_the_ring_lost(guest: AgentProcess) -> None:
    total = 3 * protocol.PROCESS_RING_BYTES
    pid = guest.result("proc_start", args=["head", "-c", str(total), "/dev/zero"])["pid"]
    deadline = time.monotonic() + REPLY_TIMEOUT
    while guest.result("proc_info", pid=pid)["running"]:  # nobody watches: it is never held back
        assert time.monotonic() < deadline
        time.sleep(0.05)
    req = guest.send("proc_attach", pid=pid)
    acked = 0
    while not guest.replies.get(req):
        assert time.monotonic() < deadline + REPLY_TIMEOUT
        acked = ack_all(guest, req, acked)
        time.sleep(0.02)
    events = guest.events[req]
    dropped = [e["bytes"] for e in events if e["type"] == "dropped"]
    assert dropped and dropped[0] + output_bytes(events) == total
    assert output_bytes(events) <= protocol.PROCESS_RING_BYTES + protocol.OUTPUT_CHUNK


def test_exec_output_goes_ahead_as_events_within_its_cap(guest: AgentProcess) -> None:
    req = guest.send("exec", args=["sh", "-c", "head -c 100000 /dev/zero; echo oops >&2"],
                     max_output_bytes=10)
    result = guest.wait(req)["result"]
    events = guest.events[req]
    assert output_bytes([e for e in events if e["type"] == "stdout"]) == 10
    assert result["stdout_bytes"] == 100000 and result["stdout_truncated"] is True
    assert result["stderr_bytes"] == 5 and result["stderr_truncated"] is False


# --------------------------------------------------------------- eval cancel


def test_eval_cancel_interrupts_the_running_eval(guest: AgentProcess) -> None:
    assert guest.result("eval_cancel") == {"cancelled": False}
    req = guest.send("eval", code="n = 0\nwhile True:\n    n += 1", timeout_secs=60)
    time.sleep(0.3)
    assert guest.result("eval_cancel") == {"cancelled": True}
    assert guest.wait(req)["result"] == {"result": None, "error": "CancelledError: eval cancelled",
                                         "exit_code": 1}
    started = time.monotonic()
    assert int(guest.result("eval", code="n")["result"]) > 0
    assert time.monotonic() - started < 2


def test_no_thread_per_request(guest: AgentProcess) -> None:
    """Threads are started once and kept: a burst of requests adds none (idle ones block)."""
    for _ in range(3):  # warm up: the worker, the evaluator, the process I/O thread
        guest.result("exec", args=["true"])
        guest.result("eval", code="1")
    before = len(os.listdir(f"/proc/{guest.proc.pid}/task"))
    for _ in range(30):
        guest.result("ping")
        guest.result("eval", code="1 + 1")
        guest.result("exec", args=["true"])
    assert len(os.listdir(f"/proc/{guest.proc.pid}/task")) == before


# ----------------------------------------------------------------- modules


def test_ring_keeps_the_newest_and_never_what_a_lossless_watch_needs() -> None:
    ring = Ring(limit=10)
    ring.append("stdout", b"ab")
    ring.append("stdout", b"cd")  # the same stream: one piece
    assert len(ring.pieces) == 1 and ring.end == 4
    ring.append("stderr", b"efgh")
    ring.append("stdout", b"ijkl")
    assert [bytes(p[2]) for p in ring.pieces] == [b"abcd", b"efgh", b"ijkl"] and ring.over()
    ring.evict(keep_from=0)  # a lossless watch at 0 holds everything
    assert ring.start == 0 and ring.over()
    ring.evict(keep_from=ring.end)  # nobody needs the oldest: whole pieces go until under the limit
    assert ring.start == 4 and not ring.over()
    assert ring.read(4, 100) == ("stderr", b"efgh")
    assert ring.read(6, 1) == ("stderr", b"g")
    assert ring.read(ring.end, 100) is None


class Recorder(Channel):
    """A channel that keeps the messages instead of writing them."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[dict[str, Any]] = []
        self.cond = threading.Condition()

    def _write(self, data: bytes) -> None:
        with self.cond:
            self.messages.append(json.loads(data))
            self.cond.notify_all()

    def wait_for(self, predicate: Any, timeout: float = REPLY_TIMEOUT) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: predicate(self.messages), timeout), self.messages


def test_the_number_of_processes_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protocol, "MAX_PROCESSES", 2)
    table = Processes(Reaper(), Recorder())
    pids = [table.start(None, ProcessSpec(args=["sleep", "30"]), stream=False)["pid"] for _ in range(2)]
    try:
        with pytest.raises(RequestError, match="already runs 2 processes") as refused:
            table.start(None, ProcessSpec(args=["sleep", "30"]), stream=False)
        assert refused.value.kind == "conflict"
    finally:
        for pid in pids:
            table.send_signal(pid, 9, group=True)


def test_detach_all_releases_a_held_back_process() -> None:
    """The host that watched went away (or this guest is a restored copy): the process runs on."""
    channel = Recorder()
    table = Processes(Reaper(), channel)
    total = 3 * protocol.PROCESS_RING_BYTES
    table.start(7, ProcessSpec(args=["head", "-c", str(total), "/dev/zero"]), stream=True)
    time.sleep(0.5)
    assert len(table.running) == 1  # held back by the lossless watch that reads nothing
    channel.opened(7)
    table.detach_all()
    deadline = time.monotonic() + REPLY_TIMEOUT
    while table.running:
        assert time.monotonic() < deadline, "the process stayed held back"
        time.sleep(0.05)
    assert not any(m.get("ok") is not None and m["id"] == 7 for m in channel.messages)  # nobody to answer


def test_the_channel_never_sends_a_line_over_its_limit(tmp_path: Path) -> None:
    read_fd, write_fd = os.pipe()
    channel = Channel(max_line=1000)
    channel.out_fd = write_fd
    channel.reply(5, {"result": "x" * 5000})
    channel.reply(6, {"result": "fits"})
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as f:
        lines = [json.loads(line) for line in f]
    assert lines[0] == {"id": 5, "ok": False, "error": "the reply is larger than the agent's 1000-byte limit"}
    assert lines[1] == {"id": 6, "ok": True, "result": {"result": "fits"}}


def test_host_wait_tells_a_gone_host_from_a_quiet_one() -> None:
    """POLLHUP means no host (a read would return at once); a quiet host is not 'gone'."""
    agent_end, host_end = socket.socketpair()
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK)
    try:
        waiter = HostWait(agent_end.fileno(), wake_r)
        assert waiter._host_gone() is False  # connected, nothing to read: the read would block
        host_end.close()
        assert waiter._host_gone() is True
    finally:
        agent_end.close()
        os.close(wake_r)
        os.close(wake_w)
