"""Warm pools without VMs: the registry's pool rows and pooled flag, hidden members,
the keeper's claim matching, refill, resize, drain and re-adoption (with stand-ins
for QEMU), the REST routes on the real runtime over the QEMU double, metrics, settings, SDK and CLI."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from forkd.api.settings import ConfigError, Settings, parse_pools
from forkd.cli.main import app as cli_app
from forkd.controller.child_specs import ChildSpec, child_specs
from forkd.controller.options import SpawnOptions
from forkd.controller.pools import PoolKeeper
from forkd.controller.sandbox_events import SandboxEvents
from forkd.controller.sandboxes import SandboxTable
from forkd.errors import InvalidRequest, NotFound
from forkd.guest.protocol import RestoreInputs
from forkd.host.accel import Accel, VMConfig
from forkd.host.egress import EgressPolicy
from forkd.sdk import Controller
from forkd.store.registry import DiskChain, PoolConfig, PoolKey, Registry, SandboxRecord, SnapshotRecord
from forkd.vmm.machine import VM
from tests.fakes.app import AUTH, TOKEN, Daemon, daemon_app, needs_memory_cgroups
from tests.fakes.daemon import FakeDaemon, serve_cli
from tests.fakes.qmp import StubQMP
from tests.fakes.vmm import SLOW_DISK

T = TypeVar("T")


def record(sb_id: str, tag: str = "py", **fields: Any) -> SandboxRecord:
    run_dir = Path(f"/nonexistent/sandboxes/{sb_id}")
    return SandboxRecord(id=sb_id, snapshot_tag=tag, dir=str(run_dir), created_at_unix=1,
                         config=VMConfig(512, 1, Accel.tcg()), disk=DiskChain.fresh(run_dir, tag),
                         pid=None, **fields)


# ------------------------------------------------------------------ registry


def test_pool_targets_and_the_pooled_flag_survive_a_reopen(tmp_path: Path) -> None:
    db = tmp_path / "registry.db"
    reg = Registry(db)
    reg.pools.set(PoolConfig(PoolKey("py", 256, True, False), 3))
    reg.pools.set(PoolConfig(PoolKey("big"), 1))
    reg.pools.set(PoolConfig(PoolKey("big", live_fork=True), 2))  # one pool per tag: replaced
    reg.sandboxes.insert(record("sb-000000-0000", pooled=True, netns="forkd-child-0", memory_limit_mib=256))
    reg.sandboxes.insert(record("sb-000000-0001"))
    reg.close()

    reg = Registry(db)
    assert reg.pools.all() == [PoolConfig(PoolKey("big", None, False, True), 2),
                                PoolConfig(PoolKey("py", 256, True, False), 3)]
    pooled = reg.sandboxes.get("sb-000000-0000")
    assert pooled.pooled and not reg.sandboxes.get("sb-000000-0001").pooled
    assert pooled.pool_key == PoolKey("py", 256, True, False)
    pooled.pooled, pooled.metadata, pooled.created_at_unix = False, {"k": "v"}, 99
    reg.sandboxes.save(pooled)
    again = reg.sandboxes.get("sb-000000-0000")
    assert (again.pooled, again.metadata, again.created_at_unix) == (False, {"k": "v"}, 99)
    reg.pools.delete("py")
    assert [p.tag for p in reg.pools.all()] == ["big"]
    reg.close()


def test_the_match_key_is_the_snapshot_and_the_restore_options() -> None:
    assert record("a").pool_key == PoolKey("py")
    assert record("a", live_fork=True).pool_key != PoolKey("py")
    assert record("a", memory_limit_mib=128).pool_key == PoolKey("py", 128)
    assert record("a", netns="forkd-child-3").pool_key == PoolKey("py", per_child_netns=True)
    assert record("a", tag="other").pool_key != PoolKey("py")


# ------------------------------------------------- the keeper, with stand-ins for VMs


@dataclass
class StubVM:
    """What the keeper uses of a VM: QMP, the post-restore call, teardown."""

    qmp: StubQMP = field(default_factory=StubQMP)
    post_restores: list[RestoreInputs | None] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)  # agent calls besides the post-restore one
    destroyed: bool = False

    # The real VM's run-state methods, over this stub's QMP.
    pause = VM.pause
    resume = VM.resume
    is_paused = VM.is_paused
    migration_status = VM.migration_status
    migrating = VM.migrating

    async def post_restore(self, timeout: float, inputs: RestoreInputs | None = None) -> dict[str, Any]:
        self.post_restores.append(inputs)
        return {"reseeded": True}

    async def call(self, ask: Callable[[Any], Awaitable[T]]) -> T:
        """A typed agent call (``VM.call``): any of ``AgentClient``'s, recorded by its name."""
        calls = self.calls

        class Agent:
            def __getattr__(self, name: str) -> Callable[..., Awaitable[dict[str, Any]]]:
                async def answer(*_: Any) -> dict[str, Any]:
                    calls.append(name)
                    return {}
                return answer

        return await ask(Agent())

    async def await_or_exit(self, aw: Awaitable[T], timeout: float, what: str) -> T:
        return await aw

    async def destroy(self) -> None:
        self.destroyed = True

    async def disconnect(self) -> None:
        pass


class StubSpawner:
    def __init__(self, table: SandboxTable) -> None:
        self.table = table
        self.vms: dict[str, StubVM] = {}
        self.restored: list[PoolKey] = []
        self.fail_with: Exception | None = None
        self.pool: object = None

    def draw_from(self, pool: object) -> None:  # the keeper says so at its construction
        self.pool = pool

    async def wait_idle(self) -> None:
        pass

    async def restore_member(self, key: PoolKey) -> SandboxRecord:
        if self.fail_with is not None:
            raise self.fail_with
        sb_id = f"sb-00000{len(self.restored) % 10}-{len(self.restored):04d}"
        self.restored.append(key)
        rec = record(sb_id, key.tag, memory_limit_mib=key.memory_limit_mib, live_fork=key.live_fork,
                     netns="forkd-child-0" if key.per_child_netns else None, pooled=True)
        self.vms[sb_id] = vm = StubVM()
        self.table.add(rec, vm)  # type: ignore[arg-type]
        return rec


class StubStore:
    def __init__(self, *tags: str) -> None:
        self.tags = set(tags)

    def get(self, tag: str) -> SnapshotRecord:
        if tag not in self.tags:
            raise NotFound(f"snapshot {tag!r} is not registered")
        return SnapshotRecord(tag=tag, dir=f"/nonexistent/{tag}", created_at_unix=1)


@dataclass
class Harness:
    registry: Registry
    table: SandboxTable
    spawner: StubSpawner
    keeper: PoolKeeper

    def members(self) -> list[SandboxRecord]:
        return [sb for sb in self.registry.sandboxes.all() if sb.pooled]

    async def filled(self, tag: str, n: int) -> None:
        for _ in range(500):
            if self.keeper.info(tag)["ready"] == n:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"pool {tag} did not reach {n}: {self.keeper.info(tag)}")


@pytest.fixture
def fast_refill(monkeypatch: pytest.MonkeyPatch) -> None:
    import forkd.controller.pools as pools

    monkeypatch.setattr(pools, "REFILL_GAP_SECS", 0.0)


def harness(tmp_path: Path, registry: Registry | None = None) -> Harness:
    registry = registry or Registry(tmp_path / "registry.db")
    (tmp_path / "sandboxes").mkdir(exist_ok=True)
    events = SandboxEvents()
    table = SandboxTable(registry.sandboxes, registry.aliases, registry.prefixes,
                         tmp_path / "sandboxes", events)
    spawner = StubSpawner(table)
    keeper = PoolKeeper(registry.pools, registry.sandboxes, table, events, spawner,  # type: ignore[arg-type]
                        StubStore("py", "other"))
    assert spawner.pool is keeper  # spawns claim from it
    return Harness(registry, table, spawner, keeper)


def test_refill_pauses_members_and_claims_match_options(tmp_path: Path, fast_refill: None) -> None:
    async def main() -> None:
        h = harness(tmp_path)
        await h.keeper.start()
        try:
            await h.keeper.set(PoolConfig(PoolKey("py", 256), 2))
            await h.filled("py", 2)
            members = h.members()
            assert len(members) == 2
            for m in members:
                assert h.spawner.vms[m.id].qmp.commands == ["stop"]
                # Its first ping and eval paths ran before the pause (translated at refill, not claim).
                assert h.spawner.vms[m.id].calls == ["ping", "eval"]
                with pytest.raises(NotFound):  # hidden from every lookup by id
                    h.table.resolve(m.id)
            # Options differ (no memory limit; other tag): no draw, counted as misses for py.
            miss = await h.keeper.claim("py", [ChildSpec()], SpawnOptions())
            assert miss == [None] and h.keeper.info("py")["misses"] == 1
            # Same limit, other egress: members have the pool's rules, so no draw either.
            opened = EgressPolicy.from_request(None, {"allow_out": ["192.0.2.7:443"]})
            assert await h.keeper.claim("py", [ChildSpec(memory_limit_mib=256)],
                                        SpawnOptions(egress=opened)) == [None]
            assert h.keeper.info("py")["misses"] == 2
            assert await h.keeper.claim("other", [ChildSpec()], SpawnOptions()) == [None]
            # Three matching children, two members: two claims, one miss.
            # The claim gives each child the very RestoreInputs a restore would (VM.restore's).
            asked = SpawnOptions(memory_limit_mib=256, child_env=[{"I": str(i)} for i in range(3)],
                                 guest=RestoreInputs(hostname="pooled-box"), metadata={"n": "x"})
            specs = child_specs(3, asked)
            got = await h.keeper.claim("py", specs, SpawnOptions())
            assert got[2] is None and {g.id for g in got[:2] if g} == {m.id for m in members}
            for i, g in enumerate(got[:2]):
                assert g is not None and not g.pooled and g.metadata == {"n": "x"}
                assert "claimed_s" in g.timings and "ready_s" in g.timings
                vm = h.spawner.vms[g.id]
                assert vm.qmp.commands == ["stop", "cont"]
                assert vm.post_restores == [RestoreInputs(env={"I": str(i)}, hostname="pooled-box")]
                assert h.table.resolve(g.id) == g.id  # visible now
                assert not h.registry.sandboxes.get(g.id).pooled
            info = h.keeper.info("py")
            assert (info["claims"], info["misses"]) == (2, 3)
            await h.filled("py", 2)  # refilled in the background
        finally:
            await h.keeper.stop()

    asyncio.run(main())


def test_a_member_that_fails_its_claim_is_discarded(tmp_path: Path, fast_refill: None) -> None:
    async def main() -> None:
        h = harness(tmp_path)
        await h.keeper.start()
        try:
            await h.keeper.set(PoolConfig(PoolKey("py"), 1))
            await h.filled("py", 1)
            [m] = h.members()
            h.spawner.vms[m.id].qmp.fail = True
            await h.keeper.set(PoolConfig(PoolKey("py"), 0))  # stop refilling; m goes too
            assert h.members() == [] and h.spawner.vms[m.id].destroyed
            await h.keeper.set(PoolConfig(PoolKey("py"), 1))
            await h.filled("py", 1)
            [m2] = h.members()
            await h.keeper.set(PoolConfig(PoolKey("py"), 0))
            assert h.members() == []
            # A broken member (QMP dead) in a pool: the claim falls back to a fresh restore.
            await h.keeper.set(PoolConfig(PoolKey("py"), 1))
            await h.filled("py", 1)
            [m3] = h.members()
            h.spawner.vms[m3.id].qmp.fail = True
            assert await h.keeper.claim("py", [ChildSpec()], SpawnOptions()) == [None]
            assert h.spawner.vms[m3.id].destroyed and m3.id not in h.table
            assert m2.id != m3.id
        finally:
            await h.keeper.stop()

    asyncio.run(main())


def test_resize_option_change_drop_and_backoff(tmp_path: Path, fast_refill: None) -> None:
    async def main() -> None:
        h = harness(tmp_path)
        await h.keeper.start()
        try:
            await h.keeper.set(PoolConfig(PoolKey("py"), 3))
            await h.filled("py", 3)
            await h.keeper.set(PoolConfig(PoolKey("py"), 1))
            assert len(h.members()) == 1
            # New options: every member restored with the old ones goes.
            old = h.members()[0]
            await h.keeper.set(PoolConfig(PoolKey("py", live_fork=True), 2))
            assert old.id not in h.table
            await h.filled("py", 2)
            assert all(m.live_fork for m in h.members())
            await h.keeper.drop("py")
            assert h.members() == [] and h.registry.pools.all() == []
            assert not h.keeper.has("py")
            # A refill that fails backs off and says why.
            h.spawner.fail_with = InvalidRequest("network namespace forkd-child-0 does not exist")
            await h.keeper.set(PoolConfig(PoolKey("other", per_child_netns=True), 1))
            for _ in range(200):
                if "last_error" in h.keeper.info("other"):
                    break
                await asyncio.sleep(0.01)
            assert "forkd-child-0" in h.keeper.info("other")["last_error"]
            assert h.keeper.info("other")["ready"] == 0
        finally:
            await h.keeper.stop()

    asyncio.run(main())


def test_refill_waits_for_foreground_spawns(tmp_path: Path, fast_refill: None) -> None:
    async def main() -> None:
        h = harness(tmp_path)
        idle = asyncio.Event()  # a foreground spawn is in progress until this is set

        async def wait_idle() -> None:
            await idle.wait()

        h.spawner.wait_idle = wait_idle  # type: ignore[method-assign]
        await h.keeper.start()
        try:
            await h.keeper.set(PoolConfig(PoolKey("py"), 2))
            await asyncio.sleep(0.1)
            assert h.spawner.restored == [] and h.keeper.info("py")["ready"] == 0
            idle.set()
            await h.filled("py", 2)
        finally:
            await h.keeper.stop()

    asyncio.run(main())


def test_a_pool_of_a_missing_snapshot_waits(tmp_path: Path, fast_refill: None) -> None:
    async def main() -> None:
        h = harness(tmp_path)
        await h.keeper.start()
        try:
            await h.keeper.set(PoolConfig(PoolKey("later"), 2))
            await asyncio.sleep(0.1)
            assert h.spawner.restored == [] and h.keeper.info("later")["size"] == 2
        finally:
            await h.keeper.stop()

    asyncio.run(main())


def test_restart_keeps_paused_members_and_discards_the_rest(tmp_path: Path) -> None:
    async def main() -> None:
        registry = Registry(tmp_path / "registry.db")
        registry.pools.set(PoolConfig(PoolKey("py"), 2))
        h = harness(tmp_path, registry)
        vms = {"sb-000000-0000": StubVM(StubQMP("paused")),   # back in the pool
               "sb-000000-0001": StubVM(StubQMP("running")),  # was mid-claim: not handed out again
               "sb-000000-0002": StubVM(StubQMP("paused")),   # its pool is gone
               "sb-000000-0003": StubVM(StubQMP("paused")),   # restored with other options
               "sb-000000-0004": StubVM(StubQMP("paused"))}   # back in the pool (its second member)
        tags = {"sb-000000-0002": "gone"}
        for sb_id, vm in vms.items():
            rec = record(sb_id, tags.get(sb_id, "py"), pooled=True,
                         live_fork=sb_id == "sb-000000-0003")
            registry.sandboxes.insert(rec)
            h.table.adopt(sb_id, vm, pooled=True)  # type: ignore[arg-type]
        registry.sandboxes.insert(record("sb-000000-0009"))  # an ordinary sandbox: untouched
        await h.keeper.start()
        try:
            assert sorted(m.id for m in h.members()) == ["sb-000000-0000", "sb-000000-0004"]
            for sb_id in ("sb-000000-0001", "sb-000000-0002", "sb-000000-0003"):
                assert vms[sb_id].destroyed and not registry.sandboxes.has(sb_id)
            assert h.keeper.info("py")["ready"] == 2
            assert registry.sandboxes.has("sb-000000-0009")
        finally:
            await h.keeper.stop()

    asyncio.run(main())


# ------------------------------------------------------------ REST, metrics


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with daemon_app(tmp_path, headers=AUTH) as d:
        # A live branch whose RAM copy does not end while the test runs: a snapshot still written.
        [source] = d.run(d.runtime.spawn, "py", 1, SpawnOptions(live_fork=True))
        (Path(source.dir) / SLOW_DISK).touch()
        d.run(d.runtime.branch, source.id, "writing", "live", False)
        yield d
        (Path(source.dir) / SLOW_DISK).unlink()


@pytest.fixture
def client(daemon: Daemon) -> TestClient:
    return daemon.client


def filled(client: TestClient, tag: str, ready: int) -> dict[str, Any]:
    """The pool of ``tag`` once ``ready`` members are ready (it refills in the background)."""
    deadline = time.monotonic() + 60
    while (info := client.get(f"/v1/snapshots/{tag}/pool").json())["ready"] != ready:
        assert time.monotonic() < deadline, info
        time.sleep(0.02)
    return dict(info)


@needs_memory_cgroups
def test_put_and_get_pool(client: TestClient, daemon: Daemon) -> None:
    r = client.put("/v1/snapshots/py/pool", json={"size": 3, "memory_limit_mib": 256})
    assert r.status_code == 200, r.text
    assert {k: r.json()[k] for k in ("tag", "size", "memory_limit_mib")} == {
        "tag": "py", "size": 3, "memory_limit_mib": 256}
    assert filled(client, "py", 3)["size"] == 3
    # The members are paused children of py, made with the pool's options.
    members = [sb for sb in daemon.runtime.sandboxes.records.all() if sb.pooled]
    assert len(members) == 3 and all(m.memory_limit_mib == 256 and not m.per_child_netns
                                     and not m.live_fork for m in members)
    assert [p["tag"] for p in client.get("/v1/pools").json()] == ["py"]
    r = client.put("/v1/snapshots/py/pool", json={"size": 0})
    assert (r.json()["size"], r.json()["ready"]) == (0, 0)


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/v1/snapshots/nope/pool", {"size": 1}, 404, "not registered"),
        ("/v1/snapshots/writing/pool", {"size": 1}, 409, "still being written"),
        ("/v1/snapshots/py/pool", {"size": -1}, 400, "size"),
        ("/v1/snapshots/py/pool", {"size": 101}, 400, "size"),
        ("/v1/snapshots/py/pool", {"size": "2"}, 400, "size"),
        ("/v1/snapshots/py/pool", {}, 400, "size"),
        ("/v1/snapshots/py/pool", {"size": 1, "memory_limit_mib": 1}, 400, "memory_limit_mib"),
        ("/v1/snapshots/py/pool", {"size": 1, "n": 2}, 400, "n"),
        ("/v1/snapshots/bad tag/pool", {"size": 1}, 400, "tag"),
    ],
)
def test_put_pool_errors(client: TestClient, path: str, body: dict[str, Any], status: int,
                         words: str) -> None:
    r = client.put(path, json=body)
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"} and words in r.json()["error"]


def test_get_pool_of_an_unknown_snapshot_is_404(client: TestClient) -> None:
    r = client.get("/v1/snapshots/nope/pool")
    assert r.status_code == 404 and set(r.json()) == {"error"}
    assert client.get("/v1/snapshots/py/pool").json()["size"] == 0


def test_pool_metrics(client: TestClient, daemon: Daemon) -> None:
    client.put("/v1/snapshots/py/pool", json={"size": 2})
    filled(client, "py", 2)
    assert client.post("/v1/sandboxes", json={"snapshot_tag": "py"}).status_code == 201  # a claim
    filled(client, "py", 2)  # and its refill: three refills in all
    text = client.get("/metrics").text
    for line in ('forkd_pool_target{tag="py"} 2.0', 'forkd_pool_ready{tag="py"} 2.0',
                 'forkd_pool_claims_total{tag="py"} 1.0', 'forkd_pool_misses_total{tag="py"} 0.0',
                 'forkd_pool_refill_seconds_count{tag="py"} 3.0'):
        assert line in text, line
    assert daemon.runtime.pools.take_refill_times() == []  # drained into the histogram
    assert 'forkd_pool_refill_seconds_count{tag="py"} 3.0' in client.get("/metrics").text


# ------------------------------------------------------------ settings, SDK, CLI


def test_pool_settings() -> None:
    assert parse_pools(["py=2", "big=3,other=0"]) == {"py": 2, "big": 3, "other": 0}
    assert parse_pools("a=1, b=2") == {"a": 1, "b": 2}
    assert parse_pools(None) == {}
    for bad in ("py", "py=x", "py=-1", "py=101", "bad tag=1", "=3"):
        with pytest.raises(ConfigError):
            parse_pools(bad)


def test_pool_variable_reaches_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKD_POOLS", "py=2,big=1")
    assert Settings.from_env().pools == {"py": 2, "big": 1}


def test_sdk_pool_methods(client: TestClient) -> None:
    class Via(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            reply = client.request(request.method, request.url.path, content=request.read(),
                                   headers=dict(request.headers))
            return httpx.Response(reply.status_code, headers=reply.headers, content=reply.content)

    c = Controller(url="http://forkd.test", token=TOKEN, transport=Via())
    info = c.set_pool("py", 2, live_fork=True)
    assert (info["size"], info["live_fork"]) == (2, True)
    assert c.get_pool("py")["size"] == 2
    assert [p["tag"] for p in c.list_pools()] == ["py"]


@pytest.fixture
def cli_daemon(monkeypatch: pytest.MonkeyPatch) -> FakeDaemon:
    return serve_cli(monkeypatch)


POOL = {"tag": "py", "size": 2, "ready": 1, "memory_limit_mib": 256, "per_child_netns": False,
        "live_fork": False, "claims": 4, "misses": 1}


def test_cli_pool_sets_and_shows(cli_daemon: FakeDaemon) -> None:
    cli_daemon.on("PUT", "/v1/snapshots/py/pool", httpx.Response(200, json=POOL))
    cli_daemon.on("GET", "/v1/snapshots/py/pool", httpx.Response(200, json=POOL))
    r = CliRunner().invoke(cli_app, ["pool", "py", "2", "--memory-limit-mib", "256", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == POOL and cli_daemon.body() == {"size": 2, "memory_limit_mib": 256}
    r = CliRunner().invoke(cli_app, ["pool", "py"])
    assert r.exit_code == 0 and "ready" in r.stdout and "claims" in r.stdout
    assert cli_daemon.calls()[-1] == ("GET", "/v1/snapshots/py/pool")
    assert CliRunner().invoke(cli_app, ["pool", "py", "101"]).exit_code == 2


def test_cli_ls_shows_pools(cli_daemon: FakeDaemon) -> None:
    cli_daemon.on("GET", "/v1/sandboxes", httpx.Response(200, json=[]))
    cli_daemon.on("GET", "/v1/snapshots", httpx.Response(200, json=[]))
    cli_daemon.on("GET", "/v1/pools", httpx.Response(200, json=[POOL, {**POOL, "tag": "x", "size": 0,
                                                                         "ready": 0}]))
    r = CliRunner().invoke(cli_app, ["ls"])
    assert r.exit_code == 0, r.output
    assert "warm pools" in r.stdout and "256 MiB" in r.stdout
    r = CliRunner().invoke(cli_app, ["ls", "--json"])
    assert [p["tag"] for p in json.loads(r.stdout)["pools"]] == ["py"]  # drained ones are left out
