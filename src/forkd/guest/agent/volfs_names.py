"""A shared volume's names in the guest: node ids to volume paths, and the FUSE requests on names.

The kernel names files by node ids; the host's files by paths (``VolOp.path``), so that nothing
on the host is per open file and any host can answer any op. Here each id is the path it was
looked up as, kept until the kernel forgets it, and moved with a rename; a removed path's ids keep
no path (ESTALE). The requests that make, find, move and remove names (and read their attributes)
are answered here; the data requests are the file system's (``volfs``).
"""

from __future__ import annotations

import errno
import os
import stat
import struct
import threading
from collections.abc import Callable
from typing import Any

from forkd.guest import volume_messages as vm
from forkd.guest.agent import fuse_wire as fw
from forkd.guest.agent.fuse_wire import FuseError
from forkd.guest.volume_messages import VolReplyNotice

Ask = Callable[..., VolReplyNotice]  # (op name, path, uid, gid, **fields) -> the host's answer


class Names:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._paths: dict[int, str | None] = {fw.ROOT: ""}  # node id -> path (None: removed meanwhile)
        self._ids: dict[str, int] = {"": fw.ROOT}
        self._lookups: dict[int, int] = {}
        self._next = fw.ROOT + 1

    def path(self, node: int) -> str:
        with self._lock:
            path = self._paths.get(node)
            known = node in self._paths
        if path is None:
            raise FuseError(errno.ESTALE if known else errno.ENOENT)
        return path

    def child(self, parent: int, name: str) -> str:
        if name in (".", ".."):
            raise FuseError(errno.EPERM)
        if not name or "/" in name or len(os.fsencode(name)) > vm.MAX_NAME:
            raise FuseError(errno.EINVAL)
        return vm.join(self.path(parent), name)

    def remember(self, path: str) -> int:
        """The node id of ``path`` (new if it has none), counted as one more kernel lookup."""
        with self._lock:
            node = self._ids.get(path)
            if node is None:
                node = self._next
                self._next += 1
                self._ids[path] = node
                self._paths[node] = path
            self._lookups[node] = self._lookups.get(node, 0) + 1
        return node

    def forget(self, node: int, n: int) -> None:
        with self._lock:
            left = self._lookups.get(node, 0) - n
            if left > 0 or node == fw.ROOT:
                self._lookups[node] = max(left, 0)
                return
            self._lookups.pop(node, None)
            path = self._paths.pop(node, None)
            if path is not None and self._ids.get(path) == node:
                del self._ids[path]

    def gone(self, path: str) -> None:
        """``path`` and everything under it no longer exist: the ids still known keep no path."""
        with self._lock:
            for p in [p for p in self._ids if p == path or p.startswith(path + "/")]:
                self._paths[self._ids.pop(p)] = None

    def moved(self, old: str, new: str) -> None:
        self.gone(new)
        with self._lock:
            for p in [p for p in self._ids if p == old or p.startswith(old + "/")]:
                node = self._ids.pop(p)
                self._ids[new + p[len(old):]] = node
                self._paths[node] = new + p[len(old):]

    def entry(self, path: str, got: VolReplyNotice) -> bytes:
        return fw.entry_bytes(self.remember(path), got["attr"])

    # ------------------------------------------------------------------ the requests on names

    def request(self, opcode: int, node: int, uid: int, gid: int, arg: memoryview, ask: Ask) -> bytes | None:
        """The answer to a request on names (None: it has none), or LookupError: not one of them."""
        if opcode == fw.FORGET:
            self.forget(node, struct.unpack_from("<Q", arg)[0])
            return None
        if opcode == fw.BATCH_FORGET:
            count = struct.unpack_from("<I", arg)[0]
            for i in range(min(count, (len(arg) - 8) // 16)):
                self.forget(*struct.unpack_from("<QQ", arg, 8 + 16 * i))
            return None
        if opcode == fw.LOOKUP:
            path = self.child(node, fw.cstr(arg)[0])
            return self.entry(path, ask("getattr", path, uid, gid))
        if opcode == fw.GETATTR:
            return fw.attr_out(node, ask("getattr", self.path(node), uid, gid)["attr"])
        if opcode == fw.SETATTR:
            return fw.attr_out(node, ask("setattr", self.path(node), uid, gid, **setattr_fields(arg))["attr"])
        if opcode == fw.READLINK:
            return os.fsencode(ask("readlink", self.path(node), uid, gid)["target"])
        if opcode == fw.SYMLINK:
            name, at = fw.cstr(arg)
            path = self.child(node, name)
            return self.entry(path, ask("symlink", path, uid, gid, target=fw.cstr(arg, at)[0]))
        if opcode == fw.MKNOD:
            mode, _rdev, umask, _pad = struct.unpack_from("<IIII", arg)
            if not stat.S_ISREG(mode):
                raise FuseError(errno.EPERM)  # a shared volume holds files, directories and links only
            path = self.child(node, fw.cstr(arg, 16)[0])
            made = ask("create", path, uid, gid, mode=mode & ~umask & 0o7777, exclusive=True)
            return self.entry(path, made)
        if opcode == fw.MKDIR:
            mode, umask = struct.unpack_from("<II", arg)
            path = self.child(node, fw.cstr(arg, 8)[0])
            return self.entry(path, ask("mkdir", path, uid, gid, mode=mode & ~umask & 0o7777))
        if opcode in (fw.UNLINK, fw.RMDIR):
            path = self.child(node, fw.cstr(arg)[0])
            ask("unlink" if opcode == fw.UNLINK else "rmdir", path, uid, gid)
            self.gone(path)
            return b""
        if opcode in (fw.RENAME, fw.RENAME2):
            newdir, flags, at = (struct.unpack_from("<Q", arg)[0], 0, 8) if opcode == fw.RENAME \
                else (*struct.unpack_from("<QI", arg), 16)
            if flags & ~fw.RENAME_NOREPLACE:
                raise FuseError(errno.EINVAL)  # RENAME_EXCHANGE, WHITEOUT: not on a shared volume
            old_name, at = fw.cstr(arg, at)
            old, new = self.child(node, old_name), self.child(newdir, fw.cstr(arg, at)[0])
            ask("rename", old, uid, gid, to=new, flags=flags)
            self.moved(old, new)
            return b""
        if opcode == fw.LINK:
            path = self.child(node, fw.cstr(arg, 8)[0])
            old = self.path(struct.unpack_from("<Q", arg)[0])
            return self.entry(path, ask("link", old, uid, gid, to=path))
        raise LookupError(opcode)


def setattr_fields(arg: memoryview) -> dict[str, Any]:
    """A fuse_setattr_in as a setattr op's fields: only what its valid bits name."""
    (valid, _pad, _fh, size, _lock, atime, mtime, _ctime, atimens, mtimens, _ctimens, mode, _u4,
     owner_uid, owner_gid, _u5) = fw.SETATTR_IN.unpack_from(arg)
    out: dict[str, Any] = {}
    if valid & fw.FATTR_MODE:
        out["mode"] = mode & 0o7777
    if valid & fw.FATTR_UID:
        out["owner_uid"] = owner_uid
    if valid & fw.FATTR_GID:
        out["owner_gid"] = owner_gid
    if valid & fw.FATTR_SIZE:
        out["size"] = size
    if valid & fw.FATTR_ATIME:
        out["atime_ns"] = -1 if valid & fw.FATTR_ATIME_NOW else atime * 1_000_000_000 + atimens
    if valid & fw.FATTR_MTIME:
        out["mtime_ns"] = -1 if valid & fw.FATTR_MTIME_NOW else mtime * 1_000_000_000 + mtimens
    return out


__all__ = ["Names", "setattr_fields"]
