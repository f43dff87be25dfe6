"""Unit tests of the Python SDK against an in-process fake daemon (httpx.MockTransport).

They pin the wire format the SDK produces (URLs, bodies with only the fields
the caller set, auth header, timeouts) and how it maps answers back (error
classes, waiting for a snapshot, sandbox ownership). No daemon, no VM.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import forkd
from forkd.errors import ForkdError
from forkd.sdk import (
    AsyncController,
    AsyncSandbox,
    AsyncSnapshot,
    BadRequest,
    CheckpointPolicy,
    Checkpoints,
    CommandResult,
    ConflictError,
    Controller,
    Deletion,
    EvalResult,
    Execution,
    ExecutionError,
    ForkdAPIError,
    ForkdConnectionError,
    ForkdTimeoutError,
    ForkFailure,
    ForkResult,
    NotFoundError,
    PromoteResult,
    Sandbox,
    ServerError,
    ServiceUnavailable,
    Snapshot,
    SnapshotFailedError,
    Unauthorized,
)
from tests.fakes.daemon import SB, FakeDaemon, clear_env, sandbox_info, sandbox_routes, snap_info


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_env(monkeypatch)


@pytest.fixture
def fake() -> FakeDaemon:
    return FakeDaemon()


# ------------------------------------------------------------------ config


def test_defaults_and_env(monkeypatch: pytest.MonkeyPatch, fake: FakeDaemon) -> None:
    assert Controller().url == "http://127.0.0.1:8889"
    monkeypatch.setenv("FORKD_URL", "10.0.0.5:9000/")
    assert Controller().url == "http://10.0.0.5:9000"
    monkeypatch.setenv("FORKD_URL", "https://forkd.example:8889")
    assert Controller().url == "https://forkd.example:8889"


def test_token_from_env_and_file(
    monkeypatch: pytest.MonkeyPatch, fake: FakeDaemon, tmp_path: Path
) -> None:
    fake.on("GET", "/healthz", httpx.Response(200, json={"ok": True}))
    fake.controller().healthz()
    assert "authorization" not in fake.requests[-1].headers

    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    monkeypatch.setenv("FORKD_TOKEN_FILE", str(token_file))
    fake.controller().healthz()
    assert fake.requests[-1].headers["authorization"] == "Bearer from-file"

    monkeypatch.setenv("FORKD_TOKEN", "from-env")
    fake.controller().healthz()
    assert fake.requests[-1].headers["authorization"] == "Bearer from-env"

    fake.controller(token="explicit").healthz()
    assert fake.requests[-1].headers["authorization"] == "Bearer explicit"


def test_unreadable_token_file_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKD_TOKEN_FILE", "/nonexistent/token")
    with pytest.raises(ForkdError, match="FORKD_TOKEN_FILE"):
        Controller()


def test_ca_cert(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import ssl

    from forkd.sdk._http import resolve_verify

    assert resolve_verify(None) is True
    assert resolve_verify(False) is False
    assert isinstance(resolve_verify(str(tmp_path)), ssl.SSLContext)  # a CA directory
    monkeypatch.setenv("FORKD_CA_CERT", str(tmp_path / "missing.pem"))
    with pytest.raises(ForkdError, match="cannot load CA certificate"):
        Controller()


def test_top_level_exports() -> None:
    assert forkd.Controller is Controller
    assert forkd.Sandbox is Sandbox
    assert forkd.NotFoundError is NotFoundError
    assert isinstance(forkd.__version__, str)
    with pytest.raises(AttributeError):
        _ = forkd.NoSuchThing  # type: ignore[attr-defined]


# ---------------------------------------------------------- request shapes


def test_spawn_sends_only_set_fields(fake: FakeDaemon) -> None:
    fake.on("POST", "/v1/sandboxes", httpx.Response(201, json=[sandbox_info()]))
    c = fake.controller()
    assert c.spawn_sandboxes("py")[0]["id"] == "sb-abcdef-0000"
    c.spawn_sandboxes("py", n=3, per_child_netns=True, memory_limit_mib=256, live_fork=True)
    assert fake.bodies("POST", "/v1/sandboxes") == [
        {"snapshot_tag": "py", "n": 1},
        {"snapshot_tag": "py", "n": 3, "per_child_netns": True, "memory_limit_mib": 256,
         "live_fork": True},
    ]


def test_branch_body(fake: FakeDaemon) -> None:
    path = "/v1/sandboxes/sb-abcdef-0000/branch"
    fake.on("POST", path, httpx.Response(201, json=snap_info("b", branched_from="sb-abcdef-0000")))
    c = fake.controller()
    branch = c.branch_sandbox("sb-abcdef-0000")
    assert branch["tag"] == "b"
    c.branch_sandbox("sb-abcdef-0000", tag="checkpoint-1", mode="diff")
    c.branch_sandbox("sb-abcdef-0000", mode="live", wait=False)
    c.branch_sandbox("sb-abcdef-0000", mode="live", wait=True)
    c.branch_sandbox("sb-abcdef-0000", diff=True)
    assert fake.bodies("POST", path) == [
        {},
        {"tag": "checkpoint-1", "mode": "diff"},
        {"mode": "live", "wait": False},
        {"mode": "live"},  # wait is only sent when it departs from the default
        {"diff": True},
    ]


def test_create_snapshot_body(fake: FakeDaemon) -> None:
    fake.on("POST", "/v1/snapshots", httpx.Response(201, json=snap_info()))
    c = fake.controller()
    assert c.create_snapshot("py")["tag"] == "py"
    c.create_snapshot(
        "ml", image="ml", mem_mib=1024, vcpus=2, boot_wait_secs=60,
        warm_imports=["numpy", "json"], setup=["pip install x", ["touch", "/ok"]], rw=True,
    )
    assert fake.bodies("POST", "/v1/snapshots") == [
        {"tag": "py"},
        {
            "tag": "ml", "image": "ml", "mem_mib": 1024, "vcpus": 2, "boot_wait_secs": 60,
            "warm_imports": ["numpy", "json"],
            "setup": [["/bin/sh", "-c", "pip install x"], ["touch", "/ok"]],
            "rw": True,
        },
    ]


def test_delete_snapshot_params(fake: FakeDaemon) -> None:
    fake.on("DELETE", "/v1/snapshots/py", httpx.Response(204))
    c = fake.controller()
    assert c.delete_snapshot("py") is None
    c.delete_snapshot("py", cascade=True, force=True)
    assert [dict(r.url.params) for r in fake.requests] == [{}, {"cascade": "true", "force": "true"}]


def test_exec_body_and_timeout(fake: FakeDaemon) -> None:
    path = "/v1/sandboxes/sb-abcdef-0000/exec"
    fake.on("POST", path, httpx.Response(200, json={"stdout": "4\n", "stderr": "", "exit_code": 0}))
    c = fake.controller()
    assert c.exec("sb-abcdef-0000", ["python3", "-c", "print(2+2)"])["stdout"] == "4\n"
    c.exec("sb-abcdef-0000", "echo $HOME", timeout_secs=120, env={"A": "1"}, cwd="/tmp", stdin="x")
    assert fake.bodies("POST", path) == [
        {"args": ["python3", "-c", "print(2+2)"], "timeout_secs": 30},
        {"args": ["/bin/sh", "-c", "echo $HOME"], "timeout_secs": 120, "env": {"A": "1"},
         "cwd": "/tmp", "stdin": "x"},
    ]
    # The HTTP wait outlasts the command's own timeout.
    assert fake.requests[-1].extensions["timeout"]["read"] > 120


def test_long_operations_have_no_read_timeout(fake: FakeDaemon) -> None:
    fake.on("POST", "/v1/snapshots", httpx.Response(201, json=snap_info()))
    fake.on("POST", "/v1/sandboxes", httpx.Response(201, json=[sandbox_info()]))
    fake.on("POST", "/v1/sandboxes/sb-abcdef-0000/branch", httpx.Response(201, json=snap_info("b")))
    fake.on("POST", "/v1/sandboxes/sb-abcdef-0000/eval",
            httpx.Response(200, json={"result": "2", "error": None, "exit_code": 0}))
    fake.on("GET", "/v1/sandboxes", httpx.Response(200, json=[]))
    c = fake.controller(timeout=5)
    c.create_snapshot("py")
    c.spawn_sandboxes("py", n=100)
    c.branch_sandbox("sb-abcdef-0000")
    c.eval("sb-abcdef-0000", "1+1")
    c.list_sandboxes()
    reads = [r.extensions["timeout"]["read"] for r in fake.requests]
    assert reads == [None, None, None, None, 5]
    assert all(r.extensions["timeout"]["connect"] == 5 for r in fake.requests)


def test_simple_routes(fake: FakeDaemon) -> None:
    fake.on("GET", "/version", httpx.Response(200, json={"version": "0.1.0", "api": "v1"}))
    fake.on("GET", "/metrics", httpx.Response(200, text="forkd_sandboxes_active 0\n"))
    fake.on("GET", "/v1/snapshots", httpx.Response(200, json=[snap_info()]))
    fake.on("GET", "/v1/snapshots/py",
            httpx.Response(200, json=snap_info(ancestors=[], dependents=["b"])))
    fake.on("GET", "/v1/sandboxes/sb-abcdef-0000", httpx.Response(200, json=sandbox_info()))
    fake.on("DELETE", "/v1/sandboxes/sb-abcdef-0000", httpx.Response(204))
    fake.on("POST", "/v1/sandboxes/sb-abcdef-0000/ping",
            httpx.Response(200, json={"pong": True, "pid": 1}))
    c = fake.controller()
    assert c.version()["api"] == "v1"
    assert "forkd_sandboxes_active" in c.metrics()
    assert c.list_snapshots()[0]["tag"] == "py"
    assert c.get_snapshot("py")["dependents"] == ["b"]
    assert c.get_sandbox("sb-abcdef-0000")["pid"] == 100
    assert c.kill_sandbox("sb-abcdef-0000") is None
    assert c.ping("sb-abcdef-0000")["pong"] is True
    assert fake.requests[-1].content == b""


def test_path_segments_are_quoted(fake: FakeDaemon) -> None:
    c = fake.controller()
    with pytest.raises(NotFoundError):
        c.get_sandbox("../snapshots")
    assert fake.requests[-1].url.raw_path == b"/v1/sandboxes/..%2Fsnapshots"


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, BadRequest),
        (401, Unauthorized),
        (404, NotFoundError),
        (409, ConflictError),
        (422, BadRequest),
        (500, ServerError),
        (502, ServerError),
        (503, ServiceUnavailable),
        (504, ServerError),
        (413, ForkdAPIError),
    ],
)
def test_error_mapping(fake: FakeDaemon, status: int, cls: type[ForkdAPIError]) -> None:
    fake.on("GET", "/v1/snapshots/x", httpx.Response(status, json={"error": "it went wrong"}))
    with pytest.raises(cls) as info:
        fake.controller().get_snapshot("x")
    assert type(info.value) is cls
    assert info.value.status == status
    assert info.value.message == "it went wrong"
    assert str(info.value) == "it went wrong"
    assert isinstance(info.value, ForkdError)


def test_service_unavailable_is_a_server_error() -> None:
    assert issubclass(ServiceUnavailable, ServerError)


def test_error_message_fallbacks(fake: FakeDaemon) -> None:
    fake.on(
        "GET", "/v1/snapshots/a",
        httpx.Response(422, json={"detail": [{"loc": ["body", "n"], "msg": "too big"}]}),
    )
    fake.on("GET", "/v1/snapshots/b", httpx.Response(502, text="Bad Gateway from proxy"))
    fake.on("GET", "/v1/snapshots/c", httpx.Response(500))
    c = fake.controller()
    with pytest.raises(BadRequest, match="n: too big"):
        c.get_snapshot("a")
    with pytest.raises(ServerError, match="Bad Gateway from proxy"):
        c.get_snapshot("b")
    with pytest.raises(ServerError, match="HTTP 500"):
        c.get_snapshot("c")


def test_connection_refused_says_how_to_start_the_daemon() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    c = Controller(url="http://127.0.0.1:8889", transport=httpx.MockTransport(refuse))
    with pytest.raises(ForkdConnectionError) as info:
        c.list_sandboxes()
    message = str(info.value)
    assert "not reachable at http://127.0.0.1:8889" in message
    assert "forkd daemon" in message


def test_read_timeout_is_a_timeout_error() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    c = Controller(url="http://forkd.test", transport=httpx.MockTransport(slow))
    with pytest.raises(ForkdTimeoutError) as info:
        c.list_sandboxes()
    assert isinstance(info.value, TimeoutError)


def test_real_connection_refused() -> None:
    # Port 9 (discard) on loopback is closed on any sane test host.
    with pytest.raises(ForkdConnectionError):
        Controller(url="http://127.0.0.1:9", timeout=2).healthz()


# ------------------------------------------------------- waiting for ready


def test_wait_snapshot_ready_polls(fake: FakeDaemon) -> None:
    fake.on(
        "GET", "/v1/snapshots/b",
        httpx.Response(200, json=snap_info("b", status="writing")),
        httpx.Response(200, json=snap_info("b", status="writing")),
        httpx.Response(200, json=snap_info("b", status="ready")),
    )
    info = fake.controller().wait_snapshot_ready("b", interval=0.001)
    assert info["status"] == "ready"
    assert len(fake.requests) == 3


def test_wait_snapshot_ready_without_status_is_ready(fake: FakeDaemon) -> None:
    fake.on("GET", "/v1/snapshots/py", httpx.Response(200, json=snap_info()))
    assert fake.controller().wait_snapshot_ready("py")["tag"] == "py"


def test_wait_snapshot_ready_failed(fake: FakeDaemon) -> None:
    fake.on(
        "GET", "/v1/snapshots/b",
        httpx.Response(200, json=snap_info("b", status="failed", error="disk full")),
    )
    with pytest.raises(SnapshotFailedError, match="disk full"):
        fake.controller().wait_snapshot_ready("b", interval=0.001)


def test_wait_snapshot_ready_timeout(fake: FakeDaemon) -> None:
    fake.on("GET", "/v1/snapshots/b", httpx.Response(200, json=snap_info("b", status="writing")))
    with pytest.raises(ForkdTimeoutError, match="still 'writing'"):
        fake.controller().wait_snapshot_ready("b", timeout=0.05, interval=0.01)


# ---------------------------------------------------- Sandbox and Snapshot


def test_sandbox_context_manager_spawns_and_kills(fake: FakeDaemon) -> None:
    sandbox_routes(fake)
    fake.on("POST", "/v1/sandboxes/sb-abcdef-0000/exec",
            httpx.Response(200, json={"stdout": "hi\n", "stderr": "", "exit_code": 0,
                                      "error": None, "timed_out": False}))
    fake.on("POST", "/v1/sandboxes/sb-abcdef-0000/eval",
            httpx.Response(200, json={"result": "0.0", "error": None, "exit_code": 0}))
    c = fake.controller()
    with Sandbox(tag="py", controller=c) as sb:
        # Spawned on entry, before any use.
        assert [r.method for r in fake.requests] == ["POST"]
        assert sb.id == "sb-abcdef-0000"
        assert sb.info["snapshot_tag"] == "py"
        result = sb.commands.run("echo hi")
        assert result == CommandResult(stdout="hi\n", stderr="", exit_code=0)
        assert result.ok
        assert sb.eval("numpy.zeros(5).sum()") == EvalResult(result="0.0", error=None, exit_code=0)
    assert fake.bodies("POST", "/v1/sandboxes/sb-abcdef-0000/exec") == [
        {"args": ["/bin/sh", "-c", "echo hi"], "timeout_secs": 30}
    ]
    assert (fake.requests[-1].method, fake.requests[-1].url.path) == (
        "DELETE", "/v1/sandboxes/sb-abcdef-0000"
    )


def test_sandbox_spawns_on_entry_not_at_construction(fake: FakeDaemon) -> None:
    sandbox_routes(fake)
    sb = Sandbox(tag="py", controller=fake.controller(), memory_limit_mib=256)
    assert fake.requests == []
    assert repr(sb) == "Sandbox(id=None, owned=False)"
    with pytest.raises(RuntimeError, match=r"not started: use `with Sandbox\(tag=...\)`"):
        _ = sb.id
    with pytest.raises(RuntimeError, match="not started"):
        sb.commands.run("true")
    sb.close()  # nothing spawned, nothing to kill
    assert fake.requests == []
    with sb:
        assert sb.owned and sb.id == "sb-abcdef-0000"
        assert fake.bodies("POST", "/v1/sandboxes") == [
            {"snapshot_tag": "py", "n": 1, "memory_limit_mib": 256}
        ]
    assert fake.calls() == [("POST", "/v1/sandboxes"), ("DELETE", "/v1/sandboxes/sb-abcdef-0000")]


def test_sandbox_start_outside_with(fake: FakeDaemon) -> None:
    sandbox_routes(fake)
    fake.on("GET", "/v1/sandboxes/sb-abcdef-0000",
            httpx.Response(200, json=sandbox_info() | {"memory_limit_mib": 128}))
    sb = Sandbox(tag="py", controller=fake.controller())
    assert sb.start() is sb
    assert sb.start() is sb  # once only
    assert repr(sb) == "Sandbox(id='sb-abcdef-0000', owned=True)"
    assert sb.info["snapshot_tag"] == "py"  # from the spawn answer, no request
    assert "memory_limit_mib" not in sb.info
    assert sb.refresh()["memory_limit_mib"] == 128
    assert sb.info["memory_limit_mib"] == 128
    with sb:  # entering a started sandbox spawns nothing more
        pass
    sb.close()
    assert fake.calls() == [
        ("POST", "/v1/sandboxes"),
        ("GET", "/v1/sandboxes/sb-abcdef-0000"),
        ("DELETE", "/v1/sandboxes/sb-abcdef-0000"),
    ]


def test_sandbox_uses_the_default_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKD_URL", "http://127.0.0.1:7003")
    sb = Sandbox(sandbox_id="sb-abcdef-0000")
    assert sb.controller.url == "http://127.0.0.1:7003"
    assert sb.controller is Sandbox(sandbox_id="sb-abcdef-0001").controller


def test_sandbox_killed_even_when_the_block_raises(fake: FakeDaemon) -> None:
    sandbox_routes(fake)
    with pytest.raises(RuntimeError), Sandbox("py", controller=fake.controller()):
        raise RuntimeError("boom")
    assert fake.requests[-1].method == "DELETE"


def test_attached_sandbox_is_not_killed(fake: FakeDaemon) -> None:
    fake.on("POST", "/v1/sandboxes/sb-abcdef-0007/ping", httpx.Response(200, json={"pong": True}))
    with Sandbox(sandbox_id="sb-abcdef-0007", controller=fake.controller()) as sb:
        assert fake.requests == []  # attaching costs no request
        assert sb.ping() == {"pong": True}
        assert not sb.owned
    assert [r.method for r in fake.requests] == ["POST"]


def test_sandbox_close_tolerates_already_dead(fake: FakeDaemon) -> None:
    fake.on("POST", "/v1/sandboxes", httpx.Response(201, json=[sandbox_info()]))
    fake.on("DELETE", "/v1/sandboxes/sb-abcdef-0000",
            httpx.Response(404, json={"error": "sandbox 'sb-abcdef-0000' is not alive"}))
    sb = Sandbox.create("py", controller=fake.controller())
    sb.close()
    sb.close()  # idempotent
    assert [r.method for r in fake.requests] == ["POST", "DELETE"]


def test_sandbox_needs_exactly_one_of_tag_or_id(fake: FakeDaemon) -> None:
    with pytest.raises(ValueError):
        Sandbox(controller=fake.controller())
    with pytest.raises(ValueError):
        Sandbox("py", sandbox_id="sb-abcdef-0000", controller=fake.controller())


def test_commands_run_reports_timeouts_and_failures(fake: FakeDaemon) -> None:
    fake.on("POST", "/v1/sandboxes/sb-abcdef-0000/exec", httpx.Response(200, json={
        "stdout": "", "stderr": "", "exit_code": 124, "error": "timed out after 1s",
        "timed_out": True, "stdout_truncated": False,
    }))
    sb = Sandbox(sandbox_id="sb-abcdef-0000", controller=fake.controller())
    result = sb.commands.run(["sleep", "10"], timeout=1)
    assert result.timed_out and result.exit_code == 124 and not result.ok
    assert fake.bodies("POST", "/v1/sandboxes/sb-abcdef-0000/exec")[0]["timeout_secs"] == 1


def test_branch_then_fork_waits_for_ready(fake: FakeDaemon) -> None:
    sandbox_routes(fake, n=5)
    fake.on("POST", "/v1/sandboxes/sb-abcdef-0000/branch",
            httpx.Response(201, json=snap_info("b1", branched_from="sb-abcdef-0000",
                                               pause_ms=48, status="writing")))
    fake.on(
        "GET", "/v1/snapshots/b1",
        httpx.Response(200, json=snap_info("b1", status="writing")),
        httpx.Response(200, json=snap_info("b1", status="ready")),
    )
    c = fake.controller()
    with Sandbox(tag="py", controller=c, live_fork=True) as sb:
        branch = sb.branch(mode="live", wait=False)
        assert isinstance(branch, Snapshot)
        assert branch["tag"] == branch.tag == "b1"
        assert branch.status == "writing"
        assert branch.branched_from == "sb-abcdef-0000"
        kids = branch.fork(n=5)
        assert branch.status == "ready"
    calls = [(r.method, r.url.path) for r in fake.requests]
    assert calls[:5] == [
        ("POST", "/v1/sandboxes"),
        ("POST", "/v1/sandboxes/sb-abcdef-0000/branch"),
        ("GET", "/v1/snapshots/b1"),
        ("GET", "/v1/snapshots/b1"),
        ("POST", "/v1/sandboxes"),
    ]
    assert fake.bodies("POST", "/v1/sandboxes/sb-abcdef-0000/branch") == [
        {"mode": "live", "wait": False}
    ]
    assert fake.bodies("POST", "/v1/sandboxes")[1] == {"snapshot_tag": "b1", "n": 5}
    assert [k.id for k in kids] == [f"sb-abcdef-{i:04d}" for i in range(5)]
    assert all(k.owned for k in kids)
    assert kids[0].info["snapshot_tag"] == "b1"


def test_fork_of_ready_snapshot_does_not_poll(fake: FakeDaemon) -> None:
    sandbox_routes(fake)
    snap = Snapshot(snap_info("py"), controller=fake.controller())
    assert snap.status == "ready"  # omitted status means ready
    snap.fork()
    assert [(r.method, r.url.path) for r in fake.requests] == [("POST", "/v1/sandboxes")]


def test_fork_of_failed_snapshot_raises(fake: FakeDaemon) -> None:
    snap = Snapshot(snap_info("b", status="failed", error="boom"), controller=fake.controller())
    with pytest.raises(SnapshotFailedError):
        snap.fork()
    assert fake.requests == []


def test_snapshot_is_a_mapping(fake: FakeDaemon) -> None:
    snap = Snapshot(snap_info("py", pause_ms=12.5), controller=fake.controller())
    assert dict(snap) == snap_info("py", pause_ms=12.5)
    assert snap.get("branched_from") is None
    assert snap.pause_ms == 12.5
    assert "tag" in snap
    assert repr(snap) == "Snapshot(tag='py', status='ready')"


def test_snapshot_from_tag_and_delete(fake: FakeDaemon) -> None:
    fake.on("GET", "/v1/snapshots/py", httpx.Response(200, json=snap_info()))
    fake.on("DELETE", "/v1/snapshots/py", httpx.Response(204))
    c = fake.controller()
    snap = Snapshot.from_tag("py", controller=c)
    snap.delete(cascade=True)
    assert dict(fake.requests[-1].url.params) == {"cascade": "true"}


def test_default_controller_follows_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from forkd.sdk import default_controller

    monkeypatch.setenv("FORKD_URL", "http://127.0.0.1:7001")
    first = default_controller()
    assert first is default_controller()
    assert first.url == "http://127.0.0.1:7001"
    monkeypatch.setenv("FORKD_URL", "http://127.0.0.1:7002")
    assert default_controller().url == "http://127.0.0.1:7002"


# -------------------------------------------------------------------- async


def test_async_controller_same_shapes(fake: FakeDaemon) -> None:
    sandbox_routes(fake)
    fake.on("POST", "/v1/sandboxes/sb-abcdef-0000/branch",
            httpx.Response(201, json=snap_info("b", status="writing")))
    fake.on(
        "GET", "/v1/snapshots/b",
        httpx.Response(200, json=snap_info("b", status="writing")),
        httpx.Response(200, json=snap_info("b", status="ready")),
    )
    fake.on("GET", "/v1/snapshots/nope", httpx.Response(404, json={"error": "no such tag"}))

    async def main() -> None:
        async with fake.async_controller() as c:
            kids = await c.spawn_sandboxes("py", n=2, live_fork=True)
            assert [k["id"] for k in kids] == ["sb-abcdef-0000", "sb-abcdef-0001"]
            branch = await c.branch_sandbox(kids[0]["id"], mode="live", wait=False)
            ready = await c.wait_snapshot_ready(branch["tag"], interval=0.001)
            assert ready["status"] == "ready"
            with pytest.raises(NotFoundError, match="no such tag"):
                await c.get_snapshot("nope")

    asyncio.run(main())
    assert fake.bodies("POST", "/v1/sandboxes") == [{"snapshot_tag": "py", "n": 2, "live_fork": True}]
    assert fake.bodies("POST", "/v1/sandboxes/sb-abcdef-0000/branch") == [
        {"mode": "live", "wait": False}
    ]


def test_async_sandbox_lifecycle(fake: FakeDaemon) -> None:
    sandbox_routes(fake)
    fake.on("POST", "/v1/sandboxes/sb-abcdef-0000/exec",
            httpx.Response(200, json={"stdout": "ok", "stderr": "", "exit_code": 0}))

    async def main() -> None:
        c = fake.async_controller()
        sb = AsyncSandbox(tag="py", controller=c)
        with pytest.raises(RuntimeError, match="not started"):
            _ = sb.id
        async with sb:
            assert sb.id == "sb-abcdef-0000"
            assert (await sb.commands.run("true")).stdout == "ok"
        await c.aclose()

    asyncio.run(main())
    assert [r.method for r in fake.requests] == ["POST", "POST", "DELETE"]


def test_async_sandbox_create_info_refresh_branch(fake: FakeDaemon) -> None:
    sandbox_routes(fake, n=2)
    fake.on("GET", "/v1/sandboxes/sb-abcdef-0000",
            httpx.Response(200, json=sandbox_info() | {"pid": 7}))
    fake.on("POST", "/v1/sandboxes/sb-abcdef-0000/eval",
            httpx.Response(200, json={"result": "2", "error": None, "exit_code": 0}))
    fake.on("POST", "/v1/sandboxes/sb-abcdef-0000/branch",
            httpx.Response(201, json=snap_info("b", status="writing")))
    fake.on("GET", "/v1/snapshots/b", httpx.Response(200, json=snap_info("b", status="ready")))

    async def main() -> None:
        c = fake.async_controller()
        sb = await AsyncSandbox.create("py", controller=c, live_fork=True)
        assert sb.owned and repr(sb) == "AsyncSandbox(id='sb-abcdef-0000', owned=True)"
        assert (await sb.info())["pid"] == 100  # from the spawn answer
        assert (await sb.refresh())["pid"] == 7
        assert await sb.eval("1 + 1") == EvalResult(result="2", error=None, exit_code=0)
        snap = await sb.branch(mode="live", wait=False)
        assert isinstance(snap, AsyncSnapshot) and snap.status == "writing"
        [kid] = await snap.fork(wait_timeout=1)
        assert snap.status == "ready"
        assert isinstance(kid, AsyncSandbox) and kid.owned and kid.id == "sb-abcdef-0000"
        await sb.close()
        await sb.close()  # once only
        await c.aclose()

    asyncio.run(main())
    assert fake.calls() == [
        ("POST", "/v1/sandboxes"),
        ("GET", "/v1/sandboxes/sb-abcdef-0000"),
        ("POST", "/v1/sandboxes/sb-abcdef-0000/eval"),
        ("POST", "/v1/sandboxes/sb-abcdef-0000/branch"),
        ("GET", "/v1/snapshots/b"),
        ("POST", "/v1/sandboxes"),
        ("DELETE", "/v1/sandboxes/sb-abcdef-0000"),
    ]
    assert fake.bodies("POST", "/v1/sandboxes") == [
        {"snapshot_tag": "py", "n": 1, "live_fork": True},
        {"snapshot_tag": "b", "n": 1},
    ]


def test_async_sandbox_default_controller_is_per_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    from forkd.sdk import default_async_controller

    monkeypatch.setenv("FORKD_URL", "http://127.0.0.1:7004")
    sb = AsyncSandbox(sandbox_id="sb-abcdef-0000")  # constructing needs no running loop
    with pytest.raises(RuntimeError):
        default_async_controller()

    async def shared() -> AsyncController:
        assert sb.controller is AsyncSandbox(sandbox_id="sb-abcdef-0001").controller
        assert sb.controller is default_async_controller()
        return sb.controller

    first = asyncio.run(shared())
    assert first.url == "http://127.0.0.1:7004"
    assert asyncio.run(_default_in_a_new_loop()) is not first  # one per event loop


async def _default_in_a_new_loop() -> AsyncController:
    from forkd.sdk import default_async_controller

    return default_async_controller()


# --------------------------------------------------- forking a running sandbox


def fork_info(count: int = 2, tree_id: str | None = None, **extra: Any) -> dict[str, Any]:
    """A ForkResponse whose children are sb-abcdef-0001.. (0000 is the source)."""
    children = [sandbox_info(i + 1, "branch-sb-abcdef-0000-1") for i in range(count)]
    if tree_id is not None:
        for i, child in enumerate(children):
            child["metadata"] = {"fork_tree_id": tree_id, "fork_parent_id": SB, "fork_index": str(i)}
    body: dict[str, Any] = {"parent_id": SB, "snapshot_tag": "branch-sb-abcdef-0000-1",
                            "children": children, "errors": [], "pause_ms": 48, **extra}
    if tree_id is not None:
        body["tree_id"] = tree_id
    return body


def test_spawn_sends_env_child_env_and_metadata(fake: FakeDaemon) -> None:
    sandbox_routes(fake)
    c = fake.controller()
    c.spawn_sandboxes("py", n=2, env={"A": "1"}, child_env=[{"I": "0"}, {"I": "1"}],
                      metadata={"team": "ml"})
    Sandbox.create("py", controller=c, env={"B": "2"}, metadata={"run": "7"})
    Snapshot(snap_info("py"), controller=c).fork(n=1, child_env=[{"C": "3"}])
    assert fake.bodies("POST", "/v1/sandboxes") == [
        {"snapshot_tag": "py", "n": 2, "env": {"A": "1"}, "child_env": [{"I": "0"}, {"I": "1"}],
         "metadata": {"team": "ml"}},
        {"snapshot_tag": "py", "n": 1, "env": {"B": "2"}, "metadata": {"run": "7"}},
        {"snapshot_tag": "py", "n": 1, "child_env": [{"C": "3"}]},
    ]


def test_the_generated_extras_go_with_every_spawn_and_fork(fake: FakeDaemon) -> None:
    """Sandbox.fork and fork_tree take ForkExtra like every other call."""
    sandbox_routes(fake)
    fake.on("POST", f"/v1/sandboxes/{SB}/fork", httpx.Response(201, json=fork_info()))
    fake.on("POST", f"/v1/sandboxes/{SB}/fork-tree", httpx.Response(201, json=fork_info(tree_id="ft-1")))
    c = fake.controller()
    sb = Sandbox.create("py", controller=c, idle_hibernate_secs=60)
    sb.fork(1, idle_pause_secs=30)
    sb.fork_tree(1, idle_hibernate_secs=90)
    assert fake.bodies("POST", "/v1/sandboxes") == [{"snapshot_tag": "py", "n": 1, "idle_hibernate_secs": 60}]
    assert fake.bodies("POST", f"/v1/sandboxes/{SB}/fork") == [{"count": 1, "idle_pause_secs": 30}]
    assert fake.bodies("POST", f"/v1/sandboxes/{SB}/fork-tree") == [{"count": 1, "idle_hibernate_secs": 90}]


def test_list_sandboxes_filters_are_query_parameters(fake: FakeDaemon) -> None:
    fake.on("GET", "/v1/sandboxes", httpx.Response(200, json=[]))
    c = fake.controller()
    c.list_sandboxes()
    c.list_sandboxes(snapshot_tag="py", metadata={"fork_tree_id": "ft-0123456789ab", "team": "ml"})
    assert fake.requests[0].url.query == b""
    assert fake.requests[1].url.params.multi_items() == [
        ("snapshot_tag", "py"), ("metadata", "fork_tree_id=ft-0123456789ab"), ("metadata", "team=ml"),
    ]
    c.list_sandboxes(state="hibernated", limit=100, after="sb-67a1b3-0099")
    assert fake.requests[2].url.params.multi_items() == [
        ("state", "hibernated"), ("after", "sb-67a1b3-0099"), ("limit", "100"),
    ]


def test_fork_bodies_send_only_what_was_set(fake: FakeDaemon) -> None:
    fake.on("POST", f"/v1/sandboxes/{SB}/fork", httpx.Response(201, json=fork_info()))
    fake.on("POST", f"/v1/sandboxes/{SB}/fork-tree",
            httpx.Response(201, json=fork_info(tree_id="ft-0123456789ab")))
    c = fake.controller(timeout=5)
    assert c.fork_sandbox(SB)["parent_id"] == SB
    c.fork_sandbox(SB, 2, per_child_netns=True, memory_limit_mib=256,
                   child_memory_limit_mib=[None, 512], live_fork=True, env={"A": "1"},
                   child_env=[{"I": "0"}, {"I": "1"}], metadata={"team": "ml"}, keep_snapshot=True)
    assert c.fork_tree(SB, 3)["tree_id"] == "ft-0123456789ab"
    assert fake.bodies("POST", f"/v1/sandboxes/{SB}/fork") == [
        {"count": 1},
        {"count": 2, "per_child_netns": True, "memory_limit_mib": 256,
         "child_memory_limit_mib": [None, 512], "live_fork": True, "env": {"A": "1"},
         "child_env": [{"I": "0"}, {"I": "1"}], "metadata": {"team": "ml"}, "keep_snapshot": True},
    ]
    assert fake.bodies("POST", f"/v1/sandboxes/{SB}/fork-tree") == [{"count": 3}]
    # A fork is a branch plus count restores: no read timeout, like a spawn.
    assert [r.extensions["timeout"]["read"] for r in fake.requests] == [None, None, None]


def test_promote_and_checkpoint_bodies(fake: FakeDaemon) -> None:
    promoted = {"winner": sandbox_info(1), "tree_id": "ft-0123456789ab", "deleted": [],
                "replaced_parent": None}
    fake.on("POST", "/v1/sandboxes/sb-abcdef-0001/promote", httpx.Response(200, json=promoted))
    listing = {"sandbox_id": SB, "policy": {"every": 5, "keep": 3, "mode": "diff"}, "calls": 2,
               "checkpoints": [snap_info("ckpt-1", checkpoint_of=SB)]}
    fake.on("POST", f"/v1/sandboxes/{SB}/checkpoints", httpx.Response(200, json=listing))
    fake.on("GET", f"/v1/sandboxes/{SB}/checkpoints", httpx.Response(200, json=listing))
    fake.on("DELETE", f"/v1/sandboxes/{SB}/checkpoints",
            httpx.Response(200, json=listing | {"policy": None}))
    c = fake.controller()
    c.promote_sandbox("sb-abcdef-0001")
    c.promote_sandbox("sb-abcdef-0001", tree_id="ft-0123456789ab", cleanup_siblings=False,
                      replace_parent=True)
    assert fake.bodies("POST", "/v1/sandboxes/sb-abcdef-0001/promote") == [
        {},  # cleanup_siblings is only sent when it departs from the default
        {"tree_id": "ft-0123456789ab", "cleanup_siblings": False, "replace_parent": True},
    ]
    assert c.set_checkpoints(SB, 5) == listing
    c.set_checkpoints(SB, 1, keep=10, mode="live")
    assert fake.bodies("POST", f"/v1/sandboxes/{SB}/checkpoints") == [
        {"every": 5}, {"every": 1, "keep": 10, "mode": "live"}]
    assert c.get_checkpoints(SB)["calls"] == 2
    assert c.delete_checkpoints(SB)["policy"] is None
    assert fake.calls()[-2:] == [("GET", f"/v1/sandboxes/{SB}/checkpoints"),
                                 ("DELETE", f"/v1/sandboxes/{SB}/checkpoints")]


def test_sandbox_fork_result_holds_owned_children(fake: FakeDaemon) -> None:
    body = fork_info(3, errors=[{"index": 1, "error": "child 1 was OOM-killed at restore"}])
    body["children"] = [body["children"][0], body["children"][2]]  # child 1 failed
    fake.on("POST", f"/v1/sandboxes/{SB}/fork", httpx.Response(201, json=body))
    for i in (1, 3):
        fake.on("DELETE", f"/v1/sandboxes/sb-abcdef-{i:04d}", httpx.Response(204))
    sb = Sandbox(sandbox_id=SB, controller=fake.controller())
    result = sb.fork(3, child_env=[{"I": str(i)} for i in range(3)])
    assert isinstance(result, ForkResult)
    assert (result.parent_id, result.snapshot_tag, result.pause_ms, result.tree_id) == (
        SB, "branch-sb-abcdef-0000-1", 48, None)
    assert [k.id for k in result.children] == ["sb-abcdef-0001", "sb-abcdef-0003"]
    assert all(isinstance(k, Sandbox) and k.owned for k in result.children)
    assert result.errors == [ForkFailure(1, "child 1 was OOM-killed at restore")]
    assert not result.ok
    assert {i: k.id for i, k in result.by_index().items()} == {0: "sb-abcdef-0001", 2: "sb-abcdef-0003"}
    assert result.children[0].info["snapshot_tag"] == "branch-sb-abcdef-0000-1"  # no request
    for kid in result.children:
        kid.close()
    assert not sb.owned  # attached: the source is not the caller's to kill
    assert fake.calls() == [("POST", f"/v1/sandboxes/{SB}/fork"),
                            ("DELETE", "/v1/sandboxes/sb-abcdef-0001"),
                            ("DELETE", "/v1/sandboxes/sb-abcdef-0003")]


def test_fork_tree_indexes_come_from_metadata(fake: FakeDaemon) -> None:
    body = fork_info(2, tree_id="ft-0123456789ab")
    body["children"].reverse()  # the stamped fork_index wins over the listing order
    fake.on("POST", f"/v1/sandboxes/{SB}/fork-tree", httpx.Response(201, json=body))
    result = Sandbox(sandbox_id=SB, controller=fake.controller()).fork_tree(2)
    assert result.tree_id == "ft-0123456789ab" and result.ok
    assert {i: k.id for i, k in result.by_index().items()} == {0: "sb-abcdef-0001", 1: "sb-abcdef-0002"}


def test_promote_result(fake: FakeDaemon) -> None:
    fake.on("POST", "/v1/sandboxes/sb-abcdef-0001/promote", httpx.Response(200, json={
        "winner": sandbox_info(1) | {"pid": 9}, "tree_id": "ft-0123456789ab",
        "deleted": [{"id": "sb-abcdef-0002", "deleted": True},
                    {"id": SB, "deleted": False, "error": "busy"}],
        "replaced_parent": None,
    }))
    kid = Sandbox(sandbox_id="sb-abcdef-0001", controller=fake.controller())
    result = kid.promote(replace_parent=True)
    assert isinstance(result, PromoteResult)
    assert result.winner is kid and kid.info["pid"] == 9  # refreshed from the answer
    assert result.deleted == [Deletion("sb-abcdef-0002", True), Deletion(SB, False, "busy")]
    assert not result.ok
    assert fake.body() == {"replace_parent": True}


def test_sandbox_checkpoints_are_snapshots(fake: FakeDaemon) -> None:
    listing = {"sandbox_id": SB, "policy": {"every": 2, "keep": 1, "mode": "diff"}, "calls": 3,
               "checkpoints": [snap_info("ckpt-1", checkpoint_of=SB)], "last_error": "disk full"}
    fake.on("POST", f"/v1/sandboxes/{SB}/checkpoints", httpx.Response(200, json=listing))
    fake.on("DELETE", f"/v1/sandboxes/{SB}/checkpoints",
            httpx.Response(200, json=listing | {"policy": None, "last_error": None}))
    sandbox_routes(fake)
    c = fake.controller()
    sb = Sandbox(sandbox_id=SB, controller=c)
    kept = sb.set_checkpoints(2, keep=1)
    assert isinstance(kept, Checkpoints)
    assert kept.policy == CheckpointPolicy(every=2, keep=1, mode="diff")
    assert (kept.sandbox_id, kept.calls, kept.last_error) == (SB, 3, "disk full")
    [snap] = kept.snapshots
    assert isinstance(snap, Snapshot) and snap.tag == "ckpt-1" and snap.controller is c
    [back] = snap.fork()  # going back to the checkpoint
    assert fake.body() == {"snapshot_tag": "ckpt-1", "n": 1}
    assert back.owned
    assert sb.delete_checkpoints().policy is None


def test_twins_concurrently() -> None:
    from forkd.sdk._twins import concurrently

    assert concurrently(lambda x: x * 2, [1, 2, 3]) == [2, 4, 6]
    assert concurrently(lambda x: x, []) == []
    with pytest.raises(ValueError, match="limit"):
        concurrently(lambda x: x, [1], limit=0)

    async def double(x: int) -> int:
        await asyncio.sleep(0)
        return x * 2

    assert asyncio.run(concurrently(double, [1, 2, 3], limit=2)) == [2, 4, 6]
    assert asyncio.run(concurrently(double, [])) == []


def test_twins_concurrently_bounds_the_calls_in_flight() -> None:
    from forkd.sdk._twins import concurrently

    in_flight = peak = 0
    lock = threading.Lock()

    def work(x: int) -> int:
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        time.sleep(0.05)  # long enough for the second thread to start under load
        with lock:
            in_flight -= 1
        return x

    assert concurrently(work, list(range(6)), limit=2) == list(range(6))
    assert peak == 2

    async def awork(x: int) -> int:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return x

    peak = 0
    assert asyncio.run(concurrently(awork, list(range(6)), limit=3)) == list(range(6))
    assert peak == 3


# ------------------------------------------------------------------ run_code

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
CELL_EVENTS: list[dict[str, Any]] = [
    {"type": "stdout", "text": "1\n"},
    {"type": "stderr", "text": "warn\n"},
    {"type": "stdout", "text": "2\n"},
    {"type": "result", "data": {"image/png": PNG, "text/plain": "<Figure>", "e2b/chart": {"type": "line"},
                                "application/x-other": "x"}, "is_main_result": False},
    {"type": "result", "data": {"text/plain": "42", "text/html": "<b>42</b>"}, "is_main_result": True},
    {"type": "error", "name": "ZeroDivisionError", "value": "division by zero",
     "traceback": "Traceback ...\nZeroDivisionError: division by zero"},
    {"type": "end", "execution_count": 3, "timed_out": False, "restarted": False},
]
CODE_PATH = "/v1/sandboxes/sb-abcdef-0000/code"


def ndjson_reply(events: list[dict[str, Any]]) -> httpx.Response:
    return httpx.Response(200, content="".join(json.dumps(e) + "\n" for e in events).encode(),
                          headers={"content-type": "application/x-ndjson"})


def check_execution(execution: Execution, seen: list[tuple[str, Any]]) -> None:
    assert execution.logs.stdout == ["1\n", "2\n"] and execution.logs.stderr == ["warn\n"]
    assert execution.text == "42"
    figure, main = execution.results
    assert base64.b64decode(figure.png or "")[:8] == b"\x89PNG\r\n\x1a\n"
    assert figure.chart == {"type": "line"} and figure.extra == {"application/x-other": "x"}
    assert not figure.is_main_result and figure.formats() == ["text", "png", "chart", "application/x-other"]
    assert main.is_main_result and main.html == "<b>42</b>"
    assert execution.error == ExecutionError("ZeroDivisionError", "division by zero",
                                             "Traceback ...\nZeroDivisionError: division by zero")
    assert (execution.execution_count, execution.timed_out, execution.restarted) == (3, False, False)
    # Each callback, in the stream's order.
    assert [kind for kind, _ in seen] == ["stdout", "stderr", "stdout", "result", "result", "error"]
    assert seen[0][1] == "1\n" and seen[3][1] is figure and seen[5][1] is execution.error


def callbacks(seen: list[tuple[str, Any]]) -> dict[str, Any]:
    return {f"on_{kind}": (lambda value, kind=kind: seen.append((kind, value)))
            for kind in ("stdout", "stderr", "result", "error")}


def test_run_code_sync(fake: FakeDaemon) -> None:
    fake.on("POST", CODE_PATH, ndjson_reply(CELL_EVENTS))
    seen: list[tuple[str, Any]] = []
    sb = Sandbox(sandbox_id="sb-abcdef-0000", controller=fake.controller())
    execution = sb.run_code("print(1)", language="python", timeout=5, env={"A": "1"}, **callbacks(seen))
    check_execution(execution, seen)
    # Only the fields set are sent; the route has no read timeout (the cell may run long).
    assert fake.body() == {"code": "print(1)", "language": "python", "timeout": 5, "env": {"A": "1"}}
    assert fake.requests[-1].extensions["timeout"]["read"] is None
    assert Sandbox(sandbox_id="sb-abcdef-0000", controller=fake.controller()).run_code("x").text == "42"
    assert fake.body() == {"code": "x"}


def test_run_code_async(fake: FakeDaemon) -> None:
    fake.on("POST", CODE_PATH, ndjson_reply(CELL_EVENTS))

    async def main() -> None:
        seen: list[tuple[str, Any]] = []
        async with fake.async_controller() as c:
            sb = AsyncSandbox(sandbox_id="sb-abcdef-0000", controller=c)
            check_execution(await sb.run_code("print(1)", context="ctx", **callbacks(seen)), seen)
            assert fake.body() == {"code": "print(1)", "context": "ctx"}
            events = [e async for e in c.code_stream("sb-abcdef-0000", "print(1)")]
            assert [e["type"] for e in events] == [e["type"] for e in CELL_EVENTS]

    asyncio.run(main())


def test_run_code_errors(fake: FakeDaemon) -> None:
    sb = Sandbox(sandbox_id="sb-abcdef-0000", controller=fake.controller())
    fake.on("POST", CODE_PATH, httpx.Response(409, json={"error": "sandbox has no Jupyter kernel"}))
    with pytest.raises(ConflictError, match="no Jupyter kernel"):
        sb.run_code("1")
    fake.routes.clear()
    refused = {"type": "end", "execution_count": None, "timed_out": False, "restarted": False,
               "error": "context 'default-bash' runs bash, not python"}
    fake.on("POST", CODE_PATH, ndjson_reply([refused]))
    with pytest.raises(ServerError, match="runs bash"):
        sb.run_code("1")
