"""Guest users: a request's ``user`` looked up in the guest's /etc/passwd, and acting as it.

Its own module because two very different things act as a user and must agree
on who that is: a process (``spawn``: the child takes the user's groups, gid and
uid before exec, through ``subprocess.Popen``'s ``extra_groups``/``group``/``user``)
and the file actions, which run on the agent's own worker threads (``as_user``).

The agent is PID 1 and multi-threaded, so a file action cannot ``setuid``: glibc
applies that to every thread of the process, and the agent must stay root.
Linux keeps the filesystem ids (``setfsuid``/``setfsgid``) and the supplementary
groups per thread; the raw system calls (not glibc's wrappers, which broadcast
``setgroups`` to all threads) change them for the calling thread alone. With
them, the kernel checks permissions as the user and new files are the user's,
and switching the fsuid away from 0 drops the thread's file capabilities
(``CAP_DAC_OVERRIDE`` and friends) until it switches back.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import grp
import os
import platform
import pwd
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from forkd.guest.protocol import INVALID, RequestError

# <asm/unistd_64.h> numbers of the per-thread calls (the guest is x86_64; arm64 for completeness).
_SYSCALLS = {
    "x86_64": {"setgroups": 116, "setfsuid": 122, "setfsgid": 123},
    "aarch64": {"setgroups": 159, "setfsuid": 151, "setfsgid": 152},
}
USER_NAME_MAX = 256


@dataclass(frozen=True)
class GuestUser:
    name: str
    uid: int
    gid: int
    home: str
    groups: tuple[int, ...]

    def env(self) -> dict[str, str]:
        """What a login sets for the user (a request's own ``env`` goes over it)."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}

    def workdir(self) -> str:
        """Where its processes start unless asked otherwise: its home, when that exists."""
        return self.home if os.path.isdir(self.home) else "/"


def lookup(name: str) -> GuestUser:
    """The user ``name`` of the guest's passwd database; an unknown one is refused (``invalid``)."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise RequestError(f"unknown user {name!r} in the sandbox", INVALID) from None
    try:
        groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
    except OSError:
        groups = (entry.pw_gid,)
    return GuestUser(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir or "/", groups)


@functools.lru_cache(maxsize=256)
def user_name(uid: int) -> str:
    """A file owner's name, as the listing shows it (its number when the guest has no name)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@functools.lru_cache(maxsize=256)
def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def user_field(req: dict[str, Any]) -> GuestUser | None:
    """A request's ``user``: None when it names none (then the agent acts as itself, root)."""
    name = req.get("user")
    if name is None:
        return None
    if not isinstance(name, str) or not name or len(name) > USER_NAME_MAX or "\0" in name:
        raise RequestError("'user' must be a user name", INVALID)
    return lookup(name)


class _ThreadCreds:
    """The raw per-thread system calls, through libc's ``syscall``."""

    def __init__(self) -> None:
        numbers = _SYSCALLS.get(platform.machine())
        if numbers is None:
            raise RequestError(f"acting as a user is not supported on {platform.machine()}")
        self.numbers = numbers
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.syscall.restype = ctypes.c_long

    def setgroups(self, groups: tuple[int, ...]) -> None:
        array = (ctypes.c_uint * max(len(groups), 1))(*groups)
        if self.libc.syscall(self.numbers["setgroups"], ctypes.c_size_t(len(groups)), array) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setgroups: {os.strerror(err)}")

    def set_fs_ids(self, uid: int, gid: int) -> None:
        self.libc.syscall(self.numbers["setfsgid"], ctypes.c_uint(gid))
        self.libc.syscall(self.numbers["setfsuid"], ctypes.c_uint(uid))
        # Both calls answer the previous id and report no error: read back what took effect.
        got_gid = self.libc.syscall(self.numbers["setfsgid"], ctypes.c_uint(0xFFFFFFFF))
        got_uid = self.libc.syscall(self.numbers["setfsuid"], ctypes.c_uint(0xFFFFFFFF))
        if (got_uid, got_gid) != (uid, gid):
            raise OSError(f"could not switch the filesystem ids to {uid}:{gid}")


_creds: _ThreadCreds | None = None


@contextlib.contextmanager
def as_user(user: GuestUser | None) -> Iterator[None]:
    """Run the block's file system calls as ``user`` (None or root: as the agent itself).

    The thread's ids and groups are restored on the way out, whatever happened:
    the worker thread serves other requests next.
    """
    global _creds
    if user is None or user.uid == 0:
        yield
        return
    if _creds is None:
        _creds = _ThreadCreds()
    creds = _creds
    own_groups = tuple(os.getgroups())  # the calling thread's (getgroups is per thread too)
    try:
        creds.setgroups(user.groups)
        creds.set_fs_ids(user.uid, user.gid)
        yield
    finally:
        creds.set_fs_ids(0, 0)
        creds.setgroups(own_groups)


FileAction = Callable[[dict[str, Any]], dict[str, Any]]


def as_requester(action: FileAction) -> FileAction:
    """A file action run as the request's ``user`` (permissions checked as theirs, new files
    theirs); without one, as the agent (root)."""

    @functools.wraps(action)
    def acting(req: dict[str, Any]) -> dict[str, Any]:
        with as_user(user_field(req)):
            return action(req)

    return acting
