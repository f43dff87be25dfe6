"""The lean path for plain JSON routes (api/fast_path.py) answers exactly as FastAPI does.

Each request is sent to two apps over one real runtime (over the QEMU double): the daemon's,
serving through the fast path, and one with it switched off (``--no-fast-path``: every request
through FastAPI's router), chosen per request by a header the test's wrapper reads. Status, body
and the headers a client reads must be the same, for answers and for every kind of error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from forkd.api.app import create_app
from forkd.api.fast_path import FastPath, _overlap, _segments
from forkd.api.settings import Settings
from tests.fakes.app import AUTH, TOKEN, Daemon, daemon_app

SLOW = "x-test-no-fast-path"  # a request with this header goes to the app without the fast path


class Both:
    """The daemon's app, and beside it the same app with the fast path off, on the same runtime."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.slow: FastAPI | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and any(k == SLOW.encode() for k, _ in scope["headers"]):
            if self.slow is None:  # the runtime is open once the daemon's lifespan ran
                settings = dataclasses.replace(self.app.state.settings, fast_path=False)
                self.slow = create_app(settings, runtime=self.app.state.runtime)
            await self.slow(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _both(app: FastAPI) -> ASGIApp:
    return Both(app)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    return Settings(token_file=token, data_dir=tmp_path / "data", audit_log=tmp_path / "audit.log")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with daemon_app(tmp_path, headers=AUTH, wrap=_both) as d:
        d.sandbox("py")
        yield d


@pytest.fixture
def sb(daemon: Daemon) -> str:
    return daemon.runtime.list_sandboxes()[0].id


def _same(daemon: Daemon, method: str, path: str, **kwargs: Any) -> Any:
    client = daemon.client
    headers = kwargs.pop("headers", {})
    a = client.request(method, path, headers=headers, **kwargs)
    b = client.request(method, path, headers={**headers, SLOW: "1"}, **kwargs)
    assert (a.status_code, a.content) == (b.status_code, b.content), (method, path, a.text, b.text)
    for header in ("content-type", "content-length", "allow", "www-authenticate"):
        assert a.headers.get(header) == b.headers.get(header), header
    return a


# What differs between two spawns of one request: the new sandboxes themselves.
OWN = ("id", "guest_addr", "created_at_unix", "pid", "disk_used_mib", "timings")


def _alike(daemon: Daemon, method: str, path: str, **kwargs: Any) -> Any:
    """``_same`` for a request that makes something new each time (a spawn): the same answer but
    for the values of ``OWN``, which must be there in both, in the same places."""
    client = daemon.client
    a = client.request(method, path, **kwargs)
    b = client.request(method, path, headers={SLOW: "1"}, **kwargs)
    assert (a.status_code, a.headers["content-type"]) == (b.status_code, b.headers["content-type"]), b.text

    def masked(body: list[dict[str, Any]]) -> list[list[tuple[str, Any]]]:
        return [[(k, "*" if k in OWN else v) for k, v in item.items()] for item in body]

    assert masked(a.json()) == masked(b.json()), (a.text, b.text)
    return a


def test_the_hot_routes_are_served_and_none_that_another_route_could_take(settings: Settings) -> None:
    app = create_app(settings)  # the routes, not the runtime: nothing here is served
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


def test_answers_are_the_same(daemon: Daemon, sb: str, monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[str] = []
    serve = FastPath._serve

    async def counted(self: FastPath, plain: Any, *args: Any) -> None:
        served.append(plain.route.path)
        await serve(self, plain, *args)

    monkeypatch.setattr(FastPath, "_serve", counted)
    assert _same(daemon, "POST", f"/v1/sandboxes/{sb}/eval", json={"code": "1+1"}).status_code == 200
    assert _same(daemon, "POST", f"/v1/sandboxes/{sb}/ping").json()["pong"] is True
    _same(daemon, "POST", f"/v1/sandboxes/{sb}/exec", json={"args": ["true"]})  # exclude_unset answer
    _same(daemon, "GET", f"/v1/sandboxes/{sb}")
    _alike(daemon, "POST", "/v1/sandboxes", json={"snapshot_tag": "py", "n": 2})  # 201
    _same(daemon, "POST", f"/v1/sandboxes/{sb}/eval",
          content=b'{"code": "1+1"}', headers={"Content-Type": "application/json; charset=utf-8"})
    assert served == ["/v1/sandboxes/{id}/eval", "/v1/sandboxes/{id}/ping", "/v1/sandboxes/{id}/exec",
                      "/v1/sandboxes/{id}", "/v1/sandboxes", "/v1/sandboxes/{id}/eval"]


@pytest.mark.parametrize(("method", "path", "kwargs"), [
    ("POST", "/v1/sandboxes/{sb}/eval", {"json": {}}),  # a field missing
    ("POST", "/v1/sandboxes/{sb}/eval", {"json": {"code": "1", "extra": 1}}),  # an unknown field
    ("POST", "/v1/sandboxes/{sb}/eval", {"json": ["code"]}),  # not an object
    ("POST", "/v1/sandboxes/{sb}/eval", {"content": b'{"code": '}),  # not JSON
    ("POST", "/v1/sandboxes/{sb}/eval", {"content": b'{"code": "1"}',
                                         "headers": {"Content-Type": "text/plain"}}),
    ("POST", "/v1/sandboxes/{sb}/eval", {}),  # no body
    ("POST", "/v1/sandboxes/not-an-id/eval", {"json": {"code": "1"}}),  # the path does not validate
    ("POST", "/v1/sandboxes/sb-000000-0009/eval", {"json": {"code": "1"}}),  # no such sandbox (404)
    ("POST", "/v1/sandboxes/{sb}/eval?x=1", {"json": {"code": "1"}}),  # an unknown query parameter
    ("PUT", "/v1/sandboxes/{sb}/eval", {"json": {"code": "1"}}),  # 405, with its Allow header
])
def test_errors_are_the_same(daemon: Daemon, sb: str, method: str, path: str, kwargs: dict[str, Any]) -> None:
    _same(daemon, method, path.format(sb=sb), **kwargs)


def test_an_optional_body_left_out_is_the_same(daemon: Daemon, sb: str) -> None:
    """Hibernate's body is optional: both apps take a request without one to the runtime (the
    sandbox hibernated by the first answers both with the same 409)."""
    assert daemon.client.post(f"/v1/sandboxes/{sb}/hibernate").status_code == 200
    r = _same(daemon, "POST", f"/v1/sandboxes/{sb}/hibernate")
    assert r.status_code == 409 and "hibernated already" in r.json()["error"]


def test_an_unexpected_error_is_a_500_with_its_error_body(daemon: Daemon, sb: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise RuntimeError("boom")

    # The agent gateway is the runtime's IO boundary: a bug below it reaches the app as this.
    monkeypatch.setattr(daemon.runtime.agents, "call", broken)
    r = _same(daemon, "POST", f"/v1/sandboxes/{sb}/ping")
    assert r.status_code == 500 and r.json() == {"error": "internal error: RuntimeError: boom"}


def test_without_a_token_nothing_is_served(daemon: Daemon, sb: str) -> None:
    r = _same(daemon, "POST", f"/v1/sandboxes/{sb}/eval", json={"code": "1"}, headers={"Authorization": ""})
    assert r.status_code == 401
