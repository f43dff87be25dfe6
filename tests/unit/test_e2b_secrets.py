"""E2B's secret calls (api/e2b/secrets.py) in the published SDK's shapes: the answers parse with
its own ``Secret`` model, and no answer carries a value."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b.api.client.models import Secret

from tests.fakes.app import TOKEN, Daemon, daemon_app

KEY = {"X-API-KEY": TOKEN}
VALUE = "e2b-secret-" + "5" * 30


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with daemon_app(tmp_path, snapshots=()) as d:
        yield d


def test_e2b_secrets_are_created_listed_updated_and_destroyed(daemon: Daemon) -> None:
    c = daemon.client
    made = c.post("/secrets", headers=KEY, json={"name": "GH_TOKEN", "value": VALUE,
                                                 "metadata": {"owner": "ci"}})
    assert made.status_code == 201, made.text
    info = Secret.from_dict(made.json())
    assert (info.secret_id, info.name, info.current_version) == ("GH_TOKEN", "GH_TOKEN", 1)
    assert info.metadata.additional_properties == {"owner": "ci"}
    listed = c.get("/secrets", headers=KEY)
    assert [Secret.from_dict(s).name for s in listed.json()] == ["GH_TOKEN"]
    updated = c.post("/secrets/GH_TOKEN", headers=KEY, json={"value": VALUE + "x"})
    assert updated.status_code == 200 and Secret.from_dict(updated.json()).current_version == 2
    for r in (made, listed, updated, c.get("/secrets/GH_TOKEN", headers=KEY)):
        assert VALUE not in r.text
    assert daemon.runtime.secrets.resolve("GH_TOKEN") == VALUE + "x"
    taken = c.post("/secrets", headers=KEY, json={"name": "GH_TOKEN", "value": "v"})
    assert taken.status_code == 409 and "exists" in taken.json()["message"]
    assert c.delete("/secrets/GH_TOKEN", headers=KEY).status_code == 204
    missing = c.get("/secrets/GH_TOKEN", headers=KEY)
    assert missing.status_code == 404 and "no secret named" in missing.json()["message"]
    bad = c.post("/secrets", headers=KEY, json={"name": "has space", "value": "v"})
    assert bad.status_code == 400 and "letters, digits" in bad.json()["message"]
    assert c.get("/secrets").status_code == 401  # the API key, as for every E2B call
