"""forkd's MCP server in process, through the ``mcp`` package's own client, against the fake daemon.

The real daemon with real VMs, over stdio and streamable HTTP, is in
tests/integration/test_ways_in.py; here: the tool list, what each tool sends,
and how errors and large files reach the model.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from mcp import Client

from forkd.mcp.server import DaemonAddress, build_server
from tests.fakes.daemon import SB, URL, FakeDaemon, sandbox_info, snap_info

EXPECTED_TOOLS = {
    "list_snapshots", "get_snapshot", "create_snapshot", "delete_snapshot", "spawn_sandboxes",
    "list_sandboxes", "kill_sandbox", "exec_command", "eval_python", "read_file", "write_file",
    "list_files", "branch_sandbox", "fork_sandbox", "fork_tree", "promote_sandbox",
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
    assert destructive == {"delete_snapshot", "kill_sandbox", "promote_sandbox"}
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
