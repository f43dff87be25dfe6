"""Unit tests of the REST layer: validation, auth, error shapes, limits, metrics, audit.

They run against ``FakeRuntime`` (tests/fakes/runtime.py), an in-memory
stand-in for ``forkd.controller.runtime.Runtime`` that boots nothing. Real-VM
behaviour is covered by the integration tests.
"""

from __future__ import annotations

import asyncio
import json
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import hypothesis
import pytest
import schemathesis
from fastapi.testclient import TestClient

from forkd.api.app import create_app
from forkd.api.auth import check_bind_safety, load_token, validate_token
from forkd.api.server import validate_settings
from forkd.api.settings import ConfigError, Settings, parse_bind
from forkd.errors import Busy, Conflict, GuestError
from forkd.store.records import Hibernation
from tests.fakes.runtime import FakeRuntime

TOKEN = "0f3c9a7b5e2d4c1a8b6f0e9d7c5a3b1f"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SB = "sb-67a1b3-0000"


# --------------------------------------------------------------------- fixtures


@pytest.fixture
def runtime_module() -> types.ModuleType:
    """The real controller module (POST /v1/snapshots imports its SnapshotSpec at request time)."""
    import forkd.controller.runtime as mod

    return mod


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture
def settings(tmp_path: Path, token_file: Path) -> Settings:
    return Settings(token_file=token_file, data_dir=tmp_path / "data", audit_log=tmp_path / "audit.log")


@pytest.fixture
def fake() -> FakeRuntime:
    rt = FakeRuntime()
    rt.add_snapshot("py")
    rt.add_sandbox(SB, live_fork=True)
    return rt


@pytest.fixture
def client(settings: Settings, fake: FakeRuntime) -> Iterator[TestClient]:
    app = create_app(settings, runtime=fake)
    with TestClient(app, raise_server_exceptions=False, headers=AUTH) as c:
        yield c


def assert_error(resp: httpx.Response, status: int, contains: str = "") -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}, body
    assert isinstance(body["error"], str) and body["error"]
    assert contains.lower() in body["error"].lower(), body["error"]
    return body["error"]


# ------------------------------------------------------------------------- auth


def test_healthz_needs_no_token(settings: Settings, fake: FakeRuntime) -> None:
    with TestClient(create_app(settings, runtime=fake)) as c:
        resp = c.get("/healthz")
    assert resp.status_code == 200
    assert resp.json() == {"ok": True}


@pytest.mark.parametrize("offer", [
    {}, {"subprotocols": ["forkd.terminal.v1"]}, {"subprotocols": ["forkd.terminal.v1", "bearer.d3Jvbmc"]},
    {"subprotocols": ["forkd.terminal.v1", "bearer.!!"]}, {"headers": {"Authorization": "Bearer wrong"}},
])
def test_a_websocket_needs_the_token_too(settings: Settings, fake: FakeRuntime,
                                         offer: dict[str, Any]) -> None:
    """Before any WebSocket route runs (a terminal), in a header or as a browser's subprotocol."""
    from starlette.websockets import WebSocketDisconnect

    with (TestClient(create_app(settings, runtime=fake)) as c, pytest.raises(WebSocketDisconnect) as refused,
          c.websocket_connect(f"/v1/sandboxes/{SB}/terminal", **offer)):
        pass
    assert refused.value.code == 1008


@pytest.mark.parametrize("path", ["/version", "/metrics", "/v1/snapshots", "/openapi.json", "/no/such/route"])
@pytest.mark.parametrize(
    "header", [None, "Bearer wrong-token-0123456789", f"Basic {TOKEN}", "Bearer", f"Bearer {TOKEN}x"]
)
def test_everything_else_needs_the_token(
    settings: Settings, fake: FakeRuntime, path: str, header: str | None
) -> None:
    headers = {"Authorization": header} if header is not None else {}
    with TestClient(create_app(settings, runtime=fake)) as c:
        resp = c.get(path, headers=headers)
    assert_error(resp, 401, "missing or invalid bearer token")
    assert resp.headers["www-authenticate"].startswith("Bearer")


def test_valid_token_is_accepted(client: TestClient) -> None:
    resp = client.get("/version")
    assert resp.status_code == 200
    assert resp.json() == {"version": "0.1.0", "api": "v1"}


def test_no_token_file_means_no_auth(tmp_path: Path, fake: FakeRuntime) -> None:
    app = create_app(Settings(audit_log=tmp_path / "a.log"), runtime=fake)
    with TestClient(app) as c:
        assert c.get("/v1/snapshots").status_code == 200


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
def test_spawn_validation_is_400(client: TestClient, fake: FakeRuntime, body: Any, contains: str) -> None:
    assert_error(client.post("/v1/sandboxes", json=body), 400, contains)
    assert "spawn" not in fake.names()


def test_malformed_bodies_are_400(client: TestClient) -> None:
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
def test_exec_validation_is_400(client: TestClient, fake: FakeRuntime, body: Any, contains: str) -> None:
    assert_error(client.post(f"/v1/sandboxes/{SB}/exec", json=body), 400, contains)
    assert "exec" not in fake.names()


def test_eval_validation_is_400(client: TestClient) -> None:
    assert_error(client.post(f"/v1/sandboxes/{SB}/eval", json={}), 400, "code")
    assert_error(client.post(f"/v1/sandboxes/{SB}/eval", json={"code": ""}), 400, "code")
    assert_error(client.post(f"/v1/sandboxes/{SB}/eval", json={"code": "1", "x": 1}), 400, "unknown field")


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
    client: TestClient, fake: FakeRuntime, bad_id: str, method: str, suffix: str
) -> None:
    body = {"args": ["ls"]} if suffix == "/exec" else {"code": "1"} if suffix == "/eval" else None
    resp = client.request(method, f"/v1/sandboxes/{bad_id}{suffix}", json=body)
    assert resp.status_code in (400, 404), resp.text
    assert set(resp.json()) == {"error"}
    assert fake.calls == []


@pytest.mark.parametrize("unknown_id", ["sb-nope-0000", "sb-67A1B3-0000", "x", "host1.sb-67a1b3-0000"])
def test_well_formed_unknown_ids_are_404(client: TestClient, unknown_id: str) -> None:
    """The seeds: 404 for a sandbox that is not alive, whatever its id looks like."""
    for method, suffix, body in (("GET", "", None), ("DELETE", "", None), ("POST", "/ping", None),
                                 ("POST", "/exec", {"args": ["ls"]}), ("POST", "/branch", None)):
        assert_error(client.request(method, f"/v1/sandboxes/{unknown_id}{suffix}", json=body), 404,
                     "not alive")


@pytest.mark.parametrize("bad_tag", [".hidden", "-x", "a" * 65, "py%0A", "a%20b", "a%2Fb"])
def test_bad_tags_in_path_are_rejected_before_lookup(
    client: TestClient, fake: FakeRuntime, bad_tag: str
) -> None:
    for method in ("GET", "DELETE"):
        resp = client.request(method, f"/v1/snapshots/{bad_tag}")
        assert resp.status_code in (400, 404), resp.text
        assert set(resp.json()) == {"error"}
    assert fake.calls == []


def test_bad_query_parameter_is_400(client: TestClient) -> None:
    assert_error(client.delete("/v1/snapshots/py?cascade=perhaps"), 400, "cascade")


# --------------------------------------------------------------- snapshots


def test_create_snapshot_passes_spec(client: TestClient, fake: FakeRuntime) -> None:
    resp = client.post(
        "/v1/snapshots",
        json={"tag": "py2", "mem_mib": 256, "vcpus": 2, "boot_wait_secs": 10, "setup": [["true"]]},
    )
    assert resp.status_code == 201, resp.text
    assert resp.json() == {
        "tag": "py2",
        "dir": "/data/snapshots/py2",
        "created_at_unix": 1717000000,
        "status": "ready",
    }
    spec = fake.calls[-1][1][0]
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
def test_create_snapshot_validation(client: TestClient, fake: FakeRuntime, body: Any, contains: str) -> None:
    assert_error(client.post("/v1/snapshots", json=body), 400, contains)
    assert fake.calls == []


def test_conflicts_map_to_409(client: TestClient) -> None:
    assert_error(client.post("/v1/snapshots", json={"tag": "py"}), 409, "already exists")


def test_get_snapshot_includes_lineage(client: TestClient, fake: FakeRuntime) -> None:
    fake.add_snapshot("child", parent_tag="py")
    resp = client.get("/v1/snapshots/py")
    assert resp.status_code == 200
    body = resp.json()
    assert body["tag"] == "py" and body["ancestors"] == [] and body["dependents"] == ["child"]
    assert body["sandboxes"] == [SB]
    assert client.get("/v1/snapshots/child").json()["ancestors"] == ["py"]
    assert "branched_from" not in body and "pause_ms" not in body  # omitted when unset


def test_list_and_delete_snapshot(client: TestClient, fake: FakeRuntime) -> None:
    assert [s["tag"] for s in client.get("/v1/snapshots").json()] == ["py"]
    resp = client.delete("/v1/snapshots/py?cascade=true&force=1")
    assert resp.status_code == 204 and resp.content == b""
    assert fake.calls[-1] == ("delete_snapshot", ("py",), {"cascade": True, "force": True})
    assert_error(client.delete("/v1/snapshots/py"), 404, "not registered")
    assert_error(client.get("/v1/snapshots/py"), 404, "not registered")


# --------------------------------------------------------------- sandboxes


def test_spawn_list_get_kill(client: TestClient, fake: FakeRuntime) -> None:
    resp = client.post("/v1/sandboxes", json={"snapshot_tag": "py", "n": 2})
    assert resp.status_code == 201, resp.text
    infos = resp.json()
    assert [i["id"] for i in infos] == ["sb-abcdef-0000", "sb-abcdef-0001"]
    assert infos[0]["netns"] is None  # explicit null is kept
    assert "memory_limit_mib" not in infos[0]  # absent stays absent
    assert infos[0]["guest_addr"].startswith("unix:")
    assert len(client.get("/v1/sandboxes").json()) == 3
    assert client.get("/v1/sandboxes/sb-abcdef-0001").json()["snapshot_tag"] == "py"
    assert client.delete("/v1/sandboxes/sb-abcdef-0001").status_code == 204
    assert_error(client.get("/v1/sandboxes/sb-abcdef-0001"), 404, "not alive")
    assert_error(client.post("/v1/sandboxes", json={"snapshot_tag": "nope"}), 404, "not registered")


def test_ping_exec_eval(client: TestClient, fake: FakeRuntime) -> None:
    ping = client.post(f"/v1/sandboxes/{SB}/ping")
    assert ping.status_code == 200
    assert ping.json() == {"pong": True, "numpy_version": "1.24.2", "pid": 1}
    resp = client.post(
        f"/v1/sandboxes/{SB}/exec",
        json={"args": ["python3", "-c", "print(2+2)"], "env": {"A": "1"}, "cwd": "/tmp", "stdin": "x"},
    )
    assert resp.status_code == 200
    assert resp.json() == {"stdout": "python3 -c print(2+2)", "stderr": "", "exit_code": 0, "error": None,
                           "timed_out": False}
    assert fake.calls[-1][2] == {"timeout_secs": 30, "env": {"A": "1"}, "cwd": "/tmp", "stdin": "x",
                                 "user": None}
    resp = client.post(f"/v1/sandboxes/{SB}/exec", json={"args": ["id"], "user": "user"})
    assert resp.status_code == 200 and fake.calls[-1].kwargs["user"] == "user"
    for bad in ("", "a/b", "x" * 40, 7):
        resp = client.post(f"/v1/sandboxes/{SB}/exec", json={"args": ["id"], "user": bad})
        assert resp.status_code == 400, (bad, resp.text)
    resp = client.get(f"/v1/sandboxes/{SB}/files/stat", params={"path": "/", "user": "a b"})
    assert resp.status_code == 400, resp.text
    resp = client.post(f"/v1/sandboxes/{SB}/eval", json={"code": "numpy.zeros(5).sum()"})
    assert resp.json() == {"result": "0.0", "error": None, "exit_code": 0}
    assert_error(client.post("/v1/sandboxes/sb-000000-0000/ping"), 404, "not alive")


@pytest.mark.parametrize(
    ("exc", "status"),
    [(GuestError("agent did not answer"), 502), (Busy("full"), 503), (Conflict("c"), 409)],
)
def test_forkd_errors_keep_their_status(
    client: TestClient, fake: FakeRuntime, exc: Exception, status: int
) -> None:
    fake.raise_on_ping = exc
    assert assert_error(client.post(f"/v1/sandboxes/{SB}/ping"), status) == str(exc)


def test_unexpected_errors_are_500_with_error_body(client: TestClient, fake: FakeRuntime) -> None:
    fake.raise_on_ping = RuntimeError("boom")
    assert assert_error(client.post(f"/v1/sandboxes/{SB}/ping"), 500) == "internal error: RuntimeError: boom"


def test_unknown_route_and_method(client: TestClient) -> None:
    assert_error(client.get("/v2/snapshots"), 404, "no such route")
    resp = client.put("/v1/snapshots")
    assert_error(resp, 405, "not allowed")
    # All methods of the path, not just those of the first route that matched.
    assert resp.headers["allow"] == "GET, POST"
    assert client.get(f"/v1/sandboxes/{SB}/exec").headers["allow"] == "POST"


def test_integral_floats_are_integers(client: TestClient, fake: FakeRuntime) -> None:
    # JSON Schema's "integer" admits 2.0 (and JavaScript cannot tell it from 2).
    assert client.post("/v1/sandboxes", json={"snapshot_tag": "py", "n": 2.0}).status_code == 201
    assert fake.calls[-1][1] == ("py", 2)


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
    client: TestClient, fake: FakeRuntime, body: dict[str, Any] | None, mode: str, wait: bool
) -> None:
    resp = client.post(f"/v1/sandboxes/{SB}/branch", json=body)
    assert resp.status_code == 201, resp.text
    assert fake.calls[-1] == ("branch", (SB,), {"tag": None, "mode": mode, "wait": wait})
    info = resp.json()
    assert info["branched_from"] == SB and info["pause_ms"] == 48
    assert info["status"] == ("writing" if not wait else "ready")


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
def test_branch_rules_are_400(client: TestClient, fake: FakeRuntime, body: Any, contains: str) -> None:
    assert_error(client.post(f"/v1/sandboxes/{SB}/branch", json=body), 400, contains)
    assert "branch" not in fake.names()


def test_branch_tag_exists_is_409(client: TestClient) -> None:
    assert_error(client.post(f"/v1/sandboxes/{SB}/branch", json={"tag": "py"}), 409, "already exists")


async def _concurrent_branches(
    app: Any, fake: FakeRuntime, first: list[dict[str, Any]], probe: dict[str, Any]
) -> tuple[list[httpx.Response], httpx.Response]:
    fake.branch_release = asyncio.Event()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=AUTH) as c:
        url = f"/v1/sandboxes/{SB}/branch"
        tasks = [asyncio.create_task(c.post(url, json=body)) for body in first]
        # Let the first requests reach the runtime and block there.
        for _ in range(100):
            if fake.names().count("branch") == len(first):
                break
            await asyncio.sleep(0.01)
        assert fake.names().count("branch") == len(first)
        probe_resp = await c.post(url, json=probe)
        fake.branch_release.set()
        return list(await asyncio.gather(*tasks)), probe_resp


def test_branch_concurrency_cap_is_503(tmp_path: Path, fake: FakeRuntime, token_file: Path) -> None:
    settings = Settings(token_file=token_file, audit_log=tmp_path / "a.log", branch_concurrency=2)
    app = create_app(settings, runtime=fake)
    first, probe = asyncio.run(_concurrent_branches(app, fake, [{"tag": "a"}, {}], {"tag": "c"}))
    assert [r.status_code for r in first] == [201, 201]
    assert_error(probe, 503, "concurrency cap")
    # The slots are released afterwards.
    with TestClient(app, headers=AUTH) as c:
        assert c.post(f"/v1/sandboxes/{SB}/branch", json={"tag": "c"}).status_code == 201


def test_same_tag_in_flight_is_409(tmp_path: Path, fake: FakeRuntime, token_file: Path) -> None:
    app = create_app(Settings(token_file=token_file, audit_log=tmp_path / "a.log"), runtime=fake)
    first, probe = asyncio.run(_concurrent_branches(app, fake, [{"tag": "cp"}], {"tag": "cp"}))
    assert first[0].status_code == 201
    assert_error(probe, 409, "already in flight")


# ------------------------------------------------------------------- limits


def test_body_size_limit_is_413(tmp_path: Path, fake: FakeRuntime, token_file: Path) -> None:
    settings = Settings(token_file=token_file, audit_log=tmp_path / "a.log", max_body_bytes=2048)
    with TestClient(create_app(settings, runtime=fake), headers=AUTH) as c:
        big = {"args": ["echo", "x" * 4096]}
        assert_error(c.post(f"/v1/sandboxes/{SB}/exec", json=big), 413, "2048-byte limit")

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted while streaming
            yield b'{"args": ["echo", "'
            for _ in range(10):
                yield b"y" * 512
            yield b'"]}'

        resp = c.post(
            f"/v1/sandboxes/{SB}/exec", content=chunks(), headers={"Content-Type": "application/json"}
        )
        assert_error(resp, 413)
        assert c.post(f"/v1/sandboxes/{SB}/exec", json={"args": ["echo", "small"]}).status_code == 200
    assert "exec" in fake.names() and fake.names().count("exec") == 1


# ------------------------------------------------------------- metrics, audit


def test_metrics(client: TestClient) -> None:
    client.post(f"/v1/sandboxes/{SB}/exec", json={"args": ["true"]})
    client.post("/v1/sandboxes", json={"snapshot_tag": "py"})
    client.post(f"/v1/sandboxes/{SB}/branch", json={"tag": "b1"})
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
    assert "forkd_branch_pause_ms_sum 48.0" in text


def test_two_apps_in_one_process_have_separate_metrics(tmp_path: Path) -> None:
    a = create_app(Settings(audit_log=tmp_path / "a.log"), runtime=FakeRuntime())
    b_rt = FakeRuntime()
    b_rt.add_snapshot("only-in-b")
    b = create_app(Settings(audit_log=tmp_path / "b.log"), runtime=b_rt)
    with TestClient(a) as ca, TestClient(b) as cb:
        assert "forkd_snapshots_total 0.0" in ca.get("/metrics").text
        assert "forkd_snapshots_total 1.0" in cb.get("/metrics").text


def test_audit_log_lines(settings: Settings, fake: FakeRuntime) -> None:
    with TestClient(create_app(settings, runtime=fake), raise_server_exceptions=False) as c:
        c.get("/healthz")
        c.get("/v1/snapshots", headers=AUTH)
        c.get("/v1/snapshots", headers={"Authorization": "Bearer not-the-right-token"})
        c.post(f"/v1/sandboxes/{SB}/exec", headers=AUTH, json={"args": ["echo", "SECRET-ARG"]})
    assert settings.audit_log is not None
    raw = settings.audit_log.read_text()
    assert TOKEN not in raw and "not-the-right-token" not in raw and "SECRET-ARG" not in raw
    lines = [json.loads(line) for line in raw.splitlines()]
    assert [(r["method"], r["path"], r["status"]) for r in lines] == [
        ("GET", "/healthz", 200),
        ("GET", "/v1/snapshots", 200),
        ("GET", "/v1/snapshots", 401),
        ("POST", f"/v1/sandboxes/{SB}/exec", 200),
    ]
    for r in lines:
        assert set(r) == {"ts", "method", "path", "status", "latency_ms", "client"}
        assert r["latency_ms"] >= 0 and r["ts"] > 1.7e9
    assert oct(settings.audit_log.stat().st_mode & 0o777) == "0o600"


def test_audit_logs_server_errors(settings: Settings, fake: FakeRuntime) -> None:
    fake.raise_on_ping = RuntimeError("boom")
    with TestClient(create_app(settings, runtime=fake), raise_server_exceptions=False, headers=AUTH) as c:
        assert c.post(f"/v1/sandboxes/{SB}/ping").status_code == 500
    assert settings.audit_log is not None
    assert json.loads(settings.audit_log.read_text().splitlines()[-1])["status"] == 500


# ----------------------------------------------------------------- lifespan


def test_lifespan_opens_and_closes_the_runtime(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, token_file: Path, runtime_module: types.ModuleType
) -> None:
    fake = FakeRuntime()
    opened: list[Any] = []

    async def fake_open(data: Any, *, store: str | None = None, host_id: str | None = None,
                        disk_quota_mib: int | None = None, limits: Any = None,
                        registries: Any = None) -> FakeRuntime:
        opened.append(data)
        return fake

    monkeypatch.setattr(runtime_module.Runtime, "open", staticmethod(fake_open))
    settings = Settings(
        token_file=token_file, data_dir=tmp_path / "d", audit_log=tmp_path / "a.log", keep_sandboxes=True
    )
    app = create_app(settings)
    with TestClient(app, headers=AUTH) as c:
        assert c.get("/v1/snapshots").json() == []
    assert opened[0].root == tmp_path / "d"
    assert fake.closed_with == {"keep_sandboxes": True}
    assert app.state.runtime is None


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


def test_openapi_documents_errors_not_422(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
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

# Examples per operation. Small enough for a unit run (~10 s for all 15
# operations); 300 per operation was also run clean while writing this.
FUZZ_EXAMPLES = 25


@pytest.fixture
def api_schema(settings: Settings, fake: FakeRuntime) -> Any:
    fake.permissive = True
    app = create_app(settings, runtime=fake)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers=AUTH)
    # Negative mode sends schema-invalid data and expects a 4xx; positive mode
    # expects schema-valid data to be accepted, which holds the OpenAPI
    # document to the validation the app really does.
    modes = [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
    schema.config.generation.update(modes=modes, max_examples=FUZZ_EXAMPLES)
    return schema


fuzz_schema = schemathesis.pytest.from_fixture("api_schema")


@fuzz_schema.parametrize()
@hypothesis.settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    database=None,  # no .hypothesis/ directory from a unit run
    derandomize=True,  # same examples on every run: a failure here is reproducible
    suppress_health_check=list(hypothesis.HealthCheck),
)
def test_openapi_fuzz(case: Any) -> None:
    """All default schemathesis checks, among them: no 5xx, documented status codes,
    responses matching their schemas, schema-valid requests accepted, invalid ones 4xx."""
    case.call_and_validate(headers=AUTH)


def test_unknown_query_parameters_are_400(client: TestClient, fake: FakeRuntime) -> None:
    # A misspelt filter or flag must not be silently ignored (it would list or delete too much).
    assert_error(client.get("/v1/sandboxes", params={"snapshot-tag": "py"}), 400,
                 "unknown query parameter 'snapshot-tag'; this route takes: after, limit, metadata, "
                 "snapshot_tag, state")
    assert_error(client.delete("/v1/snapshots/py", params={"cascde": "true"}), 400, "'cascde'")
    assert "delete_snapshot" not in fake.names()
    assert client.get("/v1/sandboxes", params={"snapshot_tag": "py"}).status_code == 200


def test_hibernate_keeps_memory_unless_asked_for_the_disk_only(client: TestClient, fake: FakeRuntime) -> None:
    fake.add_snapshot("py")
    fake.add_sandbox("sb-67a1b3-0000")
    fake.add_sandbox("sb-67a1b3-0001")
    r = client.post("/v1/sandboxes/sb-67a1b3-0000/hibernate")  # no body, as before the option
    assert r.status_code == 200, r.text
    assert r.json()["hibernation"]["memory"] is True and r.json()["state"] == "hibernated"
    r = client.post("/v1/sandboxes/sb-67a1b3-0001/hibernate", json={"memory": False})
    assert r.status_code == 200, r.text
    assert r.json()["hibernation"]["memory"] is False and r.json()["hibernation"]["pages"] == 0
    assert [c.kwargs for c in fake.calls if c.name == "hibernate"] == [{"memory": True}, {"memory": False}]
    listed = {s["id"]: s for s in client.get("/v1/sandboxes?state=hibernated").json()}
    assert listed["sb-67a1b3-0001"]["hibernation"]["memory"] is False
    assert_error(client.post("/v1/sandboxes/sb-67a1b3-0001/hibernate", json={"memory": False}), 409,
                 "hibernated already")
    r = client.post("/v1/sandboxes/sb-67a1b3-0001/hibernate", json={"memory": "no"})
    assert r.status_code in (400, 422) and "error" in r.json(), r.text


def test_the_sandbox_list_pages_and_filters_by_state(client: TestClient, fake: FakeRuntime) -> None:
    fake.add_snapshot("py")
    ids = [f"sb-67a1b3-{i:04d}" for i in range(5)]
    for sb in ids:
        fake.add_sandbox(sb)
    fake.sandboxes[ids[3]].hibernation = Hibernation(at_unix=1.0, pages=1, memory_bytes=4096,
                                                     devices_bytes=4096, pause_ms=1.0)

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
    gone = client.get("/v1/sandboxes?after=sb-67a1b3-0999")
    assert gone.status_code == 404 and "list again" in gone.json()["error"]
    for bad in ("?limit=0", "?limit=1001", "?state=pool", "?after=../x"):
        r = client.get(f"/v1/sandboxes{bad}")
        assert r.status_code == 400 or r.status_code == 422, (bad, r.status_code)
        assert r.json()["error"]


@pytest.mark.parametrize("forged", [
    {"stdout": 7, "stderr": "", "exit_code": "x", "error": None, "timed_out": 1.5},
    {"result": {"nested": []}}, {}])
def test_a_forged_agent_reply_is_a_502_naming_what_does_not_fit(client: TestClient, fake: FakeRuntime,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                forged: dict[str, Any]) -> None:
    """The tenant is root in its VM and can answer its agent's calls with anything: a reply its
    response model refuses is the guest failing (502, like any bad answer of its agent), not a 500."""
    async def exec_(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return forged  # what a replaced agent made of its exec reply

    monkeypatch.setattr(fake, "exec", exec_)
    monkeypatch.setattr(fake, "eval", exec_)
    for path, body in (("exec", {"args": ["id"]}), ("eval", {"code": "1"})):
        error = assert_error(client.post(f"/v1/sandboxes/{SB}/{path}", json=body), 502, "does not fit")
        assert "guest agent" in error


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
