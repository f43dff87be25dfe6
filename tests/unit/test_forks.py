"""Fork of a running sandbox: per-child specs, id aliases, the fork-snapshot collector,
promote's rules, and the REST routes (the real Runtime over the QEMU double). Real VMs: integration/."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from forkd.controller.branch import Brancher
from forkd.controller.child_specs import child_specs
from forkd.controller.forks import Forker, ForkOptions
from forkd.controller.hibernated_branch import HibernatedBrancher
from forkd.controller.network import Networks
from forkd.controller.options import SpawnOptions, option_names
from forkd.controller.sandbox_events import SandboxEvents
from forkd.controller.sandboxes import SandboxTable
from forkd.controller.snapshots import SnapshotStore
from forkd.controller.spawner import Spawner
from forkd.controller.tags import TagReservations
from forkd.errors import BootTimeout, Conflict, InvalidRequest, NotFound
from forkd.guest.protocol import RestoreInputs
from forkd.host.egress import EgressPolicy
from forkd.store.registry import MAX_ALIAS_HOPS, DiskChain, Registry, SandboxRecord, SnapshotRecord
from tests.fakes.app import AUTH, Daemon, daemon_app, needs_memory_cgroups
from tests.unit.test_controller import CONFIG, FakeVM, _store

SRC = "sb-abcdef-9999"


# ------------------------------------------------------------------ child specs

def test_child_env_applies_over_env_one_per_child() -> None:
    options = SpawnOptions(env={"A": "all", "B": "all"}, child_env=[{"B": "0"}, {}, {"A": "2"}],
                           metadata={"task": "t"}, memory_limit_mib=256,
                           guest=RestoreInputs(hostname="box-1"))
    specs = child_specs(3, options, [None, 512, None])
    assert [s.restore for s in specs] == [
        RestoreInputs(env={"A": "all", "B": "0"}, hostname="box-1"),
        RestoreInputs(env={"A": "all", "B": "all"}, hostname="box-1"),
        RestoreInputs(env={"A": "2", "B": "all"}, hostname="box-1")]
    assert [s.memory_limit_mib for s in specs] == [256, 512, 256]
    assert all(s.metadata == {"task": "t"} for s in specs)


def test_every_restore_input_is_a_spawn_option_of_the_same_name() -> None:
    """A request's field of a RestoreInputs field's name goes into SpawnOptions.guest, and on whole
    to each child: a new guest input needs no code in between (ForkOptions has it too: its
    children's options are SpawnOptions)."""
    daemon_only = set(RestoreInputs.DAEMON_ONLY)  # trust: the daemon's, never a request's
    assert {f.name for f in dataclasses.fields(RestoreInputs)} - daemon_only <= option_names()
    assert not daemon_only & option_names()
    fork = ForkOptions.from_request({"hostname": "a.b", "env": {"K": "v"}, "keep_snapshot": True})
    assert fork == ForkOptions(SpawnOptions(guest=RestoreInputs(hostname="a.b"), env={"K": "v"}),
                               keep_snapshot=True)
    assert child_specs(1, fork.spawn)[0].restore == RestoreInputs(env={"K": "v"}, hostname="a.b")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"child_env": [{}]}, "child_env has 1 entries but 2 children"),
    ({"child_memory_limit_mib": [None, None, None]}, "child_memory_limit_mib has 3 entries"),
    ({"env": {"A=B": "x"}}, "env must map variable names"),
    ({"env": {"": "x"}}, "env must map variable names"),
    ({"child_env": [{"A": "nul\0"}, {}]}, "without NUL"),
    ({"env": {f"V{i}": "x" for i in range(257)}}, "env may have at most 256 entries"),
    ({"metadata": {"k" * 129: "v"}}, "metadata keys must be 1 to 128"),
    ({"hostname": "-box"}, "hostname must be RFC 1123 labels"),
    ({"hostname": "a" * 64}, "hostname must be RFC 1123 labels"),  # a label is at most 63
    ({"hostname": ".".join(["a" * 30] * 3)}, "at most 64 characters"),
    ({"hostname": "under_score"}, "hostname must be RFC 1123 labels"),
])
def test_bad_per_child_inputs_are_400_before_any_vm(kwargs: dict[str, Any], message: str) -> None:
    child_memory_limit_mib = kwargs.pop("child_memory_limit_mib", None)
    with pytest.raises(InvalidRequest, match=message):
        child_specs(2, SpawnOptions.from_request(kwargs), child_memory_limit_mib)


# ------------------------------------------------------------------ aliases

@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    reg = Registry(tmp_path / "forkd.db")
    yield reg
    reg.close()


def test_aliases_follow_chains_and_survive_reopening(registry: Registry, tmp_path: Path) -> None:
    registry.aliases.set("sb-000000-0000", "sb-111111-0000")
    registry.aliases.set("sb-111111-0000", "sb-222222-0000")  # the winner was itself replaced later
    assert registry.aliases.resolve("sb-000000-0000") == "sb-222222-0000"
    assert registry.aliases.resolve("sb-333333-0000") == "sb-333333-0000"
    registry.close()
    again = Registry(tmp_path / "forkd.db")
    try:
        assert again.aliases.resolve("sb-000000-0000") == "sb-222222-0000"
    finally:
        again.close()


def test_an_alias_loop_does_not_hang(registry: Registry) -> None:
    registry.aliases.set("sb-000000-0000", "sb-111111-0000")
    registry.aliases.set("sb-111111-0000", "sb-000000-0000")
    assert registry.aliases.resolve("sb-000000-0000") in {"sb-000000-0000", "sb-111111-0000"}
    assert MAX_ALIAS_HOPS >= 2


# ------------------------------------------------------------------ collector and promote

class _NoSpawns:
    """A spawner that restores nothing: the real request checks, a real network owner."""

    check_limits = staticmethod(Spawner.check_limits)

    def __init__(self, networks: Networks) -> None:
        self._networks = networks

    def check_capacity(self, n: int) -> None:
        """No ceiling here (a host's limits have their own tests, test_capacity.py)."""

    async def check_network(self, *, tap: str | None, dns: tuple[str, ...], egress: EgressPolicy | None,
                            per_child_netns: bool, what: str) -> None:
        await self._networks.prepare(tap=tap, dns=dns, egress=egress or EgressPolicy(),
                                     per_child_netns=per_child_netns, what=what)

    def spawning(self, _tag: str) -> bool:
        return False


def _forker(registry: Registry, tmp_path: Path) -> tuple[Forker, SandboxTable, SnapshotStore]:
    events = SandboxEvents()
    table = SandboxTable(registry.sandboxes, registry.aliases, registry.prefixes,
                         tmp_path / "sandboxes", events)
    tags = TagReservations(registry.snapshots.has)
    store = _store(registry, tmp_path, tags)
    brancher = Brancher(registry.sandboxes, tmp_path / "snapshots", table, events, store, tags)
    spawner = _NoSpawns(Networks(tmp_path, registry.sandboxes))
    asleep = HibernatedBrancher(brancher, tmp_path / "snapshots", table, store, tags)
    forker = Forker(registry.sandboxes, registry.aliases, table, events, brancher, spawner, store,  # type: ignore[arg-type]
                    tags, asleep)
    return forker, table, store


def _snap(registry: Registry, tmp_path: Path, tag: str, **fields: Any) -> None:
    path = tmp_path / "snapshots" / tag
    path.mkdir(parents=True)
    registry.snapshots.insert(SnapshotRecord(tag=tag, dir=str(path), created_at_unix=1, **fields))


def _child(registry: Registry, table: SandboxTable, tmp_path: Path, sb_id: str, tag: str,
           **metadata: str) -> None:
    run_dir = tmp_path / "sandboxes" / sb_id
    run_dir.mkdir(parents=True)
    table.add(SandboxRecord(id=sb_id, snapshot_tag=tag, dir=str(run_dir), created_at_unix=1, config=CONFIG,
                            disk=DiskChain.fresh(run_dir, tag), pid=1, metadata=metadata),
              FakeVM([]))  # type: ignore[arg-type]


def test_a_fork_snapshot_goes_with_its_last_child(registry: Registry, tmp_path: Path) -> None:
    forker, table, _store = _forker(registry, tmp_path)
    _snap(registry, tmp_path, "py")
    _snap(registry, tmp_path, "fork-1", parent_tag="py", auto_delete=True)
    _snap(registry, tmp_path, "kept", parent_tag="py")
    _child(registry, table, tmp_path, "sb-aaaaaa-0000", "fork-1")
    _child(registry, table, tmp_path, "sb-aaaaaa-0001", "fork-1")
    assert asyncio.run(forker.collect()) == []
    asyncio.run(table.kill("sb-aaaaaa-0000"))
    assert registry.snapshots.has("fork-1")  # one child still runs from it
    asyncio.run(table.kill("sb-aaaaaa-0001"))
    assert not registry.snapshots.has("fork-1")
    assert not (tmp_path / "snapshots" / "fork-1").exists()
    assert registry.snapshots.has("kept") and registry.snapshots.has("py")


def test_a_fork_snapshot_with_dependents_stays_until_they_go(registry: Registry, tmp_path: Path) -> None:
    forker, _table, store = _forker(registry, tmp_path)
    _snap(registry, tmp_path, "py")
    _snap(registry, tmp_path, "fork-1", parent_tag="py", auto_delete=True)
    _snap(registry, tmp_path, "grandchild", parent_tag="fork-1", auto_delete=True, status="writing")
    assert asyncio.run(forker.collect()) == []  # still being written
    registry.snapshots.set_status("grandchild", "ready")
    # Both go, the dependent first, in one collection.
    assert asyncio.run(forker.collect()) == ["grandchild", "fork-1"]
    assert [s.tag for s in store.all()] == ["py"]


def test_egress_for_a_source_without_a_nic_is_refused_before_its_pause(
        registry: Registry, tmp_path: Path) -> None:
    forker, table, _store = _forker(registry, tmp_path)
    _snap(registry, tmp_path, "py")
    _child(registry, table, tmp_path, SRC, "py")
    options = ForkOptions(SpawnOptions(egress=EgressPolicy.from_request(True)))
    with pytest.raises(InvalidRequest, match="has no network device"):
        asyncio.run(forker.fork(SRC, 1, options))
    assert registry.snapshots.all()[0].tag == "py" and len(registry.snapshots.all()) == 1  # no branch


class _BranchesInSequence:
    """Stands in for ``Brancher.branch`` alone (the capture needs a VM): a real branch row per call."""

    def __init__(self, registry: Registry, tmp_path: Path) -> None:
        self.registry, self.tmp_path = registry, tmp_path
        self.tags: list[str] = []

    async def branch(self, sandbox_id: str, tag: str | None, mode: str, wait: bool) -> SnapshotRecord:
        tag = f"branch-{sandbox_id}-{len(self.tags) + 1}"
        self.tags.append(tag)
        _snap(self.registry, self.tmp_path, tag, parent_tag="py", pause_ms=10.0)
        return self.registry.snapshots.get(tag)


class _FirstBranchIsBad(_NoSpawns):
    """Restores from the first branch: child 0 comes up, child 1 never answers (as a branch whose
    every restore panics in the guest); from any later branch, every child comes up."""

    def __init__(self, networks: Networks, registry: Registry, table: SandboxTable, tmp_path: Path) -> None:
        super().__init__(networks)
        self.registry, self.table, self.tmp_path = registry, table, tmp_path
        self.spawned_from: list[str] = []

    async def spawn_each(self, tag: str, specs: list[Any], options: Any) -> list[Any]:
        out: list[Any] = []
        for i, _spec in enumerate(specs):
            self.spawned_from.append(tag)
            if tag.endswith("-1") and i == 1:
                out.append(BootTimeout(f"child of {tag!r} did not come up after 2 restores: Kernel panic"))
                continue
            sb_id = f"sb-{'abcdef' if tag.endswith('-1') else 'bcdefa'}-000{i}"
            _child(self.registry, self.table, self.tmp_path, sb_id, tag)
            out.append(self.registry.sandboxes.get(sb_id))
        return out


def test_a_fork_whose_children_cannot_come_up_branches_once_more(registry: Registry, tmp_path: Path) -> None:
    """Siblings from one state: what came up from the bad branch is killed, the bad branch goes
    (even with keep_snapshot), and every child comes from the second branch."""
    forker, table, _store = _forker(registry, tmp_path)
    brancher = _BranchesInSequence(registry, tmp_path)
    spawner = _FirstBranchIsBad(Networks(tmp_path, registry.sandboxes), registry, table, tmp_path)
    forker._brancher.branch = brancher.branch  # type: ignore[method-assign]
    forker._spawner = spawner  # type: ignore[assignment]
    _snap(registry, tmp_path, "py")
    _child(registry, table, tmp_path, SRC, "py")
    report = asyncio.run(forker.fork(SRC, 2, ForkOptions(keep_snapshot=True)))
    assert brancher.tags == [f"branch-{SRC}-1", f"branch-{SRC}-2"]
    assert report.errors == [] and report.snapshot_tag == f"branch-{SRC}-2"
    assert [c.snapshot_tag for c in report.children] == [f"branch-{SRC}-2"] * 2
    assert report.pause_ms == 20.0  # the source was paused twice
    assert not registry.sandboxes.has("sb-abcdef-0000")  # the first branch's child was killed
    assert not registry.snapshots.has(f"branch-{SRC}-1") and registry.snapshots.has(f"branch-{SRC}-2")


def test_a_second_bad_branch_is_reported_per_child(registry: Registry, tmp_path: Path) -> None:
    forker, table, _store = _forker(registry, tmp_path)
    brancher = _BranchesInSequence(registry, tmp_path)
    spawner = _FirstBranchIsBad(Networks(tmp_path, registry.sandboxes), registry, table, tmp_path)

    async def always_bad(tag: str, specs: list[Any], options: Any) -> list[Any]:
        return [BootTimeout(f"child {i} of {tag!r} did not come up") for i in range(len(specs))]

    spawner.spawn_each = always_bad  # type: ignore[method-assign]
    forker._brancher.branch = brancher.branch  # type: ignore[method-assign]
    forker._spawner = spawner  # type: ignore[assignment]
    _snap(registry, tmp_path, "py")
    _child(registry, table, tmp_path, SRC, "py")
    report = asyncio.run(forker.fork(SRC, 2))
    assert len(brancher.tags) == 2  # one retry, no more
    assert [e["index"] for e in report.errors] == [0, 1] and report.children == []
    assert not any(registry.snapshots.has(tag) for tag in brancher.tags)  # both collected


def test_promote_refuses_what_is_not_a_fork_tree_child(registry: Registry, tmp_path: Path) -> None:
    forker, table, _store = _forker(registry, tmp_path)
    _snap(registry, tmp_path, "py")
    _child(registry, table, tmp_path, "sb-aaaaaa-0000", "py")
    _child(registry, table, tmp_path, "sb-bbbbbb-0000", "py", fork_tree_id="ft-0123456789ab",
           fork_parent_id=SRC, fork_index="0")
    with pytest.raises(Conflict, match="not made by a fork-tree"):
        asyncio.run(forker.promote("sb-aaaaaa-0000"))
    with pytest.raises(Conflict, match="is not a child of fork-tree 'ft-ffffffffffff'"):
        asyncio.run(forker.promote("sb-bbbbbb-0000", tree_id="ft-ffffffffffff"))
    with pytest.raises(NotFound):
        asyncio.run(forker.promote("sb-cccccc-0000"))
    assert {sb.id for sb in registry.sandboxes.all()} == {"sb-aaaaaa-0000", "sb-bbbbbb-0000"}


def test_promote_replace_parent_makes_the_source_id_an_alias(registry: Registry, tmp_path: Path) -> None:
    forker, table, _store = _forker(registry, tmp_path)
    _snap(registry, tmp_path, "py")
    _child(registry, table, tmp_path, SRC, "py")
    tree = {"fork_tree_id": "ft-0123456789ab", "fork_parent_id": SRC}
    _child(registry, table, tmp_path, "sb-bbbbbb-0000", "py", **tree, fork_index="0")
    _child(registry, table, tmp_path, "sb-bbbbbb-0001", "py", **tree, fork_index="1")
    report = asyncio.run(forker.promote("sb-bbbbbb-0001", replace_parent=True))
    assert report["deleted"] == [{"id": "sb-bbbbbb-0000", "deleted": True}, {"id": SRC, "deleted": True}]
    assert report["replaced_parent"] == SRC
    assert table.resolve(SRC) == "sb-bbbbbb-0001"
    assert table.get(SRC) is table.get("sb-bbbbbb-0001")
    asyncio.run(table.kill(SRC))  # the winner, under the source's name
    assert registry.sandboxes.all() == []


# ------------------------------------------------------------------ REST routes (the real Runtime)

@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with daemon_app(tmp_path, headers=AUTH) as d:
        yield d


@pytest.fixture
def src(daemon: Daemon) -> str:
    return daemon.sandbox("py").id


@pytest.fixture
def client(daemon: Daemon) -> TestClient:
    return daemon.client


def _error(resp: httpx.Response, status: int, contains: str) -> None:
    assert resp.status_code == status, resp.text
    assert set(resp.json()) == {"error"}
    assert contains in resp.json()["error"], resp.json()


@needs_memory_cgroups
def test_fork_route_answers_children_and_errors(src: str, client: TestClient) -> None:
    # A child whose memory limit is below what a QEMU needs is OOM-killed (tests/fakes/vmm.py).
    resp = client.post(f"/v1/sandboxes/{src}/fork",
                       json={"count": 3, "child_memory_limit_mib": [None, 64, None]})
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert body["parent_id"] == src
    assert len(body["children"]) == 2
    [error] = body["errors"]
    assert error["index"] == 1 and "was OOM-killed while restoring" in error["error"]
    assert "tree_id" not in body


def test_fork_tree_promote_and_alias_over_http(src: str, client: TestClient) -> None:
    tree = client.post(f"/v1/sandboxes/{src}/fork-tree", json={"count": 3}).json()
    kids = [c["id"] for c in tree["children"]]
    assert all(c["metadata"]["fork_tree_id"] == tree["tree_id"] for c in tree["children"])
    listed = client.get("/v1/sandboxes", params={"metadata": f"fork_tree_id={tree['tree_id']}"}).json()
    assert sorted(s["id"] for s in listed) == sorted(kids)
    resp = client.post(f"/v1/sandboxes/{kids[2]}/promote", json={"replace_parent": True})
    assert resp.status_code == 200, resp.text
    assert resp.json()["replaced_parent"] == src
    assert client.get(f"/v1/sandboxes/{src}").json()["id"] == kids[2]
    assert [s["id"] for s in client.get("/v1/sandboxes").json()] == [kids[2]]


@pytest.mark.parametrize(("path", "body", "status", "contains"), [
    ("fork", {"count": 0}, 400, "count"),
    ("fork", {"count": 2, "child_env": [{}]}, 400, "child_env has 1 entries but 2 children"),
    ("fork", {"count": 1, "env": {"A=B": "x"}}, 400, "env"),
    ("fork", {"count": 1, "prewarm": True}, 400, "unknown field 'prewarm'"),
    ("fork-tree", {"count": 1, "metadata": {"fork_tree_id": "x"}}, 400, "set by fork-tree itself"),
    ("fork", {"count": 1, "metadata": {"fork_parent_id": SRC}}, 400, "set by fork-tree itself"),
    ("promote", {"tree_id": "nope"}, 400, "tree_id"),
    ("promote", {}, 409, "was not made by a fork-tree"),
    ("checkpoints", {"every": 0}, 400, "every"),
    ("checkpoints", {"every": 2, "mode": "full"}, 400, "mode"),
])
def test_fork_routes_refuse_bad_input(src: str, client: TestClient, daemon: Daemon, path: str, body: Any,
                                      status: int, contains: str) -> None:
    snapshots = daemon.runtime.list_snapshots()
    _error(client.post(f"/v1/sandboxes/{src}/{path}", json=body), status, contains)
    assert daemon.runtime.list_snapshots() == snapshots  # the source was never branched


def test_spawn_cannot_forge_fork_tree_labels(src: str, client: TestClient) -> None:
    # promote(replace_parent) kills whatever fork_parent_id names: only a fork-tree may set it.
    _error(client.post("/v1/sandboxes", json={"snapshot_tag": "py", "metadata": {"fork_parent_id": src}}),
           400, "fork_parent_id are set by fork-tree itself")


def test_fork_of_an_unknown_sandbox_is_404(client: TestClient) -> None:
    _error(client.post("/v1/sandboxes/sb-000000-0001/fork", json={"count": 1}), 404, "sb-000000-0001")


def test_checkpoint_policy_round_trip(src: str, client: TestClient) -> None:
    resp = client.post(f"/v1/sandboxes/{src}/checkpoints", json={"every": 2, "keep": 3})
    assert resp.status_code == 200, resp.text
    assert resp.json()["policy"] == {"every": 2, "keep": 3, "mode": "diff"}
    assert client.get(f"/v1/sandboxes/{src}/checkpoints").json()["policy"]["every"] == 2
    assert client.delete(f"/v1/sandboxes/{src}/checkpoints").json()["policy"] is None
