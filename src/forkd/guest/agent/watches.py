"""The ``watch`` action: directory watchers on inotify, polled by the host.

A watcher is one inotify instance (``inotify_init1`` through ctypes: the agent
is stdlib only) with a watch on the directory and, when recursive, on every
directory below it, added as they appear. The kernel queues the events between
polls, so the agent keeps no buffer of its own and no thread: ``events`` waits
(at most ``MAX_WAIT_MS``, on a worker) until the queue has something, reads it
and answers the events as ``{"name": path relative to the watched directory,
"type": create|write|remove|rename|chmod}``. A queue that overflowed is said
(``overflowed``) rather than hidden. Watchers are bounded per guest; the host
removes the ones it made, and a restored child drops its parent's.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import itertools
import os
import select
import struct
import threading
from typing import Any

from forkd.guest.protocol import CONFLICT, INVALID, NOT_FOUND, RequestError, check_path

MAX_WATCHERS = 8
MAX_WAIT_MS = 1000
MAX_DIRS = 4096  # watches per watcher (recursive): each costs kernel memory
MAX_EVENTS = 1000  # per answer; the rest stay queued for the next poll
READ_BYTES = 64 << 10

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF = 0x400, 0x800
IN_Q_OVERFLOW, IN_IGNORED, IN_ONLYDIR, IN_ISDIR = 0x4000, 0x8000, 0x1000000, 0x40000000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
MASK = IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len

# The first flag that names an event, in envd's terms.
KINDS = ((IN_CREATE, "create"), (IN_MOVED_TO, "create"), (IN_MODIFY, "write"), (IN_DELETE, "remove"),
         (IN_DELETE_SELF, "remove"), (IN_MOVED_FROM, "rename"), (IN_ATTRIB, "chmod"))

_libc: Any = None


def _inotify() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


def event_kind(mask: int) -> str | None:
    for flag, kind in KINDS:
        if mask & flag:
            return kind
    return None


class Watcher:
    def __init__(self, path: str, recursive: bool) -> None:
        self.root = path
        self.recursive = recursive
        self.dirs: dict[int, str] = {}  # watch descriptor -> directory, relative to root ("" for it)
        self.overflowed = False
        self.lock = threading.Lock()  # one poll at a time per watcher
        self.fd = _inotify().inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            err = ctypes.get_errno()
            raise RequestError(f"cannot watch {path}: {os.strerror(err)}", CONFLICT if err == errno.EMFILE
                               else INVALID)
        try:
            self._add(path, "", top=True)
            if recursive:
                self._add_below(path, "")
        except BaseException:
            os.close(self.fd)
            raise

    def _add(self, full: str, rel: str, top: bool = False) -> None:
        if len(self.dirs) >= MAX_DIRS:
            return  # bounded: deeper directories go unwatched rather than exhaust the guest
        wd = _inotify().inotify_add_watch(self.fd, os.fsencode(full), MASK | IN_ONLYDIR)
        if wd < 0:
            err = ctypes.get_errno()
            if not top:
                return  # gone already, or not a directory any more: nothing to watch
            kind = NOT_FOUND if err == errno.ENOENT else INVALID
            raise RequestError(f"cannot watch {full}: {os.strerror(err)}", kind)
        self.dirs[wd] = rel

    def _add_below(self, full: str, rel: str) -> None:
        for dirpath, dirnames, _files in os.walk(full):
            for name in dirnames:
                sub = os.path.join(dirpath, name)
                if not os.path.islink(sub):
                    self._add(sub, os.path.relpath(sub, self.root))

    def poll(self, wait_ms: int) -> list[dict[str, str]]:
        with self.lock:
            ready, _, _ = select.select([self.fd], [], [], wait_ms / 1000)
            if not ready:
                return []
            out: list[dict[str, str]] = []
            while len(out) < MAX_EVENTS:
                try:
                    buf = os.read(self.fd, READ_BYTES)
                except BlockingIOError:
                    break
                out += self._parse(buf)
            return out

    def _parse(self, buf: bytes) -> list[dict[str, str]]:
        out: list[dict[str, str]] = []
        offset = 0
        while offset + _HEADER.size <= len(buf):
            wd, mask, _cookie, length = _HEADER.unpack_from(buf, offset)
            raw = buf[offset + _HEADER.size: offset + _HEADER.size + length].rstrip(b"\0")
            offset += _HEADER.size + length
            if mask & IN_Q_OVERFLOW:
                self.overflowed = True
                continue
            if mask & IN_IGNORED:
                self.dirs.pop(wd, None)
                continue
            base = self.dirs.get(wd)
            kind = event_kind(mask)
            if base is None or kind is None:
                continue
            name = os.path.join(base, os.fsdecode(raw)) if raw else base
            if mask & IN_DELETE_SELF and base != "":
                continue  # the parent's IN_DELETE already said it
            out.append({"name": name, "type": kind})
            if self.recursive and mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
                full = os.path.join(self.root, name)
                self._add(full, name)
                self._add_below(full, name)  # what was made inside before the watch existed
        return out

    def close(self) -> None:
        with self.lock:
            os.close(self.fd)


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
                watcher = Watcher(path, req.get("recursive") is True)
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
