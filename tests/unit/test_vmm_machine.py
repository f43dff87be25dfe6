"""VM.post_restore against a scripted agent: re-sent when unanswered, a clear error when silent."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from forkd.errors import BootTimeout, Conflict
from forkd.guest import protocol
from forkd.guest.client import AgentClient
from forkd.guest.protocol import RestoreInputs
from forkd.host.accel import Accel, VMConfig
from forkd.vmm import machine
from forkd.vmm.machine import VM
from forkd.vmm.qmp import QMP
from tests.fakes.agent_peer import AgentPeer


@dataclass
class FakeProcess:
    pid: int = 4242

    def alive(self) -> bool:
        return True

    def tail(self, lines: int = 15) -> str:
        return "--- guest console ---\nKernel panic - not syncing: (as the console would say)"


def _vm(path: Path) -> VM:
    return VM(FakeProcess(), VMConfig(512, 1, Accel.tcg()), QMP(path.parent / "qmp.sock", "t"),  # type: ignore[arg-type]
              AgentClient(path))


def test_an_unanswered_post_restore_call_is_sent_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "POST_RESTORE_RESEND", 0.3)

    def first_one_lost(peer: AgentPeer, req: dict[str, Any]) -> None:
        if len([r for r in peer.requests if r["action"] == protocol.RESTORED]) > 1:
            peer.reply(req, {"reseeded": True})

    async def main(path: Path) -> dict[str, Any]:
        vm = _vm(path)
        try:
            return await vm.post_restore(timeout=10)
        finally:
            await vm.agent.close()

    with AgentPeer(tmp_path / "agent.sock", first_one_lost) as peer:
        assert asyncio.run(main(tmp_path / "agent.sock")) == {"reseeded": True}
    restored = [r for r in peer.requests if r["action"] == protocol.RESTORED]
    assert len(restored) == 2
    assert restored[0]["entropy"] != restored[1]["entropy"]  # each carries fresh entropy


def test_a_silent_guest_is_a_boot_timeout_naming_the_phase(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "POST_RESTORE_RESEND", 0.2)

    async def main(path: Path) -> None:
        vm = _vm(path)
        try:
            await vm.post_restore(timeout=1)
        finally:
            await vm.agent.close()

    with AgentPeer(tmp_path / "agent.sock", lambda peer, req: None) as peer, \
            pytest.raises(BootTimeout, match="did not answer its post-restore call") as failure:
        asyncio.run(main(tmp_path / "agent.sock"))
    assert "Kernel panic" in str(failure.value)  # the console's last words come with it
    assert len(peer.requests) >= 2


def _restored_by(agent_version: str | None) -> Callable[[AgentPeer, dict[str, Any]], None]:
    """An agent that answers ``restored`` as one of ``agent_version`` would (None: one before 12,
    whose answer has no version)."""
    def answer(peer: AgentPeer, req: dict[str, Any]) -> None:
        peer.reply(req, {"reseeded": True} | ({"agent_version": agent_version} if agent_version else {}))
    return answer


def _post_restore(path: Path, inputs: RestoreInputs) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        vm = _vm(path)
        try:
            return await vm.post_restore(timeout=10, inputs=inputs)
        finally:
            await vm.agent.close()
    return asyncio.run(main())


def test_restore_inputs_go_to_the_guest_whole(tmp_path: Path) -> None:
    inputs = RestoreInputs(env={"K": "v"}, hostname="box-1")
    with AgentPeer(tmp_path / "agent.sock", _restored_by(str(protocol.HOSTNAME_AGENT_VERSION))) as peer:
        _post_restore(tmp_path / "agent.sock", inputs)
    [req] = peer.requests
    assert RestoreInputs.from_wire(req) == inputs and {"entropy", "time_ns"} <= req.keys()


@pytest.mark.parametrize("version", [None, "11"])
def test_an_agent_too_old_for_an_input_is_refused(tmp_path: Path, version: str | None) -> None:
    with AgentPeer(tmp_path / "agent.sock", _restored_by(version)), \
            pytest.raises(Conflict, match="predates a hostname at restore: create its snapshot again"):
        _post_restore(tmp_path / "agent.sock", RestoreInputs(hostname="box-1"))
    # Inputs every agent takes are not refused by an old one.
    with AgentPeer(tmp_path / "agent2.sock", _restored_by(version)):
        assert _post_restore(tmp_path / "agent2.sock", RestoreInputs(env={"K": "v"}))["reseeded"]


def test_no_layer_above_the_vmm_speaks_qmp() -> None:
    """Run state goes through VM.pause()/resume()/is_paused()/migrating(): no raw QMP
    command strings (``vm.qmp.cmd("stop")``) outside forkd/vmm."""
    import re
    from pathlib import Path

    import forkd

    root = Path(forkd.__file__).parent
    raw = re.compile(r"\.qmp\.(cmd|status|execute)\(")
    offenders = [f"{p.relative_to(root)}:{n}" for p in sorted(root.rglob("*.py"))
                 if p.relative_to(root).parts[0] != "vmm"
                 for n, line in enumerate(p.read_text().splitlines(), 1) if raw.search(line)]
    assert offenders == []
