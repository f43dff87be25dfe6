"""Cells on kernels without a VM: the agent's relay (``guest.agent.kernels``) driven with a fake
runner, the host's checks of what the guest sends (``controller.kernel_cells``), the window
accounting of a kernel stream (``guest.client``), the E2B mapping, and the route's NDJSON."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from forkd.api.e2b.interpreter import kernel_line
from forkd.controller.kernel_cells import cell_event
from forkd.errors import GuestError
from forkd.guest import protocol
from forkd.guest.agent import kernels as agent_kernels
from forkd.guest.agent.channel import Channel
from forkd.guest.agent.reaper import Reaper
from forkd.guest.client import AgentStream
from forkd.guest.protocol import RequestError

# "N SIZE" prints N lines of SIZE characters and ends; "hang" never ends until interrupted.
FAKE_RUNNER = """
import json, os, sys
hanging = None
for line in sys.stdin:
    req = json.loads(line)
    if req["op"] == "interrupt":
        open(os.environ["INTERRUPTED"], "a").write(req["context"] + "\\n")
        if hanging is not None:
            print(json.dumps({"id": hanging, "type": "end", "execution_count": 1}), flush=True)
            hanging = None
    elif req["op"] == "run" and req["code"] == "hang":
        hanging = req["id"]
    elif req["op"] == "run":
        n, size = map(int, req["code"].split())
        for _ in range(n):
            print(json.dumps({"id": req["id"], "type": "stdout", "text": "x" * size}), flush=True)
        print(json.dumps({"id": req["id"], "type": "end", "execution_count": 1}), flush=True)
"""


class Host:
    """The host's end of the channel: every line the agent writes, parsed, by request id."""

    def __init__(self, fd: int) -> None:
        self.lines: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, args=(fd,), daemon=True).start()

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as f:
            for raw in f:
                with self.cond:
                    self.lines.append(json.loads(raw))
                    self.cond.notify_all()

    def of(self, req_id: int) -> list[dict[str, Any]]:
        with self.cond:
            return [m for m in self.lines if m.get("id") == req_id]

    def wait(self, req_id: int, done: Any, timeout: float = 10.0) -> list[dict[str, Any]]:
        with self.cond:
            assert self.cond.wait_for(lambda: done(self.of(req_id)), timeout), self.of(req_id)
            return self.of(req_id)


@pytest.fixture
def relay(tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[agent_kernels.Kernels, Host, Path]]:
    runner = tmp_path / "runner.py"
    runner.write_text(FAKE_RUNNER)
    interrupted = tmp_path / "interrupted"
    monkeypatch.setattr(agent_kernels, "RUNNER", str(runner))
    monkeypatch.setattr(agent_kernels, "RUNNER_LOG", str(tmp_path / "runner.log"))
    monkeypatch.setenv("INTERRUPTED", str(interrupted))
    read_fd, write_fd = os.pipe()
    channel = Channel()
    channel.out_fd = write_fd
    kernels = agent_kernels.Kernels(channel, Reaper())
    kernels._available = True
    yield kernels, Host(read_fd), interrupted
    if kernels.proc is not None:
        kernels.proc.kill()
        kernels.proc.wait()
    os.close(write_fd)


def run(kernels: agent_kernels.Kernels, req_id: int, code: str, **fields: Any) -> None:
    kernels.channel.opened(req_id)
    req = {"id": req_id, "action": protocol.KERNEL, "op": "run", "code": code, **fields}
    assert kernels.handle(req) is None


def ended(messages: list[dict[str, Any]]) -> bool:
    return any("ok" in m for m in messages)


def test_a_cell_streams_its_events_then_its_end(relay: Any) -> None:
    kernels, host, _ = relay
    run(kernels, 1, "3 5")
    messages = host.wait(1, ended)
    assert [m["event"] for m in messages[:-1]] == [{"type": "stdout", "text": "xxxxx"}] * 3
    assert messages[-1] == {"id": 1, "ok": True, "result": {"type": "end", "execution_count": 1}}


def test_the_window_holds_the_runner_back_until_the_host_acknowledges(relay: Any) -> None:
    kernels, host, _ = relay
    size = 64 << 10
    run(kernels, 2, f"12 {size}")  # 12 events of ~64 KiB: three fit in the 256 KiB window
    host.wait(2, lambda m: len(m) >= 3)
    time.sleep(0.5)
    held = host.of(2)
    assert len(held) == 3 and not ended(held), len(held)
    cost = protocol.line_cost(len(protocol.encode(held[0])) - 1)
    assert sum(protocol.line_cost(len(protocol.encode(m)) - 1) for m in held) <= protocol.STREAM_WINDOW
    acked = 0
    while not ended(host.of(2)):  # as the host does: acknowledge what it consumed
        now = len(host.wait(2, lambda m, n=acked: len(m) > n))
        kernels.ack(2, cost * (now - acked))
        acked = now
    assert len(host.of(2)) == 13


def test_a_host_that_stops_watching_interrupts_the_cell(relay: Any) -> None:
    kernels, host, interrupted = relay
    run(kernels, 3, "hang", context="ctx-1")
    deadline = time.monotonic() + 10
    while kernels.proc is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kernels.owns(3)
    assert kernels.detach(3) == {"detached": True}
    deadline = time.monotonic() + 10
    while not interrupted.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert interrupted.read_text() == "ctx-1\n"
    time.sleep(0.3)
    assert host.of(3) == []  # its end went nowhere: nobody watches it any more
    run(kernels, 4, "1 1")  # the runner serves the next cell at once
    assert ended(host.wait(4, ended))


def test_bad_requests_and_an_image_without_a_kernel(relay: Any) -> None:
    kernels, _, _ = relay
    with pytest.raises(RequestError, match="context"):
        kernels.handle({"id": 5, "op": "run", "code": "1", "context": "../x"})
    with pytest.raises(RequestError, match="code"):
        kernels.handle({"id": 5, "op": "run", "code": 1})
    kernels._available = False
    with pytest.raises(RequestError, match="no Jupyter kernel") as exc:
        kernels.handle({"id": 5, "op": "run", "code": "1"})
    assert exc.value.kind == protocol.NOT_FOUND
    assert kernels.handle({"op": "available"}) == {"available": False, "running": False, "languages": []}


# ------------------------------------------------------------------ the host's side


def test_cell_events_keep_only_their_documented_shape() -> None:
    assert cell_event({"type": "stdout", "text": "a", "junk": 1}) == {"type": "stdout", "text": "a"}
    assert cell_event({"type": "result", "data": {"text/plain": "1"}, "is_main_result": 1}) == \
        {"type": "result", "data": {"text/plain": "1"}, "is_main_result": False}
    assert cell_event({"type": "end", "execution_count": 3, "timed_out": True})["timed_out"] is True
    for bad in ({"type": "stdout", "text": 5}, {"type": "result", "data": []}, {"type": "nope"},
                {"type": "end", "execution_count": True}, {"type": "error", "name": "E", "value": "v"}):
        with pytest.raises(GuestError):
            cell_event(bad)


class _Client:
    def __init__(self) -> None:
        self.notes: list[tuple[str, dict[str, Any]]] = []

    def notify(self, action: str, **args: Any) -> None:
        self.notes.append((action, args))

    def forget_stream(self, req_id: int) -> bool:
        return True


def test_a_kernel_stream_costs_its_lines_and_gives_the_window_back_once_caught_up() -> None:
    async def go() -> None:
        client = _Client()
        stream = AgentStream(client, 7, protocol.KERNEL, line_cost=True)  # type: ignore[arg-type]
        stream.on_event({"type": "stdout", "text": "hi"}, 100)
        stream.on_event({"type": "result", "data": {}}, protocol.MAX_REPLY_LINE)  # one big result
        assert (await stream.__anext__())["text"] == "hi"
        assert client.notes == []  # not caught up, and less than a quarter window consumed
        await stream.__anext__()
        assert client.notes == [(protocol.PROC_ACK, {"stream": 7, "bytes": protocol.EVENT_COST_MIN
                                                     + protocol.STREAM_WINDOW})]
        stream.on_event({"type": "stdout", "text": "x"}, protocol.STREAM_WINDOW)
        with pytest.raises(GuestError, match="window"):
            stream.on_event({"type": "stdout", "text": "x"}, protocol.STREAM_WINDOW)

    asyncio.run(go())


def test_e2b_results_use_e2b_field_names() -> None:
    (line,) = kernel_line({"type": "result", "is_main_result": True, "data": {
        "text/plain": "'/'", "text/html": "<b>", "image/png": "iVBO", "application/json": {"a": 1},
        "application/x-custom": "c"}})
    assert line == {"type": "result", "is_main_result": True, "text": "/", "html": "<b>", "png": "iVBO",
                    "json": {"a": 1}, "extra": {"application/x-custom": "c"}}
    assert kernel_line({"type": "end", "execution_count": 4, "timed_out": False, "restarted": False}) == \
        [{"type": "number_of_executions", "execution_count": 4}]
    broke = kernel_line({"type": "end", "error": "sandbox died"})
    assert broke == [{"type": "error", "name": "SandboxError", "value": "sandbox died", "traceback": ""}]
    assert kernel_line({"type": "stdout", "text": "a"})[0]["timestamp"] > 0
    chart = {"type": "bar", "title": "t", "elements": [{"label": "a", "group": "g", "value": 3.0}]}
    (shown,) = kernel_line({"type": "result", "is_main_result": False, "data": {
        "image/png": "iVBO", "e2b/chart": chart, "e2b/data": {"a": [1]}}})
    assert shown == {"type": "result", "is_main_result": False, "png": "iVBO", "chart": chart,
                     "data": {"a": [1]}}  # the SDK's Result.chart and Result.data


def test_the_route_streams_ndjson(tmp_path: Path) -> None:
    from tests.fakes.app import AUTH, daemon_app

    with daemon_app(tmp_path, headers=AUTH) as daemon:
        client, sb_id = daemon.client, daemon.sandbox("py").id
        r = client.post(f"/v1/sandboxes/{sb_id}/code", json={"code": "print(1)", "context": "c1"})
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(x) for x in r.text.splitlines()]
        assert lines[0] == {"type": "stdout", "text": "print(1)"} and lines[-1]["type"] == "end"
        bad = client.post(f"/v1/sandboxes/{sb_id}/code", json={"code": "1", "context": "../x"})
        assert bad.status_code == 400, bad.text
