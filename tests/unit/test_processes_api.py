"""Processes through the real FastAPI app and Runtime (no VM): REST, SDK (both twins) and CLI.

The scripted guest's processes (tests/fakes/guest.py) play ``echo``, ``cat``,
``err``, ``sleep`` and ``bytes`` (invalid UTF-8 and a character split between
chunks), so what these tests pin is the daemon's and the clients' side: NDJSON
framing, text and base64 encodings, errors, and how each client surfaces them.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from forkd.cli import context
from forkd.cli.main import app as cli_app
from forkd.sdk import AsyncController, AsyncSandbox, BadRequest, ConflictError, Controller, Sandbox
from forkd.sdk._guest_calls import signal_name
from forkd.sdk.types import OutputChunk
from tests.fakes.app import AUTH, TOKEN, Daemon, daemon_app
from tests.fakes.transport import ViaTestClient


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with daemon_app(tmp_path, headers=AUTH) as d:
        yield d


@pytest.fixture
def sb_id(daemon: Daemon) -> str:
    return daemon.sandbox("py").id


@pytest.fixture
def http(daemon: Daemon) -> TestClient:
    return daemon.client


@pytest.fixture
def controller(http: TestClient) -> Controller:
    return Controller(url="http://forkd.test", token=TOKEN, transport=ViaTestClient(http))


def lines(body: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in body.splitlines()]


# ------------------------------------------------------------------ REST


def test_exec_stream_is_ndjson_start_output_exit(sb_id: str, http: TestClient, daemon: Daemon) -> None:
    r = http.post(f"/v1/sandboxes/{sb_id}/exec/stream", json={"args": ["echo", "hi"], "tag": "t"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
    events = lines(r.text)
    pid = events[0]["pid"]
    assert events == [{"type": "start", "pid": pid}, {"type": "stdout", "data": "hi\n"},
                      {"type": "exit", "pid": pid, "exit_code": 0, "signal": None, "timed_out": False,
                       "error": None}]
    assert daemon.guest_requests(sb_id, "proc_start")[-1]["tag"] == "t"


def test_text_output_joins_split_characters_and_base64_is_exact(sb_id: str, http: TestClient) -> None:
    text = lines(http.post(f"/v1/sandboxes/{sb_id}/exec/stream", json={"args": ["bytes"]}).text)
    assert "".join(e["data"] for e in text if e["type"] == "stdout") == "\ufffd\ufffd café\n"
    raw = lines(http.post(f"/v1/sandboxes/{sb_id}/exec/stream",
                          json={"args": ["bytes"], "encoding": "base64"}).text)
    data = b"".join(base64.b64decode(e["data"]) for e in raw if e["type"] == "stdout")
    assert data == b"\xff\xfe caf\xc3\xa9\n"


def test_errors_before_the_stream_are_http_errors(sb_id: str, http: TestClient) -> None:
    r = http.post(f"/v1/sandboxes/{sb_id}/exec/stream", json={"args": ["missing"]})
    assert r.status_code == 400 and r.json() == {"error": "executable not found: missing"}
    r = http.post("/v1/sandboxes/sb-abcdef-0009/exec/stream", json={"args": ["echo"]})
    assert r.status_code == 404
    r = http.post(f"/v1/sandboxes/{sb_id}/exec/stream", json={"args": []})
    assert r.status_code == 400
    r = http.get(f"/v1/sandboxes/{sb_id}/processes/999/stream")
    assert r.status_code == 404


def test_background_process_lifecycle(sb_id: str, http: TestClient) -> None:
    r = http.post(f"/v1/sandboxes/{sb_id}/processes", json={"args": ["cat"], "stdin_open": True, "tag": "c"})
    assert r.status_code == 201
    info = r.json()
    pid = info["pid"]
    assert info["running"] is True and info["stdin_open"] is True and info["tag"] == "c"
    assert [p["pid"] for p in http.get(f"/v1/sandboxes/{sb_id}/processes").json()] == [pid]
    assert http.get(f"/v1/sandboxes/{sb_id}/processes/{pid}").json()["args"] == ["cat"]

    r = http.post(f"/v1/sandboxes/{sb_id}/processes/{pid}/stdin", json={"data": "hello\n"})
    assert r.json() == {"pid": pid, "written": 6, "stdin_open": True}
    r = http.post(f"/v1/sandboxes/{sb_id}/processes/{pid}/stdin",
                  json={"data": base64.b64encode(b"\x00\x01").decode(), "encoding": "base64"})
    assert r.json()["written"] == 2
    bad = http.post(f"/v1/sandboxes/{sb_id}/processes/{pid}/stdin",
                    json={"data": "***", "encoding": "base64"})
    assert bad.status_code == 400 and "base64" in bad.json()["error"]

    assert http.delete(f"/v1/sandboxes/{sb_id}/processes/{pid}").status_code == 204
    assert http.get(f"/v1/sandboxes/{sb_id}/processes").json() == []
    assert http.delete(f"/v1/sandboxes/{sb_id}/processes/{pid}").status_code == 404
    ended = lines(http.get(f"/v1/sandboxes/{sb_id}/processes/{pid}/stream").text)
    assert [e["type"] for e in ended] == ["start", "stdout", "stdout", "exit"]  # what it wrote, then its end
    assert ended[-1]["exit_code"] == -9 and ended[-1]["signal"] == 9
    closed = http.post(f"/v1/sandboxes/{sb_id}/processes/{pid}/stdin", json={"data": "late"})
    assert closed.status_code == 409


def test_signals_by_name_only(sb_id: str, http: TestClient, daemon: Daemon) -> None:
    pid = http.post(f"/v1/sandboxes/{sb_id}/processes", json={"args": ["sleep"]}).json()["pid"]
    url = f"/v1/sandboxes/{sb_id}/processes/{pid}/signal"
    assert http.post(url, json={"signal": "SIGFOO"}).status_code == 400
    assert http.post(url, json={"signal": 15}).status_code == 400
    r = http.post(f"/v1/sandboxes/{sb_id}/processes/{pid}/signal", json={"signal": "SIGTERM", "group": False})
    assert r.json() == {"pid": pid, "signal": 15, "signalled": True}
    assert daemon.guest_requests(sb_id, "proc_signal")[-1]["group"] is False
    zero = http.post(f"/v1/sandboxes/{sb_id}/processes/0/signal", json={"signal": "SIGTERM"})
    assert zero.status_code == 400


def test_eval_timeout_and_cancel(sb_id: str, http: TestClient, daemon: Daemon) -> None:
    r = http.post(f"/v1/sandboxes/{sb_id}/eval", json={"code": "1+1", "timeout_secs": 2})
    assert r.json()["result"] == "2"
    assert http.post(f"/v1/sandboxes/{sb_id}/eval", json={"code": "1", "timeout_secs": 0}).status_code == 400
    assert http.post(f"/v1/sandboxes/{sb_id}/eval/cancel").json() == {"cancelled": False}
    assert len(daemon.guest_requests(sb_id, "eval_cancel")) == 1


# ------------------------------------------------------------------- SDK


def test_sdk_streams_calls_back_and_returns_the_result(sb_id: str, controller: Controller) -> None:
    sb = Sandbox(sandbox_id=sb_id, controller=controller)
    seen: list[str] = []
    result = sb.commands.run(["echo", "streamed"], on_stdout=seen.append)
    assert seen == ["streamed\n"] and result.stdout == "streamed\n" and result.exit_code == 0
    errors: list[str] = []
    failed = sb.commands.run(["err", "bad"], on_stderr=errors.append, timeout=None)
    assert errors == ["bad\n"] and failed.exit_code == 1 and not failed.ok
    events = list(controller.exec_stream(sb_id, ["echo", "x"]))
    assert [e["type"] for e in events] == ["start", "stdout", "exit"]


def test_sdk_background_handle(sb_id: str, controller: Controller) -> None:
    sb = Sandbox(sandbox_id=sb_id, controller=controller)
    handle = sb.commands.run(["cat"], background=True, stdin_open=True, tag="c")
    assert [p["pid"] for p in sb.commands.list()] == [handle.pid]
    handle.send_stdin("one\n")
    handle.send_stdin(b"two\n")
    handle.close_stdin()
    result = handle.wait()
    assert result.stdout == "one\ntwo\n" and result.exit_code == 0
    chunks = list(handle)  # iterating again replays what the guest kept
    assert chunks == [OutputChunk(stdout="one\n"), OutputChunk(stdout="two\n")]
    out, err, pty = chunks[0]
    assert (out, err, pty) == ("one\n", None, None)

    sleeper = sb.commands.run(["sleep", "100"], background=True)
    assert sb.commands.kill(sleeper.pid) is True
    assert sb.commands.kill(sleeper.pid) is False  # no longer running
    assert sleeper.wait().exit_code == -9
    again = sb.commands.connect(handle.pid)
    assert again.wait().stdout == "one\ntwo\n"


def test_sdk_errors_and_eval_cancel(sb_id: str, controller: Controller) -> None:
    sb = Sandbox(sandbox_id=sb_id, controller=controller)
    with pytest.raises(BadRequest, match="executable not found"):
        sb.commands.run(["missing"], on_stdout=print)
    pid = sb.commands.run(["sleep"], background=True).pid
    with pytest.raises(ConflictError, match="no open stdin"):
        sb.commands.send_stdin(pid, "x")
    assert sb.cancel_eval() is False
    assert signal_name(15) == "SIGTERM" and signal_name("int") == "SIGINT"
    assert signal_name("SIGKILL") == "SIGKILL"


def test_async_sdk_with_async_callbacks(sb_id: str, http: TestClient) -> None:
    async def scenario() -> None:
        async with AsyncController(url="http://forkd.test", token=TOKEN,
                                   transport=AsyncVia(http)) as controller:
            sb = AsyncSandbox(sandbox_id=sb_id, controller=controller)
            seen: list[str] = []

            async def collect(text: str) -> None:
                seen.append(text)

            result = await sb.commands.run(["echo", "async"], on_stdout=collect)
            assert seen == ["async\n"] and result.exit_code == 0
            handle = await sb.commands.run(["echo", "bg"], background=True)
            assert [chunk.stdout async for chunk in handle] == ["bg\n"]
            assert (await handle.wait()).stdout == "bg\n"

    asyncio.run(scenario())


class AsyncVia:
    """The async flavour of ViaTestClient (the TestClient call runs in a thread)."""

    def __init__(self, client: TestClient) -> None:
        self.sync = ViaTestClient(client)

    async def handle_async_request(self, request: Any) -> Any:
        await request.aread()
        return await asyncio.to_thread(self.sync.handle_request, request)

    async def aclose(self) -> None:
        return None


# ------------------------------------------------------------------- CLI


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, controller: Controller) -> CliRunner:
    monkeypatch.setattr(context, "make_controller", lambda *args, **kwargs: controller)
    return CliRunner()


def test_cli_exec_stream_detach_ps_attach_kill(sb_id: str, cli: CliRunner) -> None:
    streamed = cli.invoke(cli_app, ["exec", sb_id, "--stream", "--", "err", "oops"])
    assert streamed.exit_code == 1 and streamed.stderr == "oops\n"
    as_json = cli.invoke(cli_app, ["exec", sb_id, "--stream", "--json", "--", "echo", "x"])
    assert [json.loads(line)["type"] for line in as_json.stdout.splitlines()] == ["start", "stdout", "exit"]

    started = cli.invoke(cli_app, ["exec", sb_id, "--detach", "--tag", "srv", "--json", "--", "sleep", "9"])
    pid = json.loads(started.stdout)["pid"]
    listed = cli.invoke(cli_app, ["ps", sb_id])
    assert str(pid) in listed.stdout and "srv" in listed.stdout and "sleep 9" in listed.stdout
    killed = cli.invoke(cli_app, ["kill-proc", sb_id, str(pid), "--signal", "TERM"])
    assert killed.exit_code == 0 and "sent signal 15" in killed.stdout
    watched = cli.invoke(cli_app, ["attach", sb_id, str(pid)])
    assert watched.exit_code == 128 + 15 and "killed by signal 15" in watched.stderr
    assert "no processes running" in cli.invoke(cli_app, ["ps", sb_id]).stdout
    assert "no eval was running" in cli.invoke(cli_app, ["cancel-eval", sb_id]).stdout


def test_cli_send_stdin_and_flag_checks(sb_id: str, cli: CliRunner) -> None:
    pid = json.loads(cli.invoke(cli_app, ["exec", sb_id, "-d", "--json", "--", "cat"]).stdout)["pid"]
    refused = cli.invoke(cli_app, ["send-stdin", sb_id, str(pid), "x"])
    assert refused.exit_code == 1 and "no open stdin" in refused.stderr
    assert "exclude each other" in cli.invoke(cli_app, ["exec", sb_id, "--stream", "-d", "--", "x"]).stderr
    assert "--interactive needs --stream" in cli.invoke(cli_app, ["exec", sb_id, "-i", "--", "x"]).stderr
    assert "--tag needs" in cli.invoke(cli_app, ["exec", sb_id, "--tag", "t", "--", "x"]).stderr
