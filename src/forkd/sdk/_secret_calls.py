"""The REST v1 calls of secrets (request builders, as :mod:`forkd.sdk._calls`): a value goes in,
nothing gives it back."""

from __future__ import annotations

from forkd.sdk._build import put as _put
from forkd.sdk._build import seg as _seg
from forkd.sdk._http import Call


def create_secret(name: str, value: str, *, metadata: dict[str, str] | None) -> Call:
    return Call("POST", "/v1/secrets", json=_put({"name": name, "value": value}, metadata=metadata))


def list_secrets() -> Call:
    return Call("GET", "/v1/secrets")


def get_secret(name: str) -> Call:
    return Call("GET", f"/v1/secrets/{_seg(name)}")


def update_secret(name: str, *, value: str | None, metadata: dict[str, str] | None) -> Call:
    return Call("PUT", f"/v1/secrets/{_seg(name)}", json=_put({}, value=value, metadata=metadata))


def delete_secret(name: str) -> Call:
    return Call("DELETE", f"/v1/secrets/{_seg(name)}")
