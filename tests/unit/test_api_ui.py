"""The web console's files at /ui: served without the token, with a strict CSP; nothing else opens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.fakes.app import TOKEN, daemon_app


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with daemon_app(tmp_path, snapshots=()) as daemon:
        yield daemon.client


@pytest.mark.parametrize(("path", "kind"), [
    ("/ui", "text/html"), ("/ui/", "text/html"), ("/ui/index.html", "text/html"),
    ("/ui/app.js", "text/javascript"), ("/ui/api.js", "text/javascript"),
    ("/ui/lineage.js", "text/javascript"), ("/ui/metrics.js", "text/javascript"),
    ("/ui/cell.js", "text/javascript"),
    ("/ui/style.css", "text/css"),
])
def test_console_files_need_no_token(client: TestClient, path: str, kind: str) -> None:
    r = client.get(path)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith(kind)
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "no-referrer"


def test_the_page_loads_only_its_own_module_and_keeps_the_token_out_of_urls(client: TestClient) -> None:
    html = client.get("/ui").text
    assert '<script type="module" src="/ui/app.js"></script>' in html
    assert "<script>" not in html and "style=" not in html  # nothing inline: the CSP forbids it
    api = client.get("/ui/api.js").text
    assert "sessionStorage" in api and "Authorization" in api and 'credentials: "omit"' in api
    for name in ("app.js", "lineage.js", "metrics.js", "api.js", "cell.js", "terminal.js"):
        assert "innerHTML" not in client.get(f"/ui/{name}").text, name


def test_unknown_console_files_are_404_and_the_api_stays_closed(client: TestClient) -> None:
    r = client.get("/ui/secret.txt")
    assert r.status_code == 404 and "no console file" in r.json()["error"]
    for path in ("/v1/snapshots", "/metrics", "/uix", "/openapi.json"):
        assert client.get(path).status_code == 401, path
    # An encoded path under /ui skips the token check but reaches no API route.
    for path in ("/ui/..%2Fv1%2Fsnapshots", "/ui/%2E%2E/v1/snapshots"):
        r = client.get(path)
        assert r.status_code in (401, 404) and '"tag"' not in r.text, (path, r.status_code, r.text)
    assert client.get("/v1/snapshots", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_the_console_is_not_in_the_openapi_document(client: TestClient) -> None:
    paths = client.get("/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}).json()["paths"]
    assert not [p for p in paths if p.startswith("/ui")]
