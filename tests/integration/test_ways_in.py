"""The other ways in, against one real daemon with real VMs: the TypeScript SDK
(node's test runner), the MCP server (the ``mcp`` package's client, over stdio and
streamable HTTP) and the web console (headless Chromium driven by Playwright).

One daemon serves the whole module, started with the session's templates (booted once)
as the seed's ``pyagent`` snapshot and ``pynet``, with a NIC; every test kills what it
made, and the module teardown stops the daemon with SIGTERM and checks that none of its
QEMUs is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from .conftest import Seeder, child_netns_turn
from .daemon_fixture import (
    FORKD,
    Daemon,
    free_port,
    kill_leftover_sandboxes,
    new_daemon,
    shutdown_and_check,
    start_or_clean_up,
)

pytestmark = pytest.mark.vm

ROOT = Path(__file__).resolve().parents[2]
TS_SDK = ROOT / "sdk" / "typescript"
NETNS_SETUP = ROOT / "scripts" / "netns-setup.sh"
TAG = "pyagent"  # seed 002's snapshot tag, used verbatim by its TypeScript snippet
NET_TAG = "pynet"  # a snapshot with a NIC: its children have an ip and an egress policy


@pytest.fixture(scope="module")
def daemon(request: pytest.FixtureRequest, snapshot: str, seed: Seeder) -> Iterator[Daemon]:
    """A daemon of its own (the web console lists every snapshot), started with the session's
    templates registered under the tags seed 002 and these tests use: no boot of its own."""
    d = new_daemon("fkw-")
    templates = {TAG: snapshot}
    if os.geteuid() == 0:  # a template with a NIC needs root (network namespaces, nftables)
        templates[NET_TAG] = request.getfixturevalue("nic_snapshot")
    seed(d.root, **templates)
    start_or_clean_up(d)
    yield d
    shutdown_and_check(d)


@pytest.fixture(scope="module")
def http(daemon: Daemon) -> Iterator[httpx.Client]:
    with daemon.client() as client:
        yield client


@pytest.fixture(scope="module")
def pyagent(http: httpx.Client) -> str:
    """The session's ``py`` template, as seed 002 names it."""
    assert http.get(f"/v1/snapshots/{TAG}").status_code == 200
    return TAG


@pytest.fixture(scope="module")
def pynet(http: httpx.Client, pyagent: str) -> str:
    """The session's template with a NIC: its children have an ip and an egress policy."""
    if os.geteuid() != 0:
        pytest.skip("a snapshot with a NIC needs root (network namespaces, nftables)")
    assert http.get(f"/v1/snapshots/{NET_TAG}").status_code == 200
    return NET_TAG


@pytest.fixture(autouse=True)
def no_sandboxes_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "daemon" not in request.fixturenames:
        return
    left = kill_leftover_sandboxes(request.getfixturevalue("daemon"))
    assert not left, f"test left sandboxes running: {left}"


@pytest.fixture
def netns_zero() -> Iterator[str]:
    """The namespace ``forkd-child-0`` seed 002's ``perChildNetns: true`` child runs in, during
    this worker's turn with those names (``child_netns_turn``).

    Made with ``scripts/netns-setup.sh 1`` if the host lacks it, and removed
    afterwards only then (another test run may be using an existing one).
    """
    if os.geteuid() != 0:
        pytest.skip("per_child_netns needs root (network namespaces)")
    with child_netns_turn():
        existing = Path("/run/netns/forkd-child-0").exists()
        if not existing:
            out = subprocess.run([str(NETNS_SETUP), "1"], capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stderr
        yield "forkd-child-0"
        if not existing:
            out = subprocess.run([str(NETNS_SETUP), "1", "--teardown"], capture_output=True, text=True)
            assert out.returncode == 0, out.stderr


def node_env(daemon: Daemon) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORKD_")}
    env.update(FORKD_URL=daemon.url, FORKD_TOKEN=daemon.token, FORKD_TEST_TAG=TAG,
               FORKD_TEST_NET_TAG=NET_TAG)
    return env


# ------------------------------------------------------------ TypeScript SDK


def test_typescript_sdk(daemon: Daemon, pyagent: str, pynet: str, netns_zero: str) -> None:
    """``npm test`` in sdk/typescript: tsc (strict) builds the SDK and its tests,
    then node's test runner runs seed 002's snippet, the SDK's surface, processes
    (streamed, background, stdin, signals), evals and networking."""
    assert (TS_SDK / "node_modules").is_dir(), "run `make node-deps` (npm ci) first; `make test` does"
    npm = shutil.which("npm")
    assert npm, "npm is not installed; scripts/install-deps.sh installs it"
    started = time.monotonic()
    out = subprocess.run(
        [npm, "test", "--silent"], cwd=TS_SDK, env=node_env(daemon),
        capture_output=True, text=True, timeout=900,
    )
    report = out.stdout + out.stderr
    print(f"\nnode --test against the daemon: {time.monotonic() - started:.1f} s\n{report[-3000:]}")
    assert out.returncode == 0, report[-12000:] + "\n" + daemon.log_tail()
    # The runner's closing lines: every test passed, and there were some.
    assert "# fail 0" in report
    passed = int(report.rsplit("# pass ", 1)[1].split()[0])
    assert passed >= 25, report[-3000:]


# ---------------------------------------------------------------- MCP server

MCP_TOOLS = {
    "list_snapshots", "get_snapshot", "create_snapshot", "delete_snapshot",
    "spawn_sandboxes", "list_sandboxes", "kill_sandbox", "exec_command", "eval_python",
    "read_file", "write_file", "list_files", "branch_sandbox", "fork_sandbox", "fork_tree",
    "promote_sandbox", "start_process", "read_process_output", "send_process_input", "list_processes",
    "kill_process", "cancel_eval", "run_code",
}


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured output; the call must have succeeded."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, f"{tool}: {result.content}"
    assert result.structured_content is not None, f"{tool} returned no structured content"
    return result.structured_content


async def process_scenario(client: Client, sb: str) -> None:
    """Long-running work through MCP: a timed-out exec keeps its output, a background
    process is read in stretches, fed, signalled; an eval times out and is cancelled."""
    cut = await call(client, "exec_command", sandbox_id=sb, command="echo partial; sleep 60", timeout_secs=2)
    assert (cut["stdout"], cut["timed_out"]) == ("partial\n", True)

    # Its first line comes back while it still runs (it waits for its input); then the rest.
    started = await call(client, "start_process", sandbox_id=sb, stdin_open=True, tag="mcp-bg",
                         command="echo ready; echo warn >&2; read x; echo got $x; exit 3", wait_secs=30,
                         max_bytes=11)
    pid = started["pid"]
    assert (started["running"], started["stdout"], started["stderr"]) == (True, "ready\n", "warn\n")
    assert started["next_offset"] == 11 and not started["more"]
    listed = await call(client, "list_processes", sandbox_id=sb)
    assert [p["tag"] for p in listed["processes"] if p["pid"] == pid] == ["mcp-bg"]
    fed = await call(client, "send_process_input", sandbox_id=sb, pid=pid, data="42\n")
    assert fed["written"] == 3
    rest = await call(client, "read_process_output", sandbox_id=sb, pid=pid,
                      offset=started["next_offset"], wait_secs=60)
    assert (rest["stdout"], rest["running"], rest["exit_code"]) == ("got 42\n", False, 3)
    assert rest["next_offset"] == 18

    # A server that cleans up on SIGTERM: started, seen ready (its trap is set), stopped.
    server = await call(client, "start_process", sandbox_id=sb, wait_secs=60, max_bytes=6,
                        command="trap 'echo bye; exit 0' TERM; echo ready; while :; do sleep 0.1; done")
    assert (server["running"], server["stdout"]) == (True, "ready\n")
    stopped = await call(client, "kill_process", sandbox_id=sb, pid=server["pid"], signal="SIGTERM")
    assert stopped == {"pid": server["pid"], "signal": 15, "signalled": True}
    end = await call(client, "read_process_output", sandbox_id=sb, pid=server["pid"],
                     offset=server["next_offset"], wait_secs=60)
    assert (end["stdout"], end["running"], end["exit_code"]) == ("bye\n", False, 0)

    slow = await call(client, "eval_python", sandbox_id=sb, code="while True: pass", timeout_secs=1)
    assert "TimeoutError" in (slow["error"] or "")
    assert (await call(client, "cancel_eval", sandbox_id=sb)) == {"cancelled": False}


async def mcp_transport_scenario(client: Client) -> None:
    """What shows a transport carries the server whole: every tool listed with its schemas, a
    call's structured result each way, and a daemon error as a tool error. (The tools themselves
    are driven over stdio, in :func:`mcp_scenario`: the server behind both transports is one.)"""
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) >= MCP_TOOLS, sorted(MCP_TOOLS - set(tools))
    assert all(tool.output_schema and tool.output_schema.get("type") == "object" for tool in tools.values())
    spawned = await call(client, "spawn_sandboxes", snapshot_tag=TAG, env={"WHO": "mcp-http"})
    [sandbox] = spawned["sandboxes"]
    ran = await call(client, "exec_command", sandbox_id=sandbox["id"], command="echo $WHO; exit 4")
    assert (ran["stdout"], ran["exit_code"]) == ("mcp-http\n", 4)
    assert (await call(client, "kill_sandbox", sandbox_id=sandbox["id"])) == {"deleted": sandbox["id"]}
    missing = await client.call_tool("kill_sandbox", {"sandbox_id": sandbox["id"]})
    assert missing.is_error and "404" in missing.content[0].text  # type: ignore[union-attr]


async def mcp_scenario(client: Client, net_tag: str) -> None:
    """What an agent does through MCP: spawn, run, processes, files, branch, fork-tree, promote,
    kill; and a sandbox with egress on a snapshot with a NIC."""
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) >= MCP_TOOLS, sorted(MCP_TOOLS - set(tools))
    for tool in tools.values():
        assert tool.description and len(tool.description) >= 40, tool.name
        assert tool.output_schema and tool.output_schema.get("type") == "object", tool.name

    snapshots = await call(client, "list_snapshots")
    assert TAG in [s["tag"] for s in snapshots["snapshots"]]
    spawned = await call(client, "spawn_sandboxes", snapshot_tag=TAG, env={"WHO": "mcp"},
                         metadata={"via": "mcp"})
    [sandbox] = spawned["sandboxes"]
    sb = sandbox["id"]
    assert sandbox["metadata"] == {"via": "mcp"}
    listed = await call(client, "list_sandboxes", metadata={"via": "mcp"})
    assert [s["id"] for s in listed["sandboxes"]] == [sb]

    ran = await call(client, "exec_command", sandbox_id=sb, command="echo $WHO; exit 4")
    assert (ran["stdout"], ran["exit_code"]) == ("mcp\n", 4)
    argv = await call(client, "exec_command", sandbox_id=sb, command=["python3", "-c", "print(6*7)"])
    assert argv["stdout"] == "42\n"
    await process_scenario(client, sb)
    await call(client, "eval_python", sandbox_id=sb, code="x = 41")
    assert (await call(client, "eval_python", sandbox_id=sb, code="x + 1"))["result"] == "42"

    written = await call(client, "write_file", sandbox_id=sb, path="/tmp/notes.txt", content="héllo " * 100)
    assert written["size"] == len(("héllo " * 100).encode())
    whole = await call(client, "read_file", sandbox_id=sb, path="/tmp/notes.txt")
    assert (whole["content"], whole["encoding"], whole["truncated"]) == ("héllo " * 100, "utf-8", False)
    cut = await call(client, "read_file", sandbox_id=sb, path="/tmp/notes.txt", max_bytes=8)
    # "héllo " is 7 bytes; the 8th is "h". Cut at 9 bytes ends inside "é": that byte is dropped.
    assert (cut["content"], cut["returned"], cut["truncated"]) == ("héllo h", 8, True)
    split = await call(client, "read_file", sandbox_id=sb, path="/tmp/notes.txt", max_bytes=9)
    assert (split["content"], split["returned"], split["encoding"]) == ("héllo h", 8, "utf-8")
    binary = await call(client, "write_file", sandbox_id=sb, path="/tmp/b.bin", content="AAEC/w==",
                        encoding="base64")
    assert binary["size"] == 4
    assert (await call(client, "read_file", sandbox_id=sb, path="/tmp/b.bin"))["encoding"] == "base64"
    entries = await call(client, "list_files", sandbox_id=sb, path="/tmp")
    assert {"notes.txt", "b.bin"} <= {e["name"] for e in entries["entries"]}

    branch = await call(client, "branch_sandbox", sandbox_id=sb, mode="diff")
    assert branch["branched_from"] == sb and branch["status"] == "ready"
    lineage = await call(client, "get_snapshot", tag=branch["tag"])
    assert lineage["ancestors"] == [TAG]

    tree = await call(client, "fork_tree", sandbox_id=sb, count=2,
                      child_env=[{"IDEA": "a"}, {"IDEA": "b"}])
    assert tree["errors"] == [] and len(tree["children"]) == 2
    read_idea = "import os; os.environ['IDEA'] + str(x)"
    ideas = [await call(client, "eval_python", sandbox_id=c["id"], code=read_idea) for c in tree["children"]]
    assert sorted(i["result"] for i in ideas) == ["'a41'", "'b41'"]
    keep, drop = tree["children"][1]["id"], tree["children"][0]["id"]
    promoted = await call(client, "promote_sandbox", sandbox_id=keep)
    assert promoted["winner"]["id"] == keep
    assert [(d["id"], d["deleted"]) for d in promoted["deleted"]] == [(drop, True)]

    for sandbox_id in (keep, sb):
        assert (await call(client, "kill_sandbox", sandbox_id=sandbox_id)) == {"deleted": sandbox_id}
    assert (await call(client, "delete_snapshot", tag=branch["tag"])) == {"deleted": branch["tag"]}

    netted = await call(client, "spawn_sandboxes", snapshot_tag=net_tag, allow_out=["10.201.0.1:8080"])
    [net] = netted["sandboxes"]
    assert net["ip"] and net["network"]["allow_out"] == ["10.201.0.1:8080"], net
    assert net["network"]["allow_internet_access"] is False
    await call(client, "kill_sandbox", sandbox_id=net["id"])
    refused = await client.call_tool("spawn_sandboxes", {"snapshot_tag": TAG, "allow_internet_access": True})
    assert refused.is_error and '"nic": true' in refused.content[0].text  # type: ignore[union-attr]

    # A daemon error is a tool error carrying its status and message.
    missing = await client.call_tool("kill_sandbox", {"sandbox_id": sb})
    assert missing.is_error
    text = missing.content[0].text  # type: ignore[union-attr]
    assert "404" in text and sb in text, text


def test_mcp_over_stdio(daemon: Daemon, pyagent: str, pynet: str) -> None:
    """An MCP client starts `forkd mcp` as its subprocess and talks over stdin/stdout."""
    env = {k: v for k, v in node_env(daemon).items() if k != "FORKD_TEST_TAG"}
    params = StdioServerParameters(command=str(FORKD), args=["mcp"], env=env)

    async def run() -> None:
        async with Client(params) as client:
            await mcp_scenario(client, pynet)

    asyncio.run(asyncio.wait_for(run(), 600))


def test_mcp_over_streamable_http(daemon: Daemon, pyagent: str, tmp_path: Path) -> None:
    """`forkd mcp --transport http` with a token: the client must send it, and the transport
    carries the server whole (the tools' own scenario runs over stdio above)."""
    token = secrets.token_hex(16)
    token_file = tmp_path / "mcp-token"
    token_file.write_text(token)
    port = free_port()
    proc = subprocess.Popen(
        [str(FORKD), "mcp", "--transport", "http", "--bind", f"127.0.0.1:{port}",
         "--token-file", str(token_file), "--json"],
        env=node_env(daemon), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        announced = json.loads(proc.stdout.readline() or "{}")
        url = f"http://127.0.0.1:{port}/mcp"
        # (Not proc.stderr.read() in the message: it would wait for the server to exit.)
        assert announced == {"listening": True, "url": url, "auth": "bearer",
                             "token_file": str(token_file), "token_generated": False}, announced
        refused = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert refused.status_code == 401

        async def run() -> None:
            headers = {"Authorization": f"Bearer {token}"}
            async with create_mcp_http_client(headers=headers) as http_client, \
                    Client(streamable_http_client(url, http_client=http_client)) as client:
                await mcp_transport_scenario(client)

        asyncio.run(asyncio.wait_for(run(), 600))
    finally:
        proc.terminate()
        proc.wait(30)


# ---------------------------------------------------------------- web console

BROWSER_TEST = ROOT / "tests" / "browser"
CHROMIUM = Path("/usr/bin/chromium")
DOCS_SCREENSHOT = ROOT / "docs" / "console.png"


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and the RGB(A) rows of an 8-bit, non-interlaced PNG (what Chromium writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, chunks, header = 8, [], b""
    while pos < len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    width, height = int.from_bytes(header[0:4], "big"), int.from_bytes(header[4:8], "big")
    depth, color, interlace = header[8], header[9], header[12]
    assert depth == 8 and color in (2, 6) and interlace == 0, header
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up, corner = prev[i], (prev[i - bpp] if i >= bpp else 0)
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, rows


def distinct_colours(path: Path) -> int:
    width, _height, rows = png_pixels(path)
    bpp = len(rows[0]) // width
    return len({row[i:i + 3] for row in rows[::4] for i in range(0, len(row), bpp * 4)})


def metric_counts(http: httpx.Client) -> dict[str, int]:
    """``{histogram: observations}`` from /metrics, for the ones the console shows."""
    counts: dict[str, int] = {}
    for line in http.get("/metrics").text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("forkd_fork_seconds_count", "forkd_branch_pause_ms_count"):
            counts[name.removesuffix("_count")] = int(float(value))
    return counts


def test_web_console_in_headless_chromium(daemon: Daemon, http: httpx.Client, pyagent: str,
                                          pynet: str, tmp_path: Path) -> None:
    """After a fork-tree and a branch made through the API, the console shows them (tables,
    lineage picture, pool level, latency, each sandbox's ip and egress, an idle-paused one's
    badge), and its buttons
    kill, fork and branch."""
    assert CHROMIUM.exists(), "chromium is not installed; scripts/install-deps.sh installs it"
    assert (BROWSER_TEST / "node_modules" / "playwright-core").is_dir(), "run `make node-deps` first"
    before = metric_counts(http)
    try:
        r = http.post("/v1/sandboxes", json={"snapshot_tag": TAG, "n": 1, "metadata": {"role": "source"}})
        assert r.status_code == 201, r.text
        source = r.json()[0]["id"]
        r = http.post(f"/v1/sandboxes/{source}/fork-tree", json={"count": 2}, timeout=300)
        assert r.status_code == 201, r.text
        tree = r.json()
        branch_body = {"tag": "ui-branch", "mode": "diff"}
        r = http.post(f"/v1/sandboxes/{source}/branch", json=branch_body, timeout=300)
        assert r.status_code == 201, r.text
        r = http.put(f"/v1/snapshots/{TAG}/pool", json={"size": 1}, timeout=300)
        assert r.status_code == 200, r.text
        r = http.post("/v1/sandboxes", json={"snapshot_tag": pynet, "allow_internet_access": False,
                                             "idle_pause_secs": 1,
                                             "network": {"allow_out": ["10.201.0.1:8080"],
                                                         "deny_out": ["192.0.2.0/24"]}})
        assert r.status_code == 201, r.text
        net = r.json()[0]
        children = [c["id"] for c in tree["children"]]
        expect = {
            "sandboxes": [source, *children], "snapshots": [TAG, "ui-branch", tree["snapshot_tag"]],
            "tree": children, "kill": children[0], "fork_tag": "ui-branch", "branch_from": source,
            "pool": TAG, "net": net["id"],
        }
        env = node_env(daemon) | {"OUT_DIR": str(tmp_path), "EXPECT": json.dumps(expect),
                                  "CHROMIUM": str(CHROMIUM)}
        started = time.monotonic()
        out = subprocess.run(["node", "console.mjs"], cwd=BROWSER_TEST, env=env,
                             capture_output=True, text=True, timeout=600)
        print(f"\nheadless chromium session: {time.monotonic() - started:.1f} s")
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-8000:]
        seen = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        http.put(f"/v1/snapshots/{TAG}/pool", json={"size": 0}, timeout=300)
        for sb in http.get("/v1/sandboxes").json():
            http.delete(f"/v1/sandboxes/{sb['id']}", timeout=120)
        for snap in http.get("/v1/snapshots").json():
            if snap["tag"] not in (TAG, NET_TAG):
                http.delete(f"/v1/snapshots/{snap['tag']}", params={"cascade": "true", "force": "true"})

    assert seen["loginShown"] and seen["wrongTokenRefused"]
    assert seen["sessionHasToken"] and not seen["tokenInUrl"] and seen["cookies"] == 0
    # The picture: the source under its snapshot, the two tree children under the fork's
    # snapshot, which hangs from the source (a branch edge), as does ui-branch.
    assert seen["treeNodes"] == 2
    assert seen["edges"]["branch"] >= 2 and seen["edges"]["fork"] >= 3, seen["edges"]
    assert any(f"child 1 of fork-tree {tree['tree_id']}" in t for t in seen["nodeTitles"]), seen["nodeTitles"]
    # The page's counts are the daemon's (earlier tests of the module forked and branched too):
    # this test's fork-tree added one fork, and its branch and the fork's branch two pauses.
    latency = {row[0]: row for row in seen["latency"]}
    assert int(latency["fork of a running sandbox"][1]) == before["forkd_fork_seconds"] + 1, latency
    assert int(latency["branch pause of the source"][1]) == before["forkd_branch_pause_ms"] + 2, latency
    assert latency["branch pause of the source"][2].endswith("ms")
    assert "/ 1" in seen["pool"], seen["pool"]
    assert seen["net"]["text"] == f"{net['ip']} 1 allowed · 1 denied", seen["net"]
    guest = f"guest {net['network']['guest_ip']}, host {net['network']['host_gateway']}"
    assert seen["net"]["title"].splitlines() == [guest, "allow 10.201.0.1:8080", "deny 192.0.2.0/24"], seen
    assert seen["noNic"] == "no NIC"
    assert seen["pausedBadges"] == 1  # the idle-paused one, and only it
    assert seen["killed"] == children[0] and seen["forkedThroughPage"] == 2 and seen["branchedThroughPage"]
    assert seen["actionError"] == "", seen["actionError"]
    assert seen["signedOut"]
    # The browser logs each refused fetch; the wrong-token sign-in above is the only one expected.
    errors = [line for line in seen["console"] if line.startswith("error") and "status of 401" not in line]
    assert not errors, seen["console"]
    assert all(u.startswith(daemon.url) for u in seen["requests"]), "the console fetched from elsewhere"

    for name in ("console.png", "lineage.png", "console-after-actions.png"):
        width, height, _ = png_pixels(tmp_path / name)
        colours = distinct_colours(tmp_path / name)
        print(f"{name}: {width}x{height}, {colours} distinct colours (sampled)")
        assert width >= 300 and height >= 100 and colours >= 8, (name, width, height, colours)
    if os.environ.get("FORKD_UPDATE_DOCS_SCREENSHOT"):
        shutil.copyfile(tmp_path / "console.png", DOCS_SCREENSHOT)


# ------------------------------------------------------------ the port proxy (E2B's get_host)

# A stdlib HTTP server for the guest that answers with the headers it got, and a WebSocket echo
# server (the guest image has no WebSocket library): what the proxy passes on is then visible.
GUEST_SERVERS = r'''
import base64, hashlib, http.server, json, socket, struct, threading

class Headers(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({k.lower(): v for k, v in self.headers.items()} | {"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_POST = do_GET

def echo(conn):
    head = b""
    while b"\r\n\r\n" not in head:
        head += conn.recv(4096)
    lines = head.split(b"\r\n\r\n")[0].decode().split("\r\n")[1:]
    key = dict(l.split(": ", 1) for l in lines)["Sec-WebSocket-Key"]
    accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
    conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    f = conn.makefile("rb")
    while True:
        b1, b2 = f.read(2)
        n = b2 & 0x7F
        if n == 126:
            n = struct.unpack(">H", f.read(2))[0]
        mask = f.read(4)
        data = bytes(c ^ mask[i % 4] for i, c in enumerate(f.read(n)))
        if b1 & 0x0F == 8:
            conn.sendall(b"\x88\x02\x03\xe8")
            return
        reply = b"echo:" + data
        conn.sendall(bytes([0x80 | (b1 & 0x0F), len(reply)]) + reply)

def websockets():
    s = socket.create_server(("0.0.0.0", 8002))
    while True:
        threading.Thread(target=echo, args=(s.accept()[0],), daemon=True).start()

threading.Thread(target=websockets, daemon=True).start()
http.server.ThreadingHTTPServer(("0.0.0.0", 8001), Headers).serve_forever()
'''


def serve_in(http: httpx.Client, sandbox_id: str) -> None:
    files = http.put(f"/v1/sandboxes/{sandbox_id}/files", params={"path": "/tmp/servers.py"},
                     content=GUEST_SERVERS.encode())
    assert files.status_code < 300, files.text
    started = http.post(f"/v1/sandboxes/{sandbox_id}/processes",
                        json={"args": ["python3", "/tmp/servers.py"]})
    assert started.status_code == 201, started.text


def through_proxy(daemon: Daemon, port: int, sandbox_id: str, path: str = "/", *, listening: bool = True,
                  **headers: str) -> httpx.Response:
    """A request as E2B's get_host makes it: to the daemon, the sandbox's port named in Host.
    Retried while the answer is a 502 until the guest's server listens, unless ``listening`` is
    False (a port nothing listens on: its first 502 is the answer)."""
    host = {"Host": f"{port}-{sandbox_id}.localhost:{daemon.port}"}
    deadline = time.monotonic() + 30
    while True:
        r = httpx.get(f"http://127.0.0.1:{daemon.port}{path}", headers={**host, **headers}, timeout=30)
        if r.status_code != 502 or not listening or time.monotonic() > deadline:
            return r
        time.sleep(0.3)


def test_port_proxy_relays_http_and_websocket_with_the_sandboxs_policy(
        daemon: Daemon, http: httpx.Client, pynet: str) -> None:
    from websockets.sync.client import connect

    private = http.post("/v1/sandboxes", json={"snapshot_tag": pynet}).json()[0]["id"]
    public = http.post("/v1/sandboxes", json={
        "snapshot_tag": pynet, "network": {"allow_public_traffic": True,
                                           "mask_request_host": "masked.example:${PORT}"}}).json()[0]["id"]
    try:
        for sb in (private, public):
            serve_in(http, sb)
        bearer = f"Bearer {daemon.token}"
        # forkd's default: not public. The daemon's token opens it, and does not reach the guest.
        refused = through_proxy(daemon, 8001, private)
        assert refused.status_code == 403 and "allow_public_traffic" in refused.json()["error"]
        seen = through_proxy(daemon, 8001, private, "/a?b=c", Authorization=bearer)
        assert seen.status_code == 200, seen.text
        got = seen.json()
        assert got["path"] == "/a?b=c" and "authorization" not in got
        assert got["host"] == f"8001-{private}.localhost:{daemon.port}"
        # Public, with the Host the guest is to see instead of the proxy's.
        opened = through_proxy(daemon, 8001, public)
        assert opened.status_code == 200 and opened.json()["host"] == "masked.example:8001"
        # A port nothing listens on.
        closed = through_proxy(daemon, 8009, public, listening=False)
        assert closed.status_code == 502 and "port 8009 is not open" in closed.json()["error"]
        # Issue 38: a request-target that is not a path is refused, and reaches nothing of the host
        # (pasted after the guest's address, `*@127.0.0.1:<port>/` named the host's port).
        with socket.create_server(("127.0.0.1", 0)) as host_port:
            for line in (f"GET *@127.0.0.1:{host_port.getsockname()[1]}/ HTTP/1.1", "OPTIONS * HTTP/1.1"):
                with socket.create_connection(("127.0.0.1", daemon.port), timeout=30) as raw:
                    raw.sendall(f"{line}\r\nHost: 8001-{public}.localhost:{daemon.port}\r\n\r\n".encode())
                    answer = b""
                    with contextlib.suppress(TimeoutError):
                        while chunk := raw.recv(65536):  # the proxy's own answers close the connection
                            answer += chunk
                host_port.settimeout(0)
                with pytest.raises(BlockingIOError):  # nothing connected to it
                    host_port.accept()
                assert answer.startswith(b"HTTP/1.1 400") and b"origin-form" in answer, answer[:300]
        # A WebSocket, both ways, through the same proxy.
        sock = socket.create_connection(("127.0.0.1", daemon.port))
        with connect(f"ws://8002-{private}.localhost:{daemon.port}/ws", sock=sock,
                     additional_headers={"Authorization": bearer}, open_timeout=30) as ws:
            ws.send("hello")
            assert ws.recv(timeout=30) == "echo:hello"
            ws.send(b"\x00\x01")
            assert ws.recv(timeout=30) == b"echo:\x00\x01"
        # A hibernated sandbox is woken by traffic to its port, its server still there.
        slept = http.post(f"/v1/sandboxes/{public}/hibernate")
        assert slept.status_code < 300 and slept.json()["state"] == "hibernated", slept.text
        woken = through_proxy(daemon, 8001, public)
        assert woken.status_code == 200 and woken.json()["host"] == "masked.example:8001"
    finally:
        for sb in (private, public):
            http.delete(f"/v1/sandboxes/{sb}")


def test_e2b_ports_follow_allow_public_traffic_and_the_traffic_token(
        daemon: Daemon, http: httpx.Client, pynet: str) -> None:
    e2b = {"X-API-Key": daemon.token}
    made = http.post("/sandboxes", headers=e2b, json={"templateID": pynet,
                                                      "network": {"allowPublicTraffic": False}})
    assert made.status_code == 201, made.text
    sb, traffic = made.json()["sandboxID"], made.json()["trafficAccessToken"]
    try:
        serve_in(http, sb)
        assert through_proxy(daemon, 8001, sb).status_code == 403
        wrong = through_proxy(daemon, 8001, sb, **{"E2B-Traffic-Access-Token": "x" * len(traffic)})
        assert wrong.status_code == 403
        ok = through_proxy(daemon, 8001, sb, **{"E2B-Traffic-Access-Token": traffic})
        assert ok.status_code == 200 and "e2b-traffic-access-token" not in ok.json()
    finally:
        http.delete(f"/v1/sandboxes/{sb}")
    # E2B's default is public.
    made = http.post("/sandboxes", headers=e2b, json={"templateID": pynet})
    sb = made.json()["sandboxID"]
    try:
        serve_in(http, sb)
        assert through_proxy(daemon, 8001, sb).status_code == 200
    finally:
        http.delete(f"/v1/sandboxes/{sb}")


# ------------------------------------------------------------ terminals (a pty over a WebSocket)


def test_terminal_through_the_sdk_and_in_the_web_console(daemon: Daemon, http: httpx.Client, pyagent: str,
                                                          tmp_path: Path) -> None:
    """A login shell on a pty: through the Python SDK (keys in, output out, a resize, the exit
    code), refused without the token, and in the web console (xterm.js in headless Chromium)."""
    from forkd.sdk import Controller
    from forkd.sdk.terminal import TerminalClosed

    sb = http.post("/v1/sandboxes", json={"snapshot_tag": pyagent}).json()[0]["id"]
    try:
        with Controller(daemon.url, token=daemon.token) as c, \
                c.open_terminal(sb, cols=90, rows=20, user="user") as term:
            term.send("stty size; whoami; pwd\n")
            out = b""
            while b"/home/user" not in out.split(b"pwd", 1)[-1]:
                out += term.recv(timeout=60)
            assert b"20 90" in out and b"\nuser" in out.replace(b"\r", b""), out
            term.resize(120, 40)
            term.send("stty size; exit 3\n")
            with pytest.raises(TerminalClosed) as ended:
                while True:
                    out += term.recv(timeout=60)
            assert ended.value.exit_code == 3 and b"40 120" in out, out
        # No token, no terminal (and a wrong one likewise).
        from websockets.exceptions import InvalidStatus
        from websockets.sync.client import connect
        for protocols in (["forkd.terminal.v1"], ["forkd.terminal.v1", "bearer.d3Jvbmc"]):
            with pytest.raises(InvalidStatus) as refused:
                connect(f"ws://127.0.0.1:{daemon.port}/v1/sandboxes/{sb}/terminal", subprotocols=protocols)
            assert refused.value.response.status_code == 403

        assert CHROMIUM.exists(), "chromium is not installed; scripts/install-deps.sh installs it"
        env = node_env(daemon) | {"OUT_DIR": str(tmp_path), "SANDBOX": sb, "CHROMIUM": str(CHROMIUM)}
        started = time.monotonic()
        out_js = subprocess.run(["node", "terminal.mjs"], cwd=BROWSER_TEST, env=env, capture_output=True,
                                text=True, timeout=300)
        print(f"\nheadless chromium terminal session: {time.monotonic() - started:.1f} s")
        assert out_js.returncode == 0, out_js.stdout[-4000:] + out_js.stderr[-8000:]
        seen = json.loads(out_js.stdout.strip().splitlines()[-1])
        assert "forkd-42" in seen["afterCommand"] and "28 100" in seen["afterCommand"], seen["afterCommand"]
        assert seen["status"].endswith("shell exited with 7") and not seen["tokenInUrl"]
        # The page's first refresh, before the token is typed in, is refused (401); nothing else is.
        errors = [line for line in seen["console"]
                  if line.startswith("error") and "status of 401" not in line]
        assert not errors, seen["console"]
        width, height, _ = png_pixels(tmp_path / "terminal.png")
        assert width >= 300 and height >= 100
    finally:
        http.delete(f"/v1/sandboxes/{sb}")


# ------------------------------------------------------------ network updates of a running sandbox


class HostListener:
    """A TCP server on the host, on every address (the sandboxes' gateway 10.201.0.1 among them),
    that greets each connection: what a guest reaches when its egress policy lets it."""

    def __init__(self) -> None:
        import threading
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"hello from the host\n")

    def close(self) -> None:
        self.sock.close()


def reach_host(http: httpx.Client, sandbox_id: str, port: int) -> tuple[int, str]:
    """The guest connects to the host's ``port`` at its gateway: (exit code, what it read or why not)."""
    code = ("import socket, sys\n"
            "try:\n"
            f"    s = socket.create_connection(('10.201.0.1', {port}), timeout=10)\n"
            "    print(s.recv(64).decode().strip())\n"
            "except OSError as e:\n"
            "    print(type(e).__name__); sys.exit(3)\n")
    r = http.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"args": ["python3", "-c", code],
                                                            "timeout_secs": 60}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["exit_code"], r.json()["stdout"].strip()


def test_network_update_opens_and_closes_a_host_port_of_a_running_sandbox(
        daemon: Daemon, http: httpx.Client, pynet: str) -> None:
    """PUT /v1/sandboxes/{id}/network replaces the egress rules while the guest runs: a host port
    the first policy refuses opens, a bad update is a 400 that leaves it open, and an update that
    drops it refuses it again; E2B's route does the same, and a hibernated sandbox gets its update
    at its wake."""
    listener = HostListener()
    port = listener.port
    sb = http.post("/v1/sandboxes", json={"snapshot_tag": pynet,
                                          "network": {"allow_public_traffic": True}}).json()[0]["id"]
    e2b = {"X-API-Key": daemon.token}
    try:
        assert reach_host(http, sb, port) == (3, "ConnectionRefusedError")  # denied by default
        started = time.monotonic()
        opened = http.put(f"/v1/sandboxes/{sb}/network", json={"allow_out": [f"10.201.0.1:{port}"]})
        print(f"\nnetwork update (open): {(time.monotonic() - started) * 1000:.0f} ms")
        assert opened.status_code == 200, opened.text
        net = opened.json()["network"]
        assert net["allow_out"] == [f"10.201.0.1:{port}"] and net["allow_public_traffic"] is False, net
        assert reach_host(http, sb, port) == (0, "hello from the host")
        bad = http.put(f"/v1/sandboxes/{sb}/network", json={"allow_out": ["-bad.example"]})
        assert bad.status_code == 400 and "nor a DNS name" in bad.json()["error"], bad.text
        assert http.get(f"/v1/sandboxes/{sb}").json()["network"]["allow_out"] == [f"10.201.0.1:{port}"]
        assert reach_host(http, sb, port) == (0, "hello from the host")
        started = time.monotonic()
        closed = http.put(f"/v1/sandboxes/{sb}/network", json={"deny_out": ["192.0.2.0/24"]})
        print(f"network update (close): {(time.monotonic() - started) * 1000:.0f} ms")
        assert closed.status_code == 200 and closed.json()["network"]["allow_out"] == [], closed.text
        assert reach_host(http, sb, port) == (3, "ConnectionRefusedError")
        # E2B's update_network: the same owner call.
        r = http.put(f"/sandboxes/{sb}/network", headers=e2b, json={"allowOut": [f"10.201.0.1:{port}"]})
        assert r.status_code == 204, r.text
        assert reach_host(http, sb, port) == (0, "hello from the host")
        # Hibernated: the update is written down, and its wake makes the network with it.
        slept = http.post(f"/v1/sandboxes/{sb}/hibernate", timeout=300)
        assert slept.status_code == 200 and slept.json()["state"] == "hibernated", slept.text
        r = http.put(f"/sandboxes/{sb}/network", headers=e2b, json={})
        assert r.status_code == 204, r.text
        asleep = http.get(f"/v1/sandboxes/{sb}").json()
        assert asleep["state"] == "hibernated" and asleep["network"]["allow_out"] == [], asleep
        assert reach_host(http, sb, port) == (3, "ConnectionRefusedError")  # woken by the exec
    finally:
        http.delete(f"/v1/sandboxes/{sb}")
        listener.close()
    # A sandbox without a NIC has no network to update: 400 naming the fix.
    plain = http.post("/v1/sandboxes", json={"snapshot_tag": TAG}).json()[0]["id"]
    try:
        r = http.put(f"/v1/sandboxes/{plain}/network", json={})
        assert r.status_code == 400 and '"nic": true' in r.json()["error"], r.text
    finally:
        http.delete(f"/v1/sandboxes/{plain}")
