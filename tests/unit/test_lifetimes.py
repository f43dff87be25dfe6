"""Sandbox lifetimes (controller/lifetimes.py): deadlines, the reaper task, restarts, the API.

Real VMs expiring (QEMU and cgroup gone, also across a restart) are in
tests/integration/test_lifetimes.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from forkd.controller.lifetimes import HIBERNATE_RETRY_SECS, MAX_SLEEP_SECS, DeadlineKeeper, Hibernate
from forkd.controller.sandbox_events import SandboxEvents
from forkd.controller.sandboxes import SandboxTable
from forkd.errors import Conflict, InvalidRequest, NotFound, NotHibernatable
from forkd.store.registry import Registry
from forkd.vmm.machine import VM
from tests.fakes.app import Daemon, daemon_app
from tests.fakes.daemon import clear_env
from tests.unit.test_pools import record


@dataclass
class StubProcess:
    dir: Path = Path("/nonexistent")


class StubVM:
    """What the table's teardown uses of a VM."""

    def __init__(self) -> None:
        self.destroyed = False
        self.process = StubProcess()

    async def destroy(self) -> None:
        self.destroyed = True

    async def disconnect(self) -> None:
        pass


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


Setup = tuple[Registry, SandboxTable, DeadlineKeeper, dict[str, StubVM]]


def setup(tmp_path: Path, clock: Callable[[], float] | None = None,
          hibernate: Hibernate | None = None) -> Setup:
    registry = Registry(tmp_path / "registry.db")
    events = SandboxEvents()
    table = SandboxTable(registry.sandboxes, registry.aliases, registry.prefixes,
                         tmp_path / "sandboxes", events)
    reaper = DeadlineKeeper(registry.sandboxes, table, events, clock or Clock(), hibernate=hibernate)
    vms: dict[str, StubVM] = {}
    for i in range(3):
        sb_id = f"sb-aaaaaa-000{i}"
        vms[sb_id] = StubVM()
        table.add(record(sb_id), cast(VM, vms[sb_id]))
    return registry, table, reaper, vms


def test_apply_records_the_deadline_in_the_row_and_the_info(tmp_path: Path) -> None:
    registry, _, reaper, _ = setup(tmp_path)
    rec = registry.sandboxes.get("sb-aaaaaa-0000")
    reaper.apply([rec], 5)
    assert rec.expires_at_unix == 1005.0 and rec.info()["expires_at_unix"] == 1005.0
    assert registry.sandboxes.get("sb-aaaaaa-0000").expires_at_unix == 1005.0
    assert "expires_at_unix" not in registry.sandboxes.get("sb-aaaaaa-0001").info()
    reaper.apply([registry.sandboxes.get("sb-aaaaaa-0001")], None)  # no timeout: no deadline
    assert registry.sandboxes.get("sb-aaaaaa-0001").expires_at_unix is None


@pytest.mark.parametrize("bad", [0, -1, 30 * 86400 + 1, True, "5"])
def test_bad_timeouts_are_refused(tmp_path: Path, bad: object) -> None:
    registry, _, reaper, _ = setup(tmp_path)
    with pytest.raises(InvalidRequest, match="timeout_secs"):
        reaper.apply([registry.sandboxes.get("sb-aaaaaa-0000")], bad)  # type: ignore[arg-type]
    if bad != 0:  # set_timeout(0) is "now" (below)
        with pytest.raises(InvalidRequest, match="timeout_secs"):
            reaper.set_timeout("sb-aaaaaa-0000", bad)  # type: ignore[arg-type]


def test_next_sleep_is_until_the_earliest_deadline(tmp_path: Path) -> None:
    clock = Clock()
    registry, _, reaper, _ = setup(tmp_path, clock)
    assert reaper.next_sleep() == MAX_SLEEP_SECS  # nothing to wait for: no busy loop
    reaper.apply([registry.sandboxes.get("sb-aaaaaa-0000")], 30)
    reaper.apply([registry.sandboxes.get("sb-aaaaaa-0001")], 10)
    assert reaper.next_sleep() == 10
    clock.now += 11
    assert reaper.next_sleep() == 0
    reaper.apply([registry.sandboxes.get("sb-aaaaaa-0002")], 3600)
    clock.now = 0
    assert reaper.next_sleep() == MAX_SLEEP_SECS  # capped: a clock step cannot postpone for long


def test_set_timeout_moves_the_deadline_either_way(tmp_path: Path) -> None:
    clock = Clock()
    registry, _, reaper, _ = setup(tmp_path, clock)
    assert reaper.set_timeout("sb-aaaaaa-0000", 100) == 1100  # a sandbox without one gets one
    clock.now += 50
    assert reaper.set_timeout("sb-aaaaaa-0000", 10) == 1060  # sooner than before: E2B semantics
    assert registry.sandboxes.get("sb-aaaaaa-0000").expires_at_unix == 1060
    with pytest.raises(NotFound):
        reaper.set_timeout("sb-aaaaaa-0009", 10)
    assert reaper.set_timeout("sb-aaaaaa-0000", 0) == 1050  # E2B's set_timeout(0): due now
    assert reaper.next_sleep() == 0


def test_the_task_kills_what_expires_and_only_that(tmp_path: Path) -> None:
    async def main() -> None:
        registry, table, reaper, vms = setup(tmp_path, time.time)  # real time, short sleeps
        await reaper.start()
        try:
            reaper.apply([registry.sandboxes.get("sb-aaaaaa-0000")], 0.2)
            reaper.apply([registry.sandboxes.get("sb-aaaaaa-0001")], 0.4)
            reaper.set_timeout("sb-aaaaaa-0001", 60)  # extended before it was due
            await asyncio.sleep(0.6)
            assert vms["sb-aaaaaa-0000"].destroyed and "sb-aaaaaa-0000" not in table
            assert not registry.sandboxes.has("sb-aaaaaa-0000")
            assert not vms["sb-aaaaaa-0001"].destroyed and "sb-aaaaaa-0001" in table
            assert reaper.deadline("sb-aaaaaa-0000") is None
            # A kill by hand drops the deadline (the on_removed hook).
            await table.kill("sb-aaaaaa-0001")
            assert reaper.deadline("sb-aaaaaa-0001") is None
        finally:
            await reaper.stop()

    asyncio.run(main())


def test_start_kills_the_expired_at_once_and_schedules_the_rest(tmp_path: Path) -> None:
    async def main() -> None:
        clock = Clock()
        registry, table, reaper, vms = setup(tmp_path, clock)
        reaper.apply([registry.sandboxes.get("sb-aaaaaa-0000")], 5)
        reaper.apply([registry.sandboxes.get("sb-aaaaaa-0001")], 500)
        # A pool member never expires, whatever its row says.
        pooled = registry.sandboxes.get("sb-aaaaaa-0002")
        pooled.pooled, pooled.expires_at_unix = True, 1.0
        registry.sandboxes.save(pooled)
        # "Restart": a new reaper reads the rows, later on the clock.
        clock.now += 10
        fresh = DeadlineKeeper(registry.sandboxes, table, table._events, clock)  # told of kills too
        await fresh.start()
        try:
            assert vms["sb-aaaaaa-0000"].destroyed and not registry.sandboxes.has("sb-aaaaaa-0000")
            assert fresh.deadline("sb-aaaaaa-0001") == 1500
            assert fresh.deadline("sb-aaaaaa-0002") is None and registry.sandboxes.has("sb-aaaaaa-0002")
        finally:
            await fresh.stop()

    asyncio.run(main())


def test_an_already_gone_sandbox_is_not_an_error(tmp_path: Path) -> None:
    async def main() -> None:
        clock = Clock()
        registry, table, reaper, _ = setup(tmp_path, clock)
        reaper.apply([registry.sandboxes.get("sb-aaaaaa-0000")], 1)
        registry.sandboxes.delete("sb-aaaaaa-0000")
        table._vms.pop("sb-aaaaaa-0000")
        clock.now += 2
        await reaper.start()
        await reaper.stop()

    asyncio.run(main())


# ------------------------------------------------------------------- the API


@pytest.fixture
def daemon(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Daemon]:
    clear_env(monkeypatch)
    with daemon_app(tmp_path, token=False) as d:
        yield d


def within(answer: Any, secs: float, before: float, after: float) -> bool:
    """The deadline was set ``secs`` from a moment between ``before`` and ``after``."""
    return before + secs <= float(answer) <= after + secs


def test_api_timeout_at_spawn_fork_and_after(daemon: Daemon) -> None:
    http = daemon.client
    before = time.time()
    r = http.post("/v1/sandboxes", json={"snapshot_tag": "py", "timeout_secs": 5})
    assert r.status_code == 201, r.text
    child: dict[str, Any] = r.json()[0]
    assert within(child["expires_at_unix"], 5, before, time.time())
    before = time.time()
    r = http.post(f"/v1/sandboxes/{child['id']}/timeout", json={"timeout_secs": 60})
    assert r.status_code == 200 and within(r.json()["expires_at_unix"], 60, before, time.time())
    before = time.time()
    r = http.post(f"/v1/sandboxes/{child['id']}/fork", json={"timeout_secs": 7.5})
    assert r.status_code == 201
    assert within(r.json()["children"][0]["expires_at_unix"], 7.5, before, time.time())
    assert http.post("/v1/sandboxes/sb-abcdef-0099/timeout", json={"timeout_secs": 5}).status_code == 404


@pytest.mark.parametrize("body", [{"timeout_secs": 0}, {"timeout_secs": -1}, {"timeout_secs": "5"},
                                  {"timeout_secs": 2592001}, {}])
def test_api_refuses_bad_timeouts(daemon: Daemon, body: dict[str, Any]) -> None:
    http, sb = daemon.client, daemon.sandbox().id
    assert http.post(f"/v1/sandboxes/{sb}/timeout", json=body).status_code == 400
    if body:
        spawn = {"snapshot_tag": "py", **body}
        assert http.post("/v1/sandboxes", json=spawn).status_code == 400


def test_a_deadline_with_hibernate_on_timeout_hibernates_retries_when_busy_and_ends(tmp_path: Path) -> None:
    async def main() -> None:
        clock = Clock()
        asked: list[str] = []
        busy = [True]

        async def hibernate(sb_id: str, *, memory: bool = True) -> None:
            assert memory
            asked.append(sb_id)
            if busy[0]:
                raise Conflict("requests under way")

        registry, table, reaper, vms = setup(tmp_path, clock, hibernate)
        reaper.apply([registry.sandboxes.get("sb-aaaaaa-0000")], 5, hibernate=True)
        reaper.apply([registry.sandboxes.get("sb-aaaaaa-0001")], 5)  # killed as ever
        assert registry.sandboxes.get("sb-aaaaaa-0000").hibernate_on_timeout  # kept for a restart
        clock.now += 5
        await reaper._reap_due()
        assert asked == ["sb-aaaaaa-0000"] and "sb-aaaaaa-0000" in table and "sb-aaaaaa-0001" not in table
        assert reaper.deadline("sb-aaaaaa-0000") == clock.now + HIBERNATE_RETRY_SECS  # busy: soon again
        busy[0] = False
        clock.now += HIBERNATE_RETRY_SECS
        await reaper._reap_due()
        assert asked == ["sb-aaaaaa-0000"] * 2 and not vms["sb-aaaaaa-0000"].destroyed
        # Hibernated, it has no deadline until a wake gives it one.
        assert reaper.deadline("sb-aaaaaa-0000") is None
        assert registry.sandboxes.get("sb-aaaaaa-0000").expires_at_unix is None

    asyncio.run(main())


def test_a_disk_only_timeout_hibernation_is_asked_for_and_survives_a_restart(tmp_path: Path) -> None:
    """E2B's filesystem-only pause at the timeout (``autoPauseMemory: false``): the deadline asks
    for a hibernation with ``memory=False``, and a daemon started afterwards still does."""
    async def main() -> None:
        clock = Clock()
        registry, table, reaper, _ = setup(tmp_path, clock)
        asked: list[tuple[str, bool]] = []

        async def hibernate(sb_id: str, *, memory: bool = True) -> None:
            asked.append((sb_id, memory))

        reaper.apply([registry.sandboxes.get("sb-aaaaaa-0000")], 5, hibernate=True, memory=False)
        reaper.apply([registry.sandboxes.get("sb-aaaaaa-0001")], 5, hibernate=True)
        row = registry.sandboxes.get("sb-aaaaaa-0000")
        assert row.hibernate_on_timeout and not row.hibernate_on_timeout_memory
        assert registry.sandboxes.get("sb-aaaaaa-0001").hibernate_on_timeout_memory
        # The next daemon: a new keeper over the same registry, whose start adopts the deadlines.
        await reaper.stop()
        again = DeadlineKeeper(registry.sandboxes, table, SandboxEvents(), clock, hibernate=hibernate)
        clock.now += 5
        await again.start()
        await again.stop()
        assert sorted(asked) == [("sb-aaaaaa-0000", False), ("sb-aaaaaa-0001", True)]

    asyncio.run(main())


def test_an_expired_sandbox_that_cannot_be_hibernated_is_killed(tmp_path: Path) -> None:
    async def main() -> None:
        clock = Clock()

        async def hibernate(sb_id: str, *, memory: bool = True) -> None:
            raise NotHibernatable("a per_child_netns sandbox cannot be hibernated")

        registry, _, reaper, vms = setup(tmp_path, clock, hibernate)
        reaper.apply([registry.sandboxes.get("sb-aaaaaa-0000")], 5, hibernate=True)
        clock.now += 5
        await reaper._reap_due()
        assert vms["sb-aaaaaa-0000"].destroyed and not registry.sandboxes.has("sb-aaaaaa-0000")

    asyncio.run(main())


def test_a_fork_gives_its_children_idle_policies(daemon: Daemon) -> None:
    """idle_pause_secs and idle_hibernate_secs on a fork are the children's, as on a spawn; one that
    cannot be hibernated (live_fork) is refused before the source is paused for the branch."""
    http, sb = daemon.client, daemon.sandbox().id
    r = http.post(f"/v1/sandboxes/{sb}/fork", json={"idle_pause_secs": 30, "idle_hibernate_secs": 600})
    assert r.status_code == 201, r.text
    [kid] = [daemon.runtime.get_sandbox(c["id"]) for c in r.json()["children"]]
    assert kid.idle_pause_secs == 30 and kid.idle_hibernate_secs == 600
    snapshots = daemon.runtime.list_snapshots()
    refused = http.post(f"/v1/sandboxes/{sb}/fork", json={"idle_hibernate_secs": 600, "live_fork": True})
    assert refused.status_code == 409 and "cannot be hibernated" in refused.json()["error"], refused.text
    assert daemon.runtime.list_snapshots() == snapshots  # refused before the source was branched
    assert http.post(f"/v1/sandboxes/{sb}/fork", json={"idle_pause_secs": 0}).status_code == 400
