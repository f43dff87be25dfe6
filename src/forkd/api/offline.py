"""The daemon's work done without a daemon: ``forkd pack`` and ``forkd unpack`` on a local data dir.

They run the daemon's own travel owner in this process (``Runtime``'s
``offline_travel``), on the data dir taken alone: while a daemon runs on it they
refuse (409) and say to use ``forkd push``/``pull`` through it, or to stop it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from forkd.config import DataDir

Progress = Callable[[int], None]


def pack(data_dir: Path | None, tag: str, out: Path, *, include_base: bool,
         progress: Progress) -> dict[str, Any]:
    """Pack ``tag`` (and the ancestors its disk needs) into the archive ``out``."""
    from forkd.controller.runtime import offline_travel

    async def run() -> dict[str, Any]:
        async with offline_travel(DataDir.from_env(data_dir)) as travel:
            return await travel.pack(tag, out, include_base=include_base, progress=progress)

    return asyncio.run(run())


def unpack(data_dir: Path | None, archive: Path, *, progress: Progress) -> dict[str, Any]:
    """Verify ``archive`` and register its snapshots here."""
    from forkd.controller.runtime import offline_travel

    async def run() -> dict[str, Any]:
        async with offline_travel(DataDir.from_env(data_dir)) as travel:
            return await travel.unpack(archive, progress=progress)

    return asyncio.run(run())


__all__ = ["pack", "unpack"]
