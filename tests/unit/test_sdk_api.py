"""Contract tests: the SDK against the real FastAPI app and Runtime (over the QEMU double, no VM).

test_sdk.py pins what the SDK sends; these check that the daemon accepts it
(strict request models, query parameters, auth) and that the SDK understands
what the daemon answers, including its error bodies.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from forkd.api.app import create_app
from forkd.api.settings import Settings
from forkd.controller.runtime import Runtime
from forkd.sdk import (
    AsyncController,
    AsyncSandbox,
    BadRequest,
    CheckpointPolicy,
    ConflictError,
    Controller,
    EvalResult,
    ExploreError,
    ExploreResult,
    ForkFailure,
    NotFoundError,
    Sandbox,
    Unauthorized,
)
from tests.fakes.app import TOKEN, Daemon, daemon_app, needs_memory_cgroups, open_runtime
from tests.fakes.transport import ViaTestClient


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with daemon_app(tmp_path) as d:
        yield d


@pytest.fixture
def runtime(daemon: Daemon) -> Runtime:
    return daemon.runtime


def alive(runtime: Runtime) -> set[str]:
    return {sb.id for sb in runtime.list_sandboxes()}


def asked(daemon: Daemon, sandbox_id: str, action: str) -> dict[str, Any]:
    """What the sandbox's guest was last asked to do of ``action``, without the envelope."""
    last = daemon.guest_requests(sandbox_id, action)[-1]
    return {k: v for k, v in last.items() if k not in ("id", "action")}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    return Settings(token_file=token_file, data_dir=tmp_path / "data",
                    audit_log=tmp_path / "audit.log")


@pytest.fixture
def test_client(daemon: Daemon) -> TestClient:
    return daemon.client


@pytest.fixture
def controller(test_client: TestClient) -> Controller:
    return Controller(url="http://forkd.test", token=TOKEN, transport=ViaTestClient(test_client))


def test_seed_branch_flow(controller: Controller, runtime: Runtime) -> None:
    """The seed's Python SDK BRANCH example, end to end through the real routes."""
    parent = controller.spawn_sandboxes("py", n=1, live_fork=True)[0]
    assert parent["live_fork"] is True
    branch = controller.branch_sandbox(parent["id"], tag="checkpoint-diff", mode="diff")
    assert branch["branched_from"] == parent["id"]
    kids = controller.spawn_sandboxes(branch["tag"], n=5)
    assert len(kids) == 5

    branch = controller.branch_sandbox(parent["id"], mode="live", wait=False)
    assert branch["status"] == "writing"
    ready = controller.wait_snapshot_ready(branch["tag"], interval=0.001)
    assert ready["status"] == "ready"
    # Consecutive branches of one source chain: this one is layered on the first.
    assert ready["ancestors"] == ["checkpoint-diff", "py"]
    record = runtime.get_snapshot(branch["tag"])
    assert record.mode == "live" and record.branched_from == parent["id"]


def test_sandbox_object_flow(controller: Controller, runtime: Runtime) -> None:
    with Sandbox(tag="py", controller=controller) as sb:
        assert sb.commands.run("echo hi").stdout == "/bin/sh -c echo hi"
        assert sb.eval("2 + 2").result == "4"
        assert sb.ping()["pong"] is True
        kids = sb.branch(tag="b1").fork(n=2)
        assert [k.info["snapshot_tag"] for k in kids] == ["b1", "b1"]
        for kid in kids:
            kid.close()
    assert alive(runtime) == set()


def test_create_snapshot_is_accepted(controller: Controller, runtime: Runtime) -> None:
    info = controller.create_snapshot(
        "ml", image="default", mem_mib=1024, boot_wait_secs=30,
        warm_imports=["numpy", "json"], setup=["pip install requests"],
    )
    assert info["tag"] == "ml"
    meta = runtime.snapshots.dir("ml").read_meta()
    assert meta["config"]["mem_mib"] == 1024 and meta["warm_imports"] == ["numpy", "json"]
    assert meta["setup"] == [["/bin/sh", "-c", "pip install requests"]]
    # The template's guest ran the setup command (its requests are kept with the snapshot).
    setup = [json.loads(line) for line in (Path(runtime.get_snapshot("ml").dir) / "guest-requests.jsonl")
             .read_text().splitlines() if json.loads(line)["action"] == "exec"]
    assert setup[0]["args"] == ["/bin/sh", "-c", "pip install requests"]


def test_delete_flags_reach_the_runtime(controller: Controller, daemon: Daemon, runtime: Runtime) -> None:
    daemon.snapshot("old")
    child = daemon.sandbox("old")
    daemon.run(runtime.branch, child.id, "old-branch")
    grandchild = daemon.sandbox("old-branch")
    controller.delete_snapshot("old", cascade=True, force=True)
    # cascade: its branch went too; force: the sandboxes running from them were killed.
    assert not {"old", "old-branch"} & {s.tag for s in runtime.list_snapshots()}
    assert not {child.id, grandchild.id} & alive(runtime)


def test_exec_options_reach_the_runtime(controller: Controller, daemon: Daemon) -> None:
    sid = controller.spawn_sandboxes("py")[0]["id"]
    controller.exec(sid, ["env"], timeout_secs=5, env={"A": "1"}, cwd="/tmp", stdin="x", user="user")
    assert asked(daemon, sid, "exec") == {"args": ["env"], "timeout_secs": 5, "env": {"A": "1"},
                                          "cwd": "/tmp", "stdin": "x", "user": "user"}
    controller.exec(sid, ["env"])
    assert "user" not in asked(daemon, sid, "exec")  # root, unless asked: as before


def test_user_reaches_processes_and_files(controller: Controller, daemon: Daemon) -> None:
    """The SDK's ``user`` on commands and files reaches the guest (sync twin; the async one is
    the same code by generation)."""
    with Sandbox(tag="py", controller=controller) as sandbox:
        _user_calls(sandbox, daemon)


def _user_calls(sandbox: Sandbox, daemon: Daemon) -> None:
    sid = sandbox.id
    sandbox.commands.run("id", background=True, user="user")
    assert asked(daemon, sid, "proc_start")["user"] == "user"
    sandbox.commands.run("id", user="user")
    assert asked(daemon, sid, "exec")["user"] == "user"
    sandbox.files.mkdir("/tmp/u", parents=True, user="user")
    assert asked(daemon, sid, "file_mkdir")["user"] == "user"
    sandbox.files.write("/tmp/u/a", b"x", user="user")
    assert asked(daemon, sid, "file_write_open")["user"] == "user"
    assert sandbox.files.read("/tmp/u/a", user="user") == b"x"
    read = asked(daemon, sid, "file_read")
    assert read["path"] == "/tmp/u/a" and read["user"] == "user"
    sandbox.files.stat("/tmp/u/a", user="root")
    assert asked(daemon, sid, "file_stat")["user"] == "root"
    sandbox.files.list("/tmp/u", user="user")
    sandbox.files.remove("/tmp/u", recursive=True, user="user")
    assert [asked(daemon, sid, a)["user"] for a in ("file_list", "file_remove")] == ["user", "user"]


def test_daemon_errors_map_to_sdk_errors(controller: Controller, test_client: TestClient) -> None:
    with pytest.raises(NotFoundError, match="snapshot 'nope' is not registered"):
        controller.spawn_sandboxes("nope")
    with pytest.raises(NotFoundError):
        controller.kill_sandbox("sb-abcdef-0999")
    sid = controller.spawn_sandboxes("py")[0]["id"]
    with pytest.raises(BadRequest, match="wait"):
        controller.branch_sandbox(sid, wait=False)  # no-wait needs mode="live"
    with pytest.raises(BadRequest, match="mutually exclusive"):
        controller.branch_sandbox(sid, mode="full", diff=True)
    wrong = Controller(url="http://forkd.test", token="wrong-token-0123456789abcdef",
                       transport=ViaTestClient(test_client))
    with pytest.raises(Unauthorized):
        wrong.list_sandboxes()
    assert wrong.healthz() == {"ok": True}  # no token needed


def test_async_controller_against_the_app(settings: Settings, tmp_path: Path) -> None:
    async def main() -> None:
        async with open_runtime(tmp_path) as runtime:
            await against(create_app(settings, runtime=runtime))

    async def against(app: Any) -> None:
        transport = httpx.ASGITransport(app=app)
        async with AsyncController(url="http://forkd.test", token=TOKEN, transport=transport) as c:
            kids = await c.spawn_sandboxes("py", n=3)
            results = await asyncio.gather(*(c.eval(k["id"], "1 + 1") for k in kids))
            assert [r["result"] for r in results] == ["2", "2", "2"]
            assert (await c.version())["api"] == "v1"

    asyncio.run(main())


# --------------------------------------------------- forking a running sandbox


def test_spawn_env_and_metadata_and_list_filters(controller: Controller, daemon: Daemon) -> None:
    daemon.snapshot("other")
    kids = controller.spawn_sandboxes("py", n=2, env={"A": "1"}, child_env=[{"I": "0"}, {"I": "1"}],
                                      metadata={"team": "ml"})
    # Each child's guest got env with child_env's entry over it, in its post-restore call.
    assert [asked(daemon, k["id"], "restored")["env"] for k in kids] == [{"A": "1", "I": "0"},
                                                                         {"A": "1", "I": "1"}]
    assert all(k["metadata"] == {"team": "ml"} for k in kids)
    [other] = controller.spawn_sandboxes("other", metadata={"team": "ml", "run": "2"})
    controller.spawn_sandboxes("py")
    assert len(controller.list_sandboxes()) == 4
    ids = [kids[0]["id"], kids[1]["id"], other["id"]]
    assert sorted(s["id"] for s in controller.list_sandboxes(metadata={"team": "ml"})) == sorted(ids)
    assert sorted(s["id"] for s in controller.list_sandboxes(snapshot_tag="py", metadata={"team": "ml"})) == \
        sorted(ids[:2])
    assert [s["id"] for s in controller.list_sandboxes(metadata={"team": "ml", "run": "2"})] == [other["id"]]
    with pytest.raises(BadRequest, match="child_env"):
        controller.spawn_sandboxes("py", n=2, child_env=[{}])  # one entry per child


@needs_memory_cgroups
def test_fork_partial_failure_and_killing_the_children(
    controller: Controller, runtime: Runtime
) -> None:
    with Sandbox(tag="py", controller=controller) as sb:
        result = sb.fork(3, env={"A": "1"}, child_env=[{"I": str(i)} for i in range(3)],
                         child_memory_limit_mib=[256, 64, None], metadata={"team": "ml"},
                         keep_snapshot=True)
        assert result.parent_id == sb.id
        # Below what a QEMU needs, child 1 is OOM-killed (the QEMU double uses as much).
        [failure] = result.errors
        assert isinstance(failure, ForkFailure) and failure.index == 1
        assert "was OOM-killed while restoring" in failure.error
        assert sorted(result.by_index()) == [0, 2]
        assert [k.info["metadata"] for k in result.children] == [{"team": "ml"}] * 2
        assert result.snapshot_tag is not None
        assert runtime.get_snapshot(result.snapshot_tag).auto_delete is False  # keep_snapshot
        assert alive(runtime) == {sb.id, *(k.id for k in result.children)}
        for kid in result.children:
            kid.close()
        assert alive(runtime) == {sb.id}  # the source keeps running
    assert alive(runtime) == set()


def test_fork_tree_then_promote(controller: Controller, runtime: Runtime) -> None:
    parent = Sandbox.create("py", controller=controller)
    tree = parent.fork_tree(3)
    assert tree.tree_id is not None and tree.ok
    members = controller.list_sandboxes(metadata={"fork_tree_id": tree.tree_id})
    by_id = {m["id"]: m["metadata"]["fork_index"] for m in members}
    assert by_id == {k.id: str(i) for i, k in enumerate(tree.children)}
    winner = tree.children[1]
    promoted = winner.promote(replace_parent=True)
    assert promoted.winner is winner and promoted.tree_id == tree.tree_id
    assert promoted.ok
    deleted = [d.id for d in promoted.deleted]  # the losing siblings, then the parent
    assert sorted(deleted[:-1]) == sorted([tree.children[0].id, tree.children[2].id])
    assert deleted[-1] == parent.id
    assert promoted.replaced_parent == parent.id
    assert runtime.get_sandbox(parent.id).id == winner.id  # the parent's id names the winner
    assert alive(runtime) == {winner.id}
    for kid in tree.children:  # the losers are gone already; closing them is harmless
        kid.close()
    assert alive(runtime) == set()


def test_promote_outside_a_tree_is_a_conflict(controller: Controller) -> None:
    sb = Sandbox.create("py", controller=controller)
    [plain] = sb.fork(1).children
    with pytest.raises(ConflictError, match="fork-tree"):
        plain.promote()


def test_checkpoint_policy_round_trip(controller: Controller, daemon: Daemon) -> None:
    sb = Sandbox.create("py", controller=controller)
    assert sb.get_checkpoints().policy is None
    kept = sb.set_checkpoints(5, keep=2, mode="diff")
    assert kept.policy == CheckpointPolicy(every=5, keep=2, mode="diff")
    assert daemon.runtime.checkpoints.get(sb.id)["policy"] == {"every": 5, "keep": 2, "mode": "diff"}
    assert controller.set_checkpoints(sb.id, 3)["policy"] == {"every": 3, "keep": 3, "mode": "diff"}
    for _ in range(3):  # the third call takes a checkpoint, in the background
        sb.commands.run("true")
    daemon.run(daemon.runtime.checkpoints.wait_background)
    [snap] = sb.get_checkpoints().snapshots
    assert daemon.runtime.get_snapshot(snap.tag).checkpoint_of == sb.id
    assert [k.info["snapshot_tag"] for k in snap.fork(n=2)] == [snap.tag, snap.tag]
    assert sb.delete_checkpoints().policy is None
    with pytest.raises(BadRequest):
        sb.set_checkpoints(0)
    with pytest.raises(BadRequest):
        sb.set_checkpoints(1, mode="full")


# ----------------------------------------------------------------- explore


def _double(child: Sandbox, candidate: str) -> str:
    """run: the scripted guest evaluates arithmetic, so a candidate's score is known."""
    if candidate == "boom":
        raise RuntimeError("the agent crashed")
    result = child.eval(f"{candidate} * 2")
    if not result.ok:
        raise ValueError(result.error)
    return str(result.result)


def _as_score(child: Sandbox, candidate: str, result: str) -> float:
    if candidate == "3":
        raise KeyError("judge unavailable")
    return float(result)


@needs_memory_cgroups
def test_explore_promotes_the_best_and_reports_every_outcome(
    controller: Controller, runtime: Runtime
) -> None:
    with Sandbox(tag="py", controller=controller) as sb:
        candidates = ["1", "boom", "7", "3", "5", "4"]
        # Child 5 cannot come up: below what a QEMU needs, it is OOM-killed (tests/fakes/vmm.py).
        limits: list[int | None] = [None] * 5 + [64]
        result = sb.explore(candidates, _double, _as_score, child_memory_limit_mib=limits,
                            metadata={"job": "x"})
        assert isinstance(result, ExploreResult)
        assert [o.candidate for o in result.outcomes] == candidates
        assert [o.score for o in result.outcomes] == [2.0, None, 14.0, None, 10.0, None]
        errors = [o.error for o in result.outcomes]
        assert errors[:5] == [
            None, "run: RuntimeError: the agent crashed", None, "score: KeyError: 'judge unavailable'", None]
        assert errors[5] is not None and errors[5].startswith("spawn: ") and "OOM-killed" in errors[5]
        assert isinstance(result.outcomes[1].exception, RuntimeError)
        assert result.outcomes[3].result == "6"  # run's result is kept when score fails
        assert result.outcomes[5].sandbox is None and result.outcomes[5].sandbox_id is None
        assert [f.index for f in result.failures] == [1, 3, 5]
        assert [f.index for f in result.fork.errors] == [5]

        best = result.outcomes[2]
        assert result.best is best and result.winner is best.sandbox
        assert result.winner.owned
        assert result.tree_id == result.fork.tree_id
        # Promoted with cleanup: only the source and the winner are left.
        assert alive(runtime) == {sb.id, result.winner.id}
        assert sorted(d.id for d in result.promotion.deleted) == sorted(
            o.sandbox_id for o in result.outcomes if o.sandbox_id and o is not best)
        losers = [o.sandbox for o in result.outcomes if o.sandbox is not None and o is not best]
        assert losers and not any(s.owned for s in losers)  # their close() sends nothing
        assert result.winner.info["metadata"]["job"] == "x"
        assert result.winner.eval("1 + 1").result == "2"
        result.winner.close()
        assert alive(runtime) == {sb.id}
    assert alive(runtime) == set()


def test_explore_without_score_uses_the_result(controller: Controller, runtime: Runtime) -> None:
    sb = Sandbox.create("py", controller=controller)
    result = sb.explore([3, 9, 9, 1], lambda child, n: float(n))
    assert result.best.index == 1  # equal scores: the lowest index wins
    assert alive(runtime) == {sb.id, result.winner.id}


def explore_scores(result: ExploreResult[Sandbox, Any]) -> list[float | None]:
    return [o.score for o in result.outcomes]


def test_explore_runs_the_children_at_the_same_time(controller: Controller) -> None:
    sb = Sandbox.create("py", controller=controller)
    barrier = threading.Barrier(3, timeout=10)  # only passes if all three run at once

    def run(child: Sandbox, candidate: int) -> int:
        barrier.wait()
        return candidate

    assert explore_scores(sb.explore([1, 2, 3], run)) == [1.0, 2.0, 3.0]


@needs_memory_cgroups
def test_explore_where_everything_fails_kills_every_child(
    controller: Controller, runtime: Runtime
) -> None:
    sb = Sandbox.create("py", controller=controller)

    def run(child: Sandbox, candidate: str) -> float:
        if candidate == "nan":
            return float("nan")
        raise ValueError(f"bad {candidate}")

    with pytest.raises(ExploreError, match="every candidate of explore failed") as info:
        sb.explore(["a", "nan", "c"], run, child_memory_limit_mib=[None, None, 64])
    errors = [o.error for o in info.value.outcomes]
    assert errors[:2] == ["run: ValueError: bad a", "score: ValueError: the score is NaN"]
    assert errors[2] is not None and errors[2].startswith("spawn: ") and "OOM-killed" in errors[2]
    assert "every child was killed" in str(info.value)
    assert info.value.fork is not None and info.value.fork.tree_id
    assert alive(runtime) == {sb.id}
    assert runtime.get_sandbox(sb.id).id == sb.id  # nothing was promoted over it


def test_explore_interrupted_kills_every_child(controller: Controller, runtime: Runtime) -> None:
    sb = Sandbox.create("py", controller=controller)

    def run(child: Sandbox, candidate: int) -> int:
        if candidate == 1:
            raise KeyboardInterrupt  # not a candidate's failure: explore stops
        return candidate

    with pytest.raises(KeyboardInterrupt):
        sb.explore([0, 1], run, concurrency=1)
    assert alive(runtime) == {sb.id}


def test_explore_replace_parent(controller: Controller, runtime: Runtime, tmp_path: Path) -> None:
    sb = Sandbox.create("py", controller=controller)
    result = sb.explore([1, 2], lambda child, n: n, replace_parent=True)
    assert result.promotion.replaced_parent == sb.id
    assert runtime.get_sandbox(sb.id).id == result.winner.id
    assert alive(runtime) == {result.winner.id}
    assert sb.info["id"] == result.winner.id  # the source's id now names the winner
    with pytest.raises(ValueError, match="at least one candidate"):
        result.winner.explore([], lambda child, n: n)
    with pytest.raises(ValueError, match="concurrency must be at least 1"):
        result.winner.explore([1], lambda child, n: n, concurrency=0)
    # Neither mistake forked anything: the daemon's audit log has the one fork-tree.
    calls = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    assert [c["path"] for c in calls if c["path"].endswith(("/fork", "/fork-tree"))] == [
        f"/v1/sandboxes/{sb.id}/fork-tree"]


def test_async_explore_against_the_app(settings: Settings, tmp_path: Path) -> None:
    in_flight = peak = 0

    async def run(child: AsyncSandbox, candidate: str) -> EvalResult:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            await asyncio.sleep(0.01)
            if candidate == "oops":
                raise RuntimeError("no")
            return await child.eval(f"{candidate} + 0")
        finally:
            in_flight -= 1

    async def score(child: AsyncSandbox, candidate: str, result: EvalResult) -> float:
        return float(result.result or "nan")

    async def main() -> None:
        async with open_runtime(tmp_path) as runtime:
            await against(runtime)

    async def against(runtime: Runtime) -> None:
        transport = httpx.ASGITransport(app=create_app(settings, runtime=runtime))
        async with AsyncController(url="http://forkd.test", token=TOKEN, transport=transport) as c:
            async with AsyncSandbox(tag="py", controller=c) as sb:
                forked = await sb.fork(2)
                assert all(isinstance(k, AsyncSandbox) and k.owned for k in forked.children)
                for kid in forked.children:
                    await kid.close()
                result = await sb.explore(["4", "oops", "8", "6"], run, score, concurrency=2)
                assert result.best.candidate == "8"
                assert [o.error is None for o in result.outcomes] == [True, False, True, True]
                assert alive(runtime) == {sb.id, result.winner.id}
                checkpoints = await sb.set_checkpoints(4)
                assert checkpoints.policy is not None and checkpoints.policy.every == 4
                await result.winner.close()
            assert alive(runtime) == set()

    asyncio.run(main())
    assert peak == 2
