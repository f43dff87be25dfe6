"""A hostdir volume's files as the daemon's own API calls them (E2B's volume content API).

Its own module because the daemon's calls differ from a guest's ops in two ways: their paths are
the API's ('/a/b', '/' for the root), and their failures are forkd's errors (404, 409, 507, 400)
rather than errnos. The files, their confinement and their quota are ``HostDir``'s: this class
adds the calls, and ``Volumes`` keeps one per volume, so its quota is counted once for the
daemon's writes and every guest's.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from typing import NoReturn

from forkd.errors import Conflict, ForkdError, InsufficientStorage, InvalidRequest, NotFound
from forkd.guest.volume_messages import MAX_IO, VolAttr, VolDirEntry, check_path
from forkd.vmm.beneath import NEW_FILE, Refused, openat2
from forkd.vmm.volume_dir import HostDir, attr_of
from forkd.vmm.volume_ops import MAX_ID
from forkd.vmm.volume_tree import GUEST_GID, GUEST_UID, MODE_MASK, counted, empty_tree


def _api_path(path: str) -> str:
    """A path from the daemon's API ('/a/b', 'a/b/', '/' for the root) as a volume path."""
    try:
        return check_path(path.strip("/"))
    except ValueError as exc:
        raise InvalidRequest(f"bad path {path[:200]!r}: {exc}") from None


def _raise(path: str, exc: OSError | Refused) -> NoReturn:
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


class HostFiles(HostDir):
    def stat(self, path: str) -> VolAttr:
        p = _api_path(path)
        try:
            return attr_of(self._lstat(p))
        except (OSError, Refused) as exc:
            _raise(p, exc)

    def listdir(self, path: str) -> list[VolDirEntry]:
        p = _api_path(path)
        try:
            return self.entries(p)
        except (OSError, Refused) as exc:
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
                self.make_dir(step, mode & MODE_MASK, uid, gid)
            except FileExistsError as exc:
                if step == p and not parents:
                    _raise(step, exc)
                try:
                    is_dir = stat.S_ISDIR(self._lstat(step).st_mode)
                except (OSError, Refused) as exc2:
                    _raise(step, exc2)
                if not is_dir:
                    raise Conflict(f"{step} exists and is not a directory") from None
            except (OSError, Refused) as exc:
                _raise(step, exc)

    def remove(self, path: str, *, recursive: bool = False) -> None:
        p = _api_path(path)
        if p == "":
            raise InvalidRequest("the volume's root cannot be removed")
        try:
            st = self._lstat(p)
            if not stat.S_ISDIR(st.st_mode):
                self.remove_entry(p, directory=False)
                return
            if recursive:
                fd = openat2(self._root_fd, p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
                try:
                    used, entries = empty_tree(fd)
                except BaseException:
                    self.scan()  # some of it went: count what is left
                    raise
                finally:
                    os.close(fd)
                self._settle(0, -used, -entries)
            self.remove_entry(p, directory=True)
        except (OSError, Refused) as exc:
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
                    fd = os.open(tmp_name, NEW_FILE, 0o600, dir_fd=dfd)
                except BaseException:
                    self._settle(0, 0, -1)
                    raise
                held = 0  # the blocks of the new file counted so far
                try:
                    try:
                        for chunk in chunks:
                            view = memoryview(chunk)
                            self._reserve(len(view))
                            try:
                                while view:
                                    view = view[os.write(fd, view):]
                                blocks = counted(os.fstat(fd))
                            finally:
                                self._settle(len(chunk), 0)
                            self._settle(0, blocks - held)
                            held = blocks
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
                    self._settle(0, -held, -1)
                    raise
                if old is not None:
                    self._settle(0, -counted(old) if old.st_nlink <= 1 else 0, -1)
                return attr_of(os.stat(name, dir_fd=dfd, follow_symlinks=False))
        except (OSError, Refused) as exc:
            _raise(p, exc)

    def read_file(self, path: str) -> Iterator[bytes]:
        """The file's bytes in chunks of at most ``MAX_IO``; opened now (errors raise here), read as
        the iterator is."""
        p = _api_path(path)
        try:
            fd, st = self._open(p, os.O_RDONLY)
            if not stat.S_ISREG(st.st_mode):
                os.close(fd)
                raise Refused(errno.EISDIR)
        except (OSError, Refused) as exc:
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
            self.move(p, t, 0)
        except (OSError, Refused) as exc:
            _raise(p, exc)

    def chmod_chown(self, path: str, mode: int | None = None, uid: int | None = None,
                    gid: int | None = None) -> None:
        p = _api_path(path)
        for value, hi in ((mode, 0o7777), (uid, MAX_ID), (gid, MAX_ID)):
            if value is not None and not 0 <= value <= hi:
                raise InvalidRequest(f"{value} is out of range")
        try:
            self.set_mode_owner(p, None if mode is None else mode & MODE_MASK, uid, gid)
        except (OSError, Refused) as exc:
            _raise(p, exc)



__all__ = ["HostFiles"]
