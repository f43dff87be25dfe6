"""The ``watch`` action: directory watchers on inotify, polled by the host.

A watcher is one inotify instance (``inotify_init1`` through ctypes: the agent
is stdlib only) with a watch on the directory and, when recursive, on every
directory below it, added as they appear. The kernel queues the events between
polls; a reader thread per watcher takes them as they come (so that a new
directory is watched at once) into a bounded queue, and ``events`` waits (at
most ``MAX_WAIT_MS``, on a worker) until the queue has something and answers
the events as ``{"name": path relative to the watched directory,
"type": create|write|remove|rename|chmod}`` (a watcher made with ``entries``: and
the ``entry``, the FileInfo of what the event names, when it is still there). A
queue that overflowed is said
(``overflowed``) rather than hidden. Watchers are bounded per guest; the host
removes the ones it made, and a restored child drops its parent's.

An upload lands by renaming a temp file over its target (``uploads``), where
envd writes in place: a watcher here hides the temp file and reports the
landing as envd's watchers see a write (``create`` if the file is new, then
``write`` and ``chmod``).
"""

from __future__ import annotations

import collections
import errno
import itertools
import os
import select
import threading
from typing import Any

from forkd.guest.agent import inotify
from forkd.guest.agent.fileinfo import stat_info
from forkd.guest.agent.uploads import TEMP_PREFIX, landed_over
from forkd.guest.protocol import CONFLICT, INVALID, NOT_FOUND, RequestError, check_path

MAX_WATCHERS = 8
MAX_WAIT_MS = 1000
MAX_DIRS = 4096  # watches per watcher (recursive): each costs kernel memory
MAX_EVENTS = 1000  # per answer; the rest stay queued for the next poll
# Per answer of a watcher whose events carry their entry (a FileInfo, metadata included: ~4.5 KiB
# at most), so that the answer stays well inside the reply line's limit.
MAX_ENTRY_EVENTS = 200
# The events whose path no longer names what they were about: they carry no entry (as envd's).
NO_ENTRY = ("remove", "rename")
QUEUE_MAX = 10_000  # events read but not yet polled, per watcher
READ_BYTES = 64 << 10

def with_entry(root: str, event: dict[str, Any]) -> dict[str, Any]:
    """``event`` with the ``entry`` (FileInfo) of what it names, as it is now: none for a removal
    or a move away, or for what is gone by the time of the poll."""
    if event["type"] in NO_ENTRY:
        return event
    try:
        return {**event, "entry": stat_info(os.path.join(root, event["name"]))}
    except OSError:
        return event


class Watcher:
    def __init__(self, path: str, recursive: bool, entries: bool = False) -> None:
        self.root = path
        self.recursive = recursive
        self.entries = entries  # each event answered with its entry (E2B's include_entry)
        self.dirs: dict[int, str] = {}  # watch descriptor -> directory, relative to root ("" for it)
        self.overflowed = False
        self.uploads_moving: set[int] = set()  # rename cookies of upload temp files moving out
        self.lock = threading.Lock()  # one reader of the inotify descriptor at a time
        try:
            self.fd = inotify.instance()
        except OSError as exc:
            raise RequestError(f"cannot watch {path}: {exc.strerror}",
                               CONFLICT if exc.errno == errno.EMFILE else INVALID) from None
        try:
            self._add(path, "", top=True)
            if recursive:
                self._add_below(path, "")
        except BaseException:
            os.close(self.fd)
            raise
        self.events: collections.deque[dict[str, str]] = collections.deque()
        self.cond = threading.Condition()
        self.closed = False
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC)
        # A reader reads the queue as events come, so that a directory made now is watched before
        # the next request can write into it (a poll alone would add its watch too late).
        threading.Thread(target=self._read_until_closed, name="forkd-watch", daemon=True).start()

    def _add(self, full: str, rel: str, top: bool = False) -> None:
        if len(self.dirs) >= MAX_DIRS:
            return  # bounded: deeper directories go unwatched rather than exhaust the guest
        try:
            wd = inotify.watch_dir(self.fd, full)
        except OSError as exc:
            if not top:
                return  # gone already, or not a directory any more: nothing to watch
            kind = NOT_FOUND if exc.errno == errno.ENOENT else INVALID
            raise RequestError(f"cannot watch {full}: {exc.strerror}", kind) from None
        self.dirs[wd] = rel

    def _add_below(self, full: str, rel: str) -> None:
        for dirpath, dirnames, _files in os.walk(full):
            for name in dirnames:
                sub = os.path.join(dirpath, name)
                if not os.path.islink(sub):
                    self._add(sub, os.path.relpath(sub, self.root))

    def _read_until_closed(self) -> None:
        while True:
            ready, _, _ = select.select([self.fd, self.wake_r], [], [])  # idle: blocked, no wake-ups
            if self.wake_r in ready:
                with self.lock:
                    for fd in (self.fd, self.wake_r, self.wake_w):
                        os.close(fd)
                return
            self._drain()

    def _drain(self) -> None:
        """Read what the kernel has queued into ``events`` (bounded: beyond it, ``overflowed``)."""
        with self.lock:
            if self.closed:
                return
            while True:
                try:
                    buf = os.read(self.fd, READ_BYTES)
                except BlockingIOError:
                    return
                found = self._parse(buf)
                with self.cond:
                    room = QUEUE_MAX - len(self.events)
                    if len(found) > room:
                        self.overflowed = True
                        found = found[:max(room, 0)]
                    self.events.extend(found)
                    self.cond.notify_all()

    def poll(self, wait_ms: int) -> list[dict[str, Any]]:
        self._drain()  # what the reader has not taken yet: a request's own effects are never missed
        most = MAX_ENTRY_EVENTS if self.entries else MAX_EVENTS
        with self.cond:
            if not self.events and not self.closed:
                self.cond.wait(wait_ms / 1000)
            if self.closed:
                raise ValueError("closed")
            found: list[dict[str, Any]] = [self.events.popleft() for _ in range(min(len(self.events), most))]
        # Outside the lock: stat calls on a slow filesystem must not hold up the reader.
        return [with_entry(self.root, ev) for ev in found] if self.entries else found

    def _parse(self, buf: bytes) -> list[dict[str, str]]:
        out: list[dict[str, str]] = []
        for wd, mask, cookie, raw in inotify.decode(buf):
            if mask & inotify.IN_Q_OVERFLOW:
                self.overflowed = True
                continue
            if mask & inotify.IN_IGNORED:
                self.dirs.pop(wd, None)
                continue
            base = self.dirs.get(wd)
            kind = inotify.event_kind(mask)
            if base is None or kind is None:
                continue
            name = os.path.join(base, os.fsdecode(raw)) if raw else base
            if raw.startswith(TEMP_PREFIX.encode()):  # an upload's temp file: the agent's own
                if mask & inotify.IN_MOVED_FROM:
                    self._upload_cookies(cookie)
                continue
            if mask & inotify.IN_MOVED_TO and cookie in self.uploads_moving:
                self.uploads_moving.discard(cookie)
                replaced = landed_over(os.path.join(self.root, name))
                # As envd's in-place write shows it: the file made (if new), written, given its mode.
                out += [{"name": name, "type": k} for k in
                        (("write", "chmod") if replaced else ("create", "write", "chmod"))]
                continue
            if mask & inotify.IN_DELETE_SELF and base != "":
                continue  # the parent's IN_DELETE already said it
            out.append({"name": name, "type": kind})
            arrived = mask & (inotify.IN_CREATE | inotify.IN_MOVED_TO)
            if self.recursive and mask & inotify.IN_ISDIR and arrived:
                full = os.path.join(self.root, name)
                self._add(full, name)
                self._add_below(full, name)  # what was made inside before the watch existed
        return out

    def _upload_cookies(self, cookie: int) -> None:
        if len(self.uploads_moving) >= MAX_EVENTS:  # a rename's two halves come together: bounded
            self.uploads_moving.clear()
        self.uploads_moving.add(cookie)

    def close(self) -> None:
        with self.lock, self.cond:
            self.closed = True
            self.cond.notify_all()
        os.write(self.wake_w, b"x")  # the reader closes the descriptors, once it is out of select


class Watches:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._watchers: dict[str, Watcher] = {}

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "create":
            path = check_path(req.get("path"))
            if not os.path.isdir(path):
                if os.path.exists(path):
                    raise RequestError(f"{path} is not a directory", INVALID)
                raise RequestError(f"{path} does not exist", NOT_FOUND)
            with self._lock:
                if len(self._watchers) >= MAX_WATCHERS:
                    raise RequestError(f"this sandbox already has {MAX_WATCHERS} directory watchers; "
                                       "stop one first", CONFLICT)
                watcher = Watcher(path, req.get("recursive") is True, req.get("entries") is True)
                new_id = f"w{next(self._ids)}"
                self._watchers[new_id] = watcher
            return {"watcher": new_id}
        watcher_id = req.get("watcher")
        if not isinstance(watcher_id, str):
            raise RequestError("watcher must be a string", INVALID)
        with self._lock:
            found = self._watchers.pop(watcher_id, None) if op == "remove" else self._watchers.get(watcher_id)
        if found is None:
            raise RequestError(f"no directory watcher {watcher_id[:40]!r}", NOT_FOUND)
        if op == "remove":
            found.close()
            return {"removed": True}
        if op == "events":
            wait = req.get("wait_ms", 0)
            if isinstance(wait, bool) or not isinstance(wait, int) or wait < 0:
                raise RequestError("wait_ms must be a non-negative integer", INVALID)
            try:
                events = found.poll(min(wait, MAX_WAIT_MS))
            except (OSError, ValueError):  # removed while this poll waited
                raise RequestError(f"directory watcher {watcher_id!r} was stopped", NOT_FOUND) from None
            overflowed, found.overflowed = found.overflowed, False
            return {"events": events, "overflowed": overflowed}
        raise RequestError(f"unknown watch op {str(op)[:40]!r}", INVALID)

    def drop_all(self) -> None:
        """A restored child: the host that made these watchers watches its parent, not it."""
        with self._lock:
            watchers, self._watchers = list(self._watchers.values()), {}
        for w in watchers:
            w.close()
