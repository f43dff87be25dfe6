"""Contract tests: the SDK against the real FastAPI app (with a fake runtime, no VM).

test_sdk.py pins what the SDK sends; these check that the daemon accepts it
(strict request models, query parameters, auth) and that the SDK understands
what the daemon answers, including its error bodies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from forkd.api.app import create_app
from forkd.api.settings import Settings
from forkd.errors import NotFound
from forkd.sdk import (
    AsyncController,
    BadRequest,
    Controller,
    NotFoundError,
    Sandbox,
    Unauthorized,
)

TOKEN = "5b0e2c8d9a7f4e1b3c6d8a0f2e4b6c8d"


@dataclass
class Record:
    data: dict[str, Any]

    def info(self) -> dict[str, Any]:
        return dict(self.data)


@dataclass
class MiniRuntime:
    """Just enough of forkd.controller.runtime.Runtime for the routes."""

    snapshots: dict[str, Record] = field(default_factory=dict)
    sandboxes: dict[str, Record] = field(default_factory=dict)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    polls: int = 0

    def tag_in_flight(self, tag: str) -> bool:
        return False

    def add_snapshot(self, tag: str, **extra: Any) -> Record:
        self.snapshots[tag] = Record(
            {"tag": tag, "dir": f"/d/{tag}", "created_at_unix": 1717000000, "status": "ready"}
            | extra
        )
        return self.snapshots[tag]

    async def close(self, keep_sandboxes: bool = False) -> None:
        pass

    async def create_snapshot(self, spec: Any, progress: Any = None) -> Record:
        self.calls.append(("create_snapshot", spec))
        return self.add_snapshot(spec.tag)

    def list_snapshots(self) -> list[Record]:
        return list(self.snapshots.values())

    def get_snapshot(self, tag: str) -> Record:
        if tag not in self.snapshots:
            raise NotFound(f"snapshot {tag!r} is not registered")
        record = self.snapshots[tag]
        # A live no-wait branch finishes writing after two polls.
        if record.data.get("status") == "writing":
            self.polls += 1
            if self.polls >= 2:
                record.data["status"] = "ready"
        return record

    async def delete_snapshot(self, tag: str, cascade: bool = False, force: bool = False) -> None:
        self.calls.append(("delete_snapshot", (tag, cascade, force)))
        self.get_snapshot(tag)
        del self.snapshots[tag]

    def snapshot_lineage(self, tag: str) -> dict[str, Any]:
        return {"ancestors": ["py"] if tag != "py" else [], "dependents": []}

    async def spawn(
        self,
        tag: str,
        n: int,
        per_child_netns: bool = False,
        memory_limit_mib: int | None = None,
        live_fork: bool = False,
    ) -> list[Record]:
        self.calls.append(("spawn", (tag, n, per_child_netns, memory_limit_mib, live_fork)))
        self.get_snapshot(tag)
        out = []
        for _ in range(n):
            sid = f"sb-abcdef-{len(self.sandboxes):04d}"
            self.sandboxes[sid] = Record({
                "id": sid, "snapshot_tag": tag, "netns": None, "guest_addr": "unix:/x",
                "created_at_unix": 1717000001, "live_fork": live_fork,
            })
            out.append(self.sandboxes[sid])
        return out

    def list_sandboxes(self) -> list[Record]:
        return list(self.sandboxes.values())

    def get_sandbox(self, sandbox_id: str) -> Record:
        if sandbox_id not in self.sandboxes:
            raise NotFound(f"sandbox {sandbox_id!r} is not alive")
        return self.sandboxes[sandbox_id]

    async def kill(self, sandbox_id: str) -> None:
        self.get_sandbox(sandbox_id)
        del self.sandboxes[sandbox_id]

    async def ping(self, sandbox_id: str) -> dict[str, Any]:
        self.get_sandbox(sandbox_id)
        return {"pong": True, "pid": 1}

    async def exec(
        self,
        sandbox_id: str,
        args: list[str],
        timeout_secs: float = 30,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
    ) -> dict[str, Any]:
        self.calls.append(("exec", (args, timeout_secs, env, cwd, stdin)))
        self.get_sandbox(sandbox_id)
        return {"stdout": " ".join(args), "stderr": "", "exit_code": 0, "error": None,
                "timed_out": False}

    async def eval(self, sandbox_id: str, code: str) -> dict[str, Any]:
        self.get_sandbox(sandbox_id)
        return {"result": repr(eval(code, {})), "error": None, "exit_code": 0}

    async def branch(
        self, sandbox_id: str, tag: str | None = None, mode: str = "full", wait: bool = True
    ) -> Record:
        self.calls.append(("branch", (sandbox_id, tag, mode, wait)))
        self.get_sandbox(sandbox_id)
        extra: dict[str, Any] = {"branched_from": sandbox_id, "pause_ms": 48}
        if mode == "live" and not wait:
            extra["status"] = "writing"
        return self.add_snapshot(tag or f"branch-{sandbox_id}-1", **extra)


class ViaTestClient(httpx.BaseTransport):
    """Sends the SDK's requests through Starlette's TestClient (runs the ASGI app)."""

    def __init__(self, client: TestClient) -> None:
        self.client = client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url.copy_with(scheme="http", host="testserver", port=None)
        reply = self.client.request(
            request.method, str(url), headers=dict(request.headers), content=request.read()
        )
        return httpx.Response(reply.status_code, headers=reply.headers, content=reply.content)


@pytest.fixture
def runtime() -> MiniRuntime:
    rt = MiniRuntime()
    rt.add_snapshot("py")
    return rt


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    return Settings(token_file=token_file, data_dir=tmp_path / "data",
                    audit_log=tmp_path / "audit.log")


@pytest.fixture
def test_client(settings: Settings, runtime: MiniRuntime) -> Iterator[TestClient]:
    with TestClient(create_app(settings, runtime=runtime), raise_server_exceptions=False) as tc:
        yield tc


@pytest.fixture
def controller(test_client: TestClient) -> Controller:
    return Controller(url="http://forkd.test", token=TOKEN, transport=ViaTestClient(test_client))


def test_seed_branch_flow(controller: Controller, runtime: MiniRuntime) -> None:
    """The seed's Python SDK BRANCH example, end to end through the real routes."""
    parent = controller.spawn_sandboxes("py", n=1, live_fork=True)[0]
    assert parent["live_fork"] is True
    branch = controller.branch_sandbox(parent["id"], tag="checkpoint-diff", mode="diff")
    assert branch["branched_from"] == parent["id"]
    kids = controller.spawn_sandboxes(branch["tag"], n=5)
    assert len(kids) == 5

    branch = controller.branch_sandbox(parent["id"], mode="live", wait=False)
    assert branch["status"] == "writing"
    ready = controller.wait_snapshot_ready(branch["tag"], interval=0.001)
    assert ready["status"] == "ready"
    assert ready["ancestors"] == ["py"]
    assert ("branch", (parent["id"], None, "live", False)) in runtime.calls


def test_sandbox_object_flow(controller: Controller, runtime: MiniRuntime) -> None:
    with Sandbox(tag="py", controller=controller) as sb:
        assert sb.commands.run("echo hi").stdout == "/bin/sh -c echo hi"
        assert sb.eval("2 + 2").result == "4"
        assert sb.ping()["pong"] is True
        kids = sb.branch(tag="b1").fork(n=2)
        assert [k.info["snapshot_tag"] for k in kids] == ["b1", "b1"]
        for kid in kids:
            kid.close()
    assert runtime.sandboxes == {}


def test_create_snapshot_is_accepted(controller: Controller, runtime: MiniRuntime) -> None:
    info = controller.create_snapshot(
        "ml", image="default", mem_mib=1024, boot_wait_secs=30,
        warm_imports=["numpy", "json"], setup=["pip install requests"],
    )
    assert info["tag"] == "ml"
    spec = runtime.calls[-1][1]
    assert spec.mem_mib == 1024 and spec.boot_wait_secs == 30
    assert spec.warm_imports == ["numpy", "json"]
    assert spec.setup == [["/bin/sh", "-c", "pip install requests"]]


def test_delete_flags_reach_the_runtime(controller: Controller, runtime: MiniRuntime) -> None:
    runtime.add_snapshot("old")
    controller.delete_snapshot("old", cascade=True, force=True)
    assert runtime.calls[-1] == ("delete_snapshot", ("old", True, True))


def test_exec_options_reach_the_runtime(controller: Controller, runtime: MiniRuntime) -> None:
    sid = controller.spawn_sandboxes("py")[0]["id"]
    controller.exec(sid, ["env"], timeout_secs=5, env={"A": "1"}, cwd="/tmp", stdin="x")
    assert runtime.calls[-1] == ("exec", (["env"], 5, {"A": "1"}, "/tmp", "x"))


def test_daemon_errors_map_to_sdk_errors(controller: Controller, test_client: TestClient) -> None:
    with pytest.raises(NotFoundError, match="snapshot 'nope' is not registered"):
        controller.spawn_sandboxes("nope")
    with pytest.raises(NotFoundError):
        controller.kill_sandbox("sb-abcdef-0999")
    sid = controller.spawn_sandboxes("py")[0]["id"]
    with pytest.raises(BadRequest, match="wait"):
        controller.branch_sandbox(sid, wait=False)  # no-wait needs mode="live"
    with pytest.raises(BadRequest, match="mutually exclusive"):
        controller.branch_sandbox(sid, mode="full", diff=True)
    wrong = Controller(url="http://forkd.test", token="wrong-token-0123456789abcdef",
                       transport=ViaTestClient(test_client))
    with pytest.raises(Unauthorized):
        wrong.list_sandboxes()
    assert wrong.healthz() == {"ok": True}  # no token needed


def test_async_controller_against_the_app(settings: Settings, runtime: MiniRuntime) -> None:
    app = create_app(settings, runtime=runtime)

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with AsyncController(url="http://forkd.test", token=TOKEN, transport=transport) as c:
            kids = await c.spawn_sandboxes("py", n=3)
            results = await asyncio.gather(*(c.eval(k["id"], "1 + 1") for k in kids))
            assert [r["result"] for r in results] == ["2", "2", "2"]
            assert (await c.version())["api"] == "v1"

    asyncio.run(main())
