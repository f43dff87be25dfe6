"""forkd: fork warm microVMs copy-on-write in milliseconds, branch running ones.

``from forkd import Controller, Sandbox`` gives the SDK (:mod:`forkd.sdk`). It is
imported on first use so that the daemon and core modules, which import
``forkd.*`` too, do not pay for the HTTP client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from forkd.config import VERSION as __version__

if TYPE_CHECKING:
    from forkd.sdk import (
        AsyncController,
        AsyncSandbox,
        AsyncSnapshot,
        BadRequest,
        CheckpointPolicy,
        Checkpoints,
        CommandResult,
        ConflictError,
        Controller,
        Deletion,
        EvalResult,
        ExploreError,
        ExploreResult,
        ForkdAPIError,
        ForkdConnectionError,
        ForkdTimeoutError,
        ForkFailure,
        ForkResult,
        NoCapacityError,
        NotFoundError,
        Outcome,
        PromoteResult,
        Sandbox,
        ServerError,
        ServiceUnavailable,
        Snapshot,
        SnapshotFailedError,
        Unauthorized,
    )

__all__ = [
    "AsyncController",
    "AsyncSandbox",
    "AsyncSnapshot",
    "BadRequest",
    "CheckpointPolicy",
    "Checkpoints",
    "CommandResult",
    "ConflictError",
    "Controller",
    "Deletion",
    "EvalResult",
    "ExploreError",
    "ExploreResult",
    "ForkFailure",
    "ForkResult",
    "ForkdAPIError",
    "ForkdConnectionError",
    "ForkdTimeoutError",
    "NoCapacityError",
    "NotFoundError",
    "Outcome",
    "PromoteResult",
    "Sandbox",
    "ServerError",
    "ServiceUnavailable",
    "Snapshot",
    "SnapshotFailedError",
    "Unauthorized",
    "__version__",
]

_SDK_EXPORTS = frozenset(__all__) - {"__version__"}


def __getattr__(name: str) -> Any:
    if name in _SDK_EXPORTS:
        return getattr(importlib.import_module("forkd.sdk"), name)
    raise AttributeError(f"module 'forkd' has no attribute {name!r}")

