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
pass the quota. ``apply`` never raises: a hostile op gets an errno, never an exception.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import secrets
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import NoReturn

from forkd.errors import (
    Conflict,
    ForkdError,
    InsufficientStorage,
    InvalidRequest,
    NotFound,
    PrerequisiteMissing,
)
from forkd.guest.volume_messages import (
    MAX_IO,
    MUTATING,
    OPS,
    READDIR_PAGE,
    VolAttr,
    VolDirEntry,
    VolOp,
    VolReplyNotice,
    VolStatfs,
    check_path,
)
from forkd.vmm import volume_image

log = logging.getLogger("forkd.volume_dir")

GUEST_UID = GUEST_GID = 1000  # the guest's `user`: a new volume is theirs
MAX_TREE_ENTRIES = 100_000  # a source tree, a listing, a scan: bounded, not walked whole
BLOCK = 4096
MAX_ID = (1 << 32) - 2  # a uid/gid; (1 << 32) - 1 is chown's "no change"
MAX_TIME_NS = 1 << 62
MAX_OFFSET = 1 << 62  # an offset or a size a guest names (a file is no larger than the quota anyway)
MAX_DEPTH = 256  # directories nested below the root that a walk (scan, copy, remove) descends
RENAME_NOREPLACE = 1
MODE_MASK = 0o1777  # never set-uid or set-gid on the host
# A write's base64, bounded before it is decoded.
_MAX_B64 = 4 * ((MAX_IO + 2) // 3)

_SYS_OPENAT2 = 437  # the same number on every architecture (the unified table from 5.1 on)
RESOLVE_NO_XDEV, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 0x01, 0x02, 0x04, 0x08
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV
_DIR = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC  # a directory fd that can be read (scandir)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.syscall.restype = ctypes.c_long
_renameat2 = getattr(_libc, "renameat2", None)


def _openat2(dirfd: int, path: str, flags: int, mode: int = 0) -> int:
    """``path`` (never '' nor absolute) opened beneath ``dirfd``, no symlink followed anywhere."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, _RESOLVE)
    fd = _libc.syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dirfd), ctypes.c_char_p(os.fsencode(path)),
                       ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def _rename(src_dir: int, src: str, dst_dir: int, dst: str, flags: int) -> None:
    if flags == 0:
        os.rename(src, dst, src_dir_fd=src_dir, dst_dir_fd=dst_dir)
        return
    if _renameat2 is None:  # glibc < 2.28
        raise OSError(errno.EINVAL, "renameat2 is not available")
    if _renameat2(src_dir, os.fsencode(src), dst_dir, os.fsencode(dst), flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), dst)


class _Refused(Exception):
    """An op refused with ``errno`` before (or instead of) touching the files."""

    def __init__(self, err: int, why: str = "") -> None:
        super().__init__(why or os.strerror(err))
        self.errno = err


def _attr(st: os.stat_result) -> VolAttr:
    return VolAttr(mode=st.st_mode, nlink=st.st_nlink, uid=st.st_uid, gid=st.st_gid, size=st.st_size,
                   blocks=st.st_blocks, atime_ns=st.st_atime_ns, mtime_ns=st.st_mtime_ns,
                   ctime_ns=st.st_ctime_ns)


def _counted(st: os.stat_result) -> int:
    """The bytes an entry counts against the quota: regular files' and directories' blocks."""
    return st.st_blocks * 512 if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) else 0


def _int(op: VolOp, key: str, lo: int, hi: int, default: int | None = None) -> int:
    value = op.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise _Refused(errno.EINVAL, f"{key} must be an integer in [{lo}, {hi}]")
    return value


def _path(value: object, what: str) -> str:
    try:
        return check_path(value, what)
    except ValueError as exc:
        raise _Refused(errno.EINVAL, str(exc)) from None


def _split(path: str) -> tuple[str, str]:
    parent, _, name = path.rpartition("/")
    return parent, name


def _api_path(path: str) -> str:
    """A path from the daemon's API ('/a/b', 'a/b/', '/' for the root) as a volume path."""
    try:
        return check_path(path.strip("/"))
    except ValueError as exc:
        raise InvalidRequest(f"bad path {path[:200]!r}: {exc}") from None


def _raise(path: str, exc: OSError | _Refused) -> NoReturn:
    """An errno as the daemon's errors, for the Python-level API."""
    err = exc.errno or errno.EIO
    what = f"{path or '/'}: {exc.strerror if isinstance(exc, OSError) else exc}"
    if err == errno.ENOENT:
        raise NotFound(f"no such file or directory in the volume: {path or '/'}") from None
    if err in (errno.EEXIST, errno.ENOTEMPTY, errno.EBUSY):
        raise Conflict(what) from None
    if err in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        raise InsufficientStorage(f"the volume is full: {what}") from None
    if err in (errno.EINVAL, errno.E2BIG, errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.EPERM, errno.EXDEV,
               errno.ENAMETOOLONG, errno.EACCES):
        raise InvalidRequest(what) from None
    raise ForkdError(what) from None


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
            self._root_fd = os.open(root, _DIR | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise NotFound(f"the volume's directory {root} is missing") from None
        except OSError as exc:
            raise ForkdError(f"the volume's directory {root} cannot be opened: {exc.strerror}") from None
        try:
            _openat2_probe(self._root_fd)
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
        """A new volume's directory at ``root`` (which must not exist), owned by the guest's user,
        with ``source``'s files (a directory's tree, links never followed, or a tarball checked as a
        hostile archive) if given, all owned by the guest's user. Bounded by the quota and
        ``MAX_TREE_ENTRIES``; nothing is left on failure."""
        if root.exists() or root.is_symlink():
            raise Conflict(f"{root} already exists")
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}.new-"))
        try:
            limit = min(MAX_TREE_ENTRIES, max(1, quota_bytes // BLOCK))
            if source is None:
                pass
            elif source.is_dir():
                _copy_dir(source, tmp, quota_bytes, limit, str(source))
            elif source.is_file():
                scratch.mkdir(parents=True, exist_ok=True)
                with tempfile.TemporaryDirectory(dir=scratch, prefix="volume-dir-") as unpacked:
                    # Unpacked as a hostile archive (volume_image's checks), then copied in with the
                    # same bounds and owner as a directory.
                    volume_image.unpack(source, Path(unpacked), quota_bytes)
                    _copy_dir(Path(unpacked), tmp, quota_bytes, limit, str(source))
            else:
                raise InvalidRequest(f"{source} is neither a directory nor a tarball")
            os.chown(tmp, GUEST_UID, GUEST_GID)
            os.chmod(tmp, 0o755)
            os.rename(tmp, root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def export_to(self, target: Path) -> None:
        """The volume's files copied into the new directory ``target`` (owners and modes kept,
        symlinks as links). Nothing is left at ``target`` on failure."""
        target.mkdir()
        try:
            dst_fd = os.open(target, _LIST | os.O_NOFOLLOW)
            src_fd = _openat2(self._root_fd, ".", _LIST)
            try:
                _copy_tree(src_fd, dst_fd, None, max(self.max_entries, MAX_TREE_ENTRIES), None,
                           "the volume")
            finally:
                os.close(src_fd)
                os.close(dst_fd)
            st = os.fstat(self._root_fd)
            os.chown(target, st.st_uid, st.st_gid)
            os.chmod(target, stat.S_IMODE(st.st_mode))
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise

    def scan(self) -> None:
        """Count the tree's usage again (once at construction; after anything changed it behind
        our back). A tree past the bound counts as full."""
        bound = max(self.max_entries, MAX_TREE_ENTRIES) + 1
        fd = _openat2(self._root_fd, ".", _LIST)
        try:
            used, entries = _tree_usage(fd, bound)
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
                raise _Refused(errno.ENOSPC, "the volume's quota is reached")
            if entries and self._entries + entries > self.max_entries:
                raise _Refused(errno.ENOSPC, "the volume's file count is reached")
            self._reserved += nbytes
            self._entries += entries

    def _reserve_new(self, path: str, nbytes: int = 0) -> None:
        """Room for one new entry at ``path``; an existing name is EEXIST even when the volume is
        full (`mkdir -p` of what is there), as a file system answers."""
        try:
            self._reserve(nbytes, 1)
        except _Refused as refused:
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
            raise _Refused(errno.EINVAL, "the volume's root cannot be the object of this op")
        parent, name = _split(path)
        if parent == "":
            yield self._root_fd, name
            return
        fd = _openat2(self._root_fd, parent, _DIR)
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
        fd = _openat2(self._root_fd, path or ".", flags | os.O_NOFOLLOW | os.O_NONBLOCK, mode)
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                if flags & (os.O_WRONLY | os.O_RDWR):
                    raise _Refused(errno.EISDIR)
            elif not stat.S_ISREG(st.st_mode):
                raise _Refused(errno.EPERM, "not a regular file or a directory")
            return fd, st
        except BaseException:
            os.close(fd)
            raise

    # ------------------------------------------------------------------ the guest's ops

    def apply(self, op: VolOp, slot: int, *, read_only: bool) -> VolReplyNotice:
        """Perform one op of a guest's FUSE server; never raises (an errno instead)."""
        seq = op.get("seq", 0)
        reply = VolReplyNotice(slot=slot, seq=seq if isinstance(seq, int) else 0, errno=0)
        name = op.get("op")
        try:
            if name not in OPS:
                raise _Refused(errno.ENOSYS, f"unknown op {str(name)[:40]!r}")
            if read_only and name in MUTATING:
                raise _Refused(errno.EROFS)
            path = _path(op.get("path"), "path")
            handler: Callable[[VolOp, str, VolReplyNotice], None] = getattr(self, f"_op_{name}")
            handler(op, path, reply)
        except _Refused as exc:
            return VolReplyNotice(slot=slot, seq=reply["seq"], errno=exc.errno)
        except OSError as exc:
            return VolReplyNotice(slot=slot, seq=reply["seq"], errno=exc.errno or errno.EIO)
        except Exception:
            log.exception("volume %s: op %s failed", self.root, str(name)[:40])
            return VolReplyNotice(slot=slot, seq=reply["seq"], errno=errno.EIO)
        return reply

    def _op_getattr(self, op: VolOp, path: str, reply: VolReplyNotice) -> None:
        reply["attr"] = _attr(self._lstat(path))

    def _op_statfs(self, op: VolOp, path: str, reply: VolReplyNotice) -> None:
        used, entries = self.usage()
        reply["statfs"] = VolStatfs(bsize=BLOCK, blocks=self.quota // BLOCK,
                                    bfree=max(0, self.quota - used) // BLOCK, files=self.max_entries,
                                    ffree=max(0, self.max_entries - entries))

    def _op_readdir(self, op: VolOp, path: str, reply: VolReplyNotice) -> None:
        offset = _int(op, "offset", 0, MAX_TREE_ENTRIES, 0)
        entries = self._list(path)
        reply["entries"] = entries[offset:offset + READDIR_PAGE]
        reply["more"] = offset + READDIR_PAGE < len(entries)

    def _list(self, path: str) -> list[VolDirEntry]:
        fd = _openat2(self._root_fd, path or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            out: list[VolDirEntry] = []
            with os.scandir(fd) as it:
                for entry in it:
                    if len(out) >= MAX_TREE_ENTRIES:
                        raise _Refused(errno.E2BIG, f"more than {MAX_TREE_ENTRIES} entries")
                    try:
                        mode = stat.S_IFMT(entry.stat(follow_symlinks=False).st_mode)
                    except FileNotFoundError:
                        continue  # gone while listed
                    out.append(VolDirEntry(name=entry.name, mode=mode))
        finally:
            os.close(fd)
        out.sort(key=lambda e: os.fsencode(e["name"]))
        return out

    def _ids(self, op: VolOp) -> tuple[int, int]:
        return _int(op, "uid", 0, MAX_ID), _int(op, "gid", 0, MAX_ID)

    def _op_mkdir(self, op: VolOp, path: str, reply: VolReplyNotice) -> None:
        uid, gid = self._ids(op)
        mode = _int(op, "mode", 0, 0o7777, 0o755) & MODE_MASK
        reply["attr"] = _attr(self._mkdir(path, mode, uid, gid))

    def _mkdir(self, path: str, mode: int, uid: int, gid: int) -> os.stat_result:
        with self._parent(path) as (dfd, name):
            self._reserve_new(path, BLOCK)
            made = False
            try:
                os.mkdir(name, 0o700, dir_fd=dfd)
                made = True
                # chown, then chmod: the mode is exact (not the daemon's umask), never set-id.
                os.chown(name, uid, gid, dir_fd=dfd, follow_symlinks=False)
                fd = _openat2(dfd, name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
                try:
                    os.fchmod(fd, mode)
                    st = os.fstat(fd)
                finally:
                    os.close(fd)
            except BaseException:
                self._settle(BLOCK, 0, 0 if made else -1)
                raise
            self._settle(BLOCK, _counted(st))
            return st

    def _op_create(self, op: VolOp, path: str, reply: VolReplyNotice) -> None:
        uid, gid = self._ids(op)
        mode = _int(op, "mode", 0, 0o7777, 0o644) & MODE_MASK
        exclusive = op.get("exclusive") is True
        reply["attr"] = _attr(self._create(path, mode, uid, gid, exclusive))

    def _create(self, path: str, mode: int, uid: int, gid: int, exclusive: bool) -> os.stat_result:
        if path == "":
            raise _Refused(errno.EISDIR)
        for _ in range(8):  # made or deleted by another guest between our two opens: try again
            if not exclusive:  # an existing file is opened, even when the volume is full
                try:
                    fd, st = self._open(path, os.O_RDONLY)
                except FileNotFoundError:
                    pass
                else:
                    os.close(fd)
                    if not stat.S_ISREG(st.st_mode):
                        raise _Refused(errno.EISDIR)
                    return st
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
            return st
        raise _Refused(errno.EAGAIN)

    def _op_unlink(self, op: VolOp, path: str, reply: VolReplyNotice) -> None:
        self._remove_one(path, directory=False)

    def _op_rmdir(self, op: VolOp, path: str, reply: VolReplyNotice) -> None:
        self._remove_one(path, directory=True)

    def _remove_one(self, path: str, *, directory: bool) -> None:
        # The stat is taken before the unlink: a swap between them makes the count drift (a scan
        # puts it right), never the files leave the volume.
        with self._parent(path) as (dfd, name):
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if directory:
                os.rmdir(name, dir_fd=dfd)
            else:
                os.unlink(name, dir_fd=dfd)
            self._settle(0, -_counted(st) if st.st_nlink <= 1 or directory else 0, -1)

    def _op_rename(self, op: VolOp, path: str, reply: VolReplyNotice) -> None:
        to = _path(op.get("to"), "to")
        flags = _int(op, "flags", 0, RENAME_NOREPLACE, 0)
        self._rename(path, to, flags)

    def _rename(self, path: str, to: str, flags: int) -> None:
        if to == "":
            raise _Refused(errno.EBUSY)
        with self._parent(path) as (sfd, sname), self._parent(to) as (dfd, dname):
            try:
                old: os.stat_result | None = os.stat(dname, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                old = None
            src = os.stat(sname, dir_fd=sfd, follow_symlinks=False)
            _rename(sfd, sname, dfd, dname, flags)
            if old is not None and not os.path.samestat(old, src):
                gone = stat.S_ISDIR(old.st_mode) or old.st_nlink <= 1
                self._settle(0, -_counted(old) if gone else 0, -1)

    def _op_setattr(self, op: VolOp, path: str, reply: VolReplyNotice) -> None:
        mode = _int(op, "mode", 0, 0o7777) & MODE_MASK if "mode" in op else None
        uid = _int(op, "owner_uid", 0, MAX_ID) if "owner_uid" in op else None
        gid = _int(op, "owner_gid", 0, MAX_ID) if "owner_gid" in op else None
        size = _int(op, "size", 0, MAX_OFFSET) if "size" in op else None
        times = [_int(op, key, -MAX_TIME_NS, MAX_TIME_NS) if key in op else None
                 for key in ("atime_ns", "mtime_ns")]
        if size is not None:
            self._truncate(path, size)
        if uid is not None or gid is not None or mode is not None:
            self._chmod_chown(path, mode, uid, gid)
        if times[0] is not None or times[1] is not None:
            self._utime(path, times[0], times[1])
        reply["attr"] = _attr(self._lstat(path))

    def _utime(self, path: str, atime_ns: int | None, mtime_ns: int | None) -> None:
        """None: kept; -1: now. A symlink's own times (never its target's)."""
        now = time.time_ns()

        def pick(new: int | None, old: int) -> int:
            return old if new is None else now if new == -1 else new

        if path == "":
            fd = _openat2(self._root_fd, ".", os.O_RDONLY | os.O_DIRECTORY)
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

    def _chmod_chown(self, path: str, mode: int | None, uid: int | None, gid: int | None) -> None:
        if uid is not None or gid is not None:
            ids = (-1 if uid is None else uid, -1 if gid is None else gid)
            if path == "":
                fd = _openat2(self._root_fd, ".", os.O_RDONLY | os.O_DIRECTORY)
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

    def _truncate(self, path: str, size: int) -> None:
        if size > self.quota:
            raise _Refused(errno.EFBIG, "no file of a volume is larger than its quota")
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
                self._settle(0, _counted(after) - _counted(st))
        finally:
            os.close(fd)

    def _op_read(self, op: VolOp, path: str, reply: VolReplyNotice) -> None:
        offset = _int(op, "offset", 0, MAX_OFFSET)
        size = _int(op, "size", 0, MAX_IO)
        fd, st = self._open(path, os.O_RDONLY)
        try:
            if not stat.S_ISREG(st.st_mode):
                raise _Refused(errno.EISDIR)
            data = os.pread(fd, size, offset)
        finally:
            os.close(fd)
        reply["data"] = base64.b64encode(data).decode("ascii")

    def _op_write(self, op: VolOp, path: str, reply: VolReplyNotice) -> None:
        raw = op.get("data")
        if not isinstance(raw, str) or len(raw) > _MAX_B64:
            raise _Refused(errno.EINVAL, "data must be base64 of at most MAX_IO bytes")
        try:
            data = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise _Refused(errno.EINVAL, "data is not base64") from None
        if len(data) > MAX_IO:
            raise _Refused(errno.EINVAL, "data is longer than MAX_IO")
        append = op.get("append") is True
        offset = 0 if append else _int(op, "offset", 0, MAX_OFFSET)
        reply["written"] = self._write(path, data, offset, append)

    def _write(self, path: str, data: bytes, offset: int, append: bool) -> int:
        """One ``write(2)`` (``O_APPEND`` for an appender: the kernel orders concurrent appenders
        from every sandbox, whatever offset each guest thought was the end)."""
        fd, st = self._open(path, os.O_WRONLY | (os.O_APPEND if append else 0))
        try:
            with self._stripe(st):
                st = os.fstat(fd)
                end = (st.st_size if append else offset) + len(data)
                if end > self.quota:
                    raise _Refused(errno.EFBIG, "no file of a volume is larger than its quota")
                # A write within bytes the file already holds (not sparse) allocates nothing.
                inside = not append and end <= st.st_size and st.st_blocks * 512 >= st.st_size
                need = 0 if inside else len(data)
                self._reserve(need)
                try:
                    written = os.write(fd, data) if append else os.pwrite(fd, data, offset)
                    after = os.fstat(fd)
                finally:
                    self._settle(need, 0)
                self._settle(0, _counted(after) - _counted(st))
                return written
        finally:
            os.close(fd)

    def _op_symlink(self, op: VolOp, path: str, reply: VolReplyNotice) -> None:
        target = op.get("target")
        raw = os.fsencode(target) if isinstance(target, str) else b""
        if not raw or len(raw) >= 4096 or b"\0" in raw:
            raise _Refused(errno.EINVAL, "a symlink's target is 1 to 4095 bytes without NUL")
        uid, gid = self._ids(op)
        with self._parent(path) as (dfd, name):
            self._reserve_new(path)
            try:
                os.symlink(os.fsdecode(raw), name, dir_fd=dfd)  # stored as given, never followed
            except BaseException:
                self._settle(0, 0, -1)
                raise
            os.chown(name, uid, gid, dir_fd=dfd, follow_symlinks=False)
            reply["attr"] = _attr(os.stat(name, dir_fd=dfd, follow_symlinks=False))

    def _op_readlink(self, op: VolOp, path: str, reply: VolReplyNotice) -> None:
        with self._parent(path) as (dfd, name):
            reply["target"] = os.readlink(name, dir_fd=dfd)

    def _op_link(self, op: VolOp, path: str, reply: VolReplyNotice) -> None:
        to = _path(op.get("to"), "to")
        if to == "":
            raise _Refused(errno.EEXIST)
        with self._parent(path) as (sfd, sname), self._parent(to) as (dfd, dname):
            st = os.stat(sname, dir_fd=sfd, follow_symlinks=False)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                raise _Refused(errno.EPERM)
            self._reserve_new(to)
            try:
                os.link(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd, follow_symlinks=False)
            except BaseException:
                self._settle(0, 0, -1)
                raise
            reply["attr"] = _attr(os.stat(dname, dir_fd=dfd, follow_symlinks=False))

    def _op_fsync(self, op: VolOp, path: str, reply: VolReplyNotice) -> None:
        fd, _st = self._open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ the daemon's API

    def stat(self, path: str) -> VolAttr:
        p = _api_path(path)
        try:
            return _attr(self._lstat(p))
        except (OSError, _Refused) as exc:
            _raise(p, exc)

    def listdir(self, path: str) -> list[VolDirEntry]:
        p = _api_path(path)
        try:
            return self._list(p)
        except (OSError, _Refused) as exc:
            _raise(p, exc)

    def mkdir(self, path: str, *, parents: bool = False, uid: int = GUEST_UID, gid: int = GUEST_GID,
              mode: int = 0o755) -> None:
        p = _api_path(path)
        if p == "":
            if parents:
                return
            raise Conflict("the volume's root exists")
        steps = [p] if not parents else ["/".join(p.split("/")[:i + 1]) for i in range(p.count("/") + 1)]
        for step in steps:
            try:
                self._mkdir(step, mode & MODE_MASK, uid, gid)
            except FileExistsError as exc:
                if step == p and not parents:
                    _raise(step, exc)
                try:
                    is_dir = stat.S_ISDIR(self._lstat(step).st_mode)
                except (OSError, _Refused) as exc2:
                    _raise(step, exc2)
                if not is_dir:
                    raise Conflict(f"{step} exists and is not a directory") from None
            except (OSError, _Refused) as exc:
                _raise(step, exc)

    def remove(self, path: str, *, recursive: bool = False) -> None:
        p = _api_path(path)
        if p == "":
            raise InvalidRequest("the volume's root cannot be removed")
        try:
            st = self._lstat(p)
            if not stat.S_ISDIR(st.st_mode):
                self._remove_one(p, directory=False)
                return
            if recursive:
                fd = _openat2(self._root_fd, p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
                try:
                    used, entries = _empty_tree(fd)
                except BaseException:
                    self.scan()  # some of it went: count what is left
                    raise
                finally:
                    os.close(fd)
                self._settle(0, -used, -entries)
            self._remove_one(p, directory=True)
        except (OSError, _Refused) as exc:
            _raise(p, exc)

    def write_file(self, path: str, chunks: Iterable[bytes], *, uid: int = GUEST_UID, gid: int = GUEST_GID,
                   mode: int = 0o644) -> VolAttr:
        """``chunks`` as the file at ``path``: written to a new name beside it, then renamed over it
        (a reader sees the old file or the new one, never half); the quota is checked as it goes."""
        p = _api_path(path)
        if p == "":
            raise InvalidRequest("the volume's root is a directory")
        tmp_name = f".forkd-upload-{secrets.token_hex(8)}"
        try:
            with self._parent(p) as (dfd, name):
                self._reserve(0, 1)
                try:
                    fd = os.open(tmp_name, _NEW_FILE, 0o600, dir_fd=dfd)
                except BaseException:
                    self._settle(0, 0, -1)
                    raise
                counted = 0
                try:
                    try:
                        for chunk in chunks:
                            view = memoryview(chunk)
                            self._reserve(len(view))
                            try:
                                while view:
                                    view = view[os.write(fd, view):]
                                blocks = _counted(os.fstat(fd))
                            finally:
                                self._settle(len(chunk), 0)
                            self._settle(0, blocks - counted)
                            counted = blocks
                        os.fchown(fd, uid, gid)
                        os.fchmod(fd, mode & MODE_MASK)
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                    try:
                        old: os.stat_result | None = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    except FileNotFoundError:
                        old = None
                    os.rename(tmp_name, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp_name, dir_fd=dfd)
                    self._settle(0, -counted, -1)
                    raise
                if old is not None:
                    self._settle(0, -_counted(old) if old.st_nlink <= 1 else 0, -1)
                return _attr(os.stat(name, dir_fd=dfd, follow_symlinks=False))
        except (OSError, _Refused) as exc:
            _raise(p, exc)

    def read_file(self, path: str) -> Iterator[bytes]:
        """The file's bytes in chunks of at most ``MAX_IO``; opened now (errors raise here), read as
        the iterator is."""
        p = _api_path(path)
        try:
            fd, st = self._open(p, os.O_RDONLY)
            if not stat.S_ISREG(st.st_mode):
                os.close(fd)
                raise _Refused(errno.EISDIR)
        except (OSError, _Refused) as exc:
            _raise(p, exc)

        def chunks() -> Iterator[bytes]:
            try:
                while chunk := os.read(fd, MAX_IO):
                    yield chunk
            finally:
                os.close(fd)

        return chunks()

    def rename(self, path: str, to: str) -> None:
        p, t = _api_path(path), _api_path(to)
        try:
            self._rename(p, t, 0)
        except (OSError, _Refused) as exc:
            _raise(p, exc)

    def chmod_chown(self, path: str, mode: int | None = None, uid: int | None = None,
                    gid: int | None = None) -> None:
        p = _api_path(path)
        for value, hi in ((mode, 0o7777), (uid, MAX_ID), (gid, MAX_ID)):
            if value is not None and not 0 <= value <= hi:
                raise InvalidRequest(f"{value} is out of range")
        try:
            self._chmod_chown(p, None if mode is None else mode & MODE_MASK, uid, gid)
        except (OSError, _Refused) as exc:
            _raise(p, exc)


def _copy_dir(source: Path, into: Path, quota: int, limit: int, what: str) -> None:
    src_fd = os.open(source, _LIST)
    try:
        dst_fd = os.open(into, _LIST | os.O_NOFOLLOW)
        try:
            _copy_tree(src_fd, dst_fd, quota, limit, (GUEST_UID, GUEST_GID), what)
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)


def _openat2_probe(root_fd: int) -> None:
    try:
        os.close(_openat2(root_fd, ".", _DIR))
    except OSError as exc:
        if exc.errno in (errno.ENOSYS, errno.EPERM):
            raise PrerequisiteMissing("shared volumes need Linux 5.6 or later (openat2 with "
                                      "RESOLVE_BENEATH); this kernel refuses it") from None
        raise


# ---------------------------------------------------------------------- trees, by descriptor


def _children(dir_fd: int) -> list[str]:
    with os.scandir(dir_fd) as it:
        return [entry.name for entry in it]


def _subdir(dir_fd: int, name: str) -> int:
    """A directory below ``dir_fd``, never through a link (a swap meanwhile is ELOOP/ENOTDIR)."""
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def _too_deep(depth: int) -> None:
    if depth > MAX_DEPTH:
        raise _Refused(errno.ELOOP, f"directories nest deeper than {MAX_DEPTH}")


def _tree_usage(top_fd: int, bound: int) -> tuple[int, int]:
    """(counted bytes, entries) of ``top_fd`` and below (a hard-linked file's blocks once); stops
    at ``bound`` entries and at ``MAX_DEPTH`` (deeper entries are not counted)."""
    seen: set[tuple[int, int]] = set()
    total = [_counted(os.fstat(top_fd)), 0]

    def walk(fd: int, depth: int) -> None:
        for name in _children(fd):
            if total[1] >= bound:
                return
            total[1] += 1
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
            total[0] += _counted(st)
            if stat.S_ISDIR(st.st_mode) and depth < MAX_DEPTH:
                try:
                    sub = _subdir(fd, name)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                try:
                    walk(sub, depth + 1)
                finally:
                    os.close(sub)

    walk(top_fd, 1)
    return total[0], total[1]


def _empty_tree(top_fd: int, depth: int = 1) -> tuple[int, int]:
    """Remove everything below ``top_fd`` (depth first, by descriptor, links never followed);
    (counted bytes, entries) removed."""
    _too_deep(depth)
    used = entries = 0
    for name in _children(top_fd):
        st = os.stat(name, dir_fd=top_fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            fd = _subdir(top_fd, name)
            try:
                sub_used, sub_entries = _empty_tree(fd, depth + 1)
            finally:
                os.close(fd)
            used, entries = used + sub_used, entries + sub_entries
            os.rmdir(name, dir_fd=top_fd)
        else:
            os.unlink(name, dir_fd=top_fd)
        entries += 1
        used += _counted(st) if stat.S_ISDIR(st.st_mode) or st.st_nlink <= 1 else 0
    return used, entries


def _copy_tree(src_fd: int, dst_fd: int, quota: int | None, max_entries: int,
               owner: tuple[int, int] | None, what: str) -> None:
    """``src_fd``'s tree into the empty ``dst_fd``: regular files, directories and symlinks (as
    links, never followed); other kinds skipped. Past ``quota`` bytes, ``max_entries`` entries or
    ``MAX_DEPTH``: InvalidRequest naming ``what``. ``owner``: every copy's owner, else the source's."""
    budget = [0, 0]  # bytes, entries
    dst_st = os.fstat(dst_fd)
    into = (dst_st.st_dev, dst_st.st_ino)  # a copy made inside its own source is not copied into itself

    def count(nbytes: int, entries: int) -> None:
        budget[0] += nbytes
        budget[1] += entries
        if budget[1] > max_entries:
            raise InvalidRequest(f"{what} has more than {max_entries} files and directories")
        if quota is not None and budget[0] > quota:
            raise InvalidRequest(f"{what} holds more than fits in a volume of {quota >> 20} MiB")

    def finish(name: str, dfd: int, st: os.stat_result) -> None:
        uid, gid = owner if owner is not None else (st.st_uid, st.st_gid)
        os.chown(name, uid, gid, dir_fd=dfd, follow_symlinks=False)
        if not stat.S_ISLNK(st.st_mode):
            os.chmod(name, stat.S_IMODE(st.st_mode) & MODE_MASK, dir_fd=dfd)
        os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dfd, follow_symlinks=False)

    def copy(sfd: int, dfd: int, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise InvalidRequest(f"{what} nests directories deeper than {MAX_DEPTH}")
        for name in sorted(_children(sfd)):
            try:
                st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if (st.st_dev, st.st_ino) == into:
                    continue
                count(BLOCK, 1)
                os.mkdir(name, 0o700, dir_fd=dfd)
                sub_s = _subdir(sfd, name)
                try:
                    sub_d = _subdir(dfd, name)
                    try:
                        copy(sub_s, sub_d, depth + 1)
                    finally:
                        os.close(sub_d)
                finally:
                    os.close(sub_s)
            elif stat.S_ISLNK(st.st_mode):
                count(0, 1)
                os.symlink(os.readlink(name, dir_fd=sfd), name, dir_fd=dfd)
            elif stat.S_ISREG(st.st_mode):
                count(0, 1)
                _copy_file(sfd, dfd, name, count)
            else:
                log.info("%s: %s is not a file, directory or link: not copied", what, name)
                continue
            finish(name, dfd, st)

    copy(src_fd, dst_fd, 1)


def _copy_file(sfd: int, dfd: int, name: str, count: Callable[[int, int], None]) -> None:
    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=sfd)
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):  # swapped since it was looked at
            raise InvalidRequest(f"{name} changed while it was copied")
        dst = os.open(name, _NEW_FILE, 0o600, dir_fd=dfd)
        try:
            while chunk := os.read(src, 1 << 20):
                count(len(chunk), 0)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(dst, view):]
        finally:
            os.close(dst)
    finally:
        os.close(src)


__all__ = ["GUEST_GID", "GUEST_UID", "MAX_TREE_ENTRIES", "RENAME_NOREPLACE", "HostDir"]
