"""envd's directory watching (``WatchDir``, and ``CreateWatcher``/``GetWatcherEvents``/
``RemoveWatcher`` for the sync SDK's polling), on forkd's watchers (``Runtime.watches``).

``WatchDir`` is a stream: a ``start`` event once the watcher exists, then each
event as the guest reports it (it waits up to a second per poll, so an event
arrives at once), and a keepalive in every long silence. It ends at the call's
``Connect-Timeout-Ms`` (``deadline_exceeded``, as envd ends it), and the
watcher is removed whenever the stream ends, the client's going away included.
The polling watcher lives in the guest until ``RemoveWatcher`` (or the sandbox's
end); the guest bounds how many a sandbox has. With ``include_entry`` (envd
0.6.3) each event carries the EntryInfo of what it names, as the guest found it
when polled (none once it is gone, nor for ``remove`` and ``rename``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.filesystem import filesystem_pb
from protobuf import Oneof

from forkd.api.e2b.errors import connect_errors
from forkd.controller.results import FileEntry
from forkd.errors import ForkdError

if TYPE_CHECKING:
    from forkd.controller.runtime import Runtime, WatchBatch

@dataclass(frozen=True)
class WatchOptions:
    """A WatchDir's or CreateWatcher's options. ``allow_network_mounts`` (envd 0.6.4) lets envd
    watch NFS, CIFS or FUSE mounts, which it refuses otherwise; a forkd guest has none, so the
    option is accepted and changes nothing."""

    recursive: bool
    include_entry: bool  # envd 0.6.3: each event carries the entry it names, when it is there

    @classmethod
    def of(cls, request: filesystem_pb.WatchDirRequest | filesystem_pb.CreateWatcherRequest) -> WatchOptions:
        return cls(recursive=request.recursive, include_entry=request.include_entry)


POLL_WAIT_MS = 1000
KEEPALIVE_SECS = 50.0  # as process streams: E2B's SDK asks for a ping this often

_TYPES = {"create": filesystem_pb.EventType.CREATE, "write": filesystem_pb.EventType.WRITE,
          "remove": filesystem_pb.EventType.REMOVE, "rename": filesystem_pb.EventType.RENAME,
          "chmod": filesystem_pb.EventType.CHMOD}
_START: Oneof[Literal["start"], filesystem_pb.WatchDirResponse.StartEvent] = Oneof(
    "start", filesystem_pb.WatchDirResponse.StartEvent())
_KEEPALIVE: Oneof[Literal["keepalive"], filesystem_pb.WatchDirResponse.KeepAlive] = Oneof(
    "keepalive", filesystem_pb.WatchDirResponse.KeepAlive())


# forkd's FileInfo as envd's EntryInfo (filesystem.entry, passed in: that module imports this one).
ToEntry = Callable[[FileEntry], filesystem_pb.EntryInfo]


def events(batch: WatchBatch, to_entry: ToEntry) -> list[filesystem_pb.FilesystemEvent]:
    return [filesystem_pb.FilesystemEvent(name=ev.name, type=_TYPES[ev.type],
                                          entry=None if ev.entry is None else to_entry(ev.entry))
            for ev in batch.events]


async def watch_stream(runtime: Runtime, sandbox: str, path: str, options: WatchOptions,
                       timeout_ms: float | None, to_entry: ToEntry,
                       ) -> AsyncIterator[filesystem_pb.WatchDirResponse]:
    loop = asyncio.get_running_loop()
    deadline = None if timeout_ms is None else loop.time() + timeout_ms / 1000
    watches = runtime.watches
    with connect_errors():
        watcher = await watches.create(sandbox, path, recursive=options.recursive,
                                       include_entry=options.include_entry)
    try:
        yield filesystem_pb.WatchDirResponse(event=_START)
        quiet_since = loop.time()
        while deadline is None or loop.time() < deadline:
            left_ms = POLL_WAIT_MS if deadline is None else (deadline - loop.time()) * 1000
            wait = int(min(POLL_WAIT_MS, left_ms))
            with connect_errors():
                batch = await watches.events(sandbox, watcher, wait_ms=max(0, wait))
            for ev in events(batch, to_entry):
                found: Oneof[Literal["filesystem"], filesystem_pb.FilesystemEvent] = Oneof("filesystem", ev)
                yield filesystem_pb.WatchDirResponse(event=found)
            if batch.events:
                quiet_since = loop.time()
            elif loop.time() - quiet_since >= KEEPALIVE_SECS:
                yield filesystem_pb.WatchDirResponse(event=_KEEPALIVE)
                quiet_since = loop.time()
        raise ConnectError(Code.DEADLINE_EXCEEDED, "the watch's timeout (Connect-Timeout-Ms) ran out")
    finally:
        with contextlib.suppress(ForkdError):  # the sandbox may be gone: so is its watcher
            await watches.remove(sandbox, watcher)


async def create_watcher(runtime: Runtime, sandbox: str, path: str, options: WatchOptions) -> str:
    with connect_errors():
        return await runtime.watches.create(sandbox, path, recursive=options.recursive,
                                            include_entry=options.include_entry)


async def watcher_events(runtime: Runtime, sandbox: str, watcher: str,
                         to_entry: ToEntry) -> list[filesystem_pb.FilesystemEvent]:
    with connect_errors():
        return events(await runtime.watches.events(sandbox, watcher), to_entry)


async def remove_watcher(runtime: Runtime, sandbox: str, watcher: str) -> None:
    with connect_errors():
        await runtime.watches.remove(sandbox, watcher)
