"""A thin layer over QEMU's own asyncio QMP client (``qemu.qmp``).

Adds what every caller here needs: connect with a deadline, errors that carry
the command name, and waiting for a migration to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from qemu.qmp import ExecuteError, QMPClient

from forkd.errors import VMError

# qemu.qmp logs every disconnect at WARNING; our VMs are torn down on purpose all the time.
logging.getLogger("qemu.qmp").setLevel(logging.ERROR)

# Migration defaults throttle to ~128 MiB/s; RAM-carrying streams go to a local file.
UNTHROTTLED = 64 << 30


class QMP:
    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.client = QMPClient(name)

    async def connect(self, timeout: float = 10.0) -> QMP:
        try:
            await asyncio.wait_for(self.client.connect(str(self.path)), timeout)
        except (TimeoutError, OSError, Exception) as exc:
            raise VMError(f"cannot connect to QMP at {self.path}: {exc}") from exc
        return self

    async def cmd(self, command: str, **args: Any) -> Any:
        try:
            return await self.client.execute(command, args or None)
        except ExecuteError as exc:
            raise VMError(f"QMP {command} failed: {exc.error.error.desc}") from exc
        except Exception as exc:
            raise VMError(f"QMP {command} failed: {type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.disconnect()

    async def set_capabilities(self, **caps: bool) -> None:
        await self.cmd(
            "migrate-set-capabilities",
            capabilities=[{"capability": k.replace("_", "-"), "state": v} for k, v in caps.items()],
        )

    async def set_parameters(self, **params: Any) -> None:
        await self.cmd("migrate-set-parameters", **{k.replace("_", "-"): v for k, v in params.items()})

    async def wait_migration(
        self, timeout: float, *, poll: float = 0.002, until: tuple[str, ...] = ("completed",)
    ) -> dict:
        """Poll ``query-migrate`` until a terminal state; raise on failure."""
        deadline = time.monotonic() + timeout
        while True:
            info = await self.cmd("query-migrate")
            status = info.get("status")
            if status in until:
                return info
            if status in ("failed", "cancelled"):
                raise VMError(f"migration {status}: {info.get('error-desc', 'no detail from QEMU')}")
            if time.monotonic() > deadline:
                raise VMError(f"migration did not finish within {timeout:.0f}s (status {status})")
            await asyncio.sleep(poll)

    async def status(self) -> str:
        return (await self.cmd("query-status")).get("status", "unknown")
