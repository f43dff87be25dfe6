"""The agent's capabilities: ping reports them, old agents are mapped from their version, and the
host refuses what an agent cannot do in one place (``forkd.guest.client.require``)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from forkd.controller.agent_gateway import AgentGateway
from forkd.controller.sandbox_events import SandboxEvents
from forkd.errors import Conflict, GuestError, InvalidRequest
from forkd.guest import capabilities, protocol
from forkd.guest.agent import RUNTIME_PREFIX, restore
from forkd.guest.capabilities import AGENT_VERSION
from forkd.guest.client import AgentClient, require
from tests.fakes.agent_peer import AgentPeer
from tests.unit.test_guest_client import real_agent, run


def test_this_agent_has_every_capability() -> None:
    # A capability is added with the agent version that brings it.
    assert capabilities.capabilities_since(int(AGENT_VERSION)) == sorted(capabilities.CAPABILITIES)


def test_ping_reports_capabilities_and_typed_calls_work(tmp_path: Path) -> None:
    sock = tmp_path / "agent.sock"

    async def scenario() -> None:
        client = await AgentClient(sock).connect()
        try:
            pong = await client.ping()
            assert pong["pong"] is True and pong["agent_version"] == AGENT_VERSION
            assert pong.get("capabilities") == capabilities.capabilities_since(int(AGENT_VERSION))
            caps = await client.capabilities()
            assert caps.names == frozenset(capabilities.CAPABILITIES)
            require(caps, *capabilities.CAPABILITIES)  # this agent can do everything: no refusal
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
    old = capabilities.Capabilities.of({"pong": True, "agent_version": "8"})
    assert old.agent_version == 8
    assert old.names == {capabilities.CAP_PYTHON, capabilities.CAP_USER, capabilities.CAP_WATCH}
    assert capabilities.Capabilities.of({"pong": True}).names == frozenset()  # version 0: nothing
    # A list, when given, is what the agent says, whatever its version; junk in it counts for nothing.
    listed = capabilities.Capabilities.of({"agent_version": "99", "capabilities": ["pty", 7, None]})
    assert listed.names == {capabilities.CAP_PTY}
    assert capabilities.Capabilities.of({"agent_version": "9", "capabilities": "pty"}).names == frozenset(
        capabilities.capabilities_since(9))  # not a list: mapped from the version


def test_require_is_one_clear_409() -> None:
    old = capabilities.Capabilities.of({"agent_version": "8"})
    require(old, capabilities.CAP_USER, capabilities.CAP_WATCH)
    with pytest.raises(Conflict) as refused:
        require(old, capabilities.CAP_PTY, capabilities.CAP_WATCH, capabilities.CAP_METADATA,
                subject="sandbox 'sb-1'")
    assert refused.value.status == 409
    assert str(refused.value) == ("sandbox 'sb-1' runs guest agent version 8, which predates "
                                  "terminals (pty), file metadata: create its snapshot again "
                                  "with this version of forkd")


def test_an_agent_on_forkds_runtime_has_no_python_and_eval_is_a_400_saying_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An image without a Python of its own runs its agent on forkd's runtime (image/guest_runtime.py):
    the agent lists every capability of its version but ``python``, the host's one check refuses
    Python code with a 400 naming the image (not the 409 of an old agent), and the agent refuses an
    eval that reaches it anyway."""
    monkeypatch.setattr(sys, "prefix", RUNTIME_PREFIX)
    monkeypatch.chdir(tmp_path)  # pid1_defaults changes this process's (the agent's) cwd and environment:
    monkeypatch.setenv("GREETING", "")  # both are put back after
    assert restore.capabilities() == sorted(set(capabilities.CAPABILITIES) - {capabilities.CAP_PYTHON})
    sock = tmp_path / "agent.sock"

    async def scenario() -> None:
        client = await AgentClient(sock).connect()
        try:
            caps = await client.capabilities()
            require(caps, capabilities.CAP_PTY, capabilities.CAP_USER)  # everything else is there
            with pytest.raises(InvalidRequest) as refused:
                require(caps, capabilities.CAP_PYTHON, subject="sandbox 'sb-1'")
            assert refused.value.status == 400
            assert str(refused.value).startswith("sandbox 'sb-1' cannot run Python code: its image has "
                                                 "no Python of its own")
            with pytest.raises(GuestError, match="its image has no Python of its own"):
                await client.eval({"code": "6 * 7"}, timeout=30)
            assert (await client.exec({"args": ["echo", "hi"]}, timeout=30))["stdout"] == "hi\n"
            # A build's ENV and WORKDIR reach PID 1 without eval, and every later command.
            work = tmp_path / "made" / "here"
            defaults = await client.pid1_defaults({"env": {"GREETING": "hello"}, "cwd": str(work)}, 30)
            assert defaults["applied"] is True
            done = await client.exec({"args": ["sh", "-c", 'echo "$GREETING"; pwd']}, timeout=30)
            assert done["stdout"] == f"hello\n{work}\n"
            with pytest.raises(GuestError, match="cwd must be an absolute path"):
                await client.pid1_defaults({"cwd": "relative"}, 30)
        finally:
            await client.close()

    with real_agent(sock):
        run(scenario())
    # Older agents had Python, as every one did: one mapped from its version, and one that lists its
    # capabilities but predates listing "python" (a snapshot of forkd's last release).
    assert capabilities.CAP_PYTHON in capabilities.Capabilities.of({"agent_version": "8"}).names
    listed_without = capabilities.Capabilities.of({"agent_version": "14", "capabilities": ["pty", "user"]})
    assert listed_without.names == {capabilities.CAP_PYTHON, capabilities.CAP_PTY, capabilities.CAP_USER}
    require(listed_without, capabilities.CAP_PYTHON)


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
            await table.require_agent("sb-1", capabilities.CAP_USER, capabilities.CAP_WATCH)  # it has these
            with pytest.raises(Conflict, match=r"^sandbox 'sb-1' runs guest agent version \d+, which "
                                               r"predates terminals \(pty\): create its snapshot again"):
                await table.require_agent("sb-1", capabilities.CAP_PTY)
        finally:
            for client in clients:
                await client.close()

    with AgentPeer(sock, lambda peer, req: peer.reply(req, pong)) as peer:
        asyncio.run(scenario())
    assert [req["action"] for req in peer.requests] == [protocol.PING]  # asked once for this VM
