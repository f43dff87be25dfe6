"""File calls that never leave a directory: ``openat2(2)`` with ``RESOLVE_BENEATH`` and friends.

Its own module because a shared volume's files (``volume_dir``) and the walks over their trees
(``volume_tree``) both resolve paths a hostile guest names, and several guests race on the same
tree (one may swap a directory for a symlink while another's op walks through it). Every path is
resolved from a descriptor by ``openat2`` with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV``: the kernel refuses a symlink, a ``..`` out or a mount
crossing in any component, atomically with the walk. Python has no ``openat2``; ctypes calls it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os

from forkd.errors import PrerequisiteMissing

SYS_OPENAT2 = 437  # the same number on every architecture (the unified table from 5.1 on)
RESOLVE_NO_XDEV, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 0x01, 0x02, 0x04, 0x08
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV
DIR = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC  # a directory fd that can be read (scandir)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.syscall.restype = ctypes.c_long
_renameat2 = getattr(_libc, "renameat2", None)


class Refused(Exception):
    """An operation refused with ``errno`` before (or instead of) touching the files."""

    def __init__(self, err: int, why: str = "") -> None:
        super().__init__(why or os.strerror(err))
        self.errno = err


def openat2(dirfd: int, path: str, flags: int, mode: int = 0) -> int:
    """``path`` (never '' nor absolute) opened beneath ``dirfd``, no symlink followed anywhere."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, _RESOLVE)
    fd = _libc.syscall(ctypes.c_long(SYS_OPENAT2), ctypes.c_int(dirfd), ctypes.c_char_p(os.fsencode(path)),
                       ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def probe(root_fd: int) -> None:
    """PrerequisiteMissing on a kernel without ``openat2`` (before Linux 5.6)."""
    try:
        os.close(openat2(root_fd, ".", DIR))
    except OSError as exc:
        if exc.errno in (errno.ENOSYS, errno.EPERM):
            raise PrerequisiteMissing("shared volumes need Linux 5.6 or later (openat2 with "
                                      "RESOLVE_BENEATH); this kernel refuses it") from None
        raise


def rename(src_dir: int, src: str, dst_dir: int, dst: str, flags: int) -> None:
    """``renameat2``: names under two directory descriptors; ``flags`` 0 is a plain rename."""
    if flags == 0:
        os.rename(src, dst, src_dir_fd=src_dir, dst_dir_fd=dst_dir)
        return
    if _renameat2 is None:  # glibc < 2.28
        raise OSError(errno.EINVAL, "renameat2 is not available")
    if _renameat2(src_dir, os.fsencode(src), dst_dir, os.fsencode(dst), flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), dst)


def children(dir_fd: int) -> list[str]:
    with os.scandir(dir_fd) as it:
        return [entry.name for entry in it]


def subdir(dir_fd: int, name: str) -> int:
    """A directory below ``dir_fd``, never through a link (a swap meanwhile is ELOOP/ENOTDIR)."""
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


__all__ = ["DIR", "LIST", "NEW_FILE", "SYS_OPENAT2", "Refused", "children", "openat2", "probe", "rename",
           "subdir"]
