"""The kernel's FUSE protocol as a shared volume's server speaks it: opcodes, structs, mount(2).

Its own module because the FUSE server (``volfs``) and its name operations (``volfs_names``) both
encode the kernel's structures, and these are written once, from ``linux/fuse.h`` (protocol 7.31).
Raw, as ``forkd.host.fusefile`` does on the host: the guest may have no libfuse, and no Python of
its own (the agent may run on forkd's runtime).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import stat
import struct

from forkd.guest import volume_messages as vm

# fuse_opcode
LOOKUP, FORGET, GETATTR, SETATTR, READLINK, SYMLINK = 1, 2, 3, 4, 5, 6
MKNOD, MKDIR, UNLINK, RMDIR, RENAME, LINK = 8, 9, 10, 11, 12, 13
OPEN, READ, WRITE, STATFS, RELEASE, FSYNC = 14, 15, 16, 17, 18, 20
FLUSH, INIT, OPENDIR, READDIR, RELEASEDIR, FSYNCDIR = 25, 26, 27, 28, 29, 30
CREATE, INTERRUPT, DESTROY, BATCH_FORGET, RENAME2 = 35, 36, 38, 42, 45
NO_REPLY = frozenset({FORGET, BATCH_FORGET, INTERRUPT})  # the kernel expects no answer to these

PROTO_MAJOR, PROTO_MINOR = 7, 31
FUSE_BIG_WRITES = 1 << 5
FUSE_PARALLEL_DIROPS = 1 << 18
FUSE_MAX_PAGES = 1 << 22
FOPEN_DIRECT_IO = 1 << 0
# setattr's valid bits
FATTR_MODE, FATTR_UID, FATTR_GID, FATTR_SIZE = 1, 2, 4, 8
FATTR_ATIME, FATTR_MTIME, FATTR_ATIME_NOW, FATTR_MTIME_NOW = 16, 32, 128, 256
RENAME_NOREPLACE = 1
MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
ROOT = 1  # the root's node id

BUFFER = vm.MAX_IO + 64 * 1024  # one request: its header, arguments and at most max_write bytes
# How long the guest's kernel keeps a name or an attribute: another sandbox's change shows within it.
CACHE_SECS = 0.5

IN_HEADER = struct.Struct("<IIQQIIII")  # len, opcode, unique, nodeid, uid, gid, pid, padding
OUT_HEADER = struct.Struct("<IiQ")  # len, error (negative errno), unique
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr
ENTRY = struct.Struct("<QQQQII")  # nodeid, generation, entry_valid, attr_valid, their nsecs
ATTR_OUT = struct.Struct("<QII")  # attr_valid, attr_valid_nsec, dummy
SETATTR_IN = struct.Struct("<IIQQQQQQIIIIIIII")
IO_IN = struct.Struct("<QQIIQII")  # read and write: fh, offset, size, flags, lock_owner, open flags, padding
OPEN_OUT = struct.Struct("<QII")  # fh, open_flags, padding
KSTATFS = struct.Struct("<QQQQQIIII6I")
DIRENT = struct.Struct("<QQII")  # ino, off, namelen, type

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class FuseError(Exception):
    """An operation's errno, as the file system's caller gets it."""

    def __init__(self, err: int) -> None:
        super().__init__(err)
        self.err = err if 0 < err < 4096 else errno.EIO


def init_reply(arg: memoryview) -> bytes:
    """fuse_init_out: big writes of MAX_IO, parallel lookups; a kernel of another major is refused."""
    major, minor, readahead, _flags = struct.unpack_from("<IIII", arg)
    if major != PROTO_MAJOR:
        raise FuseError(errno.EPROTO)
    return struct.pack("<IIIIHHIIHHI7I", PROTO_MAJOR, min(minor, PROTO_MINOR), readahead,
                       FUSE_BIG_WRITES | FUSE_PARALLEL_DIROPS | FUSE_MAX_PAGES, 16, 12, vm.MAX_IO, 1,
                       vm.MAX_IO // 4096, 0, 0, *([0] * 7))


def valid() -> tuple[int, int]:
    """CACHE_SECS as the kernel's seconds and nanoseconds."""
    return int(CACHE_SECS), int((CACHE_SECS % 1) * 1e9)


def attr_bytes(node: int, a: vm.VolAttr) -> bytes:
    """A fuse_attr of the host's attributes, under the guest's node id."""
    def split(ns: int) -> tuple[int, int]:
        ns = max(0, ns)
        return ns // 1_000_000_000, ns % 1_000_000_000
    (at, atn), (mt, mtn), (ct, ctn) = split(a["atime_ns"]), split(a["mtime_ns"]), split(a["ctime_ns"])
    return ATTR.pack(node, max(0, a["size"]), max(0, a["blocks"]), at, mt, ct, atn, mtn, ctn,
                     a["mode"] & 0xFFFFFFFF, max(1, a["nlink"]) & 0xFFFFFFFF, a["uid"] & 0xFFFFFFFF,
                     a["gid"] & 0xFFFFFFFF, 0, 4096, 0)


def entry_bytes(node: int, a: vm.VolAttr) -> bytes:
    secs, nsecs = valid()
    return ENTRY.pack(node, 0, secs, secs, nsecs, nsecs) + attr_bytes(node, a)


def attr_out(node: int, a: vm.VolAttr) -> bytes:
    secs, nsecs = valid()
    return ATTR_OUT.pack(secs, nsecs, 0) + attr_bytes(node, a)


def dirent(ino: int, index: int, name: str, mode: int) -> bytes:
    """One fuse_dirent, padded to 8 bytes; its ``off`` is the index of the entry after it."""
    raw = os.fsencode(name)
    record = DIRENT.pack(ino, index + 1, len(raw), stat.S_IFMT(mode) >> 12) + raw
    return record + b"\0" * (-len(record) % 8)


def cstr(data: memoryview, at: int = 0) -> tuple[str, int]:
    """A NUL-terminated name in a request, as the file system encoding decodes it, and what follows."""
    raw = bytes(data[at:])
    end = raw.find(b"\0")
    if end < 0:
        raise FuseError(errno.EINVAL)
    return os.fsdecode(raw[:end]), at + end + 1


def mount(fd: int, target: str, read_only: bool) -> int:
    """mount(2) a FUSE file system served on ``fd`` at ``target``: 0, or the errno."""
    flags = MS_NOSUID | MS_NODEV | (MS_RDONLY if read_only else 0)
    data = (f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions,"
            f"max_read={vm.MAX_IO}")
    if _libc.mount(b"forkd", os.fsencode(target), b"fuse.forkd-volume", flags, data.encode()) != 0:
        return ctypes.get_errno() or errno.EIO
    return 0


__all__ = ["FuseError", "attr_bytes", "attr_out", "cstr", "dirent", "entry_bytes", "init_reply", "mount"]
