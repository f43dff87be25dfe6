"""Shared volumes on the wire: a host directory mounted in the guest through FUSE, over the agent's port.

Why this way (docs/BRANCHING.md#shared-volumes says it to users): a ``fork: "shared"`` volume is one
set of files that several running sandboxes write at once. QEMU 7.2 refuses to migrate a VM with a
9p or vhost-user-fs device, and migration is how forkd snapshots, branches and hibernates, so the
files cannot reach the guest as a device. NFS over the sandbox's NIC would need the guest's network
(a sandbox may have none) and does not make two clients' appends atomic. So the guest agent mounts a
FUSE file system (``forkd.guest.agent.volfs``) and hands each request that needs the files to the
host as a :class:`VolOp`; the daemon performs it on the volume's directory (``forkd.vmm.volume_dir``)
and answers with a :class:`VolReplyNotice`. Every write is one ``write(2)`` on the host's file (an
``O_APPEND`` one for a guest's ``O_APPEND`` file), so the host's file system orders concurrent writers
as it orders local ones, and every sandbox sees the same files at once (nothing is cached in a guest).

The mount lives in guest memory, so a fork, a branch and a hibernation carry it as they carry the
rest; the child's host serves the same directory. Nothing the host keeps is per-open-file: every
op names its path, so a new daemon (kill -9 and re-adoption) or a restored child serves the ops that
were in flight (``VolPollRequest.resend``).

Direction: the host asks, as for every action. It keeps one ``vol_poll`` per mount waiting; the agent
answers it with the ops its FUSE server has queued (or none after ``wait_secs``), and the host answers
each op with a ``vol_reply`` notification. Stdlib only: the guest image carries it
(``forkd.image.rootfs.GUEST_SHARED_MODULES``).
"""

from __future__ import annotations

import os
from typing import Literal, NotRequired, TypedDict

from forkd.guest.protocol import SHARED_VOLUMES_AGENT_VERSION, VOL_MOUNT, VOL_POLL, VOL_REPLY
from forkd.guest.schema import Seconds

# ----------------------------------------------------------------------------- limits

MAX_SLOTS = 8  # shared volumes in one sandbox (slot 0..7)
MAX_IO = 1 << 20  # the most bytes one read or write op carries (FUSE's max_read, max_write: 256 pages)
MAX_POLL_OPS = 32  # the most ops one vol_poll answer carries
MAX_POLL_DATA = 1 << 20  # ... and the most written bytes among them (base64 grows them by a third)
READDIR_PAGE = 256  # the most directory entries one readdir answer carries
MAX_PATH = 4096  # a path's length in bytes, as PATH_MAX
MAX_NAME = 255  # one component's length in bytes, as NAME_MAX
MAX_POLL_WAIT_SECS = 30.0
OP_TIMEOUT_SECS = 120.0  # an op the host has not answered by then fails in the guest with EIO

OPS = ("getattr", "readdir", "mkdir", "create", "unlink", "rmdir", "rename", "setattr", "read", "write",
       "symlink", "readlink", "link", "statfs", "fsync")
OpName = Literal["getattr", "readdir", "mkdir", "create", "unlink", "rmdir", "rename", "setattr", "read",
                 "write", "symlink", "readlink", "link", "statfs", "fsync"]
# Ops that change the files: refused on a read-only attachment by the host, whatever the guest says.
MUTATING = frozenset({"mkdir", "create", "unlink", "rmdir", "rename", "setattr", "write", "symlink", "link"})


class VolMountRequest(TypedDict):
    """Mount shared volume ``slot`` at ``mount`` (made if missing). A second request for a slot that is
    mounted at the same path is a no-op (a wake, a re-adopted sandbox); at another path, an error."""

    slot: int
    mount: str
    read_only: bool


class VolMountReply(TypedDict):
    mounted: bool
    already: bool  # it was mounted before this request


class VolPollRequest(TypedDict, total=False):
    slot: int  # required
    # Hand out again every op not yet answered: the host asking is not the one they went to (a new
    # daemon, a restored child, a woken sandbox).
    resend: bool
    wait_secs: Seconds  # hold the request this long when nothing is queued (at most MAX_POLL_WAIT_SECS)


class VolOp(TypedDict):
    """One request of the guest's FUSE server that needs the files. ``path`` is relative to the
    volume's root ("" is the root), '/'-separated, without '.' or '..' (``check_path``)."""

    seq: int
    op: OpName
    path: str
    uid: int  # who asks, in the guest: a new file's owner (the guest's kernel checked permissions)
    gid: int
    to: NotRequired[str]  # rename's and link's new path
    target: NotRequired[str]  # symlink's target (never followed by the host)
    mode: NotRequired[int]  # mkdir, create; setattr's chmod
    size: NotRequired[int]  # read's length; setattr's truncate
    offset: NotRequired[int]  # read, write; readdir's index
    data: NotRequired[str]  # write's bytes, base64
    append: NotRequired[bool]  # write: the guest's file is O_APPEND (the host appends, whatever offset)
    exclusive: NotRequired[bool]  # create: O_EXCL
    owner_uid: NotRequired[int]  # setattr's chown
    owner_gid: NotRequired[int]
    atime_ns: NotRequired[int]  # setattr; -1 is "now"
    mtime_ns: NotRequired[int]
    flags: NotRequired[int]  # rename: RENAME_NOREPLACE (1) or 0


class VolPollReply(TypedDict):
    ops: list[VolOp]


class VolAttr(TypedDict):
    mode: int  # st_mode, type bits included
    nlink: int
    uid: int
    gid: int
    size: int
    blocks: int  # 512-byte blocks
    atime_ns: int
    mtime_ns: int
    ctime_ns: int


class VolDirEntry(TypedDict):
    name: str
    mode: int  # the type bits only (S_IFDIR, S_IFREG, S_IFLNK, ...)


class VolStatfs(TypedDict):
    bsize: int
    blocks: int
    bfree: int
    files: int
    ffree: int


class VolReplyNotice(TypedDict):
    """The host's answer to one op: ``errno`` 0 and the op's result, or an errno and nothing."""

    slot: int
    seq: int
    errno: int
    attr: NotRequired[VolAttr]  # getattr, mkdir, create, setattr, symlink, link
    data: NotRequired[str]  # read: base64, at most the op's size
    written: NotRequired[int]  # write
    target: NotRequired[str]  # readlink
    entries: NotRequired[list[VolDirEntry]]  # readdir: from the op's offset, at most READDIR_PAGE
    more: NotRequired[bool]  # readdir: entries past these
    statfs: NotRequired[VolStatfs]


def check_path(path: object, what: str = "path") -> str:
    """A volume-relative path as both ends require it, or ValueError naming what is wrong. Names are
    the guest's bytes decoded as the file system encoding does (surrogateescape), so any name a Linux
    file can have travels, and ``os.fsencode`` gives the bytes back."""
    if not isinstance(path, str):
        raise ValueError(f"{what} must be a string")
    if path == "":
        return path
    raw = os.fsencode(path)
    if len(raw) > MAX_PATH or b"\0" in raw:
        raise ValueError(f"{what} is longer than {MAX_PATH} bytes or has a NUL")
    for part in raw.split(b"/"):
        if part in (b"", b".", b"..") or len(part) > MAX_NAME:
            raise ValueError(f"{what} must be '/'-separated names, none empty, '.', '..' "
                             f"or longer than {MAX_NAME} bytes")
    return path


def join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


__all__ = ["MAX_IO", "MAX_POLL_DATA", "MAX_POLL_OPS", "MAX_SLOTS", "MUTATING", "OPS", "OP_TIMEOUT_SECS",
           "READDIR_PAGE", "SHARED_VOLUMES_AGENT_VERSION", "VOL_MOUNT", "VOL_POLL", "VOL_REPLY", "VolAttr",
           "VolDirEntry", "VolMountReply", "VolMountRequest", "VolOp", "VolPollReply", "VolPollRequest",
           "VolReplyNotice", "VolStatfs", "check_path", "join"]
