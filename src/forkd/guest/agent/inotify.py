"""Linux's inotify, through ctypes: the agent is stdlib only, and Python's stdlib has no binding.

Its own module so that ``watches`` speaks of watchers and events, not of
system-call numbers and struct layouts: here are the flags forkd asks for, the
instance and watch calls (failing with ``OSError`` like the rest of ``os``),
and the decoding of what ``read`` returns into events.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from collections.abc import Iterator
from typing import Any

IN_MODIFY, IN_ATTRIB = 0x2, 0x4
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF = 0x400
IN_Q_OVERFLOW, IN_IGNORED, IN_ONLYDIR, IN_ISDIR = 0x4000, 0x8000, 0x1000000, 0x40000000
MASK = IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF
_HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)

# The first flag that names an event, in envd's terms.
KINDS = ((IN_CREATE, "create"), (IN_MOVED_TO, "create"), (IN_MODIFY, "write"), (IN_DELETE, "remove"),
         (IN_DELETE_SELF, "remove"), (IN_MOVED_FROM, "rename"), (IN_ATTRIB, "chmod"))

_libc: Any = None


def _lib() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


def event_kind(mask: int) -> str | None:
    for flag, kind in KINDS:
        if mask & flag:
            return kind
    return None


def instance() -> int:
    """A new inotify descriptor (non-blocking, closed on exec)."""
    fd = int(_lib().inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


def watch_dir(fd: int, path: str) -> int:
    """Watch directory ``path`` on ``fd`` for ``MASK``; its watch descriptor."""
    wd = int(_lib().inotify_add_watch(fd, os.fsencode(path), MASK | IN_ONLYDIR))
    if wd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return wd


def decode(buf: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    """The events in what one ``read`` returned: (watch descriptor, mask, cookie, name)."""
    offset = 0
    while offset + _HEADER.size <= len(buf):
        wd, mask, cookie, length = _HEADER.unpack_from(buf, offset)
        name = buf[offset + _HEADER.size: offset + _HEADER.size + length].rstrip(b"\0")
        offset += _HEADER.size + length
        yield wd, mask, cookie, name
