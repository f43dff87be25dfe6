"""The typed guest protocol (``forkd.guest.messages``, ``process_messages``, ``code_messages``,
checked by ``forkd.guest.schema``), over the scripted guest (``tests.fakes.guest``).

For every action the host calls: a well-formed round trip through ``AgentClient``'s typed call,
and a reply that does not fit its type refused as a GuestError (the API's 502) that names the
field. And the agent's side: a request that does not fit its action's type is refused (invalid,
400) naming the field, before any handler reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from forkd.errors import GuestError
from forkd.guest import capabilities, messages, protocol, schema
from forkd.guest.client import AgentClient
from tests.fakes.guest import ScriptedGuest

Scenario = Callable[[AgentClient], Awaitable[Any]]
Damage = Callable[[dict[str, Any]], None]


class TamperedGuest(ScriptedGuest):
    """The scripted guest, but its ok replies to ``action`` (the last message, for a stream) go
    through ``damage`` first: a guest that lies about one field (a reply without that field, say
    watch create's where the lie is in watch events', goes as it is)."""

    def __init__(self, action: str | None = None, damage: Damage | None = None) -> None:
        super().__init__()
        self.action = action
        self.damage = damage

    def answer(self, req: dict[str, Any], send: Callable[[dict[str, Any]], None],
               streams: dict[int, Any]) -> None:
        def tamper(message: dict[str, Any]) -> None:
            if (self.damage is not None and req.get("action") == self.action and message.get("ok")
                    and isinstance(message.get("result"), dict)):
                result = dict(message["result"])
                with contextlib.suppress(KeyError, IndexError):
                    self.damage(result)
                    message = {**message, "result": result}
            send(message)

        super().answer(req, tamper, streams)


def talk(guest: ScriptedGuest, scenario: Scenario) -> Any:
    """Run ``scenario`` with an AgentClient connected to ``guest``."""
    folder = Path(tempfile.mkdtemp(prefix="fkmsg", dir="/tmp"))  # short: a socket path's limit

    async def main() -> Any:
        server = await asyncio.start_unix_server(guest.serve, str(folder / "a.sock"))
        client = await AgentClient(folder / "a.sock").connect()
        try:
            return await asyncio.wait_for(scenario(client), 30)
        finally:
            await client.close()
            server.close()

    try:
        return asyncio.run(main())
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def _drain(stream: Any) -> list[dict[str, Any]]:
    return [event async for event in stream]


async def _started(client: AgentClient, args: list[str], **extra: Any) -> int:
    info = await client.proc_start({"args": args, **extra}, 30)  # type: ignore[typeddict-item]
    return info["pid"]


# ---------------------------------------------------------------- scenarios, one per typed call


async def context_create(c: AgentClient) -> Any:
    return await c.context_create({"op": "create", "language": "python", "cwd": "/tmp"}, 30)


async def context_list(c: AgentClient) -> Any:
    return await c.context_list(30)


async def context_run(c: AgentClient) -> Any:
    return await c.context_run({"op": "run", "code": "6 * 7", "timeout_secs": 5}, 30)


async def context_remove(c: AgentClient) -> Any:
    made = await c.context_create({"op": "create"}, 30)
    return await c.context_remove({"op": "remove", "context": made["id"]}, 30)


async def kernel_available(c: AgentClient) -> Any:
    return await c.kernel_available(30)


async def kernel_run(c: AgentClient) -> Any:
    return await c.kernel_run({"op": "run", "code": "None", "silent": True, "timeout_secs": 5}, 30)


async def kernel_run_stream(c: AgentClient) -> Any:
    return await _drain(await c.kernel_run_stream({"op": "run", "code": "print(1)", "timeout_secs": 5}))


async def kernel_interrupt(c: AgentClient) -> Any:
    return await c.kernel_interrupt({"op": "interrupt", "context": "default"}, 30)


async def kernel_stop(c: AgentClient) -> Any:
    return await c.kernel_stop({"op": "restart", "context": "default"}, 30)


async def watch_create(c: AgentClient) -> Any:
    return await c.watch_create({"op": "create", "path": "/tmp", "recursive": True}, 30)


async def watch_events(c: AgentClient) -> Any:
    made = await c.watch_create({"op": "create", "path": "/tmp", "entries": True}, 30)
    await c.file_mkdir({"path": "/tmp/d"}, 30)
    return await c.watch_events({"op": "events", "watcher": made["watcher"], "wait_ms": 0}, 30)


async def watch_remove(c: AgentClient) -> Any:
    made = await c.watch_create({"op": "create", "path": "/tmp"}, 30)
    return await c.watch_remove({"op": "remove", "watcher": made["watcher"]}, 30)


async def proc_start(c: AgentClient) -> Any:
    return await c.proc_start({"args": ["sleep", "9"], "tag": "t", "env": {"A": "1"}}, 30)


async def proc_start_stream(c: AgentClient) -> Any:
    return await _drain(await c.proc_start_stream({"args": ["echo", "hi"]}))


async def proc_attach(c: AgentClient) -> Any:
    pid = await _started(c, ["sleep", "9"])
    stream = await c.proc_attach({"pid": pid, "from_start": True})
    await c.proc_signal({"pid": pid, "signal": 9}, 30)
    return await _drain(stream)


async def proc_list(c: AgentClient) -> Any:
    await _started(c, ["sleep", "9"])
    return await c.proc_list(30)


async def proc_info(c: AgentClient) -> Any:
    return await c.proc_info({"pid": await _started(c, ["sleep", "9"])}, 30)


async def proc_input(c: AgentClient) -> Any:
    pid = await _started(c, ["cat"], stdin=True)
    return await c.proc_input({"pid": pid, "data": "aGk=", "eof": True}, 30)


async def proc_signal(c: AgentClient) -> Any:
    return await c.proc_signal({"pid": await _started(c, ["sleep", "9"]), "signal": 15, "group": True}, 30)


async def proc_resize(c: AgentClient) -> Any:
    pid = await _started(c, ["sleep", "9"], pty={"cols": 80, "rows": 24})
    return await c.proc_resize({"pid": pid, "cols": 100, "rows": 30}, 30)


async def ping(c: AgentClient) -> Any:
    return await c.ping(30)


async def fsfreeze(c: AgentClient) -> Any:
    return await c.fsfreeze(30, mounts=["/mnt/data"])


async def eval_(c: AgentClient) -> Any:
    return await c.eval({"code": "6 * 7", "timeout_secs": 5}, 30)


def _events(kinds: list[str]) -> Callable[[Any], bool]:
    return lambda events: [e["type"] for e in events] == kinds


# (scenario, what its well-formed answer must show)
ROUND_TRIPS: dict[str, tuple[Scenario, Callable[[Any], bool]]] = {
    "context_create": (context_create, lambda r: r == {"id": "c1", "language": "python", "cwd": "/tmp"}),
    "context_list": (context_list, lambda r: [c["id"] for c in r["contexts"]] == ["default"]),
    "context_run": (context_run, lambda r: r["stdout"] == "6 * 7" and r["execution_count"] == 1),
    "context_remove": (context_remove, lambda r: r["id"] == "c1"),
    "kernel_available": (kernel_available, lambda r: r["available"] is True and "bash" in r["languages"]),
    "kernel_run": (kernel_run, lambda r: r["type"] == "end" and r["execution_count"] == 1),
    "kernel_run_stream": (kernel_run_stream, _events(["stdout", "end"])),
    "kernel_interrupt": (kernel_interrupt, lambda r: r == {"interrupted": False}),
    "kernel_stop": (kernel_stop, lambda r: r["type"] == "end"),
    "watch_create": (watch_create, lambda r: r == {"watcher": "w1"}),
    "watch_events": (watch_events, lambda r: r["events"][0]["name"] == "d"
                     and r["events"][0]["entry"]["type"] == "dir"),
    "watch_remove": (watch_remove, lambda r: r == {"removed": True}),
    "proc_start": (proc_start, lambda r: r["args"] == ["sleep", "9"] and r["tag"] == "t" and r["running"]),
    "proc_start_stream": (proc_start_stream, _events(["start", "stdout", "exit"])),
    "proc_attach": (proc_attach, _events(["start", "exit"])),
    "proc_list": (proc_list, lambda r: [p["args"] for p in r["processes"]] == [["sleep", "9"]]),
    "proc_info": (proc_info, lambda r: r["pid"] == 100 and r["running"] is True),
    "proc_input": (proc_input, lambda r: r == {"written": 2}),
    "proc_signal": (proc_signal, lambda r: r["signalled"] is True),
    "proc_resize": (proc_resize, lambda r: r == {"resized": True}),
    "ping": (ping, lambda r: r["pong"] is True and r["agent_version"] == capabilities.AGENT_VERSION),
    "fsfreeze": (fsfreeze, lambda r: r == {"frozen": True}),
    "eval": (eval_, lambda r: r["result"] == "42" and r["exit_code"] == 0),
}


@pytest.mark.parametrize("name", list(ROUND_TRIPS))
def test_a_well_formed_reply_comes_back_typed(name: str) -> None:
    scenario, holds = ROUND_TRIPS[name]
    assert holds(talk(ScriptedGuest(), scenario))


def _set(path: str, value: object) -> Damage:
    """Set the field at ``path`` ("events.0.type") of a reply to ``value``."""
    *parents, last = path.split(".")

    def damage(result: dict[str, Any]) -> None:
        at: Any = result
        for step in parents:
            at = at[int(step)] if isinstance(at, list) else at[step]
        at[last if isinstance(at, dict) else int(last)] = value

    return damage


def _drop(name: str) -> Damage:
    def damage(result: dict[str, Any]) -> None:
        del result[name]

    return damage


# (scenario, the action whose reply lies, how, the field the refusal names)
MALFORMED: dict[str, tuple[Scenario, str, Damage, str]] = {
    "context_create": (context_create, protocol.CONTEXT, _set("id", 5), "'id'"),
    "context_list": (context_list, protocol.CONTEXT, _set("contexts.0.cwd", None), "'contexts'[0].cwd"),
    "context_run": (context_run, protocol.CONTEXT, _drop("execution_count"), "'execution_count'"),
    "context_run_error": (context_run, protocol.CONTEXT, _set("error", {"name": "E"}), "'error'.value"),
    "context_remove": (context_remove, protocol.CONTEXT, _set("language", ["python"]), "'language'"),
    "kernel_available": (kernel_available, protocol.KERNEL, _set("available", "yes"), "'available'"),
    "kernel_run": (kernel_run, protocol.KERNEL, _set("type", "done"), "'type'"),
    "kernel_run_stream": (kernel_run_stream, protocol.KERNEL, _set("execution_count", "1"),
                          "'execution_count'"),
    "kernel_interrupt": (kernel_interrupt, protocol.KERNEL, _drop("interrupted"), "'interrupted'"),
    "kernel_stop": (kernel_stop, protocol.KERNEL, _drop("type"), "'type'"),
    "watch_create": (watch_create, protocol.WATCH, _set("watcher", 1), "'watcher'"),
    "watch_events": (watch_events, protocol.WATCH, _set("events.0.type", "explode"), "'events'[0].type"),
    "watch_entry": (watch_events, protocol.WATCH, _set("events.0.entry.size", "big"),
                    "'events'[0].entry.size"),
    "watch_remove": (watch_remove, protocol.WATCH, _drop("removed"), "'removed'"),
    "proc_start": (proc_start, protocol.PROC_START, _set("pid", "100"), "'pid'"),
    "proc_start_stream": (proc_start_stream, protocol.PROC_START, _set("exit_code", "0"), "'exit_code'"),
    "proc_attach": (proc_attach, protocol.PROC_ATTACH, _set("type", "quit"), "'type'"),
    "proc_list": (proc_list, protocol.PROC_LIST, _set("processes.0.args", "sleep 9"), "'processes'[0].args"),
    "proc_info": (proc_info, protocol.PROC_INFO, _set("pty", {"cols": 80}), "'pty'.rows"),
    "proc_input": (proc_input, protocol.PROC_INPUT, _set("written", True), "'written'"),
    "proc_signal": (proc_signal, protocol.PROC_SIGNAL, _drop("signalled"), "'signalled'"),
    "proc_resize": (proc_resize, protocol.PROC_RESIZE, _set("resized", 1), "'resized'"),
    "ping": (ping, protocol.PING, _drop("pong"), "'pong'"),
    "eval": (eval_, protocol.EVAL, _set("exit_code", None), "'exit_code'"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_reply_that_does_not_fit_is_a_502_naming_the_field(name: str) -> None:
    scenario, action, damage, field = MALFORMED[name]
    with pytest.raises(GuestError) as refused:
        talk(TamperedGuest(action, damage), scenario)
    assert refused.value.status == 502
    assert str(refused.value).startswith(f"guest agent sent a malformed answer: the {action} reply: {field} ")


# ------------------------------------------------------------------------------ the agent's side


@pytest.mark.parametrize(("action", "req", "field"), [
    (protocol.PROC_SIGNAL, {"pid": "100", "signal": 9}, "'pid' must be an integer"),
    (protocol.PROC_INPUT, {"pid": 1, "data": 5}, "'data' must be a string"),
    (protocol.PROC_START, {"args": ["x"], "pty": {"cols": 80}}, "'pty'.rows must be present"),
    (protocol.PROC_ACK, {"stream": 1, "bytes": "10"}, "'bytes' must be an integer"),
    (protocol.CONTEXT, {"op": "run", "code": 1}, "'code' must be a string"),
    (protocol.KERNEL, {"op": "run", "code": "1", "timeout_secs": "5"},
     "'timeout_secs' must be a positive number"),
    (protocol.WATCH, {"op": "events", "watcher": "w1", "wait_ms": 1.5}, "'wait_ms' must be an integer"),
    (protocol.WATCH, {"op": "create"}, "'path' must be present"),
    (protocol.FSFREEZE, {"mounts": "/mnt/data"}, "'mounts' must be a list"),
])
def test_the_agent_refuses_a_request_that_does_not_fit_naming_the_field(
        action: str, req: dict[str, Any], field: str) -> None:
    with pytest.raises(protocol.RequestError) as refused:
        messages.check_request(action, {"id": 1, "action": action, **req})
    assert refused.value.kind == protocol.INVALID and f"the {action} request: {field}" in str(refused.value)


def test_the_agent_lets_a_well_formed_request_through_and_leaves_unknown_ops_to_their_handler() -> None:
    for action, req in [(protocol.PROC_START, {"args": ["x"], "pty": {"cols": 1, "rows": 2}, "stream": True}),
                        (protocol.KERNEL, {"op": "run", "code": "1", "timeout_secs": 5, "env": {"A": "b"}}),
                        (protocol.CONTEXT, {"op": "list", "extra": "ignored"}),
                        (protocol.WATCH, {"op": "explode"}),  # the handler says which ops there are
                        (protocol.PING, {})]:
        messages.check_request(action, {"id": 1, "action": action, **req})


def test_the_schema_names_nested_fields_and_keeps_unknown_keys() -> None:
    reply = {"path": "/", "entries": [{"path": "/a", "name": "a", "type": "file", "size": 1, "mode": 0,
                                       "mtime": 1, "new_field": [1]}], "truncated": False}
    assert schema.check(messages.FileListReply, reply, "the file_list reply") is reply
    reply["entries"][0]["size"] = 1.5  # type: ignore[index]
    with pytest.raises(schema.ProtocolError) as refused:
        schema.check(messages.FileListReply, reply, "the file_list reply")
    assert refused.value.field == "entries[0].size"
    assert str(refused.value) == "the file_list reply: 'entries'[0].size must be an integer"
