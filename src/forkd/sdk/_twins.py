"""Markers used in the async SDK modules, read by ``scripts/unasync_sdk.py``.

The sync modules (``client.py``, ``sandbox.py``) are generated from the async
ones by a table of token substitutions. Where the two APIs must differ in
shape, not only in ``async``/``await``, the async source says so with a marker
from here, and the script's table rewrites the marker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def sync_property(method: F) -> F:
    """Mark a coroutine method whose sync twin is a read-only property.

    At run time it returns the method unchanged (``await sb.info()``); the
    generator turns ``@sync_property`` into ``@property`` (``sb.info``), since a
    property may do I/O in sync code but cannot be awaited.
    """
    return method


__all__ = ["sync_property"]
