"""SandboxEvents: the hooks around live sandboxes, and the real Runtime's owners subscribed to them
at construction (no VM: a sandbox's row alone, killed through the real SandboxTable)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from forkd.config import DataDir
from forkd.controller.runtime import Runtime
from forkd.controller.sandbox_events import SandboxEvents
from forkd.store.records import SandboxRecord
from forkd.store.registry import Registry
from tests.unit.test_pools import record

SB = "sb-000000-0000"


def test_a_removal_reaches_every_hook_in_order_past_a_failing_one(caplog: pytest.LogCaptureFixture) -> None:
    events = SandboxEvents()
    heard: list[str] = []

    def hook(name: str, fail: bool = False) -> object:
        async def on_removed(rec: SandboxRecord) -> None:
            heard.append(f"{name}:{rec.id}")
            if fail:
                raise RuntimeError("this hook broke")
        return on_removed

    events.on_removed(hook("first"))  # type: ignore[arg-type]
    events.on_removed(hook("broken", fail=True))  # type: ignore[arg-type]
    events.on_removed(hook("last"))  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="forkd.sandboxes"):
        asyncio.run(events.removed(record(SB)))  # the kill already happened: it must not fail
    assert heard == [f"first:{SB}", f"broken:{SB}", f"last:{SB}"]
    assert f"after removing {SB}" in caplog.text


def test_turns_kills_activity_and_wakes_go_to_their_subscribers() -> None:
    events = SandboxEvents()
    heard: list[str] = []

    async def scenario() -> None:
        # Before anyone subscribes: no activity watcher, no waker, nothing to await.
        async with events.during(SB):
            heard.append("request")
        assert await events.wake(SB) is False
        await events.turn_done(SB)
        await events.killing(SB)

        class Watcher:
            @contextlib.asynccontextmanager
            async def during(self, sandbox_id: str) -> AsyncIterator[None]:
                heard.append(f"resume {sandbox_id}")
                yield

            async def wake_locked(self, sandbox_id: str) -> None:
                heard.append(f"wake_locked {sandbox_id}")

        class Waker:
            async def wake(self, sandbox_id: str) -> bool:
                heard.append(f"wake {sandbox_id}")
                return True

        async def turn(sandbox_id: str) -> None:
            heard.append(f"turn {sandbox_id}")

        async def guard(sandbox_id: str) -> None:
            heard.append(f"guard {sandbox_id}")

        events.watch_activity(Watcher())
        events.wake_with(Waker())
        events.after_turn(turn)
        events.before_kill(guard)
        async with events.during(SB):
            heard.append("request")
        await events.wake_locked(SB)
        assert await events.wake(SB) is True
        await events.turn_done(SB)
        await events.killing(SB)

    asyncio.run(scenario())
    assert heard == ["request", f"resume {SB}", "request", f"wake_locked {SB}", f"wake {SB}",
                     f"turn {SB}", f"guard {SB}"]


def test_the_runtimes_owners_hear_a_kill_through_the_events_they_were_built_with(tmp_path: Path) -> None:
    """No wiring after construction: a sandbox killed through the table is forgotten by the owners
    that kept state for it (its deadline, its idle policy), which subscribed in their constructors."""
    data = DataDir(tmp_path / "data").ensure()
    registry = Registry(data.registry)
    rt = Runtime(data, registry)
    try:
        run_dir = data.sandboxes / SB
        run_dir.mkdir(parents=True)
        row = record(SB)
        row.dir = str(run_dir)
        registry.sandboxes.insert(row)
        rt.reaper.apply([row], 600)
        rt.idle.apply([row], 60)
        assert rt.reaper.deadline(SB) is not None and rt.idle.counts()["tracked"] == 1

        asyncio.run(rt.sandboxes.kill(SB))

        assert not registry.sandboxes.has(SB) and not run_dir.exists()
        assert rt.reaper.deadline(SB) is None
        assert rt.idle.counts()["tracked"] == 0
    finally:
        registry.close()
