"""Contract tests: the SDK against the real FastAPI app (with a fake runtime, no VM).

test_sdk.py pins what the SDK sends; these check that the daemon accepts it
(strict request models, query parameters, auth) and that the SDK understands
what the daemon answers, including its error bodies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from forkd.api.app import create_app
from forkd.api.settings import Settings
from forkd.sdk import (
    AsyncController,
    BadRequest,
    Controller,
    NotFoundError,
    Sandbox,
    Unauthorized,
)
from tests.fakes.runtime import FakeRuntime

TOKEN = "5b0e2c8d9a7f4e1b3c6d8a0f2e4b6c8d"


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
def runtime() -> FakeRuntime:
    rt = FakeRuntime()
    rt.add_snapshot("py")
    return rt


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    return Settings(token_file=token_file, data_dir=tmp_path / "data",
                    audit_log=tmp_path / "audit.log")


@pytest.fixture
def test_client(settings: Settings, runtime: FakeRuntime) -> Iterator[TestClient]:
    with TestClient(create_app(settings, runtime=runtime), raise_server_exceptions=False) as tc:
        yield tc


@pytest.fixture
def controller(test_client: TestClient) -> Controller:
    return Controller(url="http://forkd.test", token=TOKEN, transport=ViaTestClient(test_client))


def test_seed_branch_flow(controller: Controller, runtime: FakeRuntime) -> None:
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
    # Consecutive branches of one source chain: this one is layered on the first.
    assert ready["ancestors"] == ["checkpoint-diff", "py"]
    assert ("branch", (parent["id"],), {"tag": None, "mode": "live", "wait": False}) in runtime.calls


def test_sandbox_object_flow(controller: Controller, runtime: FakeRuntime) -> None:
    with Sandbox(tag="py", controller=controller) as sb:
        assert sb.commands.run("echo hi").stdout == "/bin/sh -c echo hi"
        assert sb.eval("2 + 2").result == "4"
        assert sb.ping()["pong"] is True
        kids = sb.branch(tag="b1").fork(n=2)
        assert [k.info["snapshot_tag"] for k in kids] == ["b1", "b1"]
        for kid in kids:
            kid.close()
    assert runtime.sandboxes == {}


def test_create_snapshot_is_accepted(controller: Controller, runtime: FakeRuntime) -> None:
    info = controller.create_snapshot(
        "ml", image="default", mem_mib=1024, boot_wait_secs=30,
        warm_imports=["numpy", "json"], setup=["pip install requests"],
    )
    assert info["tag"] == "ml"
    spec = runtime.calls[-1].args[0]
    assert spec.mem_mib == 1024 and spec.boot_wait_secs == 30
    assert spec.warm_imports == ["numpy", "json"]
    assert spec.setup == [["/bin/sh", "-c", "pip install requests"]]


def test_delete_flags_reach_the_runtime(controller: Controller, runtime: FakeRuntime) -> None:
    runtime.add_snapshot("old")
    controller.delete_snapshot("old", cascade=True, force=True)
    assert runtime.calls[-1] == ("delete_snapshot", ("old",), {"cascade": True, "force": True})


def test_exec_options_reach_the_runtime(controller: Controller, runtime: FakeRuntime) -> None:
    sid = controller.spawn_sandboxes("py")[0]["id"]
    controller.exec(sid, ["env"], timeout_secs=5, env={"A": "1"}, cwd="/tmp", stdin="x")
    assert runtime.calls[-1] == ("exec", (sid, ["env"]),
                                 {"timeout_secs": 5, "env": {"A": "1"}, "cwd": "/tmp", "stdin": "x"})


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


def test_async_controller_against_the_app(settings: Settings, runtime: FakeRuntime) -> None:
    app = create_app(settings, runtime=runtime)

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with AsyncController(url="http://forkd.test", token=TOKEN, transport=transport) as c:
            kids = await c.spawn_sandboxes("py", n=3)
            results = await asyncio.gather(*(c.eval(k["id"], "1 + 1") for k in kids))
            assert [r["result"] for r in results] == ["2", "2", "2"]
            assert (await c.version())["api"] == "v1"

    asyncio.run(main())
