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
