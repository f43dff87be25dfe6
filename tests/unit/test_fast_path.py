"""The lean path for plain JSON routes (api/fast_path.py) answers exactly as FastAPI does.

Each request is sent to two apps over the same kind of FakeRuntime: one serving through the
fast path, one with it switched off (``--no-fast-path``: every request through FastAPI's
router). Status, body and the headers a client reads must be the same, for answers and for
every kind of error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from forkd.api.app import create_app
from forkd.api.fast_path import FastPath, _overlap, _segments
from forkd.api.settings import Settings
from tests.fakes.runtime import FakeRuntime

TOKEN = "0f3c9a7b5e2d4c1a8b6f0e9d7c5a3b1f"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SB = "sb-67a1b3-0000"


def _runtime() -> FakeRuntime:
    rt = FakeRuntime()
    rt.add_snapshot("py")
    rt.add_sandbox(SB)
    rt.raise_on_ping = None
    return rt


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    return Settings(token_file=token, data_dir=tmp_path / "data", audit_log=tmp_path / "audit.log")


@pytest.fixture
def pair(settings: Settings) -> Iterator[tuple[TestClient, TestClient]]:
    fast_app = create_app(settings, runtime=_runtime())
    slow_app = create_app(dataclasses.replace(settings, fast_path=False), runtime=_runtime())
    with TestClient(fast_app, raise_server_exceptions=False, headers=AUTH) as fast, \
            TestClient(slow_app, raise_server_exceptions=False, headers=AUTH) as slow:
        yield fast, slow


def _same(pair: tuple[TestClient, TestClient], method: str, path: str, **kwargs: Any) -> Any:
    fast, slow = pair
    a, b = fast.request(method, path, **kwargs), slow.request(method, path, **kwargs)
    assert (a.status_code, a.content) == (b.status_code, b.content), (method, path, a.text, b.text)
    for header in ("content-type", "content-length", "allow", "www-authenticate"):
        assert a.headers.get(header) == b.headers.get(header), header
    return a


def test_the_hot_routes_are_served_and_none_that_another_route_could_take(settings: Settings) -> None:
    app = create_app(settings, runtime=_runtime())
    served = FastPath(app.router, owner=app).served()
    for hot in (("POST", "/v1/sandboxes/{id}/eval"), ("POST", "/v1/sandboxes/{id}/ping"),
                ("POST", "/v1/sandboxes/{id}/exec"), ("GET", "/v1/sandboxes/{id}")):
        assert hot in served
    # Streams, uploads, WebSockets and list routes (query parameters) stay FastAPI's.
    paths = {path for _, path in served}
    assert not any("/files" in p and not p.endswith("/mkdir") for p in paths)
    assert "/v1/sandboxes/{id}/terminal" not in paths


def test_templates_overlap_only_where_some_path_matches_both() -> None:
    a = _segments("/v1/sandboxes/{id}/eval")
    assert _overlap(a, _segments("/v1/sandboxes/{id}/{what}"))
    assert _overlap(a, _segments("/v1/sandboxes/batch/eval"))
    assert not _overlap(a, _segments("/v1/sandboxes/{id}/ping"))
    assert not _overlap(a, _segments("/v1/sandboxes/{id}"))
    assert _overlap(a, _segments("/v1/sandboxes/{rest:path}"))
    assert _overlap(a, _segments("/v1", prefix=True))
    assert not _overlap(a, _segments("/ui", prefix=True))


def test_answers_are_the_same(pair: tuple[TestClient, TestClient], monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[str] = []
    serve = FastPath._serve

    async def counted(self: FastPath, plain: Any, *args: Any) -> None:
        served.append(plain.route.path)
        await serve(self, plain, *args)

    monkeypatch.setattr(FastPath, "_serve", counted)
    assert _same(pair, "POST", f"/v1/sandboxes/{SB}/eval", json={"code": "1+1"}).status_code == 200
    assert _same(pair, "POST", f"/v1/sandboxes/{SB}/ping").json()["pong"] is True
    _same(pair, "POST", f"/v1/sandboxes/{SB}/exec", json={"args": ["true"]})  # exclude_unset answer
    _same(pair, "GET", f"/v1/sandboxes/{SB}")
    _same(pair, "POST", "/v1/sandboxes", json={"snapshot_tag": "py", "n": 2})  # 201
    _same(pair, "POST", f"/v1/sandboxes/{SB}/eval",
          content=b'{"code": "1+1"}', headers={"Content-Type": "application/json; charset=utf-8"})
    assert served == ["/v1/sandboxes/{id}/eval", "/v1/sandboxes/{id}/ping", "/v1/sandboxes/{id}/exec",
                      "/v1/sandboxes/{id}", "/v1/sandboxes", "/v1/sandboxes/{id}/eval"]


@pytest.mark.parametrize(("method", "path", "kwargs"), [
    ("POST", f"/v1/sandboxes/{SB}/eval", {"json": {}}),  # a field missing
    ("POST", f"/v1/sandboxes/{SB}/eval", {"json": {"code": "1", "extra": 1}}),  # an unknown field
    ("POST", f"/v1/sandboxes/{SB}/eval", {"json": ["code"]}),  # not an object
    ("POST", f"/v1/sandboxes/{SB}/eval", {"content": b'{"code": '}),  # not JSON
    ("POST", f"/v1/sandboxes/{SB}/eval", {"content": b'{"code": "1"}',
                                          "headers": {"Content-Type": "text/plain"}}),
    ("POST", f"/v1/sandboxes/{SB}/eval", {}),  # no body
    ("POST", "/v1/sandboxes/not-an-id/eval", {"json": {"code": "1"}}),  # the path does not validate
    ("POST", "/v1/sandboxes/sb-000000-0009/eval", {"json": {"code": "1"}}),  # no such sandbox (404)
    ("POST", f"/v1/sandboxes/{SB}/eval?x=1", {"json": {"code": "1"}}),  # an unknown query parameter
    ("PUT", f"/v1/sandboxes/{SB}/eval", {"json": {"code": "1"}}),  # 405, with its Allow header
    ("POST", f"/v1/sandboxes/{SB}/hibernate", {}),  # an optional body left out
])
def test_errors_are_the_same(pair: tuple[TestClient, TestClient], method: str, path: str,
                             kwargs: dict[str, Any]) -> None:
    _same(pair, method, path, **kwargs)


def test_an_unexpected_error_is_a_500_with_its_error_body(pair: tuple[TestClient, TestClient]) -> None:
    for client in pair:
        runtime = client.app.state.runtime  # type: ignore[attr-defined]
        runtime.raise_on_ping = RuntimeError("boom")
    r = _same(pair, "POST", f"/v1/sandboxes/{SB}/ping")
    assert r.status_code == 500 and r.json() == {"error": "internal error: RuntimeError: boom"}


def test_without_a_token_nothing_is_served(pair: tuple[TestClient, TestClient]) -> None:
    r = _same(pair, "POST", f"/v1/sandboxes/{SB}/eval", json={"code": "1"}, headers={"Authorization": ""})
    assert r.status_code == 401
