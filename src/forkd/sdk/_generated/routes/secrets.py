# GENERATED from src/forkd/sdk/async_routes/secrets.py by scripts/unasync_sdk.py — do not edit.
# Edit the async source, then run: python scripts/unasync_sdk.py
"""Secret routes: write-only values that a sandbox's requests carry without the sandbox holding
them (``${secrets.NAME}`` in a request to a host with a header rule, put in at egress)."""

from __future__ import annotations

from typing import cast

from forkd.sdk import _secret_calls
from forkd.sdk.models import SecretInfo

from .transport import Transport


class SecretRoutes(Transport):
    """``/v1/secrets``."""

    def create_secret(self, name: str, value: str, *,
                            metadata: dict[str, str] | None = None) -> SecretInfo:
        """``POST /v1/secrets``: ``value`` is never returned; ``${secrets.NAME}`` names it in a
        header rule's header or in a request to a host with a rule (``network={"rules": ...}``)."""
        return cast(SecretInfo, self._send(_secret_calls.create_secret(name, value, metadata=metadata)))

    def list_secrets(self) -> list[SecretInfo]:
        """``GET /v1/secrets``: names, versions and labels (never a value)."""
        return cast(list[SecretInfo], self._send(_secret_calls.list_secrets()))

    def get_secret(self, name: str) -> SecretInfo:
        """``GET /v1/secrets/{name}``."""
        return cast(SecretInfo, self._send(_secret_calls.get_secret(name)))

    def update_secret(self, name: str, *, value: str | None = None,
                            metadata: dict[str, str] | None = None) -> SecretInfo:
        """``PUT /v1/secrets/{name}``: a new value (its version goes up by one) or new labels."""
        call = _secret_calls.update_secret(name, value=value, metadata=metadata)
        return cast(SecretInfo, self._send(call))

    def delete_secret(self, name: str) -> None:
        """``DELETE /v1/secrets/{name}``."""
        self._send(_secret_calls.delete_secret(name))
