"""A ``fork: "shared"`` volume's files: a directory on the host that every sandbox mounting the
volume reads and writes at once, through the ops its guest agent forwards (guest/volume_messages.py).

The guest is hostile and controls every path, and several guests race on the same tree (one may
swap a directory for a symlink while another's op walks through it). So nothing here resolves a
guest's path the ordinary way: every path is resolved from an ``O_PATH`` descriptor of the root by
``openat2(2)`` with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
RESOLVE_NO_XDEV`` (the kernel refuses a symlink, a ``..`` out, a mount crossing, in any component,
atomically with the walk), the *parent* is opened that way and the last component acted on with the
``*at`` calls that never follow a link, and a file is opened with ``O_NOFOLLOW``. A symlink a guest
makes is stored as given and never followed by the host. Only regular files, directories and
symlinks are created; anything else found is refused (``EPERM``).

The quota is the host's: one :class:`HostDir` per volume per daemon counts the blocks (and
entries) of the tree, shared by every sandbox mounting it, and refuses what would pass it with
``ENOSPC``. Writes reserve their bytes before the syscall, so concurrent writers cannot together
pass the quota.

Around it: ``beneath`` (the ``openat2`` calls), ``volume_ops`` (a guest's op read and answered:
``apply`` never raises, a hostile op gets an errno), ``volume_tree`` (walks: make, export, count,
empty) and ``volume_files`` (the daemon's own calls on the files, errors as forkd's).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from forkd.errors import ForkdError, InvalidRequest, NotFound
from forkd.guest.volume_messages import VolAttr, VolDirEntry, VolOp, VolReplyNotice
from forkd.vmm import volume_ops, volume_tree
from forkd.vmm.beneath import DIR, LIST, Refused, openat2, probe
from forkd.vmm.beneath import rename as rename_at
from forkd.vmm.volume_tree import (
    BLOCK,
    MAX_TREE_ENTRIES,
    counted,
    tree_usage,
)

log = logging.getLogger("forkd.volume_dir")


def attr_of(st: os.stat_result) -> VolAttr:
    return VolAttr(mode=st.st_mode, nlink=st.st_nlink, uid=st.st_uid, gid=st.st_gid, size=st.st_size,
                   blocks=st.st_blocks, atime_ns=st.st_atime_ns, mtime_ns=st.st_mtime_ns,
                   ctime_ns=st.st_ctime_ns)


def _split(path: str) -> tuple[str, str]:
    parent, _, name = path.rpartition("/")
    return parent, name


class HostDir:
    """One shared volume's files on the host: ``root`` and its quota. Thread-safe: every sandbox
    mounting the volume calls it, from threads (``asyncio.to_thread``)."""

    def __init__(self, root: Path, quota_bytes: int, max_entries: int | None = None) -> None:
        if quota_bytes <= 0:
            raise InvalidRequest("a volume's quota must be positive")
        self.root = root
        self.quota = quota_bytes
        self.max_entries = quota_bytes // BLOCK if max_entries is None else max_entries
        self._lock = threading.Lock()  # the counters below
        # Writes and truncates of one inode measure its blocks before and after under its stripe,
        # so two sandboxes writing one file do not count each other's blocks.
        self._stripes = [threading.Lock() for _ in range(64)]
        self._used = 0
        self._reserved = 0  # bytes of writes between their check and their accounting
        self._entries = 0
        try:
            self._root_fd = os.open(root, DIR | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise NotFound(f"the volume's directory {root} is missing") from None
        except OSError as exc:
            raise ForkdError(f"the volume's directory {root} cannot be opened: {exc.strerror}") from None
        try:
            probe(self._root_fd)
            self.scan()
        except BaseException:
            os.close(self._root_fd)
            raise

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._root_fd)
        self._root_fd = -1

    # ------------------------------------------------------------------ making and copying

    @staticmethod
    def make(root: Path, source: Path | None, quota_bytes: int, scratch: Path) -> None:
        """A new volume's directory (``volume_tree.make``)."""
        volume_tree.make(root, source, quota_bytes, scratch)

    def export_to(self, target: Path) -> None:
        """The volume's files copied into the new directory ``target`` (``volume_tree.export``)."""
        volume_tree.export(self._root_fd, target, self.max_entries)

    def scan(self) -> None:
        """Count the tree's usage again (once at construction; after anything changed it behind
        our back). A tree past the bound counts as full."""
        bound = max(self.max_entries, MAX_TREE_ENTRIES) + 1
        fd = openat2(self._root_fd, ".", LIST)
        try:
            used, entries = tree_usage(fd, bound)
        finally:
            os.close(fd)
        if entries >= bound:
            log.warning("volume %s has more than %d entries: counted as full", self.root, bound - 1)
        with self._lock:
            self._used, self._entries = used, entries

    def usage(self) -> tuple[int, int]:
        """(bytes, entries) counted against the quota."""
        with self._lock:
            return self._used, self._entries

    # ------------------------------------------------------------------ the counters

    def _reserve(self, nbytes: int, entries: int = 0) -> None:
        with self._lock:
            if nbytes and self._used + self._reserved + nbytes > self.quota:
                raise Refused(errno.ENOSPC, "the volume's quota is reached")
            if entries and self._entries + entries > self.max_entries:
                raise Refused(errno.ENOSPC, "the volume's file count is reached")
            self._reserved += nbytes
            self._entries += entries

    def _reserve_new(self, path: str, nbytes: int = 0) -> None:
        """Room for one new entry at ``path``; an existing name is EEXIST even when the volume is
        full (`mkdir -p` of what is there), as a file system answers."""
        try:
            self._reserve(nbytes, 1)
        except Refused as refused:
            try:
                self._lstat(path)
            except FileNotFoundError:
                raise refused from None
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path) from None

    def _settle(self, reserved: int, used_delta: int, entries_delta: int = 0) -> None:
        with self._lock:
            self._reserved -= reserved
            self._used = max(0, self._used + used_delta)
            self._entries = max(0, self._entries + entries_delta)

    def _stripe(self, st: os.stat_result) -> threading.Lock:
        return self._stripes[hash((st.st_dev, st.st_ino)) % len(self._stripes)]

    # ------------------------------------------------------------------ resolving

    @contextlib.contextmanager
    def _parent(self, path: str) -> Iterator[tuple[int, str]]:
        """(an fd of ``path``'s parent, its last name); '' (the root) has no parent."""
        if path == "":
            raise Refused(errno.EINVAL, "the volume's root cannot be the object of this op")
        parent, name = _split(path)
        if parent == "":
            yield self._root_fd, name
            return
        fd = openat2(self._root_fd, parent, DIR)
        try:
            yield fd, name
        finally:
            os.close(fd)

    def _lstat(self, path: str) -> os.stat_result:
        if path == "":
            return os.fstat(self._root_fd)
        with self._parent(path) as (dfd, name):
            return os.stat(name, dir_fd=dfd, follow_symlinks=False)

    def _open(self, path: str, flags: int, mode: int = 0) -> tuple[int, os.stat_result]:
        """``path`` opened (no link followed; ``O_NONBLOCK`` so a FIFO the host's admin left never
        blocks the open): a regular file, or a directory when the flags allow it; else EPERM."""
        fd = openat2(self._root_fd, path or ".", flags | os.O_NOFOLLOW | os.O_NONBLOCK, mode)
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                if flags & (os.O_WRONLY | os.O_RDWR):
                    raise Refused(errno.EISDIR)
            elif not stat.S_ISREG(st.st_mode):
                raise Refused(errno.EPERM, "not a regular file or a directory")
            return fd, st
        except BaseException:
            os.close(fd)
            raise

    # ------------------------------------------------------------------ what a guest's ops do

    def apply(self, op: VolOp, slot: int, *, read_only: bool) -> VolReplyNotice:
        """Perform one op of a guest's FUSE server (``volume_ops.apply``); never raises."""
        return volume_ops.apply(self, op, slot, read_only=read_only)

    def attr(self, path: str) -> VolAttr:
        return attr_of(self._lstat(path))

    def read_at(self, path: str, offset: int, size: int) -> bytes:
        fd, st = self._open(path, os.O_RDONLY)
        try:
            if not stat.S_ISREG(st.st_mode):
                raise Refused(errno.EISDIR)
            return os.pread(fd, size, offset)
        finally:
            os.close(fd)

    def symlink(self, path: str, target: str, uid: int, gid: int) -> VolAttr:
        with self._parent(path) as (dfd, name):
            self._reserve_new(path)
            try:
                os.symlink(target, name, dir_fd=dfd)  # stored as given, never followed
            except BaseException:
                self._settle(0, 0, -1)
                raise
            os.chown(name, uid, gid, dir_fd=dfd, follow_symlinks=False)
            return attr_of(os.stat(name, dir_fd=dfd, follow_symlinks=False))

    def readlink(self, path: str) -> str:
        with self._parent(path) as (dfd, name):
            return os.readlink(name, dir_fd=dfd)

    def link(self, path: str, to: str) -> VolAttr:
        with self._parent(path) as (sfd, sname), self._parent(to) as (dfd, dname):
            st = os.stat(sname, dir_fd=sfd, follow_symlinks=False)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                raise Refused(errno.EPERM)
            self._reserve_new(to)
            try:
                os.link(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd, follow_symlinks=False)
            except BaseException:
                self._settle(0, 0, -1)
                raise
            return attr_of(os.stat(dname, dir_fd=dfd, follow_symlinks=False))

    def fsync(self, path: str) -> None:
        fd, _st = self._open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def entries(self, path: str) -> list[VolDirEntry]:
        fd = openat2(self._root_fd, path or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            out: list[VolDirEntry] = []
            with os.scandir(fd) as it:
                for entry in it:
                    if len(out) >= MAX_TREE_ENTRIES:
                        raise Refused(errno.E2BIG, f"more than {MAX_TREE_ENTRIES} entries")
                    try:
                        mode = stat.S_IFMT(entry.stat(follow_symlinks=False).st_mode)
                    except FileNotFoundError:
                        continue  # gone while listed
                    out.append(VolDirEntry(name=entry.name, mode=mode))
        finally:
            os.close(fd)
        out.sort(key=lambda e: os.fsencode(e["name"]))
        return out

    def make_dir(self, path: str, mode: int, uid: int, gid: int) -> VolAttr:
        with self._parent(path) as (dfd, name):
            self._reserve_new(path, BLOCK)
            made = False
            try:
                os.mkdir(name, 0o700, dir_fd=dfd)
                made = True
                # chown, then chmod: the mode is exact (not the daemon's umask), never set-id.
                os.chown(name, uid, gid, dir_fd=dfd, follow_symlinks=False)
                fd = openat2(dfd, name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
                try:
                    os.fchmod(fd, mode)
                    st = os.fstat(fd)
                finally:
                    os.close(fd)
            except BaseException:
                self._settle(BLOCK, 0, 0 if made else -1)
                raise
            self._settle(BLOCK, counted(st))
            return attr_of(st)

    def create(self, path: str, mode: int, uid: int, gid: int, exclusive: bool) -> VolAttr:
        if path == "":
            raise Refused(errno.EISDIR)
        for _ in range(8):  # made or deleted by another guest between our two opens: try again
            if not exclusive:  # an existing file is opened, even when the volume is full
                try:
                    fd, st = self._open(path, os.O_RDONLY)
                except FileNotFoundError:
                    pass
                else:
                    os.close(fd)
                    if not stat.S_ISREG(st.st_mode):
                        raise Refused(errno.EISDIR)
                    return attr_of(st)
            self._reserve_new(path)
            try:
                fd, st = self._open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                self._settle(0, 0, -1)
                if exclusive:
                    raise
                continue
            except BaseException:
                self._settle(0, 0, -1)
                raise
            try:
                os.fchown(fd, uid, gid)
                os.fchmod(fd, mode)
                st = os.fstat(fd)
            finally:
                os.close(fd)
            return attr_of(st)
        raise Refused(errno.EAGAIN)

    def remove_entry(self, path: str, *, directory: bool) -> None:
        # The stat is taken before the unlink: a swap between them makes the count drift (a scan
        # puts it right), never the files leave the volume.
        with self._parent(path) as (dfd, name):
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if directory:
                os.rmdir(name, dir_fd=dfd)
            else:
                os.unlink(name, dir_fd=dfd)
            self._settle(0, -counted(st) if st.st_nlink <= 1 or directory else 0, -1)

    def move(self, path: str, to: str, flags: int) -> None:
        if to == "":
            raise Refused(errno.EBUSY)
        with self._parent(path) as (sfd, sname), self._parent(to) as (dfd, dname):
            try:
                old: os.stat_result | None = os.stat(dname, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                old = None
            src = os.stat(sname, dir_fd=sfd, follow_symlinks=False)
            rename_at(sfd, sname, dfd, dname, flags)
            if old is not None and not os.path.samestat(old, src):
                gone = stat.S_ISDIR(old.st_mode) or old.st_nlink <= 1
                self._settle(0, -counted(old) if gone else 0, -1)

    def set_times(self, path: str, atime_ns: int | None, mtime_ns: int | None) -> None:
        """None: kept; -1: now. A symlink's own times (never its target's)."""
        now = time.time_ns()

        def pick(new: int | None, old: int) -> int:
            return old if new is None else now if new == -1 else new

        if path == "":
            fd = openat2(self._root_fd, ".", os.O_RDONLY | os.O_DIRECTORY)
            try:
                st = os.fstat(fd)
                os.utime(fd, ns=(pick(atime_ns, st.st_atime_ns), pick(mtime_ns, st.st_mtime_ns)))
            finally:
                os.close(fd)
            return
        with self._parent(path) as (dfd, name):
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            os.utime(name, ns=(pick(atime_ns, st.st_atime_ns), pick(mtime_ns, st.st_mtime_ns)), dir_fd=dfd,
                     follow_symlinks=False)

    def set_mode_owner(self, path: str, mode: int | None, uid: int | None, gid: int | None) -> None:
        if uid is not None or gid is not None:
            ids = (-1 if uid is None else uid, -1 if gid is None else gid)
            if path == "":
                fd = openat2(self._root_fd, ".", os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fchown(fd, *ids)
                finally:
                    os.close(fd)
            else:
                with self._parent(path) as (dfd, name):
                    os.chown(name, *ids, dir_fd=dfd, follow_symlinks=False)
        if mode is not None:
            try:
                fd, _st = self._open(path, os.O_RDONLY)
            except OSError as exc:
                if exc.errno == errno.ELOOP and stat.S_ISLNK(self._lstat(path).st_mode):
                    return  # a symlink's mode: Linux has none to set
                raise
            try:
                os.fchmod(fd, mode)
            finally:
                os.close(fd)

    def truncate(self, path: str, size: int) -> None:
        if size > self.quota:
            raise Refused(errno.EFBIG, "no file of a volume is larger than its quota")
        fd, st = self._open(path, os.O_WRONLY)
        try:
            with self._stripe(st):
                st = os.fstat(fd)
                grow = max(0, size - st.st_size)
                self._reserve(grow)
                try:
                    os.ftruncate(fd, size)
                    after = os.fstat(fd)
                finally:
                    self._settle(grow, 0)
                self._settle(0, counted(after) - counted(st))
        finally:
            os.close(fd)

    def write_at(self, path: str, data: bytes, offset: int, append: bool) -> int:
        """One ``write(2)`` (``O_APPEND`` for an appender: the kernel orders concurrent appenders
        from every sandbox, whatever offset each guest thought was the end)."""
        fd, st = self._open(path, os.O_WRONLY | (os.O_APPEND if append else 0))
        try:
            with self._stripe(st):
                st = os.fstat(fd)
                end = (st.st_size if append else offset) + len(data)
                if end > self.quota:
                    raise Refused(errno.EFBIG, "no file of a volume is larger than its quota")
                # A write within bytes the file already holds (not sparse) allocates nothing.
                inside = not append and end <= st.st_size and st.st_blocks * 512 >= st.st_size
                need = 0 if inside else len(data)
                self._reserve(need)
                try:
                    written = os.write(fd, data) if append else os.pwrite(fd, data, offset)
                    after = os.fstat(fd)
                finally:
                    self._settle(need, 0)
                self._settle(0, counted(after) - counted(st))
                return written
        finally:
            os.close(fd)


__all__ = ["HostDir", "attr_of"]
