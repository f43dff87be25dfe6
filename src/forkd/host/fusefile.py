"""One read-only file served by this process through the kernel's FUSE protocol.

A lazily arriving snapshot's ``mem`` is such a file: QEMU maps it ``MAP_PRIVATE``
(``share=off``), so a page the guest touches is a page fault, the page cache
asks us with a READ, and we answer from whatever ``read(offset, length)``
gives (store/lazyblob.py: fetch the covering chunk, verify it, then answer).

Why the raw protocol (``/dev/fuse`` and ``mount(2)``) rather than libfuse: the
daemon serves these files from threads of its own process, and libfuse's
``fuse_main`` installs SIGINT/SIGTERM/SIGHUP handlers that would take the
daemon's shutdown away from asyncio; a single read-only file needs only a
dozen opcodes. No package beyond the kernel is needed (``/dev/fuse``; we run as
root, so no ``fusermount3``).

The file system's root *is* the file (``rootmode=100000``): it is mounted onto
an empty regular file, so there is no directory, no LOOKUP and no READDIR.
Files are opened without ``FOPEN_DIRECT_IO`` and with ``FOPEN_KEEP_CACHE``:
reads go through the page cache, which is what makes ``mmap`` work, and 20
QEMUs mapping it share one copy of each page (one READ per page range).

Lifetime: ``detach()`` is ``umount2(MNT_DETACH)``: the path no longer leads to
the file, but QEMUs that map it keep their mappings, and the kernel keeps the
connection (and sends us READs for their pages) until the last of them is
gone; then reads of ``/dev/fuse`` fail with ENODEV and the threads end.
``abort()`` also ends it at once (the fusectl ``abort`` file when it is
mounted), for a daemon that stops after its children are killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import stat
import struct
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("forkd.fuse")

# fuse_opcode (linux/fuse.h)
LOOKUP, FORGET, GETATTR, SETATTR = 1, 2, 3, 4
OPEN, READ, WRITE, STATFS, RELEASE = 14, 15, 16, 17, 18
FLUSH, INIT, INTERRUPT, DESTROY, BATCH_FORGET = 25, 26, 36, 38, 42
FOPEN_KEEP_CACHE = 1 << 1
FUSE_ASYNC_READ = 1 << 0
FUSE_MAX_PAGES = 1 << 22
PROTO_MAJOR, PROTO_MINOR = 7, 31
MAX_READ = 1 << 20  # the largest READ we accept (max_pages below makes the kernel ask up to it)
BUFFER = MAX_READ + 64 * 1024  # a request: header and arguments, at most one max_write of data
_IN_HEADER = struct.Struct("<IIQQIIII")  # len, opcode, unique, nodeid, uid, gid, pid, padding
_OUT_HEADER = struct.Struct("<IiQ")  # len, error (negative errno), unique
_READ_IN = struct.Struct("<QQIIQII")  # fh, offset, size, read_flags, lock_owner, flags, padding
_ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr: 88 bytes
MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2
ROOT = 1
ATTR_VALID_S = 3600  # the file never changes while it is mounted

ReadFn = Callable[[int, int], bytes]
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class FuseUnavailable(OSError):
    """This host cannot serve a file through FUSE (no /dev/fuse, or mount(2) refused)."""


def available() -> bool:
    return os.path.exists("/dev/fuse") and os.access("/dev/fuse", os.R_OK | os.W_OK)


def _mount(source: str, target: Path, fstype: str, flags: int, data: str) -> None:
    if _libc.mount(source.encode(), str(target).encode(), fstype.encode(), flags, data.encode()) != 0:
        err = ctypes.get_errno()
        raise FuseUnavailable(err, f"mount {fstype} on {target}: {os.strerror(err)}")


def umount(target: Path, *, detach: bool = True) -> bool:
    """Unmount ``target`` (lazily by default); False if nothing was mounted there."""
    if _libc.umount2(str(target).encode(), MNT_DETACH if detach else 0) != 0:
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOENT):
            return False
        raise OSError(err, f"umount {target}: {os.strerror(err)}")
    return True


def mounts_under(root: Path) -> list[Path]:
    """FUSE file systems of ours mounted at or below ``root`` (from /proc/self/mountinfo), deepest first."""
    out: list[Path] = []
    prefix = str(root).rstrip("/") + "/"
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split(" ")
            point = fields[4].encode().decode("unicode_escape") if len(fields) > 4 else ""
            if point.startswith(prefix) and " - fuse.forkd-lazy " in line:
                out.append(Path(point))
    return sorted(out, key=lambda p: -len(str(p)))


class FuseFile:
    """Serve ``size`` bytes read through ``read`` as the (read-only) file at ``path``."""

    def __init__(self, path: Path, size: int, read: ReadFn, *, threads: int = 8,
                 on_error: Callable[[BaseException], None] | None = None,
                 on_end: Callable[[], None] | None = None) -> None:
        self.path = path
        self.size = size
        self._read = read
        self._threads_n = threads
        self._on_error = on_error
        self._on_end = on_end  # the connection is gone: nothing will read through us again
        self._fd = -1
        self._threads: list[threading.Thread] = []
        self._mounted = False
        self._ended = threading.Event()
        self._lock = threading.Lock()
        self._running = 0
        self.reads = 0  # READ requests answered (tests, logs)
        self._dev: int | None = None

    # ------------------------------------------------------------ lifetime

    def start(self) -> None:
        """Mount it (``path`` must be an existing regular file) and start serving."""
        if not available():
            raise FuseUnavailable(errno.ENODEV, "/dev/fuse is missing or not accessible")
        self._fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        try:
            _mount("forkd-lazy", self.path, "fuse.forkd-lazy", MS_NOSUID | MS_NODEV,
                   f"fd={self._fd},rootmode=100000,user_id=0,group_id=0,allow_other,max_read={MAX_READ}")
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            raise
        self._mounted = True
        self._running = self._threads_n
        for i in range(self._threads_n):
            t = threading.Thread(target=self._serve, name=f"fuse-{self.path.name}-{i}", daemon=True)
            self._threads.append(t)
            t.start()
        with contextlib.suppress(OSError):  # after the threads: a stat waits for our INIT reply
            self._dev = os.stat(self.path).st_dev

    def detach(self) -> None:
        """Unmount lazily: existing mappings keep being served until the last one goes."""
        if self._mounted:
            self._mounted = False
            with contextlib.suppress(OSError):
                umount(self.path)

    def abort(self) -> None:
        """End the connection now (after ``detach``): readers of unserved pages get errors."""
        self.detach()
        if self._dev is not None:
            with contextlib.suppress(OSError):
                Path(f"/sys/fs/fuse/connections/{os.minor(self._dev)}/abort").write_text("1")

    def wait_ended(self, timeout: float | None = None) -> bool:
        """Whether the kernel dropped the connection (every thread has stopped) within ``timeout``."""
        return self._ended.wait(timeout)

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    # ------------------------------------------------------------ serving

    def _serve(self) -> None:
        try:
            while True:
                try:
                    req = os.read(self._fd, BUFFER)
                except OSError as exc:
                    if exc.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):
                        continue  # ENOENT: the request was interrupted before we read it
                    break  # ENODEV: unmounted and no user left (or aborted)
                if not req:
                    break
                self._handle(req)
        finally:
            with self._lock:
                self._running -= 1
                last = self._running == 0
            if last:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                if self._on_end is not None:
                    self._on_end()
                self._ended.set()

    def _reply(self, unique: int, error: int = 0, body: bytes = b"") -> None:
        with contextlib.suppress(OSError):  # ENOENT: the request was interrupted meanwhile
            os.write(self._fd, _OUT_HEADER.pack(_OUT_HEADER.size + len(body), -error, unique) + body)

    def _attr(self) -> bytes:
        mode = stat.S_IFREG | 0o600
        return _ATTR.pack(ROOT, self.size, (self.size + 511) // 512, 0, 0, 0, 0, 0, 0,
                          mode, 1, 0, 0, 0, 4096, 0)

    def _handle(self, req: bytes) -> None:
        _len, opcode, unique, _node, _uid, _gid, _pid, _ = _IN_HEADER.unpack_from(req)
        arg = memoryview(req)[_IN_HEADER.size:]
        if opcode == READ:
            _fh, offset, size, *_rest = _READ_IN.unpack_from(arg)
            size = max(0, min(size, self.size - offset))
            try:
                data = self._read(offset, size) if size else b""
            except BaseException as exc:  # any failure is EIO to the reader, never wrong bytes
                if self._on_error is not None:
                    self._on_error(exc)
                self._reply(unique, errno.EIO)
                return
            self.reads += 1
            self._reply(unique, body=data)
        elif opcode == GETATTR:
            self._reply(unique, body=struct.pack("<QII", ATTR_VALID_S, 0, 0) + self._attr())
        elif opcode == OPEN:
            self._reply(unique, body=struct.pack("<QII", 0, FOPEN_KEEP_CACHE, 0))
        elif opcode in (RELEASE, FLUSH):
            self._reply(unique)
        elif opcode == INIT:
            major, minor, readahead, _flags = struct.unpack_from("<IIII", arg)
            if major != PROTO_MAJOR:
                self._reply(unique, errno.EPROTO)
                return
            # fuse_init_out: major, minor, max_readahead, flags, max_background, congestion_threshold,
            # max_write, time_gran, max_pages, map_alignment, flags2, unused[7]
            body = struct.pack("<IIIIHHIIHHI7I", PROTO_MAJOR, min(minor, PROTO_MINOR), readahead,
                               FUSE_ASYNC_READ | FUSE_MAX_PAGES, 16, 12, 4096, 1, MAX_READ // 4096, 0, 0,
                               *([0] * 7))
            self._reply(unique, body=body)
        elif opcode == STATFS:
            self._reply(unique, body=bytes(80))
        elif opcode in (FORGET, BATCH_FORGET, INTERRUPT):
            return  # no reply expected
        elif opcode == DESTROY:
            self._reply(unique)
        elif opcode in (SETATTR, WRITE):
            self._reply(unique, errno.EROFS)
        else:
            self._reply(unique, errno.ENOSYS)


__all__ = ["FuseFile", "FuseUnavailable", "available", "mounts_under", "umount"]
