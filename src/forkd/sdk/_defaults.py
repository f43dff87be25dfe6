"""The shared controllers that sandboxes and snapshots use when given none.

The two flavours differ for a reason, so they are written here by hand rather
than generated one from the other (see ``scripts/unasync_sdk.py``): a
:class:`~forkd.sdk.Controller` can serve every thread of the process,
while an :class:`~forkd.sdk.async_client.AsyncController`'s connections belong
to the event loop that opened them, so there is one per loop.
"""

from __future__ import annotations

import asyncio
import threading
import weakref

from forkd.sdk._generated.client import Controller
from forkd.sdk._http import resolve_token, resolve_url
from forkd.sdk.async_client import AsyncController

_Key = tuple[str, str | None]  # (url, token) as resolved from the environment

_sync: dict[_Key, Controller] = {}
_sync_lock = threading.Lock()
# Per loop, and gone with the loop.
_async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[_Key, AsyncController]] = (
    weakref.WeakKeyDictionary()
)


def _key() -> _Key:
    return resolve_url(None), resolve_token(None)


def default_controller() -> Controller:
    """A process-wide :class:`Controller` for the current ``FORKD_URL``/``FORKD_TOKEN``.

    Sandboxes and snapshots made without an explicit controller share it, so a
    :class:`~forkd.sdk.Snapshot` returned by ``sb.branch()`` keeps
    working after the sandbox's ``with`` block has closed.
    """
    key = _key()
    with _sync_lock:
        controller = _sync.get(key)
        if controller is None:
            controller = _sync[key] = Controller(*key)
        return controller


def default_async_controller() -> AsyncController:
    """The shared :class:`AsyncController` of the running event loop for the current env.

    Raises ``RuntimeError`` outside a running loop.
    """
    loop = asyncio.get_running_loop()
    key = _key()
    per_loop = _async.setdefault(loop, {})
    controller = per_loop.get(key)
    if controller is None:
        controller = per_loop[key] = AsyncController(*key)
    return controller


__all__ = ["default_async_controller", "default_controller"]
