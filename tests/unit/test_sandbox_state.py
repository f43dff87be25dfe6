"""A sandbox's one state (``store.records.SandboxState``): derived in one place, and read by /v1
(SandboxInfo ``state``), the E2B layer (``controller.suspend.view``) and, through /v1, the console."""

from __future__ import annotations

from pathlib import Path

import pytest

from forkd.controller.suspend import view
from forkd.host.accel import Accel, VMConfig
from forkd.store.records import DiskChain, Hibernation, PausedRecord, SandboxRecord, SandboxState


def record(**fields: object) -> SandboxRecord:
    base = Path("/data/sandboxes/sb-67a1b3-0000")
    sb = SandboxRecord(id="sb-67a1b3-0000", snapshot_tag="py", dir=str(base), created_at_unix=1,
                       config=VMConfig(512, 1, Accel.tcg()), disk=DiskChain.fresh(base, "py"), pid=42)
    for name, value in fields.items():
        setattr(sb, name, value)
    return sb


HIBERNATED = Hibernation(at_unix=2.0, pages=10, memory_bytes=4096, devices_bytes=100, pause_ms=30.0)


@pytest.mark.parametrize(("fields", "state", "e2b"), [
    ({}, SandboxState.RUNNING, "running"),
    ({"paused": True}, SandboxState.PAUSED, "running"),  # any request resumes it at once
    ({"hibernation": HIBERNATED}, SandboxState.HIBERNATED, "paused"),
    ({"hibernation": HIBERNATED, "paused": True}, SandboxState.HIBERNATED, "paused"),
    ({"pooled": True}, SandboxState.POOL, "running"),
])
def test_a_live_sandbox_has_one_state_that_every_view_reads(fields: dict[str, object], state: SandboxState,
                                                            e2b: str) -> None:
    sb = record(**fields)
    assert sb.state is state
    assert sb.info()["state"] == state.value
    assert state.e2b == e2b
    if state is not SandboxState.POOL:  # never shown: pool members are hidden from every list
        assert view(sb, "py")["state"] == e2b


def test_a_suspended_sandbox_is_paused_to_e2b() -> None:
    paused = PausedRecord(id="sb-67a1b3-0000", state_tag="paused-sb-67a1b3-0000-1", template="py",
                          created_at_unix=1, paused_at_unix=2)
    assert paused.state is SandboxState.SUSPENDED
    assert view(paused, "py")["state"] == "paused"


def test_lists_sort_by_the_sub_second_start(tmp_path: Path) -> None:
    """An older paused sandbox and a newer running one started in the same second: E2B's list
    (newest first, by startedAt) shows the running one first, and forkd's list keeps the order
    of start even when a pool member (an earlier row) is claimed after a later spawn."""
    from types import SimpleNamespace

    from forkd.controller.runtime import Runtime
    from forkd.store.registry import Registry

    reg = Registry(tmp_path / "forkd.db")
    reg.paused.insert(PausedRecord(id="sb-67a1b3-0001", state_tag="paused-sb-67a1b3-0001-1", template="py",
                                   created_at_unix=1000, started_unix=1000.2, paused_at_unix=1000))
    running = record(id="sb-67a1b3-0002", created_at_unix=1000, started_unix=1000.7)
    reg.sandboxes.insert(running)
    stored = reg.sandboxes.get(running.id)
    assert (stored.created_at_unix, stored.started_unix) == (1000, 1000.7)
    assert reg.paused.get("sb-67a1b3-0001").started_unix == 1000.2
    rt = SimpleNamespace(list_sandboxes=lambda: [reg.sandboxes.get(running.id)],
                         suspender=SimpleNamespace(template_of=lambda _: "py", all=reg.paused.all))
    views = Runtime.describe_sandboxes(rt)  # type: ignore[arg-type]
    assert [v["id"] for v in views] == ["sb-67a1b3-0001", "sb-67a1b3-0002"]  # oldest first
    assert views[1]["started"] == 1000.7

    # A pool member's row is older than a spawn's; claimed after it, it is listed after it.
    member = record(id="sb-67a1b3-0003", created_at_unix=1000, started_unix=1000.1, pooled=True)
    reg.sandboxes.insert(member)
    reg.sandboxes.insert(record(id="sb-67a1b3-0004", created_at_unix=1000, started_unix=1000.5))
    member.pooled, member.started_unix = False, 1000.8
    reg.sandboxes.save(member)
    assert [sb.id for sb in reg.sandboxes.all()] == ["sb-67a1b3-0004", "sb-67a1b3-0002", "sb-67a1b3-0003"]
    assert [sb.id for sb in reg.sandboxes.scan("sb-67a1b3-0002")] == ["sb-67a1b3-0003"]
    # A record made without it (a row written before it) starts at its whole second.
    assert PausedRecord(id="sb-67a1b3-0005", state_tag="t", template="py", created_at_unix=999,
                        paused_at_unix=999).started_unix == 999.0
