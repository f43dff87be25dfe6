"""A thin layer over QEMU's own asyncio QMP client (``qemu.qmp``).

Adds what every caller here needs: connect with a deadline, errors that carry
the command name, and waiting for a migration to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qemu.qmp import EventListener, ExecuteError, QMPClient

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
        """Set migration capabilities; ``events`` is always on (MIGRATION events wake waiters)."""
        caps = {"events": True, **caps}
        await self.cmd(
            "migrate-set-capabilities",
            capabilities=[{"capability": k.replace("_", "-"), "state": v} for k, v in caps.items()],
        )

    async def start_incoming(self, uri: str, **caps: bool) -> None:
        """Set migration capabilities and start loading ``uri``, in one round trip.

        QMP runs one monitor's commands in order, so both go out before either
        answer comes back. Nothing more is needed: without ``-S`` QEMU starts the
        guest once the state is loaded, and exits (saying why on stderr) if it
        cannot load it.
        """
        await asyncio.gather(self.set_capabilities(**caps), self.cmd("migrate-incoming", uri=uri))

    async def wait_incoming(self, events: EventListener, timeout: float) -> bool:
        """Wait until ``events`` (recording MIGRATION and RESUME) sees the load complete;
        whether QEMU resumed the guest by itself (it does when the state was saved
        from a running VM, and emits RESUME before "completed").

        A failed load makes QEMU exit (callers wrap this in ``VM.await_or_exit``);
        a ``failed`` MIGRATION event is reported here too.
        """
        async def loaded() -> bool:
            resumed = False
            while True:
                msg: dict[str, Any] = dict(await events.get())
                if msg.get("event") == "RESUME":
                    resumed = True
                    continue
                status = (msg.get("data") or {}).get("status")
                if status == "completed":
                    return resumed
                if status in ("failed", "cancelled"):
                    raise VMError(f"loading the incoming state {status}")
        try:
            return await asyncio.wait_for(loaded(), timeout)
        except TimeoutError:
            raise VMError(f"the incoming state was not loaded within {timeout:.0f}s") from None

    @contextlib.contextmanager
    def recording(self, *names: str) -> Iterator[EventListener]:
        """Keep the events ``names`` that arrive while the block runs (read ``.history``)."""
        listener = EventListener(names)
        with self.client.listen(listener):
            yield listener

    async def set_parameters(self, **params: Any) -> None:
        await self.cmd("migrate-set-parameters", **{k.replace("_", "-"): v for k, v in params.items()})

    async def run_migration(self, command: str, timeout: float, *,
                            until: tuple[str, ...] = ("completed",), **args: Any) -> dict[str, Any]:
        """Issue ``migrate``/``migrate-incoming``/``migrate-continue`` and wait for its outcome.

        The listener is registered before the command, so no MIGRATION event can
        slip by; events only wake us, and ``query-migrate`` is the authority.
        """
        listener = EventListener(("MIGRATION",))
        with self.client.listen(listener):
            await self.cmd(command, **args)
            return await self._await_migration(listener, timeout, until)

    async def wait_migration(self, timeout: float, *,
                             until: tuple[str, ...] = ("completed",)) -> dict[str, Any]:
        """Wait for a migration already under way (no command issued here)."""
        listener = EventListener(("MIGRATION",))
        with self.client.listen(listener):
            return await self._await_migration(listener, timeout, until)

    async def _await_migration(self, listener: EventListener, timeout: float,
                               until: tuple[str, ...]) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            info: dict[str, Any] = await self.cmd("query-migrate")
            status = info.get("status")
            if status in until:
                return info
            if status in ("failed", "cancelled"):
                raise VMError(f"migration {status}: {info.get('error-desc', 'no detail from QEMU')}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise VMError(f"migration did not finish within {timeout:.0f}s (status {status})")
            # A status change wakes us at once (capability "events"); the bound
            # keeps us honest should an event ever be missed.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(listener.get(), min(remaining, 0.5))

    async def status(self) -> str:
        status: str = (await self.cmd("query-status")).get("status", "unknown")
        return status


def restore_phases(events: EventListener, started_wall: float) -> dict[str, float]:
    """``restored_s`` (state loaded: MIGRATION completed) and ``running_s`` (RESUME), in
    seconds after ``started_wall``, from QEMU's own event timestamps."""
    out: dict[str, float] = {}
    for event in events.history:
        msg: dict[str, Any] = dict(event)
        name = msg.get("event")
        if name == "MIGRATION" and (msg.get("data") or {}).get("status") == "completed":
            out["restored_s"] = max(0.0, _event_time(msg) - started_wall)
        elif name == "RESUME":
            out["running_s"] = max(0.0, _event_time(msg) - started_wall)
    return out


def _event_time(msg: dict[str, Any]) -> float:
    stamp = msg.get("timestamp") or {}
    return float(stamp.get("seconds", 0)) + float(stamp.get("microseconds", 0)) / 1e6
