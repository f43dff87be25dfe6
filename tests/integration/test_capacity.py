"""A host's --max-sandboxes with real VMs: a spawn (or fork) past it is refused before any VM starts,
and a place freed by a kill is taken again."""

from __future__ import annotations

import pytest

from forkd.config import HostLimits
from forkd.controller.options import ForkOptions
from forkd.controller.runtime import Runtime
from forkd.errors import NoCapacity

from .conftest import Loop, qemu_processes_of

pytestmark = pytest.mark.vm


def test_spawns_and_forks_past_max_sandboxes_are_refused_and_a_kill_frees_a_place(
        loop: Loop, runtime: Runtime, snapshot: str) -> None:
    before = set(runtime.sandboxes.ids())
    kept = runtime.capacity.limits
    runtime.capacity.limits = HostLimits(max_sandboxes=len(before) + 2)
    made: list[str] = []
    try:
        made += [sb.id for sb in loop.run(runtime.spawn(snapshot, 2))]
        qemus = qemu_processes_of(runtime.data.root)
        with pytest.raises(NoCapacity, match=r"--max-sandboxes.*1 more were asked for \(0 free\)"):
            loop.run(runtime.spawn(snapshot, 1))
        with pytest.raises(NoCapacity):  # a fork's children are new VMs too
            loop.run(runtime.fork(made[0], 1, ForkOptions()))
        # Refused before any VM started: no new QEMU, no new sandbox, nothing half-registered.
        assert qemu_processes_of(runtime.data.root) == qemus
        assert set(runtime.sandboxes.ids()) == before | set(made)
        loop.run(runtime.kill(made.pop()))
        [again] = loop.run(runtime.spawn(snapshot, 1))
        made.append(again.id)
        assert loop.run(runtime.eval(again.id, "1 + 1"))["result"] == "2"
    finally:
        runtime.capacity.limits = kept
        for sandbox_id in made:
            loop.run(runtime.kill(sandbox_id))
