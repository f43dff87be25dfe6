"""forkd's MCP server in process, through the ``mcp`` package's own client, against the fake daemon.

The real daemon with real VMs, over stdio and streamable HTTP, is in
tests/integration/test_ways_in.py; here: the tool list, what each tool sends,
and how errors and large files reach the model.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client

from forkd.mcp.processes import OutputWindow, char_boundary
from forkd.mcp.server import DaemonAddress, build_server
from tests.fakes.daemon import SB, URL, FakeDaemon, sandbox_info, snap_info

EXPECTED_TOOLS = {
    "list_snapshots", "get_snapshot", "create_snapshot", "delete_snapshot", "spawn_sandboxes",
    "list_sandboxes", "kill_sandbox", "exec_command", "eval_python", "read_file", "write_file",
    "list_files", "branch_sandbox", "fork_sandbox", "fork_tree", "promote_sandbox",
    "start_process", "read_process_output", "send_process_input", "list_processes", "kill_process",
    "cancel_eval", "run_code", "get_sandbox_diff", "get_sandbox_patch", "apply_changes",
}


def run(fake: FakeDaemon, scenario: Callable[[Client], Awaitable[Any]]) -> Any:
    server = build_server(DaemonAddress(url=URL, token="t" * 20), transport=httpx.MockTransport(fake))

    async def go() -> Any:
        async with Client(server) as client:
            return await scenario(client)

    return asyncio.run(go())


@pytest.fixture
def fake() -> FakeDaemon:
    return FakeDaemon()


def test_every_tool_is_described_and_structured(fake: FakeDaemon) -> None:
    tools = run(fake, lambda c: c.list_tools()).tools
    assert {t.name for t in tools} == EXPECTED_TOOLS
    for tool in tools:
        assert tool.description and len(tool.description) >= 40, tool.name
        assert tool.output_schema and tool.output_schema["type"] == "object", tool.name
        assert tool.annotations is not None, tool.name
        readonly = tool.name.startswith(("list_", "get_", "read_"))
        assert tool.annotations.read_only_hint is readonly, tool.name
    destructive = {t.name for t in tools if t.annotations and t.annotations.destructive_hint}
    assert destructive == {"delete_snapshot", "kill_sandbox", "promote_sandbox", "kill_process"}
    exec_tool = next(t for t in tools if t.name == "exec_command")
    assert exec_tool.input_schema["required"] == ["sandbox_id", "command"]
    assert "ctx" not in exec_tool.input_schema["properties"]


def test_exec_command_sends_the_rest_body_and_returns_its_answer(fake: FakeDaemon) -> None:
    answer = {"stdout": "hi\n", "stderr": "", "exit_code": 0, "error": None, "timed_out": False}
    fake.on("POST", f"/v1/sandboxes/{SB}/exec", httpx.Response(200, json=answer))
    result = run(fake, lambda c: c.call_tool("exec_command", {"sandbox_id": SB, "command": "echo hi"}))
    assert not result.is_error
    assert result.structured_content["stdout"] == "hi\n"
    assert fake.body() == {"args": ["/bin/sh", "-c", "echo hi"], "timeout_secs": 30}
    assert fake.requests[-1].headers["authorization"] == "Bearer " + "t" * 20


def test_spawn_and_list_wrap_the_lists(fake: FakeDaemon) -> None:
    fake.on("POST", "/v1/sandboxes", httpx.Response(201, json=[sandbox_info(0), sandbox_info(1)]))
    fake.on("GET", "/v1/snapshots", httpx.Response(200, json=[snap_info("py")]))

    async def scenario(c: Client) -> tuple[Any, Any]:
        spawned = await c.call_tool("spawn_sandboxes", {"snapshot_tag": "py", "n": 2, "env": {"A": "1"}})
        listed = await c.call_tool("list_snapshots", {})
        return spawned.structured_content, listed.structured_content

    spawned, listed = run(fake, scenario)
    assert [s["id"] for s in spawned["sandboxes"]] == ["sb-abcdef-0000", "sb-abcdef-0001"]
    assert fake.bodies("POST", "/v1/sandboxes") == [{"snapshot_tag": "py", "n": 2, "env": {"A": "1"}}]
    assert [s["tag"] for s in listed["snapshots"]] == ["py"]


def test_a_daemon_error_is_a_tool_error_with_status_and_message(fake: FakeDaemon) -> None:
    fake.on("DELETE", f"/v1/sandboxes/{SB}",
            httpx.Response(404, json={"error": f"no sandbox {SB!r} is alive"}))
    result = run(fake, lambda c: c.call_tool("kill_sandbox", {"sandbox_id": SB}))
    assert result.is_error
    assert f"forkd daemon answered 404: no sandbox {SB!r} is alive" in result.content[0].text


def test_an_unreachable_daemon_says_so() -> None:
    server = build_server(DaemonAddress(url="http://127.0.0.1:9", token="t" * 20))

    async def go() -> Any:
        async with Client(server) as client:
            return await client.call_tool("list_snapshots", {})

    result = asyncio.run(go())
    assert result.is_error and "not reachable at http://127.0.0.1:9" in result.content[0].text


def test_read_file_is_bounded_and_keeps_characters_whole(fake: FakeDaemon) -> None:
    text = "héllo wörld " * 1000
    data = text.encode()
    fake.on("GET", f"/v1/sandboxes/{SB}/files/stat",
            httpx.Response(200, json={"path": "/f", "name": "f", "type": "file", "size": len(data),
                                      "mode": 420, "mtime": 0}))
    fake.on("GET", f"/v1/sandboxes/{SB}/files", httpx.Response(200, content=data))

    def read(max_bytes: int) -> Callable[[Client], Awaitable[Any]]:
        return lambda c: c.call_tool("read_file", {"sandbox_id": SB, "path": "/f", "max_bytes": max_bytes})

    whole = run(fake, read(len(data))).structured_content
    assert (whole["content"], whole["truncated"], whole["encoding"]) == (text, False, "utf-8")
    cut = run(fake, read(2)).structured_content  # "h" and the first byte of "é"
    assert (cut["content"], cut["returned"], cut["size"], cut["truncated"]) == ("h", 1, len(data), True)


def test_binary_files_travel_as_base64(fake: FakeDaemon) -> None:
    data = bytes([0, 1, 2, 255, 254])
    fake.on("GET", f"/v1/sandboxes/{SB}/files/stat",
            httpx.Response(200, json={"path": "/b", "name": "b", "type": "file", "size": 5,
                                      "mode": 420, "mtime": 0}))
    fake.on("GET", f"/v1/sandboxes/{SB}/files", httpx.Response(200, content=data))
    fake.on("PUT", f"/v1/sandboxes/{SB}/files",
            httpx.Response(200, json={"path": "/b", "name": "b", "type": "file", "size": 5,
                                      "mode": 420, "mtime": 0}))

    async def scenario(c: Client) -> tuple[Any, Any, Any]:
        read = await c.call_tool("read_file", {"sandbox_id": SB, "path": "/b"})
        wrote = await c.call_tool("write_file", {"sandbox_id": SB, "path": "/b",
                                                 "content": base64.b64encode(data).decode(),
                                                 "encoding": "base64"})
        bad = await c.call_tool("write_file", {"sandbox_id": SB, "path": "/b", "content": "%%%",
                                               "encoding": "base64"})
        return read, wrote, bad

    read, wrote, bad = run(fake, scenario)
    assert read.structured_content["encoding"] == "base64"
    assert base64.b64decode(read.structured_content["content"]) == data
    assert not wrote.is_error and fake.requests[-1].content == data
    assert bad.is_error and "not valid base64" in bad.content[0].text


def test_forkd_mcp_refuses_an_open_http_bind_without_a_token() -> None:
    from typer.testing import CliRunner

    from forkd.cli.main import app

    runner = CliRunner()
    open_bind = runner.invoke(app, ["mcp", "--transport", "http", "--bind", "0.0.0.0:8890"])
    assert open_bind.exit_code == 2
    assert "without --token-file" in open_bind.output
    stdio_token = runner.invoke(app, ["mcp", "--token-file", "/nonexistent"])
    assert stdio_token.exit_code == 2
    assert "--transport http only" in stdio_token.output


def test_forkd_mcp_over_http_always_wants_a_bearer_token(tmp_path: Path) -> None:
    """Issue 24 #7: `forkd mcp --transport http` on loopback served anyone (every local user)
    with the daemon's token. Without --token-file it now makes a token of its own (0600 file)."""
    import os
    import socket
    import stat
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "FORKD_URL": "http://127.0.0.1:9", "FORKD_TOKEN": "x" * 40,
           "XDG_RUNTIME_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "forkd.cli", "mcp", "--transport", "http", "--bind",
                             f"127.0.0.1:{port}", "--json"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        assert ready["listening"] and ready["auth"] == "bearer" and ready["token_generated"]
        token_file = Path(ready["token_file"])
        assert token_file.parent == tmp_path and stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert len(token) >= 32
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-03-26", "capabilities": {},
                           "clientInfo": {"name": "t", "version": "1"}}}
        headers = {"Accept": "application/json, text/event-stream"}
        url = ready["url"]
        for auth in ({}, {"Authorization": "Bearer " + "y" * len(token)}, {"Authorization": token}):
            r = httpx.post(url, json=init, headers={**headers, **auth}, timeout=10)
            assert r.status_code == 401, (auth, r.status_code, r.text)
        r = httpx.post(url, json=init, headers={**headers, "Authorization": f"Bearer {token}"}, timeout=10)
        assert r.status_code == 200, r.text
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert not token_file.exists()  # a generated token goes with the server


# ------------------------------------------------------------------ processes

def ndjson(*events: dict[str, Any]) -> httpx.Response:
    body = "".join(json.dumps(e) + "\n" for e in events).encode()
    return httpx.Response(200, content=body, headers={"Content-Type": "application/x-ndjson"})


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def process_info(pid: int, running: bool = True, **extra: Any) -> dict[str, Any]:
    return {"pid": pid, "tag": None, "args": ["/bin/sh", "-c", "x"], "env": {}, "cwd": None,
            "running": running, "exit_code": None, "signal": None, "timed_out": False,
            "stdin_open": False, "started_at": 1.0, "ended_at": None, **extra}


def feed(window: OutputWindow, *events: dict[str, Any]) -> bool:
    done = False
    for event in events:
        done = window.take(event)
        if done:
            break
    return done


def test_an_output_window_counts_offsets_over_both_streams_and_what_was_dropped() -> None:
    events = [{"type": "start", "pid": 7}, {"type": "dropped", "bytes": 10},
              {"type": "stdout", "data": b64(b"abcd")}, {"type": "stderr", "data": b64(b"EF")},
              {"type": "stdout", "data": b64(b"gh")}]
    whole = OutputWindow(offset=0, limit=100)
    assert not feed(whole, *events)
    assert (bytes(whole.out["stdout"]), bytes(whole.out["stderr"])) == (b"abcdgh", b"EF")
    assert (whole.cursor, whole.lost) == (18, 10)
    # From inside the first piece: what came before is skipped, nothing counts as lost.
    later = OutputWindow(offset=12, limit=100)
    feed(later, *events)
    assert (later.text("stdout"), later.text("stderr"), later.cursor, later.lost) == ("cdgh", "EF", 18, 0)
    # Cut at the limit: `more`, and the next read starts right after what was returned.
    cut = OutputWindow(offset=0, limit=5)
    assert feed(cut, *events)
    assert (cut.text("stdout"), cut.text("stderr"), cut.more, cut.cursor) == ("abcd", "E", True, 15)
    rest = OutputWindow(offset=cut.cursor, limit=100)
    feed(rest, *events)
    assert (rest.text("stdout"), rest.text("stderr"), rest.lost) == ("gh", "F", 0)
    assert feed(OutputWindow(offset=0, limit=100), {"type": "exit", "exit_code": 0})
    # Exactly full: the read is complete (whether more follows is not known yet).
    full = OutputWindow(offset=0, limit=4)
    assert feed(full, *events)
    assert (full.text("stdout"), full.more) == ("abcd", False)


def test_an_output_window_never_splits_a_character() -> None:
    data = "aé€".encode()  # 1 + 2 + 3 bytes
    assert [char_boundary(data, n) for n in range(7)] == [0, 1, 1, 3, 3, 3, 6]
    window = OutputWindow(offset=0, limit=4)
    assert feed(window, {"type": "stdout", "data": b64(data)})
    assert (window.text("stdout"), window.cursor) == ("aé", 3)
    # A limit smaller than the first character still makes progress (its bytes, replaced).
    tiny = OutputWindow(offset=1, limit=1)
    feed(tiny, {"type": "stdout", "data": b64(data)})
    assert (tiny.cursor, tiny.more) == (2, True)


def test_start_process_starts_it_and_returns_its_output_and_end(fake: FakeDaemon) -> None:
    fake.on("POST", f"/v1/sandboxes/{SB}/processes", httpx.Response(201, json=process_info(42)))
    fake.on("GET", f"/v1/sandboxes/{SB}/processes/42/stream", ndjson(
        {"type": "start", "pid": 42}, {"type": "stdout", "data": b64(b"hi\n")},
        {"type": "exit", "pid": 42, "exit_code": 3, "signal": None, "timed_out": False, "error": None}))
    result = run(fake, lambda c: c.call_tool("start_process", {
        "sandbox_id": SB, "command": "echo hi; exit 3", "stdin_open": True, "tag": "t", "wait_secs": 5}))
    assert not result.is_error, result.content
    out = result.structured_content
    assert (out["pid"], out["running"], out["stdout"], out["exit_code"]) == (42, False, "hi\n", 3)
    assert out["next_offset"] == 3
    assert fake.bodies("POST", f"/v1/sandboxes/{SB}/processes") == [
        {"args": ["/bin/sh", "-c", "echo hi; exit 3"], "stdin_open": True, "tag": "t"}]
    stream = next(r for r in fake.requests if r.url.path.endswith("/stream"))
    assert dict(stream.url.params) == {"from": "start", "encoding": "base64"}


def test_read_process_output_asks_how_it_stands_when_the_wait_ends_first(fake: FakeDaemon) -> None:
    # The stream shows output but no exit (the process keeps running): the reply asks the daemon.
    fake.on("GET", f"/v1/sandboxes/{SB}/processes/9/stream",
            ndjson({"type": "start", "pid": 9}, {"type": "stderr", "data": b64(b"warn\n")}))
    fake.on("GET", f"/v1/sandboxes/{SB}/processes/9", httpx.Response(200, json=process_info(9)))
    result = run(fake, lambda c: c.call_tool("read_process_output",
                                             {"sandbox_id": SB, "pid": 9, "offset": 2}))
    out = result.structured_content
    assert (out["running"], out["stderr"], out["offset"], out["next_offset"]) == (True, "rn\n", 2, 5)


def test_process_input_signals_and_eval_cancel_send_the_rest_bodies(fake: FakeDaemon) -> None:
    fake.on("POST", f"/v1/sandboxes/{SB}/processes/5/stdin",
            httpx.Response(200, json={"pid": 5, "written": 3, "stdin_open": False}))
    fake.on("POST", f"/v1/sandboxes/{SB}/processes/5/signal",
            httpx.Response(200, json={"pid": 5, "signal": 15, "signalled": True}))
    fake.on("POST", f"/v1/sandboxes/{SB}/eval/cancel", httpx.Response(200, json={"cancelled": True}))
    fake.on("GET", f"/v1/sandboxes/{SB}/processes", httpx.Response(200, json=[process_info(5)]))

    async def scenario(c: Client) -> list[Any]:
        return [(await c.call_tool(tool, args)).structured_content for tool, args in [
            ("send_process_input", {"sandbox_id": SB, "pid": 5, "data": "hi\n", "eof": True}),
            ("kill_process", {"sandbox_id": SB, "pid": 5, "signal": "SIGTERM"}),
            ("cancel_eval", {"sandbox_id": SB}),
            ("list_processes", {"sandbox_id": SB}),
        ]]

    wrote, signalled, cancelled, listed = run(fake, scenario)
    assert wrote["written"] == 3 and signalled["signalled"] and cancelled == {"cancelled": True}
    assert [p["pid"] for p in listed["processes"]] == [5]
    assert fake.bodies("POST", f"/v1/sandboxes/{SB}/processes/5/stdin") == [{"data": "hi\n", "eof": True}]
    assert fake.bodies("POST", f"/v1/sandboxes/{SB}/processes/5/signal") == [{"signal": "SIGTERM"}]


def test_spawn_sends_egress_and_eval_its_timeout(fake: FakeDaemon) -> None:
    fake.on("POST", "/v1/sandboxes", httpx.Response(201, json=[sandbox_info(0)]))
    fake.on("POST", f"/v1/sandboxes/{SB}/eval",
            httpx.Response(200, json={"result": "1", "error": None, "exit_code": 0}))

    async def scenario(c: Client) -> None:
        await c.call_tool("spawn_sandboxes", {"snapshot_tag": "net", "allow_internet_access": True,
                                              "deny_out": ["192.0.2.0/24"]})
        await c.call_tool("eval_python", {"sandbox_id": SB, "code": "1", "timeout_secs": 5})

    run(fake, scenario)
    assert fake.bodies("POST", "/v1/sandboxes") == [{
        "snapshot_tag": "net", "n": 1, "allow_internet_access": True,
        "network": {"allow_out": [], "deny_out": ["192.0.2.0/24"]}}]
    assert fake.bodies("POST", f"/v1/sandboxes/{SB}/eval") == [{"code": "1", "timeout_secs": 5}]


def test_run_code_returns_the_cells_text_and_each_png_as_an_image_block(fake: FakeDaemon) -> None:
    png = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()
    events = [
        {"type": "stdout", "text": "hello\n"},
        {"type": "result", "data": {"image/png": png, "text/plain": "<Figure>"}, "is_main_result": False},
        {"type": "result", "data": {"text/plain": "42"}, "is_main_result": True},
        {"type": "error", "name": "ValueError", "value": "bad", "traceback": ["Tb", "ValueError: bad"]},
        {"type": "end", "execution_count": 3, "timed_out": False, "restarted": False},
    ]
    ndjson = "".join(json.dumps(e) + "\n" for e in events)
    fake.on("POST", f"/v1/sandboxes/{SB}/code",
            httpx.Response(200, text=ndjson, headers={"content-type": "application/x-ndjson"}))
    result = run(fake, lambda c: c.call_tool("run_code", {"sandbox_id": SB, "code": "x", "timeout_secs": 9}))
    assert not result.is_error
    assert fake.body() == {"code": "x", "language": "python", "timeout": 9}
    text, image = result.content
    assert "hello" in text.text and "42" in text.text and "ValueError: bad" in text.text
    assert image.type == "image" and image.mime_type == "image/png" and image.data == png
    assert result.structured_content["error"]["name"] == "ValueError"
    assert result.structured_content["text"] == "42" and result.structured_content["images"] == 1
