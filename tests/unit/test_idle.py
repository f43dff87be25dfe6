"""Idle pauses without VMs: the IdlePauser with a real SandboxTable and registry, and
stand-ins for QEMU and the guest agent; a fake clock drives it (no sleeping). The real
pause and resume (and the guest's clock after it) are checked in
tests/integration/test_idle.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from typer.testing import CliRunner

from forkd import bounds
from forkd.cli.main import app as cli_app
from forkd.controller.agent_gateway import AgentGateway
from forkd.controller.idle import IdlePauser
from forkd.controller.sandbox_events import SandboxEvents
from forkd.controller.sandboxes import SandboxTable
from forkd.errors import InvalidRequest
from forkd.host.accel import Accel, VMConfig
from forkd.store.registry import DiskChain, Registry, SandboxRecord
from forkd.vmm.machine import VM
from tests.fakes.app import daemon_app
from tests.fakes.daemon import FakeDaemon, serve_cli
from tests.fakes.qmp import StubQMP

T = TypeVar("T")


@dataclass
class Process:
    dir: Path

    def alive(self) -> bool:
        return True


class _StubAgent:
    """Any typed agent call (``AgentClient``'s): logged as ``agent:<its name>``, answered once the
    VM's gate is open."""

    def __init__(self, vm: StubVM) -> None:
        self._vm = vm

    def __getattr__(self, name: str) -> Callable[..., Awaitable[dict[str, Any]]]:
        async def answer(*_: Any, **__: Any) -> dict[str, Any]:
            self._vm.log.append(f"agent:{name}")
            if self._vm.gate is not None:
                await self._vm.gate.wait()
            return {"ok": True}
        return answer


@dataclass
class StubVM:
    """What the table and the pauser use of a VM: QMP, agent calls, the clock step."""

    dir: Path
    log: list[str] = field(default_factory=list)
    gate: asyncio.Event | None = None  # when set, agent calls wait for it

    def __post_init__(self) -> None:
        self.qmp = StubQMP(commands=self.log)
        self.process = Process(self.dir)
        self.pid = 0

    # The real VM's run-state methods, over this stub's QMP.
    pause = VM.pause
    resume = VM.resume
    is_paused = VM.is_paused
    migration_status = VM.migration_status
    migrating = VM.migrating

    async def call(self, ask: Callable[[Any], Awaitable[T]]) -> T:
        return await ask(_StubAgent(self))

    async def step_clock(self, timeout: float) -> dict[str, Any]:
        self.log.append("agent:clock")
        return {"clock_stepped": True}

    async def await_or_exit(self, aw: Awaitable[T], timeout: float, what: str) -> T:
        return await aw

    async def destroy(self) -> None:
        self.log.append("destroyed")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Harness:
    registry: Registry
    table: SandboxTable
    pauser: IdlePauser
    clock: Clock
    vms: dict[str, StubVM]
    events: SandboxEvents
    agents: AgentGateway

    def add(self, sb_id: str) -> StubVM:
        run_dir = Path(f"/nonexistent/sandboxes/{sb_id}")
        rec = SandboxRecord(id=sb_id, snapshot_tag="py", dir=str(run_dir), created_at_unix=1,
                            config=VMConfig(512, 1, Accel.tcg()), disk=DiskChain.fresh(run_dir, "py"))
        vm = self.vms[sb_id] = StubVM(run_dir)
        self.table.add(rec, vm)  # type: ignore[arg-type]
        return vm


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    registry = Registry(tmp_path / "registry.db")
    events = SandboxEvents()
    table = SandboxTable(registry.sandboxes, registry.aliases, registry.prefixes,
                         tmp_path / "sandboxes", events)
    clock = Clock()
    pauser = IdlePauser(registry.sandboxes, table, events, clock=clock)  # it watches the activity
    yield Harness(registry, table, pauser, clock, {}, events, AgentGateway(table, events))
    registry.close()


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 10))  # type: ignore[arg-type]


def test_an_idle_sandbox_is_paused_and_its_next_request_resumes_it_first(h: Harness) -> None:
    async def main() -> None:
        vm = h.add("sb-000000-0000")
        h.add("sb-000000-0001")  # no policy: never paused
        h.pauser.apply([h.registry.sandboxes.get("sb-000000-0000")], 30)
        assert h.registry.sandboxes.get("sb-000000-0000").idle_pause_secs == 30  # kept for a restart
        h.clock.now += 29
        assert await h.pauser.pause_due() == []
        h.clock.now += 1
        assert await h.pauser.pause_due() == ["sb-000000-0000"]
        assert h.pauser.paused("sb-000000-0000") and vm.log == ["query-migrate", "stop"]
        assert h.pauser.counts() == {"tracked": 1, "paused": 1, "pauses": 1, "resumes": 0}
        vm.log.clear()
        await h.agents.call("sb-000000-0000", lambda agent: agent.ping(5))
        # Resumed, clock stepped, and only then the request itself.
        assert vm.log == ["cont", "agent:clock", "agent:ping"]
        assert not h.pauser.paused("sb-000000-0000")
        # Idle again from the end of that request.
        h.clock.now += 29
        assert await h.pauser.pause_due() == []
        assert h.pauser.next_sleep() == pytest.approx(1)

    run(main())


def test_no_pause_while_a_request_is_in_flight(h: Harness) -> None:
    async def main() -> None:
        vm = h.add("sb-000000-0000")
        h.pauser.apply([h.registry.sandboxes.get("sb-000000-0000")], 5)
        vm.gate = asyncio.Event()
        call = asyncio.create_task(h.agents.call("sb-000000-0000",
                                                  lambda agent: agent.exec({"args": ["true"]}, 60)))
        await asyncio.sleep(0.01)
        h.clock.now += 60  # a long exec
        assert await h.pauser.pause_due() == [] and "stop" not in vm.log
        vm.gate.set()
        await call
        h.clock.now += 4
        assert await h.pauser.pause_due() == []
        h.clock.now += 1
        assert await h.pauser.pause_due() == ["sb-000000-0000"]

    run(main())


def test_no_pause_while_a_live_branch_is_still_copying(h: Harness) -> None:
    async def main() -> None:
        vm = h.add("sb-000000-0000")
        h.pauser.apply([h.registry.sandboxes.get("sb-000000-0000")], 5)
        vm.qmp.migration = "active"
        h.clock.now += 10
        assert await h.pauser.pause_due() == [] and "stop" not in vm.log
        vm.qmp.migration = "completed"
        h.clock.now += 5
        assert await h.pauser.pause_due() == ["sb-000000-0000"]

    run(main())


def test_a_branch_wakes_its_paused_source_under_the_lock(h: Harness) -> None:
    async def main() -> None:
        vm = h.add("sb-000000-0000")
        h.pauser.apply([h.registry.sandboxes.get("sb-000000-0000")], 5)
        h.clock.now += 5
        await h.pauser.pause_due()
        vm.log.clear()
        async with h.table.lock("sb-000000-0000"):
            await h.events.wake_locked("sb-000000-0000")
        assert vm.log == ["cont", "agent:clock"] and not h.pauser.paused("sb-000000-0000")

    run(main())


def test_a_restart_takes_back_policies_and_paused_sandboxes(h: Harness) -> None:
    async def main() -> None:
        paused, running = h.add("sb-000000-0000"), h.add("sb-000000-0001")
        h.pauser.apply([h.registry.sandboxes.get(i) for i in ("sb-000000-0000", "sb-000000-0001")], 5)
        paused.qmp.status_ = "paused"
        # A new daemon (its own events), same VMs.
        again = IdlePauser(h.registry.sandboxes, h.table, SandboxEvents(), clock=h.clock)
        await again.start()
        try:
            assert again.paused("sb-000000-0000") and not again.paused("sb-000000-0001")
            assert again.counts()["tracked"] == 2
            assert running.log == paused.log == []
        finally:
            await again.stop()

    run(main())


def test_a_killed_sandbox_is_forgotten(h: Harness) -> None:
    async def main() -> None:
        h.add("sb-000000-0000")
        h.pauser.apply([h.registry.sandboxes.get("sb-000000-0000")], 5)
        await h.table.kill("sb-000000-0000")
        assert h.pauser.counts()["tracked"] == 0
        h.clock.now += 10
        assert await h.pauser.pause_due() == []

    run(main())


@pytest.mark.parametrize("secs", [0, 0.5, 31 * 86400])
def test_idle_pause_secs_bounds(h: Harness, secs: float) -> None:
    with pytest.raises(InvalidRequest, match="idle_pause_secs"):
        h.pauser.apply([], secs)
    with pytest.raises(InvalidRequest, match="idle_pause_secs"):
        bounds.IDLE_PAUSE_SECS.check(secs)


def test_spawn_route_takes_idle_pause_secs_and_info_shows_the_state(tmp_path: Path) -> None:
    with daemon_app(tmp_path, token=False) as daemon:
        client = daemon.client
        r = client.post("/v1/sandboxes", json={"snapshot_tag": "py", "idle_pause_secs": 30})
        assert r.status_code == 201, r.text
        [info] = r.json()
        assert info["idle_pause_secs"] == 30 and info["state"] == "running"
        assert daemon.runtime.get_sandbox(info["id"]).idle_pause_secs == 30  # the policy is kept
        r = client.post("/v1/sandboxes", json={"snapshot_tag": "py", "idle_pause_secs": 0.5})
        assert r.status_code == 400 and "idle_pause_secs" in r.json()["error"]


@pytest.fixture
def cli_daemon(monkeypatch: pytest.MonkeyPatch) -> FakeDaemon:
    return serve_cli(monkeypatch)


SB = {"id": "sb-000000-0000", "snapshot_tag": "py", "netns": None, "guest_addr": "unix:/x",
      "created_at_unix": 1, "idle_pause_secs": 30, "state": "paused"}


def test_cli_fork_idle_pause_and_ls_state(cli_daemon: FakeDaemon) -> None:
    cli_daemon.on("POST", "/v1/sandboxes", httpx.Response(201, json=[{**SB, "state": "running"}]))
    r = CliRunner().invoke(cli_app, ["fork", "--tag", "py", "--idle-pause", "30", "--json"])
    assert r.exit_code == 0, r.output
    assert cli_daemon.body()["idle_pause_secs"] == 30
    assert CliRunner().invoke(cli_app, ["fork", "--tag", "py", "--idle-pause", "0.5"]).exit_code == 2
    r = CliRunner().invoke(cli_app, ["fork", "--from-sandbox", "sb-000000-0000", "--idle-pause", "30"])
    assert r.exit_code == 2 and "--idle-pause" in r.output
    cli_daemon.on("GET", "/v1/sandboxes", httpx.Response(200, json=[SB]))
    cli_daemon.on("GET", "/v1/snapshots", httpx.Response(200, json=[]))
    cli_daemon.on("GET", "/v1/pools", httpx.Response(200, json=[]))
    r = CliRunner().invoke(cli_app, ["ls"])
    assert r.exit_code == 0 and "STATE" in r.stdout and "paused" in r.stdout


def test_sdk_sends_idle_pause_secs(cli_daemon: FakeDaemon) -> None:
    cli_daemon.on("POST", "/v1/sandboxes", httpx.Response(201, json=[SB]))
    c = cli_daemon.controller()
    assert c.spawn_sandboxes("py", idle_pause_secs=30)[0]["state"] == "paused"
    assert cli_daemon.body() == {"snapshot_tag": "py", "n": 1, "idle_pause_secs": 30}
    c.spawn_sandboxes("py")
    assert "idle_pause_secs" not in cli_daemon.body()
