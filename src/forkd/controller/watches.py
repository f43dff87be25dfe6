"""`DirWatches`: directory watchers in a sandbox (inotify in the guest, ``guest.agent.watches``).

A watcher lives in the guest and is polled: ``events`` answers what happened
since the last poll, waiting up to ``wait_ms`` for the first event, so a
caller that streams events (E2B's ``WatchDir``) loops on it and one that polls
(``GetWatcherEvents``) calls it with no wait. What the guest answers is
checked for shape and size before anyone sees it: the guest is not trusted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from forkd.controller.agent_gateway import AgentGateway
from forkd.controller.files import check_path, checked_info
from forkd.controller.results import FileEntry
from forkd.errors import GuestError, InvalidRequest
from forkd.guest import capabilities, messages, protocol
from forkd.guest.client import checked_reply

WatchEventType = Literal["create", "write", "remove", "rename", "chmod"]
EVENT_TYPES: tuple[WatchEventType, ...] = ("create", "write", "remove", "rename", "chmod")
MAX_WAIT_MS = 1000  # the guest waits no longer; a stream polls again
MAX_EVENTS = 1000  # one answer, as the guest bounds it
CALL_GRACE_SECS = 30.0  # beyond the wait: a guest that answers later is wedged


@dataclass(frozen=True)
class WatchEvent:
    name: str  # relative to the watched directory
    type: WatchEventType
    # What it names, as ``SandboxFiles.stat`` answers (a watcher made with include_entry; None
    # when gone, and for remove and rename).
    entry: FileEntry | None = None


@dataclass(frozen=True)
class WatchBatch:
    events: list[WatchEvent]
    overflowed: bool  # the guest's queue overflowed: events were lost before these


def _batch(result: dict[str, Any]) -> WatchBatch:
    """What the guest answered (``messages.WatchEventsReply``), checked and bounded."""
    reply = checked_reply(messages.WatchEventsReply, result, protocol.WATCH)
    if len(reply["events"]) > MAX_EVENTS:
        raise GuestError("guest agent sent more watcher events than it may")
    events = []
    for item in reply["events"]:
        if len(item["name"]) > protocol.FILE_PATH_MAX:
            raise GuestError("guest agent sent an overlong watcher event name")
        entry = item.get("entry")
        events.append(WatchEvent(item["name"], item["type"], None if entry is None else checked_info(entry)))
    return WatchBatch(events, reply.get("overflowed") is True)


class DirWatches:
    def __init__(self, agents: AgentGateway) -> None:
        self._agents = agents

    async def create(self, sandbox_id: str, path: str, *, recursive: bool = False,
                     include_entry: bool = False) -> str:
        """A new watcher of directory ``path``; its id (the guest's, at most ``MAX_WATCHERS``).
        With ``include_entry``, its events carry the entry they name."""
        path = check_path(path)
        await self._agents.require_agent(sandbox_id, capabilities.CAP_WATCH)
        req: messages.WatchCreateRequest = {"op": "create", "path": path, "recursive": recursive}
        if include_entry:
            await self._agents.require_agent(sandbox_id, capabilities.CAP_WATCH_ENTRIES)
            req["entries"] = True
        result = await self._agents.call(sandbox_id, lambda agent: agent.watch_create(req, CALL_GRACE_SECS))
        watcher = result["watcher"]
        if not 0 < len(watcher) <= 64:
            raise GuestError("guest agent sent a malformed watcher id")
        return watcher

    async def events(self, sandbox_id: str, watcher: str, *, wait_ms: int = 0) -> WatchBatch:
        """What happened since the last poll, waiting up to ``wait_ms`` for something."""
        if not 0 <= wait_ms <= MAX_WAIT_MS:
            raise InvalidRequest(f"wait_ms must be 0 to {MAX_WAIT_MS}")
        result = await self._agents.call(sandbox_id, lambda agent: agent.watch_events(
            {"op": "events", "watcher": watcher, "wait_ms": wait_ms}, CALL_GRACE_SECS + wait_ms / 1000))
        return _batch(dict(result))

    async def remove(self, sandbox_id: str, watcher: str) -> None:
        await self._agents.call(sandbox_id, lambda agent: agent.watch_remove(
            {"op": "remove", "watcher": watcher}, CALL_GRACE_SECS))
