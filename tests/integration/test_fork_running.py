"""Fork a *running* sandbox (fork, fork-tree, promote), per-child inputs and auto-checkpoints.

Real QEMU children of the session's ``py`` snapshot, driven through the Runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from forkd.controller.options import ForkOptions, SpawnOptions
from forkd.controller.runtime import Runtime
from forkd.errors import NotFound
from forkd.guest.protocol import RestoreInputs
from forkd.host import cgroups

from .conftest import Loop, qemu_processes_of

pytestmark = pytest.mark.vm

# A thread in the source's warm interpreter that counts while the test forks it.
TICKER = """
import threading, time
ticks = [0]
def _tick():
    while True:
        ticks[0] += 1
        time.sleep(0.05)
threading.Thread(target=_tick, daemon=True).start()
"""


def ev(loop: Loop, runtime: Runtime, sandbox_id: str, code: str) -> str:
    out = loop.run(runtime.eval(sandbox_id, code))
    assert out["exit_code"] == 0, out
    return str(out["result"])


def alive_ids(runtime: Runtime) -> set[str]:
    return {sb.id for sb in runtime.list_sandboxes()}


def test_fork_of_a_running_sandbox(loop: Loop, runtime: Runtime, snapshot: str) -> None:
    [src] = loop.run(runtime.spawn(snapshot, 1))
    kids: list[str] = []
    try:
        ev(loop, runtime, src.id, TICKER)
        ev(loop, runtime, src.id, "secret = 'set just before the fork'")
        before = int(ev(loop, runtime, src.id, "ticks[0]"))
        result = loop.run(runtime.fork(src.id, 5))
        kids = [c.id for c in result.children]
        assert result.errors == []
        assert len(kids) == 5 and len(set(kids)) == 5
        assert result.parent_id == src.id
        assert result.pause_ms is not None and result.pause_ms >= 0
        # Every child starts from the source's state as of the fork.
        assert {ev(loop, runtime, k, "secret") for k in kids} == {"'set just before the fork'"}
        # Their later changes are their own.
        for i, k in enumerate(kids):
            ev(loop, runtime, k, f"secret = 'child {i}'")
        assert [ev(loop, runtime, k, "secret") for k in kids] == [f"'child {i}'" for i in range(5)]
        assert ev(loop, runtime, src.id, "secret") == "'set just before the fork'"
        # The source kept running: its counter advances after the fork.
        time.sleep(0.5)
        after = int(ev(loop, runtime, src.id, "ticks[0]"))
        assert after > before, (before, after)
        # The intermediate snapshot is dropped with its last child (keep_snapshot: false).
        tag = result.snapshot_tag
        assert runtime.get_snapshot(tag).auto_delete is True
        loop.gather(*(runtime.kill(k) for k in kids))
        kids = []
        assert tag not in {s.tag for s in runtime.list_snapshots()}
        assert ev(loop, runtime, src.id, "secret") == "'set just before the fork'"
    finally:
        loop.gather(*(runtime.kill(i) for i in [*kids, src.id] if i in alive_ids(runtime)))


def test_keep_snapshot_outlives_the_children(loop: Loop, runtime: Runtime, snapshot: str) -> None:
    [src] = loop.run(runtime.spawn(snapshot, 1))
    tag = None
    try:
        ev(loop, runtime, src.id, "kept = 7")
        result = loop.run(runtime.fork(src.id, 1, ForkOptions(keep_snapshot=True)))
        tag = result.snapshot_tag
        loop.run(runtime.kill(result.children[0].id))
        assert runtime.get_snapshot(tag).auto_delete is False
        [again] = loop.run(runtime.spawn(tag, 1))  # still forkable later
        assert ev(loop, runtime, again.id, "kept") == "7"
        loop.run(runtime.kill(again.id))
    finally:
        loop.run(runtime.kill(src.id))
        if tag is not None:
            loop.run(runtime.delete_snapshot(tag))


def test_fork_tree_and_promote_with_cleanup(loop: Loop, runtime: Runtime, snapshot: str) -> None:
    [src] = loop.run(runtime.spawn(snapshot, 1))
    try:
        options = ForkOptions(SpawnOptions(metadata={"task": "t1"}))
        result = loop.run(runtime.fork(src.id, 3, options, tree=True))
        assert result.tree_id and result.tree_id.startswith("ft-")
        for i, child in enumerate(result.children):
            assert child.metadata == {"task": "t1", "fork_tree_id": result.tree_id,
                                      "fork_parent_id": src.id, "fork_index": str(i)}
        winner, *losers = (c.id for c in result.children)
        report = loop.run(runtime.promote(winner, cleanup_siblings=True))
        assert report["tree_id"] == result.tree_id  # taken from the winner's metadata
        assert sorted(d["id"] for d in report["deleted"]) == sorted(losers)
        assert all(d["deleted"] for d in report["deleted"])
        assert alive_ids(runtime) == {src.id, winner}
        loop.run(runtime.kill(winner))
    finally:
        loop.gather(*(runtime.kill(i) for i in alive_ids(runtime)))
    assert alive_ids(runtime) == set()


def test_promote_replace_parent(loop: Loop, runtime: Runtime, snapshot: str) -> None:
    [src] = loop.run(runtime.spawn(snapshot, 1))
    try:
        ev(loop, runtime, src.id, "who = 'source'")
        result = loop.run(runtime.fork(src.id, 3, tree=True))
        for i, child in enumerate(result.children):
            ev(loop, runtime, child.id, f"who = 'child {i}'")
        winner = result.children[1].id
        report = loop.run(runtime.promote(winner, replace_parent=True))
        assert report["replaced_parent"] == src.id
        assert {d["id"] for d in report["deleted"]} == {c.id for c in result.children} - {winner} | {src.id}
        assert alive_ids(runtime) == {winner}
        # The source's id now answers as the winner, in every endpoint.
        assert ev(loop, runtime, src.id, "who") == "'child 1'"
        assert runtime.get_sandbox(src.id).id == winner
        assert loop.run(runtime.exec(src.id, ["echo", "hi"]))["stdout"] == "hi\n"
        loop.run(runtime.kill(src.id))  # kills the winner
        assert alive_ids(runtime) == set()
        with pytest.raises(NotFound):
            loop.run(runtime.ping(src.id))
    finally:
        loop.gather(*(runtime.kill(i) for i in alive_ids(runtime)))


def test_child_env_reaches_eval_and_exec(loop: Loop, runtime: Runtime, snapshot: str) -> None:
    env = {"FORKD_SHARED": "all"}
    child_env = [{"HINT": f"try-{i}"} for i in range(3)]
    spawned = loop.run(runtime.spawn(snapshot, 3, SpawnOptions(env=env, child_env=child_env)))
    [src] = loop.run(runtime.spawn(snapshot, 1))
    options = ForkOptions(SpawnOptions(child_env=[{"HINT": "fork-0"}, {"HINT": "fork-1"}],
                                       env={"HINT": "overridden", "FORKD_SHARED": "fork"}))
    forked = loop.run(runtime.fork(src.id, 2, options))
    try:
        assert forked.errors == []
        cases = [(sb.id, f"try-{i}", "all") for i, sb in enumerate(spawned)]
        cases += [(c.id, f"fork-{i}", "fork") for i, c in enumerate(forked.children)]
        for sb_id, hint, shared in cases:
            assert ev(loop, runtime, sb_id, "__import__('os').environ['HINT']") == repr(hint)
            out = loop.run(runtime.exec(sb_id, ["sh", "-c", "echo $HINT $FORKD_SHARED"]))
            assert out["stdout"] == f"{hint} {shared}\n"
        # The source's own environment is untouched.
        assert ev(loop, runtime, src.id, "'HINT' in __import__('os').environ") == "False"
    finally:
        loop.gather(*(runtime.kill(i) for i in alive_ids(runtime)))


def test_hostname_reaches_the_guest_at_spawn_and_fork(loop: Loop, runtime: Runtime, snapshot: str) -> None:
    """A spawn's and a fork's hostname is the guest's: the kernel's, /etc/hostname's, and it resolves."""
    [sb] = loop.run(runtime.spawn(snapshot, 1, SpawnOptions(guest=RestoreInputs(hostname="worker-1.lab"))))
    try:
        renamed = ForkOptions(SpawnOptions(guest=RestoreInputs(hostname="worker-2")))
        forked = loop.run(runtime.fork(sb.id, 1, renamed))
        assert forked.errors == []
        for sb_id, name in ((sb.id, "worker-1.lab"), (forked.children[0].id, "worker-2")):
            script = "hostname; cat /etc/hostname; getent hosts $(hostname)"
            out = loop.run(runtime.exec(sb_id, ["sh", "-c", script]))
            assert out["exit_code"] == 0, out
            kernel, etc, hosts = out["stdout"].splitlines()
            assert (kernel, etc, hosts.split()) == (name, name, ["127.0.1.1", name])
            assert ev(loop, runtime, sb_id, "__import__('socket').gethostname()") == repr(name)
    finally:
        loop.gather(*(runtime.kill(i) for i in alive_ids(runtime)))


def _wait_checkpoints(loop: Loop, runtime: Runtime, sb_id: str, count: int) -> list[dict[str, object]]:
    deadline = time.monotonic() + 180
    while True:
        listed = runtime.checkpoints.get(sb_id)["checkpoints"]
        if len(listed) == count and all(s["status"] == "ready" for s in listed):
            return listed  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, runtime.checkpoints.get(sb_id)
        loop.run(asyncio.sleep(0.5))


def test_auto_checkpoints_keep_the_newest(loop: Loop, runtime: Runtime, snapshot: str) -> None:
    [src] = loop.run(runtime.spawn(snapshot, 1))
    tags: list[str] = []
    try:
        policy = runtime.checkpoints.set(src.id, every=2, keep=3)
        assert policy["policy"] == {"every": 2, "keep": 3, "mode": "diff"}
        for turn in range(1, 11):
            ev(loop, runtime, src.id, f"turn = {turn}")
        listed = _wait_checkpoints(loop, runtime, src.id, 3)
        tags = [str(s["tag"]) for s in listed]
        assert runtime.checkpoints.get(src.id)["calls"] == 10
        every_ckpt = [s.tag for s in runtime.list_snapshots() if s.checkpoint_of == src.id]
        assert sorted(every_ckpt) == sorted(tags)  # older ones were deleted, not only hidden
        # The oldest kept one holds the state after call 6 (checkpoints after 2, 4, …, 10).
        [child] = loop.run(runtime.spawn(tags[0], 1))
        assert ev(loop, runtime, child.id, "turn") == "6"
        loop.run(runtime.kill(child.id))
        stopped = runtime.checkpoints.delete(src.id)
        assert stopped["policy"] is None
        ev(loop, runtime, src.id, "turn = 11")
        ev(loop, runtime, src.id, "turn = 12")
        assert [s["tag"] for s in runtime.checkpoints.get(src.id)["checkpoints"]] == tags
    finally:
        loop.run(runtime.kill(src.id))
        for tag in tags:
            loop.run(runtime.delete_snapshot(tag))


@contextlib.contextmanager
def parent_cgroup_limit(mib: int) -> Iterator[None]:
    """An operator's overall limit on forkd's parent cgroup, lifted afterwards."""
    hierarchy = cgroups.find_hierarchy()
    assert hierarchy is not None
    made = not hierarchy.base.is_dir()
    if made:
        hierarchy.base.mkdir()
    limit = hierarchy.base / hierarchy.limit_file
    old = limit.read_text().strip()
    limit.write_text(str(mib << 20))
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):  # forkd removed its own empty parent
            limit.write_text(old)
            if made:
                hierarchy.base.rmdir()


def test_one_failed_child_leaves_nothing_and_spares_the_rest(loop: Loop, runtime: Runtime,
                                                             snapshot: str) -> None:
    if cgroups.detect() == "none":
        pytest.skip("no cgroup memory controller on this host")
    if any(line.strip() for line in Path("/proc/swaps").read_text().splitlines()[1:]):
        pytest.skip("with swap the kernel swaps instead of OOM-killing")
    [src] = loop.run(runtime.spawn(snapshot, 1))
    try:
        ev(loop, runtime, src.id, "x = 5")
        before_dirs = set(runtime.data.sandboxes.iterdir())
        # Only child 1 runs in a cgroup, under forkd's parent, which an operator capped at
        # 8 MiB: less than a restored child's QEMU needs, so the kernel OOM-kills it.
        with parent_cgroup_limit(8):
            result = loop.run(runtime.fork(src.id, 3, ForkOptions(child_memory_limit_mib=[None, 64, None])))
        assert [e["index"] for e in result.errors] == [1], result.errors
        assert "OOM-killed while restoring" in result.errors[0]["error"], result.errors
        assert len(result.children) == 2
        assert [ev(loop, runtime, c.id, "x") for c in result.children] == ["5", "5"]
        live = {c.id for c in result.children} | {src.id}
        assert alive_ids(runtime) == live
        # Nothing of the failed child: no process, no run dir, no cgroup.
        new_dirs = set(runtime.data.sandboxes.iterdir()) - before_dirs
        assert {d.name for d in new_dirs} == {c.id for c in result.children}
        pids = {str(sb.pid) for sb in runtime.list_sandboxes()}
        for line in qemu_processes_of(runtime.data.root):
            assert line.split()[0] in pids, f"stray QEMU: {line}"
        for c in result.children:
            assert c.cgroup is None  # only child 1 asked for a limit
        hierarchy = cgroups.find_hierarchy()
        assert hierarchy is not None
        failed_id = f"{result.children[0].id[:-4]}0001"
        assert not (hierarchy.base / failed_id).exists(), "the failed child's cgroup was left behind"
    finally:
        loop.gather(*(runtime.kill(i) for i in alive_ids(runtime)))
