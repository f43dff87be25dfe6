"""The daemon's app on a FakeRuntime, with a token, behind a TestClient: for REST-layer tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from forkd.api.app import create_app
from forkd.api.settings import Settings
from tests.fakes.runtime import FakeRuntime

TOKEN = "0f3c9a7b5e2d4c1a8b6f0e9d7c5a3b1f"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@contextmanager
def app_client(tmp_path: Path, runtime: FakeRuntime, *, headers: dict[str, str] | None = None,
               **settings: Any) -> Iterator[TestClient]:
    """A client of the app (token ``TOKEN``, data under ``tmp_path``); ``headers`` on every request."""
    (tmp_path / "token").write_text(TOKEN)
    config = Settings(token_file=tmp_path / "token", data_dir=tmp_path / "data",
                      audit_log=tmp_path / "audit.log", **settings)
    with TestClient(create_app(config, runtime=runtime), raise_server_exceptions=False,
                    headers=headers or {}) as client:
        yield client
