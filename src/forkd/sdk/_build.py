"""What every request builder of the SDK shares: a safe URL segment, optional fields left out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote


def seg(value: str) -> str:
    """One URL path segment; ids and tags are never allowed to add path levels."""
    return quote(str(value), safe="")


def put(body: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """Add only the fields that are not None."""
    body.update({k: v for k, v in fields.items() if v is not None})
    return body


def extra(body: dict[str, Any], extra: Mapping[str, object] | None) -> dict[str, Any]:
    """Add the caller's further request fields (the generated ``*Extra`` models), not None ones."""
    return put(body, **(extra or {}))


def command_args(cmd: str | Sequence[str]) -> list[str]:
    """A shell string runs via ``/bin/sh -c``; a sequence is the argv itself."""
    if isinstance(cmd, str):
        return ["/bin/sh", "-c", cmd]
    args = [str(a) for a in cmd]
    if not args:
        raise ValueError("command must not be empty")
    return args
