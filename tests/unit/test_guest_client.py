"""Unit tests of the host's guest-agent client (``forkd.guest.client.AgentClient``).

Most run the real agent server (``forkd.guest.agent.server.Agent``) in a thread
on a unix socket, which is what a VM's virtio-serial port looks like from the
host; the scripted peer in ``tests/fakes/agent_peer.py`` covers what the real
agent never does on purpose (stray bytes, a dropped connection, a chosen order).
"""

from __future__ import annotations

import asyncio
import base64
import socket
import threading
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from forkd.errors import GuestError, InvalidRequest
from forkd.guest import protocol
from forkd.guest.agent.server import Agent
from forkd.guest.client import AgentClient
from tests.fakes.agent_peer import AgentPeer, Request

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


@contextmanager
def real_agent(path: Path) -> Iterator[Agent]:
    """The real agent server, serving one connection at ``path`` until the client hangs up."""
    agent = Agent([])
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    listener.settimeout(30)

    def serve() -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            agent.serve(conn.fileno(), conn.fileno(), stop_at_eof=True)

    server = threading.Thread(target=serve, name="agent-under-test", daemon=True)
    server.start()
    try:
        yield agent
    finally:
        listener.close()
        server.join(timeout=15)


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    return tmp_path / "agent.sock"


# ------------------------------------------------------------- against the real agent


def test_call_returns_the_result(sock: Path) -> None:
    async def scenario() -> None:
        client = await AgentClient(sock).connect()
        try:
            assert client.connected
            ping = await client.call(protocol.PING)
            assert ping["pong"] is True and ping["warm"] == []
            res = await client.call(protocol.EXEC, args=["echo", "hi"])
            assert res["stdout"] == "hi\n" and res["exit_code"] == 0
            assert await client.call(protocol.EVAL, code="6 * 7") == {
                "result": "42", "error": None, "exit_code": 0
            }
        finally:
            await client.close()
        assert not client.connected

    with real_agent(sock):
        run(scenario())


def test_concurrent_calls_are_matched_by_id(sock: Path) -> None:
    """Twenty calls in flight on one connection; each gets its own answer."""

    async def scenario() -> float:
        client = await AgentClient(sock).connect()
        try:
            started = time.monotonic()
            execs = [client.call(protocol.EXEC, args=["sh", "-c", f"sleep 0.4; echo {i}"])
                     for i in range(10)]
            evals = [client.call(protocol.EVAL, code=f"{i} * 10") for i in range(10)]
            results = await asyncio.gather(*execs, *evals)
            elapsed = time.monotonic() - started
        finally:
            await client.close()
        assert [r["stdout"] for r in results[:10]] == [f"{i}\n" for i in range(10)]
        assert [r["result"] for r in results[10:]] == [repr(i * 10) for i in range(10)]
        return elapsed

    with real_agent(sock):
        elapsed = run(scenario())
    assert elapsed < 3.0, f"10 execs of 0.4 s took {elapsed:.1f}s: not concurrent"


def test_out_of_order_replies(sock: Path) -> None:
    """A slow exec sent first is answered after a quick eval sent second."""

    async def scenario() -> list[str]:
        client = await AgentClient(sock).connect()
        order: list[str] = []

        async def call(name: str, action: str, **args: Any) -> dict[str, Any]:
            result = await client.call(action, **args)
            order.append(name)
            return result

        try:
            slow, quick = await asyncio.gather(
                call("slow", protocol.EXEC, args=["sh", "-c", "sleep 0.5; echo slow"]),
                call("quick", protocol.EVAL, code="'quick'"),
            )
        finally:
            await client.close()
        assert slow["stdout"] == "slow\n" and quick["result"] == "'quick'"
        return order

    with real_agent(sock):
        assert run(scenario()) == ["quick", "slow"]


def test_error_reply_raises_guest_error(sock: Path) -> None:
    async def scenario() -> None:
        client = await AgentClient(sock).connect()
        try:
            # An action the agent does not know: most likely an agent older than the daemon.
            with pytest.raises(GuestError, match=r"^guest agent: unknown action 'teleport' \(the "
                               r"sandbox's guest agent predates 'teleport': create its snapshot again"):
                await client.call("teleport")
            with pytest.raises(InvalidRequest, match="'args'"):  # the agent says: the caller's mistake
                await client.call(protocol.EXEC, args=[])
            with pytest.raises(GuestError, match="timeout_secs"):
                await client.call(protocol.EVAL, code="1", timeout_secs=-1)
            # An error is one call's answer, not the connection's end.
            assert (await client.call(protocol.PING))["pong"] is True
        finally:
            await client.close()

    with real_agent(sock):
        run(scenario())


def test_timeout_raises_guest_error_and_the_late_reply_is_dropped(sock: Path) -> None:
    async def scenario() -> None:
        client = await AgentClient(sock).connect()
        try:
            started = time.monotonic()
            with pytest.raises(GuestError, match=r"did not answer exec within 0\.2s"):
                await client.call(protocol.EXEC, timeout=0.2, args=["sh", "-c", "sleep 1; echo late"])
            assert time.monotonic() - started < 1.0
            assert client.connected
            await asyncio.sleep(1.2)  # the late answer arrives now, for an id no one waits on
            assert (await client.call(protocol.EVAL, code="'next'"))["result"] == "'next'"
        finally:
            await client.close()

    with real_agent(sock):
        run(scenario())


def test_eval_timeout_is_the_agents_answer(sock: Path) -> None:
    """The agent interrupts a runaway eval at timeout_secs and answers; the next eval runs."""

    async def scenario() -> None:
        client = await AgentClient(sock).connect()
        try:
            res = await client.call(protocol.EVAL, timeout=10, code="while True: pass", timeout_secs=0.3)
            assert res == {"result": None, "error": "TimeoutError: eval exceeded 0.3 s", "exit_code": 1}
            assert (await client.call(protocol.EVAL, code="1 + 1"))["result"] == "2"
        finally:
            await client.close()

    with real_agent(sock):
        run(scenario())


def test_cannot_connect(sock: Path) -> None:
    with pytest.raises(GuestError, match="cannot connect to the guest agent socket"):
        run(AgentClient(sock).connect())


# ------------------------------------------------------------- against the scripted peer


def test_requests_follow_the_protocol(sock: Path) -> None:
    async def scenario() -> None:
        client = await AgentClient(sock).connect()
        try:
            assert await client.call("eval", code="x", timeout_secs=5) == {
                "echo": {"id": 1, "action": "eval", "code": "x", "timeout_secs": 5}
            }
            with pytest.raises(ValueError, match="may not be named"):
                await client.call("ping", id=7)
        finally:
            await client.close()

    with AgentPeer(sock) as peer:
        run(scenario())
    assert [r["id"] for r in peer.requests] == [1]


def test_replies_in_reverse_order(sock: Path) -> None:
    held: list[Request] = []

    def answer_backwards(peer: AgentPeer, req: Request) -> None:
        held.append(req)
        if len(held) == 3:
            for r in reversed(held):
                peer.reply(r, {"n": r["n"]})

    async def scenario() -> list[Any]:
        client = await AgentClient(sock).connect()
        try:
            return list(await asyncio.gather(*(client.call("ping", n=n) for n in range(3))))
        finally:
            await client.close()

    with AgentPeer(sock, answer_backwards):
        assert run(scenario()) == [{"n": 0}, {"n": 1}, {"n": 2}]


def test_stray_bytes_are_ignored(sock: Path) -> None:
    def noisy(peer: AgentPeer, req: Request) -> None:
        peer.send_raw(b"\x00\xff\xfe not json\n")  # e.g. left in the port from before a restore
        peer.send_raw(b"[1, 2]\n")
        peer.send_raw(b'{"id": null, "ok": false, "error": "malformed request"}\n')
        peer.send_raw(b'{"id": [1], "ok": true}\n')  # an unhashable id must not break the reader
        peer.send_raw(b'{"id": true, "ok": true, "result": 1}\n')
        peer.send_raw(b'{"id": 999, "ok": true, "result": "for no one"}\n')
        peer.send_raw(b"\n")
        peer.reply(req, {"real": True})

    async def scenario() -> None:
        client = await AgentClient(sock).connect()
        try:
            assert await client.call("ping") == {"real": True}
            assert await client.call("ping") == {"real": True}
            assert client.connected
        finally:
            await client.close()

    with AgentPeer(sock, noisy):
        run(scenario())


def test_connection_closed_mid_call_fails_every_pending_call(sock: Path) -> None:
    def hang_up_on_third(peer: AgentPeer, req: Request) -> None:
        if len(peer.requests) == 3:
            peer.close_connection()

    async def scenario() -> None:
        client = await AgentClient(sock).connect()
        try:
            calls = [asyncio.ensure_future(client.call("ping", timeout=20)) for _ in range(3)]
            results = await asyncio.gather(*calls, return_exceptions=True)
            for res in results:
                assert isinstance(res, GuestError), res
                assert str(res) == "guest agent connection closed"
            assert not client.connected
            with pytest.raises(GuestError, match="guest agent connection closed"):
                await client.call("ping")
        finally:
            await client.close()

    with AgentPeer(sock, hang_up_on_third) as peer:
        started = time.monotonic()
        run(scenario())
        assert time.monotonic() - started < 10, "pending calls waited for their timeout"
    assert peer.error is None


def test_error_reply_from_peer(sock: Path) -> None:
    def refuse(peer: AgentPeer, req: Request) -> None:
        peer.reply(req, error="cannot freeze the root filesystem: Operation not supported")

    async def scenario() -> None:
        client = await AgentClient(sock).connect()
        try:
            with pytest.raises(GuestError, match=r"^guest agent: cannot freeze the root filesystem"):
                await client.call(protocol.FSFREEZE)
        finally:
            await client.close()

    with AgentPeer(sock, refuse):
        run(scenario())


def test_restored_sends_entropy_and_time(sock: Path) -> None:
    async def scenario() -> dict[str, Any]:
        client = await AgentClient(sock).connect()
        try:
            return await client.restored()
        finally:
            await client.close()

    before = time.time_ns()
    with AgentPeer(sock) as peer:
        req = run(scenario())["echo"]
    assert req["action"] == protocol.RESTORED == peer.requests[0]["action"]
    assert len(bytes.fromhex(req["entropy"])) == 64
    assert before <= req["time_ns"] <= time.time_ns()


# ------------------------------------------------------- a hostile guest


def test_a_flood_of_garbage_is_dropped_counted_and_never_buffered(sock: Path) -> None:
    """Garbage lines, an endless line without a newline, replies for no one: the client drops
    them as they come (its buffer stays under the line limit) and keeps answering calls."""
    sizes: list[int] = []

    def flood(peer: AgentPeer, req: Request) -> None:
        if req.get("action") == "flood":
            peer.send_raw(b"garbage that is not json\n" * 20000)  # ~0.5 MB of lines
            peer.send_raw(b"x" * (3 << 20))  # 3 MiB without a newline: past the line limit
            peer.send_raw(b"\n")
            peer.send_raw(b'{"id": 424242, "ok": true, "result": {}}\n' * 1000)  # replies for no one
        peer.reply(req, {"pong": True})

    async def scenario() -> AgentClient:
        client = await AgentClient(sock).connect()
        try:
            assert await client.call("flood") == {"pong": True}
            sizes.append(len(client._buf))
            started = time.monotonic()
            assert await client.call("ping", timeout=20) == {"pong": True}
            sizes.append(int((time.monotonic() - started) * 1000))
            return client
        finally:
            await client.close()

    with AgentPeer(sock, flood):
        client = run(scenario())
    assert client.garbage_lines >= 21000
    assert client.garbage_bytes >= (3 << 20) + 20000 * 25
    assert sizes[0] <= protocol.MAX_REPLY_LINE


def test_a_reply_too_long_fails_its_call_at_once(sock: Path) -> None:
    def too_long(peer: AgentPeer, req: Request) -> None:
        if req.get("action") == "huge":
            peer.send_raw(b'{"id":' + str(req["id"]).encode() + b',"ok":true,"result":{"x":"'
                          + b"y" * (protocol.MAX_REPLY_LINE + 10) + b'"}}\n')
        else:
            peer.reply(req, {"pong": True})

    async def scenario() -> None:
        client = await AgentClient(sock).connect()
        try:
            started = time.monotonic()
            with pytest.raises(GuestError, match="reply longer than"):
                await client.call("huge", timeout=30)
            assert time.monotonic() - started < 10, "the call waited for its timeout"
            assert await client.call("ping") == {"pong": True}
        finally:
            await client.close()

    with AgentPeer(sock, too_long):
        run(scenario())


def test_a_stream_that_overruns_its_window_is_failed_not_buffered(sock: Path) -> None:
    piece = base64.b64encode(b"z" * protocol.OUTPUT_CHUNK).decode()

    def overrun(peer: AgentPeer, req: Request) -> None:
        if req.get("action") == protocol.PROC_ATTACH:
            peer.send_raw(protocol.encode(protocol.event(req["id"], {"type": "start", "pid": 5})))
            for _ in range(2 * protocol.STREAM_WINDOW // protocol.OUTPUT_CHUNK):  # twice the window
                peer.send_raw(protocol.encode(protocol.event(req["id"], {"type": "stdout", "data": piece})))
        elif "id" in req:
            peer.reply(req, {"pong": True})

    async def scenario() -> list[str]:
        client = await AgentClient(sock).connect()
        try:
            stream = await client.proc_attach({"pid": 5})
            seen = []
            with pytest.raises(GuestError, match="more than the stream's window"):
                await asyncio.sleep(0.5)  # everything has arrived before anyone reads
                async for event in stream:
                    seen.append(event["type"])
            assert await client.call("ping") == {"pong": True}  # the connection lives on
            return seen
        finally:
            await client.close()

    with AgentPeer(sock, overrun) as peer:
        seen = run(scenario())
        detach = [r for r in peer.wait_for_requests(3) if r.get("action") == protocol.PROC_DETACH]
    # What fit in the window was kept (and is read); then the stream fails, the rest never held.
    assert seen[0] == "start" and seen.count("stdout") <= protocol.STREAM_WINDOW // protocol.OUTPUT_CHUNK
    assert detach and "id" not in detach[0]


def test_a_stream_from_the_real_agent_is_acknowledged_as_it_is_read(sock: Path) -> None:
    total = 3 * protocol.STREAM_WINDOW

    async def scenario() -> tuple[bytes, dict[str, Any]]:
        client = await AgentClient(sock).connect()
        try:
            stream = await client.proc_start_stream({"args": ["head", "-c", str(total), "/dev/zero"]})
            data = b""
            last: dict[str, Any] = {}
            async for event in stream:
                if event["type"] == "stdout":
                    data += event["data"]
                    await asyncio.sleep(0.01)  # a slow reader: the window holds the agent back
                last = event
            return data, last
        finally:
            await client.close()

    with real_agent(sock):
        data, last = run(scenario(), timeout=60)
    assert data == b"\0" * total
    assert last["type"] == "exit" and last["exit_code"] == 0


def test_a_deeply_nested_line_is_garbage_and_the_channel_stays(sock: Path) -> None:
    # Issue 24: a line of 20,000 nested arrays made the reader raise RecursionError, which
    # killed this VM's agent connection for good. It is now dropped like any undecodable line.
    def nested(peer: AgentPeer, req: Request) -> None:
        peer.send_raw(b"[" * 20000 + b"]" * 20000 + b"\n")
        peer.send_raw(b'{"id": ' + str(req["id"]).encode() + b', "ok": true, "result": {"x": '
                      + b"[" * 100 + b"]" * 100 + b"}}\n")  # a reply too deep: dropped too
        peer.reply(req, {"real": True})

    async def scenario() -> AgentClient:
        client = await AgentClient(sock).connect()
        try:
            assert await client.call("ping") == {"real": True}
            assert await client.call("ping") == {"real": True}
            assert client.connected
            return client
        finally:
            await client.close()

    with AgentPeer(sock, nested):
        client = run(scenario())
    assert client.garbage_lines == 4


def test_the_protocol_reads_a_too_deep_line_as_not_json() -> None:
    deep = b"[" * 20000 + b"]" * 20000
    with pytest.raises(ValueError, match="nests too deeply"):
        protocol.decode(deep)
    assert protocol.decode_reply(deep) is None
