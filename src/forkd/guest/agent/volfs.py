"""Shared volumes in the guest: a FUSE file system whose files live on the host (``vol_mount``).

The wire and why it is built this way: ``forkd.guest.volume_messages``. Here, one ``VolumeFs`` per
mounted slot reads the kernel's requests on ``/dev/fuse`` (``fuse_wire``), keeps the guest's view
of names (``volfs_names``), and hands each request that needs the files to the host as a
``VolOp`` through its ``HostQueue`` (``volfs_queue``); a FUSE thread waits for the op's answer.

Nothing is cached in the guest, so every sandbox sees every other's writes: files are opened
``FOPEN_DIRECT_IO`` (each read and write goes to the host), and names and attributes are kept
``CACHE_SECS`` at most. A guest's ``O_APPEND`` file is appended on the host, whatever offset the
guest's kernel believed.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import logging
import os
import stat
import struct
import threading
import zlib
from dataclasses import dataclass
from typing import Any

from forkd.guest import volume_messages as vm
from forkd.guest.agent import fuse_wire as fw
from forkd.guest.agent.channel import Channel
from forkd.guest.agent.fuse_wire import FuseError
from forkd.guest.agent.volfs_names import Names
from forkd.guest.agent.volfs_queue import HostQueue
from forkd.guest.protocol import CONFLICT, RequestError
from forkd.guest.volume_messages import VolReplyNotice

log = logging.getLogger("forkd.agent.volfs")

THREADS = 4  # FUSE requests served at once per mount (each may wait on the host)
MAX_DIR_ENTRIES = 100_000  # the most entries one open directory lists


@dataclass
class _Handle:
    node: int
    flags: int
    entries: list[tuple[str, int]] | None = None  # an open directory's listing, fetched as read
    more: bool = True


class VolumeFs:
    """One shared volume mounted at ``mount``: the FUSE server, its names and its queue to the host."""

    def __init__(self, slot: int, mount: str, read_only: bool, channel: Channel) -> None:
        self.slot = slot
        self.mount = mount
        self.read_only = read_only
        self.host = HostQueue(channel)
        self._names = Names()
        self._fd = -1
        self._lock = threading.Lock()
        self._handles: dict[int, _Handle] = {}
        self._next_fh = 1

    def start(self) -> None:
        """Mount it (``mount`` made if missing) and start the threads that serve the kernel."""
        os.makedirs(self.mount, exist_ok=True)
        if not os.path.exists("/dev/fuse"):
            with contextlib.suppress(OSError):
                os.mknod("/dev/fuse", stat.S_IFCHR | 0o666, os.makedev(10, 229))
        self._fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        err = fw.mount(self._fd, self.mount, self.read_only)
        if err:
            os.close(self._fd)
            self._fd = -1
            raise RequestError(f"mounting the shared volume at {self.mount}: {os.strerror(err)} (the guest "
                               "kernel needs FUSE: an image built by this forkd loads it)", CONFLICT)
        for i in range(THREADS):
            threading.Thread(target=self._serve, name=f"volfs-{self.slot}-{i}", daemon=True).start()

    # ------------------------------------------------------------------ serving the kernel

    def _serve(self) -> None:
        while True:
            try:
                req = os.read(self._fd, fw.BUFFER)
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):
                    continue
                return  # ENODEV: unmounted
            if not req:
                return
            self._handle(req)

    def _reply(self, unique: int, err: int = 0, body: bytes = b"") -> None:
        with contextlib.suppress(OSError):  # ENOENT: the request was interrupted meanwhile
            os.write(self._fd, fw.OUT_HEADER.pack(fw.OUT_HEADER.size + len(body), -err, unique) + body)

    def _handle(self, req: bytes) -> None:
        _len, opcode, unique, node, uid, gid, _pid, _ = fw.IN_HEADER.unpack_from(req)
        arg = memoryview(req)[fw.IN_HEADER.size:]
        try:
            try:
                body = self._names.request(opcode, node, uid, gid, arg, self._ask)
            except LookupError:
                body = self._data(opcode, node, uid, gid, arg)
        except FuseError as exc:
            if opcode not in fw.NO_REPLY:
                self._reply(unique, exc.err)
            return
        except Exception:  # a bug here must not kill the thread (nor PID 1)
            log.exception("volume %s: FUSE opcode %d", self.slot, opcode)
            if opcode not in fw.NO_REPLY:
                self._reply(unique, errno.EIO)
            return
        if body is not None:
            self._reply(unique, body=body)

    def _ask(self, name: str, path: str, uid: int, gid: int, **extra: Any) -> VolReplyNotice:
        return self.host.ask({"op": name, "path": path, "uid": uid, "gid": gid, **extra})

    def _data(self, opcode: int, node: int, uid: int, gid: int, arg: memoryview) -> bytes | None:
        """The answer to a request that is not on names: the file system's and its files' data."""
        if opcode == fw.INIT:
            return fw.init_reply(arg)
        if opcode == fw.INTERRUPT:
            return None
        if opcode in (fw.DESTROY, fw.FLUSH, fw.FSYNCDIR):
            return b""
        if opcode in (fw.OPEN, fw.OPENDIR):
            self._names.path(node)
            fh = self._new_handle(node, struct.unpack_from("<I", arg)[0])
            return fw.OPEN_OUT.pack(fh, fw.FOPEN_DIRECT_IO if opcode == fw.OPEN else 0, 0)
        if opcode == fw.CREATE:
            flags, mode, umask, _open_flags = struct.unpack_from("<IIII", arg)
            path = self._names.child(node, fw.cstr(arg, 16)[0])
            got = self._ask("create", path, uid, gid, mode=mode & ~umask & 0o7777,
                            exclusive=bool(flags & os.O_EXCL))
            entry = self._names.entry(path, got)
            fh = self._new_handle(fw.ENTRY.unpack_from(entry)[0], flags)
            return entry + fw.OPEN_OUT.pack(fh, fw.FOPEN_DIRECT_IO, 0)
        if opcode == fw.READ:
            fh, offset, size, *_rest = fw.IO_IN.unpack_from(arg)
            got = self._ask("read", self._names.path(self._handle_of(fh).node), uid, gid, offset=offset,
                            size=min(size, vm.MAX_IO))
            return base64.b64decode(got.get("data", ""))[:size]
        if opcode == fw.WRITE:
            fh, offset, size, _wf, _lock, flags, _pad = fw.IO_IN.unpack_from(arg)
            handle = self._handle_of(fh)
            data = bytes(arg[fw.IO_IN.size:fw.IO_IN.size + size])
            got = self._ask("write", self._names.path(handle.node), uid, gid, offset=offset,
                            append=bool((flags | handle.flags) & os.O_APPEND),
                            data=base64.b64encode(data).decode())
            return struct.pack("<II", min(max(got.get("written", 0), 0), size), 0)
        if opcode == fw.STATFS:
            s = self._ask("statfs", "", uid, gid)["statfs"]
            return fw.KSTATFS.pack(s["blocks"], s["bfree"], s["bfree"], s["files"], s["ffree"],
                                   s["bsize"], vm.MAX_NAME, s["bsize"], 0, *([0] * 6))
        if opcode in (fw.RELEASE, fw.RELEASEDIR):
            with self._lock:
                self._handles.pop(struct.unpack_from("<Q", arg)[0], None)
            return b""
        if opcode == fw.FSYNC:
            self._ask("fsync", self._names.path(self._handle_of(struct.unpack_from("<Q", arg)[0]).node),
                      uid, gid)
            return b""
        if opcode == fw.READDIR:
            return self._readdir(uid, gid, arg)
        raise FuseError(errno.ENOSYS)  # xattrs, locks (the guest's kernel keeps them local), fallocate, ...

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
            raise FuseError(errno.EBADF)
        return handle

    def _readdir(self, uid: int, gid: int, arg: memoryview) -> bytes:
        fh, offset, size, *_rest = fw.IO_IN.unpack_from(arg)
        handle = self._handle_of(fh)
        path = self._names.path(handle.node)
        if handle.entries is None:
            handle.entries = []
        entries = handle.entries
        out = bytearray()
        index = offset
        while True:
            if index >= len(entries):
                if not handle.more or len(entries) >= MAX_DIR_ENTRIES:
                    break
                got = self._ask("readdir", path, uid, gid, offset=len(entries))
                entries.extend((e["name"], e["mode"]) for e in got.get("entries", []))
                handle.more = bool(got.get("more")) and bool(got.get("entries"))
                continue
            name, mode = entries[index]
            ino = zlib.crc32(os.fsencode(vm.join(path, name))) | 1 << 32
            record = fw.dirent(ino, index, name, mode)
            if len(out) + len(record) > size:
                break
            out += record
            index += 1
        return bytes(out)


__all__ = ["VolumeFs"]
