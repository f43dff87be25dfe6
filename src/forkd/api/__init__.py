"""The forkd REST daemon (API v1): FastAPI app, schemas, bearer auth, audit log, metrics.

``create_app``, ``Settings`` and ``serve`` are resolved on first use so that
importing ``forkd.api.schemas`` (as the SDK or CLI may) does not load uvicorn.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from forkd.api.app import create_app
    from forkd.api.server import serve
    from forkd.api.settings import Settings

__all__ = ["Settings", "create_app", "serve"]

_WHERE = {"create_app": "forkd.api.app", "serve": "forkd.api.server", "Settings": "forkd.api.settings"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'forkd.api' has no attribute {name!r}")
