"""The one way the controller's owners stop their background task (refill, reaper, warden)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` and wait until it has really ended (None: nothing to do).

    Waiting matters: a task still unwinding could touch a VM the caller is about
    to tear down, or outlive the event loop at daemon shutdown.
    """
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
