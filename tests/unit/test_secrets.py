"""Secrets (controller/secrets.py, /v1/secrets): written once, never read back, sealed at rest."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from forkd.controller.secrets import Secrets
from forkd.errors import CorruptState
from forkd.store.registry import Registry
from forkd.store.secret_box import SecretBox
from tests.fakes.app import Daemon, daemon_app

VALUE = "sk-live-" + "7" * 40


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Daemon]:
    with daemon_app(tmp_path, token=False, snapshots=()) as daemon:
        yield daemon


def _files_holding(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_a_secret_is_written_once_and_never_read_back(api: Daemon) -> None:
    made = api.client.post("/v1/secrets", json={"name": "API_TOKEN", "value": VALUE,
                                                "metadata": {"team": "a"}})
    assert made.status_code == 201, made.text
    assert set(made.json()) == {"name", "version", "metadata", "created_at_unix", "updated_at_unix"}
    assert made.json()["version"] == 1 and made.json()["metadata"] == {"team": "a"}
    for r in (api.client.get("/v1/secrets"), api.client.get("/v1/secrets/API_TOKEN")):
        assert r.status_code == 200 and VALUE not in r.text, r.text
    again = api.client.post("/v1/secrets", json={"name": "API_TOKEN", "value": "x"})
    assert again.status_code == 409 and "exists" in again.json()["error"]
    updated = api.client.put("/v1/secrets/API_TOKEN", json={"value": VALUE + "2"})
    assert updated.status_code == 200 and updated.json()["version"] == 2 and VALUE not in updated.text
    assert api.runtime.secrets.resolve("API_TOKEN") == VALUE + "2"  # only the egress asks this
    # Sealed at rest: the registry (and every file of the data dir) holds no value in the clear.
    assert _files_holding(api.data, VALUE.encode()) == []
    key = api.data / "secrets.key"
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600 and len(key.read_bytes()) == 32
    assert api.client.delete("/v1/secrets/API_TOKEN").status_code == 204
    gone = api.client.get("/v1/secrets/API_TOKEN")
    assert gone.status_code == 404 and "no secret named" in gone.json()["error"]
    assert api.client.delete("/v1/secrets/API_TOKEN").status_code == 404


@pytest.mark.parametrize("body", [
    {"name": "9LIVES", "value": "x"}, {"name": "a-b", "value": "x"}, {"name": "A", "value": ""},
    {"name": "A", "value": "x" * (64 * 1024 + 1)}, {"name": "A", "value": "x", "extra": 1},
    {"name": "A"},
])
def test_bad_secrets_are_400_and_say_why_without_echoing_the_value(
        api: Daemon, body: dict[str, object]) -> None:
    r = api.client.post("/v1/secrets", json=body)
    assert r.status_code in (400, 422) and r.json()["error"], r.text
    assert "x" * 64 not in r.text
    assert api.client.get("/v1/secrets").json() == []


def test_a_sealed_value_opens_only_under_its_own_name_and_key(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "forkd.db")
    secrets = Secrets(reg.secrets, SecretBox(tmp_path / "secrets.key"))
    secrets.create("A", VALUE)
    row = reg.secrets.get("A")
    assert row is not None and VALUE.encode() not in row.sealed
    box = SecretBox(tmp_path / "secrets.key")
    assert box.open("A", row.nonce, row.sealed) == VALUE
    with pytest.raises(CorruptState, match="does not open"):
        box.open("B", row.nonce, row.sealed)  # a sealed value copied onto another name
    with pytest.raises(CorruptState, match="does not open"):
        SecretBox(tmp_path / "other.key").open("A", row.nonce, row.sealed)
    assert secrets.resolve("NOPE") is None and secrets.resolve("../x") is None


def test_the_python_sdk_makes_lists_updates_and_deletes_secrets(api: Daemon) -> None:
    """The SDK's calls against the real app (its transport is the test client's)."""
    from forkd.sdk import _secret_calls as _calls
    from forkd.sdk._http import Call

    def send(call: Call) -> object:
        r = api.client.request(call.method, call.path, json=call.json)
        assert r.status_code < 300, r.text
        return r.json() if r.content else None

    made = send(_calls.create_secret("DB_PASS", VALUE, metadata={"env": "ci"}))
    assert isinstance(made, dict) and made["version"] == 1 and made["metadata"] == {"env": "ci"}
    assert [s["name"] for s in send(_calls.list_secrets())] == ["DB_PASS"]  # type: ignore[union-attr]
    assert send(_calls.update_secret("DB_PASS", value="v2", metadata=None))["version"] == 2  # type: ignore[index]
    assert send(_calls.get_secret("DB_PASS"))["version"] == 2  # type: ignore[index]
    send(_calls.delete_secret("DB_PASS"))
    assert send(_calls.list_secrets()) == []
