"""Unit tests of the REST layer: validation, auth, error shapes, limits, metrics, audit.

They run the daemon's app on the real ``Runtime`` over the test doubles of QEMU and the guest
agent (tests/fakes/app.py: ``daemon_app``): every route reaches the real controller, and only
the VM's process, its QMP and its guest agent are stand-ins. Faults are injected where the
guest answers (the agent gateway), and what the routes asked of the runtime is read by a spy
that lets every call through. Real-VM behaviour is covered by the integration tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import hypothesis
import pytest
import schemathesis
from fastapi.testclient import TestClient
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import positive_data_acceptance
from starlette.types import Message, Receive, Scope, Send

from forkd.api.app import create_app
from forkd.api.auth import check_bind_safety, load_token, validate_token
from forkd.api.schemas.common import SANDBOX_ID_PATTERN, TAG_PATTERN
from forkd.api.server import validate_settings
from forkd.api.settings import ConfigError, Settings, parse_bind
from forkd.controller.options import SpawnOptions
from forkd.controller.runtime import Runtime
from forkd.errors import NO_CAPACITY, Busy, Conflict, GuestError, NotFound
from forkd.guest.client import AgentClient
from tests.fakes.app import AUTH, TOKEN, Daemon, daemon_app
from tests.fakes.vmm import SLOW_DISK

SB = "sb-67a1b3-0000"  # a well-formed id no daemon here has


# --------------------------------------------------------------------- fixtures


class Call(NamedTuple):
    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class Calls(list[Call]):
    """What the routes asked of the runtime: each method still runs, the spy only writes it down."""

    def names(self) -> list[str]:
        return [c.name for c in self]

    def named(self, name: str) -> list[Call]:
        return [c for c in self if c.name == name]


def spy(monkeypatch: pytest.MonkeyPatch, owner: object, calls: Calls, prefix: str = "") -> None:
    """Write down every call of ``owner``'s public methods in ``calls`` (for the test's length)."""
    for name in dir(type(owner)):
        if name.startswith("_") or not inspect.isfunction(getattr(type(owner), name, None)):
            continue  # properties (the sub-APIs) and class attributes are read, not called
        real = getattr(owner, name)

        def called(*args: Any, _name: str = prefix + name, _real: Any = real, **kwargs: Any) -> Any:
            calls.append(Call(_name, args, kwargs))
            return _real(*args, **kwargs)

        monkeypatch.setattr(owner, name, called)


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture(scope="module")
def anon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon whose client sends no token of its own (for the auth tests); nothing in it."""
    with daemon_app(tmp_path_factory.mktemp("anon"), snapshots=()) as d:
        yield d


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the tests whose requests are refused (they change nothing): snapshot "py"
    and a sandbox spawned from it."""
    with daemon_app(tmp_path_factory.mktemp("shared"), headers=AUTH) as d:
        d.sandbox("py")
        yield d


@pytest.fixture
def shared_client(shared: Daemon) -> TestClient:
    return shared.client


@pytest.fixture
def shared_sb(shared: Daemon) -> str:
    return shared.runtime.list_sandboxes()[0].id


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon of the test's own: snapshot "py" and a live-fork sandbox spawned from it (``sb``)."""
    with daemon_app(tmp_path, headers=AUTH) as d:
        d.run(d.runtime.spawn, "py", 1, SpawnOptions(live_fork=True))
        yield d


@pytest.fixture
def sb(daemon: Daemon) -> str:
    return daemon.runtime.list_sandboxes()[0].id


@pytest.fixture
def client(daemon: Daemon) -> TestClient:
    return daemon.client


@pytest.fixture
def calls(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> Calls:
    """The runtime's calls (its own methods and its hibernation owner's) from here on."""
    log = Calls()
    spy(monkeypatch, daemon.runtime, log)
    spy(monkeypatch, daemon.runtime.hibernation, log, "hibernation.")
    return log


@pytest.fixture
def refused(shared: Daemon, monkeypatch: pytest.MonkeyPatch) -> Calls:
    """The shared daemon's runtime calls during the test (the test asserts there were none)."""
    log = Calls()
    spy(monkeypatch, shared.runtime, log)
    return log


def assert_error(resp: httpx.Response, status: int, contains: str = "") -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}, body
    assert isinstance(body["error"], str) and body["error"]
    assert contains.lower() in body["error"].lower(), body["error"]
    return body["error"]


# ------------------------------------------------------------------------- auth


def test_healthz_needs_no_token(anon: Daemon) -> None:
    resp = anon.client.get("/healthz")
    assert resp.status_code == 200
    assert resp.json() == {"ok": True}


@pytest.mark.parametrize("offer", [
    {}, {"subprotocols": ["forkd.terminal.v1"]}, {"subprotocols": ["forkd.terminal.v1", "bearer.d3Jvbmc"]},
    {"subprotocols": ["forkd.terminal.v1", "bearer.!!"]}, {"headers": {"Authorization": "Bearer wrong"}},
])
def test_a_websocket_needs_the_token_too(anon: Daemon, offer: dict[str, Any]) -> None:
    """Before any WebSocket route runs (a terminal), in a header or as a browser's subprotocol."""
    from starlette.websockets import WebSocketDisconnect

    with pytest.raises(WebSocketDisconnect) as refused, \
            anon.client.websocket_connect(f"/v1/sandboxes/{SB}/terminal", **offer):
        pass
    assert refused.value.code == 1008


@pytest.mark.parametrize("path", ["/version", "/metrics", "/v1/snapshots", "/openapi.json", "/no/such/route"])
@pytest.mark.parametrize(
    "header", [None, "Bearer wrong-token-0123456789", f"Basic {TOKEN}", "Bearer", f"Bearer {TOKEN}x"]
)
def test_everything_else_needs_the_token(anon: Daemon, path: str, header: str | None) -> None:
    headers = {"Authorization": header} if header is not None else {}
    resp = anon.client.get(path, headers=headers)
    assert_error(resp, 401, "missing or invalid bearer token")
    assert resp.headers["www-authenticate"].startswith("Bearer")


def test_valid_token_is_accepted(shared: Daemon) -> None:
    resp = shared.client.get("/version")
    assert resp.status_code == 200
    assert resp.json() == {"version": "0.1.0", "api": "v1"}


def test_no_token_file_means_no_auth(tmp_path: Path) -> None:
    with daemon_app(tmp_path, token=False, snapshots=()) as d:
        assert d.app.state.settings.token_file is None
        assert d.client.get("/v1/snapshots").status_code == 200


@pytest.mark.parametrize(
    "token",
    [
        "",
        "changeme",
        "CHANGE_ME",
        "token",
        "secret",
        "<token>",
        "<your-token-here>",
        "xxxxxxxxxxxxxxxxxxxxxxxx",
        "0000000000000000",
        "changemechangemechangeme",
        "please-changeme-now-1234",
        "secretsecretsecretsecret",
        "tokentokentokentoken",
        "a8Fk2pQz",  # random-looking but too short
        "has space in the middle-12345678",
    ],
)
def test_placeholder_and_weak_tokens_are_refused(tmp_path: Path, token: str) -> None:
    path = tmp_path / "token"
    path.write_text(token + "\n")
    with pytest.raises(ConfigError):
        load_token(path)
    with pytest.raises(ConfigError):
        create_app(Settings(token_file=path, audit_log=tmp_path / "a.log"))


def test_token_file_is_stripped_and_real_tokens_pass(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(f"  {TOKEN}\n\n")
    assert load_token(path) == TOKEN
    assert validate_token("Zq8-r1_Vb3xK9mWc") == "Zq8-r1_Vb3xK9mWc"


def test_missing_token_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_token(tmp_path / "nope")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "example.com"])
def test_non_loopback_bind_without_token_is_refused(host: str, token_file: Path) -> None:
    with pytest.raises(ConfigError, match="without a bearer token"):
        check_bind_safety(Settings(host=host))
    check_bind_safety(Settings(host=host, token_file=token_file))  # fine with a token


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "localhost"])
def test_loopback_bind_without_token_is_allowed(host: str) -> None:
    check_bind_safety(Settings(host=host))


def test_validate_settings_tls_both_or_neither(tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("not a cert")
    with pytest.raises(ConfigError, match="both"):
        validate_settings(Settings(tls_cert=cert))
    with pytest.raises(ConfigError, match="does not exist"):
        validate_settings(Settings(tls_cert=cert, tls_key=tmp_path / "missing.pem"))
    key = tmp_path / "key.pem"
    key.write_text("not a key")
    with pytest.raises(ConfigError, match="cannot load TLS"):
        validate_settings(Settings(tls_cert=cert, tls_key=key))
    validate_settings(Settings())  # loopback, no TLS, no token: allowed


# ---------------------------------------------------------------- settings


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FORKD_BIND", "0.0.0.0:9000")
    monkeypatch.setenv("FORKD_TOKEN_FILE", str(tmp_path / "t"))
    monkeypatch.setenv("FORKD_DATA_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("FORKD_KEEP_SANDBOXES", "yes")
    monkeypatch.setenv("FORKD_BRANCH_CONCURRENCY", "7")
    monkeypatch.delenv("FORKD_TLS_CERT", raising=False)
    s = Settings.from_env()
    assert (s.host, s.port, s.keep_sandboxes, s.branch_concurrency) == ("0.0.0.0", 9000, True, 7)
    assert s.token_file == tmp_path / "t"
    assert s.audit_log_path() == tmp_path / "d" / "audit.log"
    assert s.max_body_bytes == 1024 * 1024
    assert s.tls_cert is None and s.url == "http://0.0.0.0:9000"


def test_settings_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FORKD_BIND", "FORKD_TOKEN_FILE", "FORKD_KEEP_SANDBOXES", "FORKD_BRANCH_CONCURRENCY"):
        monkeypatch.delenv(name, raising=False)
    s = Settings.from_env()
    assert (s.host, s.port, s.keep_sandboxes, s.branch_concurrency) == ("127.0.0.1", 8889, False, 4)


def test_parse_bind() -> None:
    assert parse_bind("[::1]:8889") == ("::1", 8889)
    assert parse_bind("localhost:1") == ("localhost", 1)
    for bad in ("8889", "host:", "host:x", ":80", "::1:8889", "h:70000"):
        with pytest.raises(ConfigError):
            parse_bind(bad)


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("body", "contains"),
    [
        ({"snapshot_tag": "py", "n": 0}, "n:"),
        ({"snapshot_tag": "py", "n": 1001}, "n:"),
        ({"snapshot_tag": "py", "n": "5"}, "n:"),
        ({"snapshot_tag": "py", "n": 2.5}, "n:"),
        ({"snapshot_tag": "py", "per_child_netns": "true"}, "per_child_netns"),
        ({"snapshot_tag": "py", "memory_limit_mib": 0}, "memory_limit_mib"),
        ({"n": 1}, "snapshot_tag"),
        ({"snapshot_tag": ".hidden"}, "snapshot_tag"),
        ({"snapshot_tag": "a" * 65}, "snapshot_tag"),
        ({"snapshot_tag": "py", "snapshot-tag": "py"}, "unknown field 'snapshot-tag'"),
        ([{"snapshot_tag": "py"}], "JSON object"),
    ],
)
def test_spawn_validation_is_400(shared_client: TestClient, refused: Calls, body: Any,
                                 contains: str) -> None:
    assert_error(shared_client.post("/v1/sandboxes", json=body), 400, contains)
    assert "spawn" not in refused.names()


def test_malformed_bodies_are_400(shared_client: TestClient) -> None:
    client = shared_client
    assert_error(
        client.post("/v1/sandboxes", content=b"{nope", headers={"Content-Type": "application/json"}),
        400,
        "not valid JSON",
    )
    assert_error(client.post("/v1/sandboxes"), 400, "body is required")
    # Without a JSON Content-Type the body is not parsed (CSRF protection).
    assert_error(
        client.post(
            "/v1/sandboxes", content=b'{"snapshot_tag": "py"}', headers={"Content-Type": "text/plain"}
        ),
        400,
        "application/json",
    )


@pytest.mark.parametrize(
    ("body", "contains"),
    [
        ({"args": []}, "args"),
        ({"args": "ls"}, "args"),
        ({"args": ["ls"], "timeout_secs": 0}, "timeout_secs"),
        ({"args": ["ls"], "timeout_secs": -1}, "timeout_secs"),
        ({"args": ["ls", "a\x00b"]}, "NUL"),
        ({"args": ["ls"], "env": {"A=B": "c"}}, "env"),
        ({"args": ["ls"], "env": {"A": 1}}, "env"),
        ({"args": ["ls"], "shell": True}, "unknown field 'shell'"),
    ],
)
def test_exec_validation_is_400(shared_client: TestClient, shared_sb: str, refused: Calls, body: Any,
                                contains: str) -> None:
    assert_error(shared_client.post(f"/v1/sandboxes/{shared_sb}/exec", json=body), 400, contains)
    assert "exec" not in refused.names()


def test_eval_validation_is_400(shared_client: TestClient, shared_sb: str, refused: Calls) -> None:
    client, url = shared_client, f"/v1/sandboxes/{shared_sb}/eval"
    assert_error(client.post(url, json={}), 400, "code")
    assert_error(client.post(url, json={"code": ""}), 400, "code")
    assert_error(client.post(url, json={"code": "1", "x": 1}), 400, "unknown field")
    assert "eval" not in refused.names()


@pytest.mark.parametrize(
    "bad_id",
    ["..%2F..%2Fetc", "sb-67a1b3-0000%0A", "-x", ".hidden", "a%20b", "a" * 49, "sb%2C1", "sb:1"],
)
@pytest.mark.parametrize(
    ("method", "suffix"),
    [
        ("GET", ""),
        ("DELETE", ""),
        ("POST", "/ping"),
        ("POST", "/exec"),
        ("POST", "/eval"),
        ("POST", "/branch"),
    ],
)
def test_bad_sandbox_ids_are_rejected_before_lookup(
    shared_client: TestClient, refused: Calls, bad_id: str, method: str, suffix: str
) -> None:
    body = {"args": ["ls"]} if suffix == "/exec" else {"code": "1"} if suffix == "/eval" else None
    resp = shared_client.request(method, f"/v1/sandboxes/{bad_id}{suffix}", json=body)
    assert resp.status_code in (400, 404), resp.text
    assert set(resp.json()) == {"error"}
    assert refused == []


@pytest.mark.parametrize("unknown_id", ["sb-nope-0000", "sb-67A1B3-0000", "x", "host1.sb-67a1b3-0000"])
def test_well_formed_unknown_ids_are_404(shared_client: TestClient, unknown_id: str) -> None:
    """The seeds: 404 for a sandbox that is not alive, whatever its id looks like."""
    for method, suffix, body in (("GET", "", None), ("DELETE", "", None), ("POST", "/ping", None),
                                 ("POST", "/exec", {"args": ["ls"]}), ("POST", "/branch", None)):
        assert_error(shared_client.request(method, f"/v1/sandboxes/{unknown_id}{suffix}", json=body), 404,
                     "not alive")


@pytest.mark.parametrize("bad_tag", [".hidden", "-x", "a" * 65, "py%0A", "a%20b", "a%2Fb"])
def test_bad_tags_in_path_are_rejected_before_lookup(
    shared_client: TestClient, refused: Calls, bad_tag: str
) -> None:
    for method in ("GET", "DELETE"):
        resp = shared_client.request(method, f"/v1/snapshots/{bad_tag}")
        assert resp.status_code in (400, 404), resp.text
        assert set(resp.json()) == {"error"}
    assert refused == []


def test_bad_query_parameter_is_400(shared_client: TestClient, refused: Calls) -> None:
    assert_error(shared_client.delete("/v1/snapshots/py?cascade=perhaps"), 400, "cascade")
    assert refused == []


# --------------------------------------------------------------- snapshots


def test_create_snapshot_passes_spec(daemon: Daemon, client: TestClient, calls: Calls) -> None:
    resp = client.post(
        "/v1/snapshots",
        json={"tag": "py2", "mem_mib": 256, "vcpus": 2, "boot_wait_secs": 10, "setup": [["true"]]},
    )
    assert resp.status_code == 201, resp.text
    record = daemon.runtime.get_snapshot("py2")
    assert resp.json() == {
        "tag": "py2",
        "dir": str(daemon.data / "snapshots" / "py2"),
        "created_at_unix": record.created_at_unix,
        "status": "ready",
    }
    assert calls[0].name == "create_snapshot"
    spec = calls[0].args[0]
    assert (spec.tag, spec.mem_mib, spec.vcpus, spec.boot_wait_secs, spec.setup) == (
        "py2",
        256,
        2,
        10,
        [["true"]],
    )
    assert spec.image == "default" and spec.rw is True  # SnapshotSpec's own defaults


@pytest.mark.parametrize(
    ("body", "contains"),
    [
        ({"tag": "x", "mem_mib": 64}, "mem_mib"),
        ({"tag": "x", "mem_mib": 20000}, "mem_mib"),
        ({"tag": "x", "vcpus": 9}, "vcpus"),
        ({"tag": "x", "boot_wait_secs": 0}, "boot_wait_secs"),
        ({"tag": "x", "setup": [[]]}, "setup"),
        ({"tag": "x", "setup": ["ls"]}, "setup"),
        ({"tag": "x", "warm_imports": ["os; rm -rf"]}, "warm_imports"),
        ({"tag": "x", "tap": "a/b"}, "tap"),
        ({"tag": "x", "rw": "yes"}, "rw"),
        ({"tag": "x/y"}, "tag"),
        ({"tag": "x", "firecracker": True}, "unknown field"),
    ],
)
def test_create_snapshot_validation(shared_client: TestClient, refused: Calls, body: Any,
                                    contains: str) -> None:
    assert_error(shared_client.post("/v1/snapshots", json=body), 400, contains)
    assert refused == []


def test_conflicts_map_to_409(shared_client: TestClient) -> None:
    assert_error(shared_client.post("/v1/snapshots", json={"tag": "py"}), 409, "already exists")


def test_get_snapshot_includes_lineage(daemon: Daemon, client: TestClient, sb: str) -> None:
    daemon.run(daemon.runtime.branch, sb, "child")  # a snapshot whose parent is "py"
    resp = client.get("/v1/snapshots/py")
    assert resp.status_code == 200
    body = resp.json()
    assert body["tag"] == "py" and body["ancestors"] == [] and body["dependents"] == ["child"]
    assert body["sandboxes"] == [sb]
    assert client.get("/v1/snapshots/child").json()["ancestors"] == ["py"]
    assert "branched_from" not in body and "pause_ms" not in body  # omitted when unset


def test_list_and_delete_snapshot(daemon: Daemon, client: TestClient, calls: Calls) -> None:
    assert [s["tag"] for s in client.get("/v1/snapshots").json()] == ["py"]
    resp = client.delete("/v1/snapshots/py?cascade=true&force=1")
    assert resp.status_code == 204 and resp.content == b""
    assert calls.named("delete_snapshot") == [("delete_snapshot", ("py",), {"cascade": True, "force": True})]
    assert daemon.runtime.list_snapshots() == [] and daemon.runtime.list_sandboxes() == []  # forced
    assert_error(client.delete("/v1/snapshots/py"), 404, "not registered")
    assert_error(client.get("/v1/snapshots/py"), 404, "not registered")


# --------------------------------------------------------------- sandboxes


def test_spawn_list_get_kill(client: TestClient) -> None:
    resp = client.post("/v1/sandboxes", json={"snapshot_tag": "py", "n": 2})
    assert resp.status_code == 201, resp.text
    infos = resp.json()
    ids = [i["id"] for i in infos]
    assert len(ids) == 2 and all(re.fullmatch(r"sb-[0-9a-f]{6}-000[01]", i) for i in ids), ids
    assert infos[0]["netns"] is None  # explicit null is kept
    assert "memory_limit_mib" not in infos[0]  # absent stays absent
    assert infos[0]["guest_addr"].startswith("unix:")
    assert len(client.get("/v1/sandboxes").json()) == 3
    assert client.get(f"/v1/sandboxes/{ids[1]}").json()["snapshot_tag"] == "py"
    assert client.delete(f"/v1/sandboxes/{ids[1]}").status_code == 204
    assert_error(client.get(f"/v1/sandboxes/{ids[1]}"), 404, "not alive")
    assert_error(client.post("/v1/sandboxes", json={"snapshot_tag": "nope"}), 404, "not registered")


def test_ping_exec_eval(daemon: Daemon, client: TestClient, sb: str, calls: Calls) -> None:
    ping = client.post(f"/v1/sandboxes/{sb}/ping")
    assert ping.status_code == 200
    assert {k: ping.json()[k] for k in ("pong", "numpy_version", "pid")} == {
        "pong": True, "numpy_version": "1.24.2", "pid": 1}  # the scripted guest's answer, passed on
    resp = client.post(
        f"/v1/sandboxes/{sb}/exec",
        json={"args": ["python3", "-c", "print(2+2)"], "env": {"A": "1"}, "cwd": "/tmp", "stdin": "x"},
    )
    assert resp.status_code == 200
    body = resp.json()
    body.pop("duration_ms")  # the guest's own measure
    assert body == {"stdout": "python3 -c print(2+2)", "stderr": "", "exit_code": 0, "error": None,
                    "timed_out": False}  # the scripted guest echoes its args
    assert calls.named("exec")[-1].kwargs == {"timeout_secs": 30, "env": {"A": "1"}, "cwd": "/tmp",
                                              "stdin": "x", "user": None}
    asked = daemon.guest_requests(sb, "exec")[-1]
    assert (asked["args"], asked["env"], asked["cwd"], asked["stdin"], asked["timeout_secs"]) == (
        ["python3", "-c", "print(2+2)"], {"A": "1"}, "/tmp", "x", 30)
    resp = client.post(f"/v1/sandboxes/{sb}/exec", json={"args": ["id"], "user": "user"})
    assert resp.status_code == 200 and calls.named("exec")[-1].kwargs["user"] == "user"
    assert daemon.guest_requests(sb, "exec")[-1]["user"] == "user"
    for bad in ("", "a/b", "x" * 40, 7):
        resp = client.post(f"/v1/sandboxes/{sb}/exec", json={"args": ["id"], "user": bad})
        assert resp.status_code == 400, (bad, resp.text)
    resp = client.get(f"/v1/sandboxes/{sb}/files/stat", params={"path": "/", "user": "a b"})
    assert resp.status_code == 400, resp.text
    resp = client.post(f"/v1/sandboxes/{sb}/eval", json={"code": "(2 + 3) * 4"})
    assert resp.json() == {"result": "20", "error": None, "exit_code": 0}
    assert_error(client.post("/v1/sandboxes/sb-000000-0000/ping"), 404, "not alive")


def fail_at_the_agent(daemon: Daemon, monkeypatch: pytest.MonkeyPatch, action: str,
                      answer: Exception | dict[str, Any]) -> None:
    """The sandbox's agent raises ``answer`` (or replies it) for ``action``; every other call
    reaches the guest as before. Patched at the agent's transport, under the typed calls, so a
    forged reply still meets their checks."""
    del daemon  # the one daemon's agents are the ones patched: the fixture orders the set-up
    real_call = AgentClient.call

    async def call(self: AgentClient, act: str, timeout: float | None = 60.0, **args: Any) -> dict[str, Any]:
        if act != action:
            return await real_call(self, act, timeout, **args)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(AgentClient, "call", call)


@pytest.mark.parametrize(
    ("exc", "status"),
    [(GuestError("agent did not answer"), 502), (Busy("full"), 503), (Conflict("c"), 409)],
)
def test_forkd_errors_keep_their_status(
    daemon: Daemon, client: TestClient, sb: str, monkeypatch: pytest.MonkeyPatch, exc: Exception, status: int
) -> None:
    fail_at_the_agent(daemon, monkeypatch, "ping", exc)
    assert assert_error(client.post(f"/v1/sandboxes/{sb}/ping"), status) == str(exc)


def test_unexpected_errors_are_500_with_error_body(daemon: Daemon, client: TestClient, sb: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    fail_at_the_agent(daemon, monkeypatch, "ping", RuntimeError("boom"))
    assert assert_error(client.post(f"/v1/sandboxes/{sb}/ping"), 500) == "internal error: RuntimeError: boom"


def test_unknown_route_and_method(shared_client: TestClient, shared_sb: str) -> None:
    client = shared_client
    assert_error(client.get("/v2/snapshots"), 404, "no such route")
    resp = client.put("/v1/snapshots")
    assert_error(resp, 405, "not allowed")
    # All methods of the path, not just those of the first route that matched.
    assert resp.headers["allow"] == "GET, POST"
    assert client.get(f"/v1/sandboxes/{shared_sb}/exec").headers["allow"] == "POST"


def test_integral_floats_are_integers(client: TestClient, calls: Calls) -> None:
    # JSON Schema's "integer" admits 2.0 (and JavaScript cannot tell it from 2).
    resp = client.post("/v1/sandboxes", json={"snapshot_tag": "py", "n": 2.0})
    assert resp.status_code == 201 and len(resp.json()) == 2
    [spawn] = calls.named("spawn")
    assert spawn.args[:2] == ("py", 2) and type(spawn.args[1]) is int


# ------------------------------------------------------------------ branch


@pytest.mark.parametrize(
    ("body", "mode", "wait"),
    [
        (None, "full", True),
        ({}, "full", True),
        ({"diff": True}, "diff", True),
        ({"diff": False}, "full", True),
        ({"mode": "diff"}, "diff", True),
        ({"mode": "live", "wait": False}, "live", False),
        ({"mode": "live"}, "live", True),
    ],
)
def test_branch_effective_mode(
    daemon: Daemon, client: TestClient, sb: str, calls: Calls, body: dict[str, Any] | None, mode: str,
    wait: bool
) -> None:
    slow = Path(daemon.runtime.get_sandbox(sb).dir) / SLOW_DISK
    if not wait:
        slow.touch()  # the RAM copy goes on until the test ends: the branch is still being written
    try:
        resp = client.post(f"/v1/sandboxes/{sb}/branch", json=body)
        assert resp.status_code == 201, resp.text
        assert calls.named("branch") == [("branch", (sb,), {"tag": None, "mode": mode, "wait": wait,
                                                            "measure_diff": False, "parent_tag": None})]
        info = resp.json()
        assert info["branched_from"] == sb
        assert info["pause_ms"] == daemon.runtime.get_snapshot(info["tag"]).pause_ms
        assert info["status"] == ("writing" if not wait else "ready")
    finally:
        slow.unlink(missing_ok=True)


@pytest.mark.parametrize(
    ("body", "contains"),
    [
        ({"mode": "diff", "diff": True}, "mutually exclusive"),
        ({"mode": "live", "diff": False}, "mutually exclusive"),
        ({"wait": False}, "only meaningful with 'mode': 'live'"),
        ({"mode": "diff", "wait": False}, "only meaningful"),
        ({"diff": True, "wait": False}, "only meaningful"),
        ({"mode": "fast"}, "mode"),
        ({"tag": "bad tag"}, "tag"),
        ({"tag": "ok", "extra": 1}, "unknown field"),
    ],
)
def test_branch_rules_are_400(shared_client: TestClient, shared_sb: str, refused: Calls, body: Any,
                              contains: str) -> None:
    assert_error(shared_client.post(f"/v1/sandboxes/{shared_sb}/branch", json=body), 400, contains)
    assert "branch" not in refused.names()


def test_branch_tag_exists_is_409(client: TestClient, sb: str) -> None:
    assert_error(client.post(f"/v1/sandboxes/{sb}/branch", json={"tag": "py"}), 409, "already exists")


async def _concurrent_branches(
    daemon: Daemon, sb: str, first: list[dict[str, Any]], probe: dict[str, Any]
) -> tuple[list[httpx.Response], httpx.Response]:
    """``first`` sent at once and held where a branch waits for its sandbox (the sandbox's lock,
    taken here), ``probe`` sent while they wait; then they go on. On the daemon's loop."""
    gate = daemon.app.state.branch_gate
    tags = [body["tag"] for body in first if "tag" in body]
    transport = httpx.ASGITransport(app=daemon.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=AUTH) as c:
        url = f"/v1/sandboxes/{sb}/branch"
        async with daemon.runtime.sandboxes.lock(sb):
            tasks = [asyncio.create_task(c.post(url, json=body)) for body in first]

            def waiting() -> bool:  # in the gate, their tags reserved, at the sandbox's lock
                return gate.active == len(first) and all(daemon.runtime.tags.in_flight(t) for t in tags)

            for _ in range(1000):
                if waiting():
                    break
                await asyncio.sleep(0.01)
            assert waiting()
            probe_resp = await c.post(url, json=probe)
        return list(await asyncio.gather(*tasks)), probe_resp


def test_branch_concurrency_cap_is_503(tmp_path: Path) -> None:
    with daemon_app(tmp_path, headers=AUTH, branch_concurrency=2) as d:
        sb = d.sandbox().id
        first, probe = d.run(_concurrent_branches, d, sb, [{"tag": "a"}, {}], {"tag": "c"})
        assert [r.status_code for r in first] == [201, 201]
        assert_error(probe, 503, "concurrency cap")
        # The slots are released afterwards.
        assert d.client.post(f"/v1/sandboxes/{sb}/branch", json={"tag": "c"}).status_code == 201


def test_same_tag_in_flight_is_409(daemon: Daemon, sb: str) -> None:
    first, probe = daemon.run(_concurrent_branches, daemon, sb, [{"tag": "cp"}], {"tag": "cp"})
    assert first[0].status_code == 201
    assert_error(probe, 409, "already in flight")


# ------------------------------------------------------------------- limits


def test_body_size_limit_is_413(tmp_path: Path) -> None:
    with daemon_app(tmp_path, headers=AUTH, max_body_bytes=2048) as c_daemon:
        c, sb = c_daemon.client, c_daemon.sandbox().id
        big = {"args": ["echo", "x" * 4096]}
        assert_error(c.post(f"/v1/sandboxes/{sb}/exec", json=big), 413, "2048-byte limit")

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted while streaming
            yield b'{"args": ["echo", "'
            for _ in range(10):
                yield b"y" * 512
            yield b'"]}'

        resp = c.post(
            f"/v1/sandboxes/{sb}/exec", content=chunks(), headers={"Content-Type": "application/json"}
        )
        assert_error(resp, 413)
        assert c.post(f"/v1/sandboxes/{sb}/exec", json={"args": ["echo", "small"]}).status_code == 200
        assert [r["args"] for r in c_daemon.guest_requests(sb, "exec")] == [["echo", "small"]]


# ------------------------------------------------------------- metrics, audit


def test_metrics(client: TestClient, sb: str) -> None:
    client.post(f"/v1/sandboxes/{sb}/exec", json={"args": ["true"]})
    client.post("/v1/sandboxes", json={"snapshot_tag": "py"})
    pause_ms = client.post(f"/v1/sandboxes/{sb}/branch", json={"tag": "b1"}).json()["pause_ms"]
    resp = client.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    text = resp.text
    assert "forkd_snapshots_total 2.0" in text
    assert "forkd_sandboxes_active 2.0" in text
    assert 'forkd_build_info{version="0.1.0"} 1.0' in text
    assert "forkd_spawn_seconds_count 1.0" in text
    assert "forkd_exec_seconds_count 1.0" in text
    assert "forkd_branch_pause_ms_count 1.0" in text
    [pause_sum] = re.findall(r"^forkd_branch_pause_ms_sum (\S+)$", text, re.M)
    assert float(pause_sum) == pytest.approx(pause_ms)


def test_two_apps_in_one_process_have_separate_metrics(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with (daemon_app(tmp_path / "a", token=False, snapshots=()) as a,
          daemon_app(tmp_path / "b", token=False, snapshots=("only-in-b",)) as b):
        assert "forkd_snapshots_total 0.0" in a.client.get("/metrics").text
        assert "forkd_snapshots_total 1.0" in b.client.get("/metrics").text


def test_audit_log_lines(tmp_path: Path) -> None:
    with daemon_app(tmp_path) as d:
        sb = d.sandbox().id
        c = d.client
        c.get("/healthz")
        c.get("/v1/snapshots", headers=AUTH)
        c.get("/v1/snapshots", headers={"Authorization": "Bearer not-the-right-token"})
        c.post(f"/v1/sandboxes/{sb}/exec", headers=AUTH, json={"args": ["echo", "SECRET-ARG"]})
    audit_log = d.app.state.settings.audit_log
    assert audit_log is not None
    raw = audit_log.read_text()
    assert TOKEN not in raw and "not-the-right-token" not in raw and "SECRET-ARG" not in raw
    lines = [json.loads(line) for line in raw.splitlines()]
    assert [(r["method"], r["path"], r["status"]) for r in lines] == [
        ("GET", "/healthz", 200),
        ("GET", "/v1/snapshots", 200),
        ("GET", "/v1/snapshots", 401),
        ("POST", f"/v1/sandboxes/{sb}/exec", 200),
    ]
    for r in lines:
        assert set(r) == {"ts", "method", "path", "status", "latency_ms", "client"}
        assert r["latency_ms"] >= 0 and r["ts"] > 1.7e9
    assert oct(audit_log.stat().st_mode & 0o777) == "0o600"


def test_audit_logs_server_errors(daemon: Daemon, client: TestClient, sb: str,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    fail_at_the_agent(daemon, monkeypatch, "ping", RuntimeError("boom"))
    assert client.post(f"/v1/sandboxes/{sb}/ping").status_code == 500
    audit_log = daemon.app.state.settings.audit_log
    assert audit_log is not None
    assert json.loads(audit_log.read_text().splitlines()[-1])["status"] == 500


# ----------------------------------------------------------------- lifespan


def test_lifespan_opens_and_closes_the_runtime(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    opened: list[Any] = []
    closed: list[dict[str, Any]] = []
    real_open, real_close = Runtime.open, Runtime.close

    async def open_(data: Any, **kwargs: Any) -> Runtime:
        opened.append(data)
        return await real_open(data, **kwargs)

    async def close(self: Runtime, **kwargs: Any) -> None:
        closed.append(kwargs)
        await real_close(self, **kwargs)

    monkeypatch.setattr(Runtime, "open", staticmethod(open_))
    monkeypatch.setattr(Runtime, "close", close)
    with daemon_app(tmp_path, headers=AUTH, snapshots=(), keep_sandboxes=True) as d:
        assert d.client.get("/v1/snapshots").json() == []
        assert isinstance(d.app.state.runtime, Runtime)
    assert opened[0].root == d.data
    assert closed == [{"keep_sandboxes": True}]
    assert d.app.state.runtime is None


def test_main_refuses_unsafe_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from forkd.api.__main__ import main

    for name in ("FORKD_BIND", "FORKD_TOKEN_FILE", "FORKD_TLS_CERT", "FORKD_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert main(["--bind", "0.0.0.0:18999", "--data-dir", str(tmp_path)]) == 2
    assert "without a bearer token" in capsys.readouterr().err
    bad = tmp_path / "token"
    bad.write_text("changeme\n")
    assert main(["--token-file", str(bad), "--data-dir", str(tmp_path)]) == 2
    assert "placeholder" in capsys.readouterr().err


# ------------------------------------------------------------------ openapi


def test_openapi_documents_errors_not_422(shared_client: TestClient) -> None:
    schema = shared_client.get("/openapi.json").json()
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for path, item in schema["paths"].items():
        for method, op in item.items():
            assert "422" not in op["responses"], (method, path)
            if path == "/healthz":
                assert op["security"] == []
                continue
            assert "401" in op["responses"] and "500" in op["responses"], (method, path)
            if path.startswith("/v1/"):
                ref = op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
                assert ref == "#/components/schemas/ErrorBody"
    ops = schema["paths"]
    assert set(ops["/v1/sandboxes/{id}/branch"]["post"]["responses"]) >= {"201", "400", "404", "409", "503"}
    assert "204" in ops["/v1/snapshots/{tag}"]["delete"]["responses"]


# --------------------------------------------------------------- schemathesis

# Examples per operation. Small enough for a unit run; 300 per operation was also run clean
# while writing this.
FUZZ_EXAMPLES = 25
# The fuzzed daemon's ceiling: a generated spawn of up to 1,000 children is refused at once (the
# documented 503 of a full host) rather than started.
FUZZ_MAX_SANDBOXES = 6
WORKSPACE = "ws"


class Fuzzed:
    """The daemon the fuzz runs against, and the real things its cases are aimed at.

    A generated path parameter that is well formed names something that exists here (the
    snapshot "py", a live sandbox, the workspace "ws"), so a case reaches the route's work
    instead of its 404; one that is not is sent as generated. A case that removed one of them
    (a DELETE, a forced cascade) gets it made again before the next, and the children a case
    made are killed after it, so every case starts from the same daemon.
    """

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.rt = daemon.runtime
        self.sandbox = ""
        self.kept: set[str] = set()
        self.restore()

    def restore(self) -> None:
        rt, run = self.rt, self.daemon.run
        if not rt.snapshots.exists("py"):
            self.daemon.snapshot("py")
        alive = {s.id: s for s in rt.list_sandboxes()}
        if self.sandbox not in alive or alive[self.sandbox].hibernation is not None:
            self.sandbox = self.daemon.sandbox("py").id
        if WORKSPACE not in {w.name for w in rt.workspaces.all()}:
            run(rt.workspaces.create, WORKSPACE, "py")
        self.kept = {s.id for s in rt.list_sandboxes()}

    def aim(self, case: Any) -> None:
        self.restore()
        params = case.path_parameters or {}
        for name, value in params.items():
            if not isinstance(value, str):
                continue
            if name == "id" and re.fullmatch(SANDBOX_ID_PATTERN, value):
                params[name] = self.sandbox
            elif name == "tag" and re.fullmatch(TAG_PATTERN, value):
                params[name] = "py"
            elif name == "name" and re.fullmatch(TAG_PATTERN, value):
                params[name] = WORKSPACE
        body = case.body
        if isinstance(body, dict) and isinstance(body.get("snapshot_tag"), str) \
                and re.fullmatch(TAG_PATTERN, body["snapshot_tag"]):
            body["snapshot_tag"] = "py"  # a spawn, a workspace: from the snapshot there is

    def tidy(self) -> None:
        rt, run = self.rt, self.daemon.run
        for pool in rt.pools.all():
            if pool["size"]:
                run(rt.pools.configure, pool["tag"], 0)
        for sandbox in rt.list_sandboxes():
            if sandbox.id not in self.kept:
                with contextlib.suppress(NotFound):  # one that died on its own meanwhile
                    run(rt.kill, sandbox.id)



class OnTheDaemonsLoop:
    """An ASGI app that serves each request with the daemon's app, on the daemon's event loop.

    Schemathesis calls the app it is given from a client of its own (each case, and the extra
    requests some checks send), on a loop of that client's; the real runtime lives on the loop
    of the daemon's client, where its tasks, locks and connections to the VMs belong. The request
    is read here, served there, and the response messages replayed here. The daemon's lifespan
    ran once already (``daemon_app``): a lifespan of the calling client is answered here.
    """

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": f"{message['type']}.complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        request: list[Message] = []
        while not request or request[-1].get("more_body"):
            request.append(await receive())
        for message in self.daemon.run(self._serve, scope, request):
            await send(message)

    async def _serve(self, scope: Scope, request: list[Message]) -> list[Message]:
        sent: list[Message] = []
        done = asyncio.Event()
        pending = iter(request)

        async def receive() -> Message:
            message = next(pending, None)
            if message is not None:
                return message
            await done.wait()  # the client hangs up once it has the whole response
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                done.set()

        await self.daemon.app(scope, receive, send)
        return sent


@pytest.fixture
def fuzzed(tmp_path: Path) -> Iterator[Fuzzed]:
    # No token of the client's own: the cases carry theirs (or, to test its checks, none).
    with daemon_app(tmp_path, max_sandboxes=FUZZ_MAX_SANDBOXES) as d:
        yield Fuzzed(d)


@pytest.fixture
def api_schema(fuzzed: Fuzzed) -> Any:
    schema = schemathesis.openapi.from_asgi("/openapi.json", OnTheDaemonsLoop(fuzzed.daemon), headers=AUTH)
    # Negative mode sends schema-invalid data and expects a 4xx; positive mode
    # expects schema-valid data to be accepted, which holds the OpenAPI
    # document to the validation the app really does.
    modes = [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
    schema.config.generation.update(modes=modes, max_examples=FUZZ_EXAMPLES)
    return schema


fuzz_schema = schemathesis.pytest.from_fixture("api_schema")


def error_named(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx/5xx carries {"error": "..."} naming the problem."""
    if response.status_code >= 400:
        body = json.loads(response.content)
        assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"], body
    return None


# What the daemon refuses in a request the schema admits: facts about the host's files, the
# snapshot and the build that no JSON schema can state. A schema-valid request answered 400
# for one of these is the daemon doing its job; any other 400 to one is the document and the
# validation disagreeing (schemathesis' positive_data_acceptance, which this narrows).
BEYOND_THE_SCHEMA = (
    r"is not an ELF vmlinux", r"^(kernel|rootfs|image) .* (does not exist|not found|is not)",
    r"^child_\w+ has \d+ entries but \d+ children were asked for",
    r"OOM-killed while restoring: its memory limit of \d+ MiB",  # what a child needs: the host's
    r"has no network device", r"need a network device", r"^the build context is not a tar archive",
    r"^(the )?Dockerfile[: ]",
    r"could not restore in time under its cpu_limit",  # a sliver of a CPU: what this host's QEMU needs
    # An image reference's grammar past its characters (IMAGE_REF_CHARS): Docker's reading of its parts.
    r"is not an image reference", r"a repository name is lower-case",
    r"would cover the guest's own files",  # a volume's mount path on the guest's own folders
    r'^fork "shared" .* is not supported yet',  # documented as 400 until shared volumes exist
    r"^size_mib is for a host_path volume",
    r"without '\.' or '\.\.' segments", r"is not a plain absolute path",  # a path's '.' and '..' parts
    r"is neither a directory nor a tarball",  # what a volume's source on the host is
    r"two volumes are mounted at the same path",  # unique mounts across a list's items
    r"holds more than fits in a volume", r"has more than \d+ files and directories",  # a source's size
    r"^setup_eval .* failed: ", r"^setup command .* failed with exit code",  # the guest ran the code
    r"a rule opens nothing on its own",  # a rule's host must be one of the same request's allow_out
    r"^network\.rules \(header transforms\) apply to sandboxes, not to a template",
    r"network\.rules\[.*\]: at most \d+ headers",  # a host's rules' headers, merged
)


def valid_data_accepted(ctx: Any, response: Any, case: Any) -> bool | None:
    """schemathesis' positive_data_acceptance, but for the refusals of ``BEYOND_THE_SCHEMA``."""
    if response.status_code == 400:
        error = json.loads(response.content).get("error", "")
        if any(re.search(p, error) for p in BEYOND_THE_SCHEMA):
            return None
    return positive_data_acceptance(ctx, response, case)


def not_a_server_error_but_a_full_host(ctx: Any, response: Any, case: Any) -> bool | None:
    """No 5xx, except the documented 503 of a host at its ceiling (FUZZ_MAX_SANDBOXES), which
    says so (``"code": "no_capacity"``): a request for more children than the host may hold; and
    a diff's 502 here, where the QEMU double's disks are not the ext4 a guest's are (the diff reads
    a real guest's disk in tests/integration/test_diff.py)."""
    if response.status_code == 503 and json.loads(response.content).get("code") == NO_CAPACITY:
        return None
    if response.status_code == 502 and "is not an ext filesystem debugfs can read" in response.text:
        return None
    assert response.status_code < 500, (response.status_code, response.content[:500])
    return None


# Hypothesis' settings for every part of the fuzz: the same examples on every run, so a failure
# here is reproducible; no .hypothesis/ directory from a unit run.
FUZZ_SETTINGS = hypothesis.settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
                                    derandomize=True, suppress_health_check=list(hypothesis.HealthCheck))


def fuzz_one(case: Any, fuzzed: Fuzzed) -> None:
    """All default schemathesis checks, among them: documented status codes, responses matching
    their schemas, schema-valid requests accepted, invalid ones 4xx; and no 5xx (but a full
    host's), every error with its {"error"} body. On the real runtime over the QEMU double."""
    fuzzed.aim(case)
    try:
        case.call_and_validate(headers=AUTH, excluded_checks=[not_a_server_error, positive_data_acceptance],
                               additional_checks=[not_a_server_error_but_a_full_host, valid_data_accepted,
                                                  error_named])
    finally:
        fuzzed.tidy()


# The fuzz in four parts of about equal time, so that the unit run's workers share it: the spawns
# and the forks (each case starts QEMU doubles), the rest of a sandbox's routes, and the rest.
SPAWNS = r"^/v1/sandboxes(/\{id\}/fork.*)?$"


@fuzz_schema.include(path_regex=r"^/v1/sandboxes$").parametrize()
@FUZZ_SETTINGS
def test_openapi_fuzz_spawns(case: Any, fuzzed: Fuzzed) -> None:
    fuzz_one(case, fuzzed)


@fuzz_schema.include(path_regex=r"^/v1/sandboxes/\{id\}/fork").parametrize()
@FUZZ_SETTINGS
def test_openapi_fuzz_forks(case: Any, fuzzed: Fuzzed) -> None:
    fuzz_one(case, fuzzed)


@fuzz_schema.include(path_regex=r"^/v1/sandboxes").exclude(path_regex=SPAWNS).parametrize()
@FUZZ_SETTINGS
def test_openapi_fuzz_sandboxes(case: Any, fuzzed: Fuzzed) -> None:
    fuzz_one(case, fuzzed)


@fuzz_schema.exclude(path_regex=r"^/v1/sandboxes").parametrize()
@FUZZ_SETTINGS
def test_openapi_fuzz_the_rest(case: Any, fuzzed: Fuzzed) -> None:
    fuzz_one(case, fuzzed)


def test_unknown_query_parameters_are_400(shared_client: TestClient, refused: Calls) -> None:
    client = shared_client
    # A misspelt filter or flag must not be silently ignored (it would list or delete too much).
    assert_error(client.get("/v1/sandboxes", params={"snapshot-tag": "py"}), 400,
                 "unknown query parameter 'snapshot-tag'; this route takes: after, limit, metadata, "
                 "snapshot_tag, state")
    assert_error(client.delete("/v1/snapshots/py", params={"cascde": "true"}), 400, "'cascde'")
    assert "delete_snapshot" not in refused.names()
    assert client.get("/v1/sandboxes", params={"snapshot_tag": "py"}).status_code == 200


def test_hibernate_keeps_memory_unless_asked_for_the_disk_only(daemon: Daemon, client: TestClient,
                                                               calls: Calls) -> None:
    [first, second] = [s.id for s in daemon.run(daemon.runtime.spawn, "py", 2)]
    r = client.post(f"/v1/sandboxes/{first}/hibernate")  # no body, as before the option
    assert r.status_code == 200, r.text
    assert r.json()["hibernation"]["memory"] is True and r.json()["state"] == "hibernated"
    r = client.post(f"/v1/sandboxes/{second}/hibernate", json={"memory": False})
    assert r.status_code == 200, r.text
    assert r.json()["hibernation"]["memory"] is False and r.json()["hibernation"]["pages"] == 0
    assert [c.kwargs for c in calls.named("hibernation.hibernate")] == [{"memory": True}, {"memory": False}]
    listed = {s["id"]: s for s in client.get("/v1/sandboxes?state=hibernated").json()}
    assert listed[second]["hibernation"]["memory"] is False
    assert_error(client.post(f"/v1/sandboxes/{second}/hibernate", json={"memory": False}), 409,
                 "hibernated already")
    r = client.post(f"/v1/sandboxes/{second}/hibernate", json={"memory": "no"})
    assert r.status_code in (400, 422) and "error" in r.json(), r.text


def test_the_sandbox_list_pages_and_filters_by_state(tmp_path: Path) -> None:
    with daemon_app(tmp_path, headers=AUTH) as d:
        d.run(d.runtime.spawn, "py", 5)
        ids = [s.id for s in d.runtime.list_sandboxes()]  # oldest first, as the list pages
        assert len(ids) == 5
        d.run(d.runtime.hibernation.hibernate, ids[3])
        client = d.client

        def listed(query: str) -> list[str]:
            r = client.get(f"/v1/sandboxes{query}")
            assert r.status_code == 200, r.text
            return [s["id"] for s in r.json()]

        assert listed("") == ids
        assert listed("?limit=2") == ids[:2]
        assert listed(f"?limit=2&after={ids[1]}") == ids[2:4]
        assert listed(f"?limit=2&after={ids[3]}") == ids[4:]
        assert listed(f"?after={ids[4]}") == []
        assert listed("?state=hibernated") == [ids[3]]
        assert listed(f"?state=running&after={ids[0]}&limit=3") == [ids[1], ids[2], ids[4]]
        gone = client.get(f"/v1/sandboxes?after={SB}")  # an id this daemon never had
        assert gone.status_code == 404 and "list again" in gone.json()["error"]
        for bad in ("?limit=0", "?limit=1001", "?state=pool", "?after=../x"):
            r = client.get(f"/v1/sandboxes{bad}")
            assert r.status_code == 400 or r.status_code == 422, (bad, r.status_code)
            assert r.json()["error"]


@pytest.mark.parametrize("forged", [
    {"stdout": 7, "stderr": "", "exit_code": "x", "error": None, "timed_out": 1.5},
    {"result": {"nested": []}}, {}])
def test_a_forged_agent_reply_is_a_502_naming_what_does_not_fit(daemon: Daemon, client: TestClient, sb: str,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                forged: dict[str, Any]) -> None:
    """The tenant is root in its VM and can answer its agent's calls with anything: a reply its
    response model refuses is the guest failing (502, like any bad answer of its agent), not a 500.
    On the real runtime the agent protocol's typed reply check (guest/client.checked_reply) is the
    first to refuse it, naming the field."""
    for path, body in (("exec", {"args": ["id"]}), ("eval", {"code": "1"})):
        fail_at_the_agent(daemon, monkeypatch, path, forged)  # what a replaced agent made of its reply
        error = assert_error(client.post(f"/v1/sandboxes/{sb}/{path}", json=body), 502, "malformed answer")
        assert "guest agent" in error
        monkeypatch.undo()


def test_a_no_capacity_503_fits_the_documented_error_body() -> None:
    """The 503 of a host at its ceiling carries ``"code": "no_capacity"`` beside its error (a fleet's
    gateway reads it, errors.NoCapacity): the OpenAPI's ErrorBody must describe that body, or a
    client validating responses refuses the daemon's own answer (the fuzz on the real runtime found
    it, on the fix/apitest branch)."""
    from forkd.api.schemas.responses import ErrorBody
    from forkd.errors import NO_CAPACITY

    body = ErrorBody.model_validate({"error": "host is full", "code": NO_CAPACITY})
    assert body.code == NO_CAPACITY
    assert ErrorBody.model_validate({"error": "x"}).code is None
