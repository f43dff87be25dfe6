"""The agent's capabilities: ping reports them, old agents are mapped from their version, and the
host refuses what an agent cannot do in one place (``forkd.guest.client.require``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from forkd.controller.agent_gateway import AgentGateway
from forkd.controller.sandbox_events import SandboxEvents
from forkd.errors import Conflict
from forkd.guest import protocol
from forkd.guest.client import AgentClient, require
from forkd.guest.protocol import AGENT_VERSION
from tests.fakes.agent_peer import AgentPeer
from tests.unit.test_guest_client import real_agent, run


def test_this_agent_has_every_capability() -> None:
    # A capability is added with the agent version that brings it.
    assert protocol.capabilities_since(int(AGENT_VERSION)) == sorted(protocol.CAPABILITIES)


def test_ping_reports_capabilities_and_typed_calls_work(tmp_path: Path) -> None:
    sock = tmp_path / "agent.sock"

    async def scenario() -> None:
        client = await AgentClient(sock).connect()
        try:
            pong = await client.ping()
            assert pong["pong"] is True and pong["agent_version"] == AGENT_VERSION
            assert pong.get("capabilities") == protocol.capabilities_since(int(AGENT_VERSION))
            caps = await client.capabilities()
            assert caps.names == frozenset(protocol.CAPABILITIES)
            require(caps, *protocol.CAPABILITIES)  # this agent can do everything: no refusal
            done = await client.exec({"args": ["echo", "hi"]}, timeout=30)
            assert done["stdout"] == "hi\n" and done["exit_code"] == 0
            assert (await client.eval({"code": "6 * 7"}, timeout=30))["result"] == "42"
            target = str(tmp_path / "dir")
            assert (await client.file_mkdir({"path": target}, timeout=30))["created"] is True
            info = await client.file_stat({"path": target}, timeout=30)
            assert info["type"] == "dir" and info["path"] == target
            listing = await client.file_list({"path": str(tmp_path)}, timeout=30)
            assert "dir" in [entry["name"] for entry in listing["entries"]]
        finally:
            await client.close()

    with real_agent(sock):
        run(scenario())


def test_an_old_agent_is_mapped_from_its_version() -> None:
    """An agent older than "13" lists nothing: its agent_version says what it can do."""
    old = protocol.Capabilities.of({"pong": True, "agent_version": "8"})
    assert old.agent_version == 8
    assert old.names == {protocol.CAP_USER, protocol.CAP_WATCH}
    assert protocol.Capabilities.of({"pong": True}).names == frozenset()  # version 0: nothing
    # A list, when given, is what the agent says, whatever its version; junk in it counts for nothing.
    listed = protocol.Capabilities.of({"agent_version": "99", "capabilities": ["pty", 7, None]})
    assert listed.names == {protocol.CAP_PTY}
    assert protocol.Capabilities.of({"agent_version": "9", "capabilities": "pty"}).names == frozenset(
        protocol.capabilities_since(9))  # not a list: mapped from the version


def test_require_is_one_clear_409() -> None:
    old = protocol.Capabilities.of({"agent_version": "8"})
    require(old, protocol.CAP_USER, protocol.CAP_WATCH)
    with pytest.raises(Conflict) as refused:
        require(old, protocol.CAP_PTY, protocol.CAP_WATCH, protocol.CAP_METADATA,
                subject="sandbox 'sb-1'")
    assert refused.value.status == 409
    assert str(refused.value) == ("sandbox 'sb-1' runs guest agent version 8, which predates "
                                  "terminals (pty), file metadata: create its snapshot again "
                                  "with this version of forkd")


class _VM:
    """A VM as the gateway's capability cache sees it: an identity (weakly referenced)."""


class _Ids:
    """The table as ``require_agent`` asks it: every id stands for itself."""

    def resolve(self, sandbox_id: str) -> str:
        return sandbox_id


def _table(path: Path) -> tuple[AgentGateway, list[AgentClient]]:
    """The AgentGateway over a real AgentClient (to a scripted peer)."""
    clients: list[AgentClient] = []
    table = AgentGateway(_Ids(), SandboxEvents())  # type: ignore[arg-type]
    vm = _VM()

    async def for_call(sandbox_id: str) -> object:
        return vm

    async def call(sandbox_id: str, ask: Callable[[AgentClient], Awaitable[Any]]) -> Any:
        if not clients:
            clients.append(await AgentClient(path).connect())
        return await ask(clients[0])

    table.for_call = for_call  # type: ignore[method-assign,assignment]
    table.call = call  # type: ignore[method-assign]
    return table, clients


@pytest.mark.parametrize("pong", [
    {"pong": True, "agent_version": "8"},  # before capabilities: mapped from the version
    {"pong": True, "agent_version": "13", "capabilities": ["user", "watch"]},  # listed: as listed
])
def test_the_agent_gateway_refuses_a_missing_capability(tmp_path: Path, pong: dict[str, Any]) -> None:
    sock = tmp_path / "agent.sock"
    table, clients = _table(sock)

    async def scenario() -> None:
        try:
            await table.require_agent("sb-1", protocol.CAP_USER, protocol.CAP_WATCH)  # it has these
            with pytest.raises(Conflict, match=r"^sandbox 'sb-1' runs guest agent version \d+, which "
                                               r"predates terminals \(pty\): create its snapshot again"):
                await table.require_agent("sb-1", protocol.CAP_PTY)
        finally:
            for client in clients:
                await client.close()

    with AgentPeer(sock, lambda peer, req: peer.reply(req, pong)) as peer:
        asyncio.run(scenario())
    assert [req["action"] for req in peer.requests] == [protocol.PING]  # asked once for this VM
