"""Shared volumes in the guest: a FUSE file system whose files live on the host (``vol_mount``).

The wire and why it is built this way: ``forkd.guest.volume_messages``. Here, one ``VolumeFs`` per
mounted slot speaks the kernel's FUSE protocol on ``/dev/fuse`` (raw, as ``forkd.host.fusefile``
does on the host: no libfuse in a guest image that may have no Python of its own), keeps the
guest's view of names (node ids to paths), and hands each request that needs the files to the
host as a ``VolOp``, queued until the host's ``vol_poll`` takes it. A FUSE thread waits for the
``vol_reply`` of its op (at most ``OP_TIMEOUT_SECS``; then the caller gets EIO).

Nothing is cached in the guest, so every sandbox sees every other's writes: files are opened
``FOPEN_DIRECT_IO`` (each read and write goes to the host), and names and attributes are kept
``CACHE_SECS`` at most. A guest's ``O_APPEND`` file is appended on the host, whatever offset the
guest's kernel believed.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import stat
import struct
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any

from forkd.guest import volume_messages as vm
from forkd.guest.agent.channel import Channel
from forkd.guest.protocol import CONFLICT, INVALID, NOT_FOUND, RequestError
from forkd.guest.volume_messages import VolOp, VolPollReply, VolReplyNotice

log = logging.getLogger("forkd.agent.volfs")

# fuse_opcode (linux/fuse.h)
LOOKUP, FORGET, GETATTR, SETATTR, READLINK, SYMLINK = 1, 2, 3, 4, 5, 6
MKNOD, MKDIR, UNLINK, RMDIR, RENAME, LINK = 8, 9, 10, 11, 12, 13
OPEN, READ, WRITE, STATFS, RELEASE, FSYNC = 14, 15, 16, 17, 18, 20
FLUSH, INIT, OPENDIR, READDIR, RELEASEDIR, FSYNCDIR = 25, 26, 27, 28, 29, 30
CREATE, INTERRUPT, DESTROY, BATCH_FORGET, RENAME2 = 35, 36, 38, 42, 45
NO_REPLY = frozenset({FORGET, BATCH_FORGET, INTERRUPT})

PROTO_MAJOR, PROTO_MINOR = 7, 31
FUSE_BIG_WRITES = 1 << 5
FUSE_PARALLEL_DIROPS = 1 << 18
FUSE_MAX_PAGES = 1 << 22
FOPEN_DIRECT_IO = 1 << 0
# setattr's valid bits
FATTR_MODE, FATTR_UID, FATTR_GID, FATTR_SIZE = 1, 2, 4, 8
FATTR_ATIME, FATTR_MTIME, FATTR_ATIME_NOW, FATTR_MTIME_NOW = 16, 32, 128, 256
RENAME_NOREPLACE = 1

BUFFER = vm.MAX_IO + 64 * 1024  # one request: its header, arguments and at most max_write bytes
THREADS = 4  # FUSE requests served at once per mount (each may wait on the host)
# How long the guest's kernel keeps a name or an attribute: another sandbox's change shows within it.
CACHE_SECS = 0.5
MAX_DIR_ENTRIES = 100_000  # the most entries one open directory lists
ROOT = 1
MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4

_IN = struct.Struct("<IIQQIIII")  # len, opcode, unique, nodeid, uid, gid, pid, padding
_OUT = struct.Struct("<IiQ")  # len, error (negative errno), unique
_ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr
_ENTRY = struct.Struct("<QQQQII")  # nodeid, generation, entry_valid, attr_valid, their nsecs
_ATTR_OUT = struct.Struct("<QII")  # attr_valid, attr_valid_nsec, dummy
_SETATTR_IN = struct.Struct("<IIQQQQQQIIIIIIII")
_READ_IN = struct.Struct("<QQIIQII")  # fh, offset, size, read/write_flags, lock_owner, flags, padding
_OPEN_OUT = struct.Struct("<QII")  # fh, open_flags, padding
_KSTATFS = struct.Struct("<QQQQQIIII6I")
_DIRENT = struct.Struct("<QQII")  # ino, off, namelen, type

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class _Failed(Exception):
    """An op's errno, as the caller of the file system gets it."""

    def __init__(self, err: int) -> None:
        super().__init__(err)
        self.err = err if 0 < err < 4096 else errno.EIO


@dataclass
class _Pending:
    op: VolOp
    sent: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    reply: VolReplyNotice | None = None


@dataclass
class _Handle:
    node: int
    flags: int
    entries: list[tuple[str, int]] | None = None  # an open directory's listing, fetched as read
    more: bool = True


def _valid(secs: float) -> tuple[int, int]:
    return int(secs), int((secs % 1) * 1e9)


def _attr_bytes(node: int, a: vm.VolAttr) -> bytes:
    def split(ns: int) -> tuple[int, int]:
        ns = max(0, ns)
        return ns // 1_000_000_000, ns % 1_000_000_000
    (at, atn), (mt, mtn), (ct, ctn) = split(a["atime_ns"]), split(a["mtime_ns"]), split(a["ctime_ns"])
    return _ATTR.pack(node, max(0, a["size"]), max(0, a["blocks"]), at, mt, ct, atn, mtn, ctn,
                      a["mode"] & 0xFFFFFFFF, max(1, a["nlink"]) & 0xFFFFFFFF, a["uid"] & 0xFFFFFFFF,
                      a["gid"] & 0xFFFFFFFF, 0, 4096, 0)


def _cstr(data: memoryview, at: int = 0) -> tuple[str, int]:
    """A NUL-terminated name in a request, as the file system encoding decodes it, and what follows."""
    raw = bytes(data[at:])
    end = raw.find(b"\0")
    if end < 0:
        raise _Failed(errno.EINVAL)
    return os.fsdecode(raw[:end]), at + end + 1


class VolumeFs:
    """One shared volume mounted at ``mount``: the FUSE server and the queue of ops for the host."""

    def __init__(self, slot: int, mount: str, read_only: bool, channel: Channel) -> None:
        self.slot = slot
        self.mount = mount
        self.read_only = read_only
        self._channel = channel
        self._fd = -1
        self._lock = threading.Lock()
        self._paths: dict[int, str | None] = {ROOT: ""}  # node id -> path (None: removed meanwhile)
        self._ids: dict[str, int] = {"": ROOT}
        self._lookups: dict[int, int] = {}
        self._next_node = ROOT + 1
        self._handles: dict[int, _Handle] = {}
        self._next_fh = 1
        self._pending: dict[int, _Pending] = {}
        self._next_seq = 1
        self._poll: tuple[Any, threading.Timer] | None = None  # the host's waiting vol_poll

    # ------------------------------------------------------------------ mount

    def start(self) -> None:
        """Mount it (``mount`` made if missing) and start the threads that serve the kernel."""
        os.makedirs(self.mount, exist_ok=True)
        if not os.path.exists("/dev/fuse"):
            with contextlib.suppress(OSError):
                os.mknod("/dev/fuse", stat.S_IFCHR | 0o666, os.makedev(10, 229))
        self._fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        flags = MS_NOSUID | MS_NODEV | (MS_RDONLY if self.read_only else 0)
        data = (f"fd={self._fd},rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions,"
                f"max_read={vm.MAX_IO}")
        if _libc.mount(b"forkd", os.fsencode(self.mount), b"fuse.forkd-volume", flags, data.encode()) != 0:
            err = ctypes.get_errno()
            os.close(self._fd)
            self._fd = -1
            raise RequestError(f"mounting the shared volume at {self.mount}: {os.strerror(err)} (the guest "
                               "kernel needs FUSE: an image built by this forkd loads it)", CONFLICT)
        for i in range(THREADS):
            threading.Thread(target=self._serve, name=f"volfs-{self.slot}-{i}", daemon=True).start()

    # ------------------------------------------------------------------ the host's side

    def poll(self, req_id: Any, resend: bool, wait_secs: float) -> VolPollReply | None:
        """The ops queued for the host, or None: the request is held and answered when one is queued
        or ``wait_secs`` pass. ``resend``: every op not yet answered is queued again."""
        with self._lock:
            if resend:
                for p in self._pending.values():
                    p.sent = False
            old, self._poll = self._poll, None
            ops = self._take()
            if not ops:
                timer = threading.Timer(wait_secs, self._expire, args=(req_id,))
                timer.daemon = True
                self._poll = (req_id, timer)
        if old is not None:  # the host asks again: its earlier request is answered (empty), not lost
            old[1].cancel()
            self._channel.reply(old[0], {"ops": []})
        if ops:
            return {"ops": ops}
        timer.start()
        return None

    def answer(self, notice: VolReplyNotice) -> None:
        with self._lock:
            pending = self._pending.pop(notice["seq"], None)
        if pending is not None:
            pending.reply = notice
            pending.done.set()

    def host_gone(self) -> None:
        """The host that polled went away (or this is a restored copy): its waiting poll is nobody's,
        and the ops it took are handed out again to the next one."""
        with self._lock:
            poll, self._poll = self._poll, None
            for p in self._pending.values():
                p.sent = False
        if poll is not None:
            poll[1].cancel()
            self._channel.forget(poll[0])

    def _expire(self, req_id: Any) -> None:
        with self._lock:
            if self._poll is None or self._poll[0] != req_id:
                return
            self._poll = None
        self._channel.reply(req_id, {"ops": []})

    def _take(self) -> list[VolOp]:
        """Ops not yet handed out, oldest first, within one answer's bounds (lock held)."""
        ops: list[VolOp] = []
        data = 0
        for p in self._pending.values():
            if p.sent:
                continue
            size = len(p.op.get("data", ""))
            if ops and (len(ops) >= vm.MAX_POLL_OPS or data + size > vm.MAX_POLL_DATA * 4 // 3):
                break
            p.sent = True
            ops.append(p.op)
            data += size
        return ops

    def _ask(self, op: dict[str, Any]) -> VolReplyNotice:
        """Queue one op for the host and wait for its answer; its errno raised as ``_Failed``."""
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            op["seq"] = seq
            pending = _Pending(op)  # type: ignore[arg-type]  # the op's fields are set by its caller
            self._pending[seq] = pending
            waiting = self._poll
            ops: list[VolOp] = []
            if waiting is not None:
                self._poll = None
                ops = self._take()
        if waiting is not None:
            waiting[1].cancel()
            self._channel.reply(waiting[0], {"ops": ops})
        if not pending.done.wait(vm.OP_TIMEOUT_SECS):
            with self._lock:
                self._pending.pop(seq, None)
            raise _Failed(errno.EIO)
        reply = pending.reply
        assert reply is not None
        if reply["errno"]:
            raise _Failed(reply["errno"])
        return reply

    # ------------------------------------------------------------------ names

    def _path(self, node: int) -> str:
        with self._lock:
            path = self._paths.get(node)
        if path is None:
            raise _Failed(errno.ESTALE if node in self._paths else errno.ENOENT)
        return path

    def _remember(self, path: str) -> int:
        """The node id of ``path`` (new if it has none), counted as one more kernel lookup."""
        with self._lock:
            node = self._ids.get(path)
            if node is None:
                node = self._next_node
                self._next_node += 1
                self._ids[path] = node
                self._paths[node] = path
            self._lookups[node] = self._lookups.get(node, 0) + 1
        return node

    def _forget(self, node: int, n: int) -> None:
        with self._lock:
            left = self._lookups.get(node, 0) - n
            if left > 0 or node == ROOT:
                self._lookups[node] = max(left, 0)
                return
            self._lookups.pop(node, None)
            path = self._paths.pop(node, None)
            if path is not None and self._ids.get(path) == node:
                del self._ids[path]

    def _gone(self, path: str) -> None:
        """``path`` and everything under it no longer exist: nodes still known keep no path."""
        with self._lock:
            for p in [p for p in self._ids if p == path or p.startswith(path + "/")]:
                self._paths[self._ids.pop(p)] = None

    def _moved(self, old: str, new: str) -> None:
        self._gone(new)
        with self._lock:
            for p in [p for p in self._ids if p == old or p.startswith(old + "/")]:
                node = self._ids.pop(p)
                moved = new + p[len(old):]
                self._ids[moved] = node
                self._paths[node] = moved

    def _child(self, parent: int, name: str) -> str:
        if not name or name in (".", "..") or "/" in name or len(os.fsencode(name)) > vm.MAX_NAME:
            raise _Failed(errno.EINVAL if name not in (".", "..") else errno.EPERM)
        return vm.join(self._path(parent), name)

    # ------------------------------------------------------------------ serving the kernel

    def _serve(self) -> None:
        while True:
            try:
                req = os.read(self._fd, BUFFER)
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):
                    continue
                return  # ENODEV: unmounted
            if not req:
                return
            self._handle(req)

    def _reply(self, unique: int, err: int = 0, body: bytes = b"") -> None:
        with contextlib.suppress(OSError):  # ENOENT: the request was interrupted meanwhile
            os.write(self._fd, _OUT.pack(_OUT.size + len(body), -err, unique) + body)

    def _handle(self, req: bytes) -> None:
        _len, opcode, unique, node, uid, gid, _pid, _ = _IN.unpack_from(req)
        arg = memoryview(req)[_IN.size:]
        try:
            body = self._dispatch(opcode, node, uid, gid, arg)
        except _Failed as exc:
            if opcode not in NO_REPLY:
                self._reply(unique, exc.err)
            return
        except Exception:  # a bug here must not kill the thread (nor PID 1)
            log.exception("volume %s: FUSE opcode %d", self.slot, opcode)
            if opcode not in NO_REPLY:
                self._reply(unique, errno.EIO)
            return
        if body is not None:
            self._reply(unique, body=body)

    def _entry(self, path: str, attr: vm.VolAttr) -> bytes:
        """A fuse_entry_out for ``path``: its node id (one more lookup the kernel forgets), its attributes."""
        node = self._remember(path)
        secs, nsecs = _valid(CACHE_SECS)
        return _ENTRY.pack(node, 0, secs, secs, nsecs, nsecs) + _attr_bytes(node, attr)

    def _attr_out(self, node: int, attr: vm.VolAttr) -> bytes:
        secs, nsecs = _valid(CACHE_SECS)
        return _ATTR_OUT.pack(secs, nsecs, 0) + _attr_bytes(node, attr)

    def _op(self, name: str, path: str, uid: int, gid: int, **extra: Any) -> VolReplyNotice:
        return self._ask({"op": name, "path": path, "uid": uid, "gid": gid, **extra})

    def _dispatch(self, opcode: int, node: int, uid: int, gid: int, arg: memoryview) -> bytes | None:
        if opcode == INIT:
            major, minor, readahead, _flags = struct.unpack_from("<IIII", arg)
            if major != PROTO_MAJOR:
                raise _Failed(errno.EPROTO)
            return struct.pack("<IIIIHHIIHHI7I", PROTO_MAJOR, min(minor, PROTO_MINOR), readahead,
                               FUSE_BIG_WRITES | FUSE_PARALLEL_DIROPS | FUSE_MAX_PAGES, 16, 12, vm.MAX_IO, 1,
                               vm.MAX_IO // 4096, 0, 0, *([0] * 7))
        if opcode == FORGET:
            self._forget(node, struct.unpack_from("<Q", arg)[0])
            return None
        if opcode == BATCH_FORGET:
            count = struct.unpack_from("<I", arg)[0]
            for i in range(min(count, (len(arg) - 8) // 16)):
                one, n = struct.unpack_from("<QQ", arg, 8 + 16 * i)
                self._forget(one, n)
            return None
        if opcode == INTERRUPT:
            return None
        if opcode == DESTROY:
            return b""
        if opcode == LOOKUP:
            path = self._child(node, _cstr(arg)[0])
            return self._entry(path, self._op("getattr", path, uid, gid)["attr"])
        if opcode == GETATTR:
            return self._attr_out(node, self._op("getattr", self._path(node), uid, gid)["attr"])
        if opcode == SETATTR:
            return self._setattr(node, uid, gid, arg)
        if opcode == READLINK:
            return os.fsencode(self._op("readlink", self._path(node), uid, gid)["target"])
        if opcode == SYMLINK:
            name, at = _cstr(arg)
            target, _ = _cstr(arg, at)
            path = self._child(node, name)
            return self._entry(path, self._op("symlink", path, uid, gid, target=target)["attr"])
        if opcode == MKNOD:
            mode, _rdev, umask, _pad = struct.unpack_from("<IIII", arg)
            if not stat.S_ISREG(mode):
                raise _Failed(errno.EPERM)  # a shared volume holds files, directories and links only
            path = self._child(node, _cstr(arg, 16)[0])
            return self._entry(path, self._op("create", path, uid, gid, mode=mode & ~umask & 0o7777,
                                              exclusive=True)["attr"])
        if opcode == MKDIR:
            mode, umask = struct.unpack_from("<II", arg)
            path = self._child(node, _cstr(arg, 8)[0])
            return self._entry(path, self._op("mkdir", path, uid, gid, mode=mode & ~umask & 0o7777)["attr"])
        if opcode in (UNLINK, RMDIR):
            path = self._child(node, _cstr(arg)[0])
            self._op("unlink" if opcode == UNLINK else "rmdir", path, uid, gid)
            self._gone(path)
            return b""
        if opcode in (RENAME, RENAME2):
            newdir, flags, at = (struct.unpack_from("<Q", arg)[0], 0, 8) if opcode == RENAME \
                else (*struct.unpack_from("<QI", arg), 16)
            if flags & ~RENAME_NOREPLACE:
                raise _Failed(errno.EINVAL)  # RENAME_EXCHANGE, WHITEOUT: not on a shared volume
            old_name, at = _cstr(arg, at)
            new_name, _ = _cstr(arg, at)
            old, new = self._child(node, old_name), self._child(newdir, new_name)
            self._op("rename", old, uid, gid, to=new, flags=flags)
            self._moved(old, new)
            return b""
        if opcode == LINK:
            (old_node,) = struct.unpack_from("<Q", arg)
            path = self._child(node, _cstr(arg, 8)[0])
            return self._entry(path, self._op("link", self._path(old_node), uid, gid, to=path)["attr"])
        if opcode in (OPEN, OPENDIR):
            (flags,) = struct.unpack_from("<I", arg)
            self._path(node)
            return _OPEN_OUT.pack(self._new_handle(node, flags), FOPEN_DIRECT_IO if opcode == OPEN else 0, 0)
        if opcode == CREATE:
            flags, mode, umask, _open_flags = struct.unpack_from("<IIII", arg)
            path = self._child(node, _cstr(arg, 16)[0])
            attr = self._op("create", path, uid, gid, mode=mode & ~umask & 0o7777,
                            exclusive=bool(flags & os.O_EXCL))["attr"]
            entry = self._entry(path, attr)
            fh = self._new_handle(_ENTRY.unpack_from(entry)[0], flags)
            return entry + _OPEN_OUT.pack(fh, FOPEN_DIRECT_IO, 0)
        if opcode == READ:
            fh, offset, size, *_rest = _READ_IN.unpack_from(arg)
            handle = self._handle_of(fh)
            got = self._op("read", self._path(handle.node), uid, gid, offset=offset,
                           size=min(size, vm.MAX_IO))
            return base64.b64decode(got.get("data", ""))[:size]
        if opcode == WRITE:
            fh, offset, size, _wf, _lock, flags, _pad = _READ_IN.unpack_from(arg)
            handle = self._handle_of(fh)
            data = bytes(arg[_READ_IN.size:_READ_IN.size + size])
            append = bool((flags | handle.flags) & os.O_APPEND)
            got = self._op("write", self._path(handle.node), uid, gid, offset=offset, append=append,
                           data=base64.b64encode(data).decode())
            return struct.pack("<II", min(max(got.get("written", 0), 0), size), 0)
        if opcode == STATFS:
            s = self._op("statfs", "", uid, gid)["statfs"]
            return _KSTATFS.pack(s["blocks"], s["bfree"], s["bfree"], s["files"], s["ffree"],
                                 s["bsize"], vm.MAX_NAME, s["bsize"], 0, *([0] * 6))
        if opcode in (RELEASE, RELEASEDIR):
            (fh,) = struct.unpack_from("<Q", arg)
            with self._lock:
                self._handles.pop(fh, None)
            return b""
        if opcode in (FLUSH, FSYNCDIR):
            return b""
        if opcode == FSYNC:
            (fh,) = struct.unpack_from("<Q", arg)
            self._op("fsync", self._path(self._handle_of(fh).node), uid, gid)
            return b""
        if opcode == READDIR:
            return self._readdir(uid, gid, arg)
        raise _Failed(errno.ENOSYS)  # xattrs, locks (the guest's kernel keeps them local), fallocate, ...

    def _new_handle(self, node: int, flags: int) -> int:
        with self._lock:
            fh = self._next_fh
            self._next_fh += 1
            self._handles[fh] = _Handle(node, flags)
        return fh

    def _handle_of(self, fh: int) -> _Handle:
        with self._lock:
            handle = self._handles.get(fh)
        if handle is None:
            raise _Failed(errno.EBADF)
        return handle

    def _setattr(self, node: int, uid: int, gid: int, arg: memoryview) -> bytes:
        (valid, _pad, _fh, size, _lock, atime, mtime, _ctime, atimens, mtimens, _ctimens, mode, _u4,
         owner_uid, owner_gid, _u5) = _SETATTR_IN.unpack_from(arg)
        extra: dict[str, Any] = {}
        if valid & FATTR_MODE:
            extra["mode"] = mode & 0o7777
        if valid & FATTR_UID:
            extra["owner_uid"] = owner_uid
        if valid & FATTR_GID:
            extra["owner_gid"] = owner_gid
        if valid & FATTR_SIZE:
            extra["size"] = size
        if valid & FATTR_ATIME:
            extra["atime_ns"] = -1 if valid & FATTR_ATIME_NOW else atime * 1_000_000_000 + atimens
        if valid & FATTR_MTIME:
            extra["mtime_ns"] = -1 if valid & FATTR_MTIME_NOW else mtime * 1_000_000_000 + mtimens
        return self._attr_out(node, self._op("setattr", self._path(node), uid, gid, **extra)["attr"])

    def _readdir(self, uid: int, gid: int, arg: memoryview) -> bytes:
        fh, offset, size, *_rest = _READ_IN.unpack_from(arg)
        handle = self._handle_of(fh)
        path = self._path(handle.node)
        entries = handle.entries if handle.entries is not None else []
        handle.entries = entries
        out = bytearray()
        index = offset
        while True:
            if index >= len(entries):
                if not handle.more or len(entries) >= MAX_DIR_ENTRIES:
                    break
                got = self._op("readdir", path, uid, gid, offset=len(entries))
                entries.extend((e["name"], e["mode"]) for e in got.get("entries", []))
                handle.more = bool(got.get("more")) and bool(got.get("entries"))
                continue
            name, mode = entries[index]
            raw = os.fsencode(name)
            record = _DIRENT.pack(zlib.crc32(os.fsencode(vm.join(path, name))) | 1 << 32, index + 1, len(raw),
                                  stat.S_IFMT(mode) >> 12) + raw
            record += b"\0" * (-len(record) % 8)
            if len(out) + len(record) > size:
                break
            out += record
            index += 1
        return bytes(out)


class VolumeMounts:
    """The agent's shared volumes by slot: ``vol_mount``, ``vol_poll`` and ``vol_reply``."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._slots: dict[int, VolumeFs] = {}
        self._lock = threading.Lock()

    def mount(self, req: dict[str, Any]) -> vm.VolMountReply:
        slot = self._slot(req)
        mount = req["mount"]
        if not isinstance(mount, str) or not mount.startswith("/") or "\0" in mount or len(mount) > 4096 \
                or any(part in (".", "..") for part in mount.split("/")):
            raise RequestError("mount must be an absolute guest path without '.' or '..'", INVALID)
        with self._lock:
            existing = self._slots.get(slot)
            if existing is not None:
                if existing.mount != mount:
                    raise RequestError(f"slot {slot} is mounted at {existing.mount}, not {mount}", CONFLICT)
                return {"mounted": True, "already": True}
            fs = VolumeFs(slot, mount, bool(req["read_only"]), self._channel)
            fs.start()
            self._slots[slot] = fs
        return {"mounted": True, "already": False}

    def poll(self, req: dict[str, Any]) -> VolPollReply | None:
        wait = req.get("wait_secs", vm.MAX_POLL_WAIT_SECS)
        wait = min(max(float(wait), 0.0), vm.MAX_POLL_WAIT_SECS)
        return self._mounted(self._slot(req)).poll(req.get("id"), bool(req.get("resend")), wait)

    def reply(self, req: dict[str, Any]) -> None:
        with contextlib.suppress(RequestError):  # a notification: nobody to tell
            self._mounted(self._slot(req)).answer(req)  # type: ignore[arg-type]  # checked as VolReplyNotice

    def host_gone(self) -> None:
        with self._lock:
            mounted = list(self._slots.values())
        for fs in mounted:
            fs.host_gone()

    def _slot(self, req: dict[str, Any]) -> int:
        slot = req.get("slot")
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < vm.MAX_SLOTS:
            raise RequestError(f"slot must be an integer in [0, {vm.MAX_SLOTS})", INVALID)
        return slot

    def _mounted(self, slot: int) -> VolumeFs:
        with self._lock:
            fs = self._slots.get(slot)
        if fs is None:
            raise RequestError(f"no shared volume is mounted in slot {slot}", NOT_FOUND)
        return fs


__all__ = ["VolumeFs", "VolumeMounts"]
