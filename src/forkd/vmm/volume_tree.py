"""A shared volume's tree walked by descriptor: its usage counted, emptied, copied in and out.

Its own module because a volume's directory (``volume_dir``) is made from a host directory or a
tarball, exported, counted at start and emptied by a recursive remove, each a walk over a tree
that hostile guests write and race on. Every walk goes by descriptor, one level at a time, never
through a link (``beneath.subdir``), and is bounded in entries and in depth (``MAX_DEPTH``).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from forkd.errors import Conflict, InvalidRequest
from forkd.vmm import volume_image
from forkd.vmm.beneath import LIST, NEW_FILE, Refused, children, openat2, subdir

log = logging.getLogger("forkd.volume_tree")

GUEST_UID = GUEST_GID = 1000  # the guest's `user`: a new volume is theirs
MAX_TREE_ENTRIES = 100_000  # a source tree, a listing, a scan: bounded, not walked whole
BLOCK = 4096
MAX_DEPTH = 256  # directories nested below the root that a walk (scan, copy, remove) descends
MODE_MASK = 0o1777  # never set-uid or set-gid on the host


def counted(st: os.stat_result) -> int:
    """The bytes an entry counts against the quota: regular files' and directories' blocks."""
    return st.st_blocks * 512 if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) else 0


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


def export(root_fd: int, target: Path, max_entries: int) -> None:
    """The tree of ``root_fd`` copied into the new directory ``target`` (owners and modes kept,
    symlinks as links). Nothing is left at ``target`` on failure."""
    target.mkdir()
    try:
        dst_fd = os.open(target, LIST | os.O_NOFOLLOW)
        src_fd = openat2(root_fd, ".", LIST)
        try:
            _copy_tree(src_fd, dst_fd, None, max(max_entries, MAX_TREE_ENTRIES), None, "the volume")
        finally:
            os.close(src_fd)
            os.close(dst_fd)
        st = os.fstat(root_fd)
        os.chown(target, st.st_uid, st.st_gid)
        os.chmod(target, stat.S_IMODE(st.st_mode))
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise


def _copy_dir(source: Path, into: Path, quota: int, limit: int, what: str) -> None:
    src_fd = os.open(source, LIST)
    try:
        dst_fd = os.open(into, LIST | os.O_NOFOLLOW)
        try:
            _copy_tree(src_fd, dst_fd, quota, limit, (GUEST_UID, GUEST_GID), what)
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)


def _too_deep(depth: int) -> None:
    if depth > MAX_DEPTH:
        raise Refused(errno.ELOOP, f"directories nest deeper than {MAX_DEPTH}")


def tree_usage(top_fd: int, bound: int) -> tuple[int, int]:
    """(counted bytes, entries) of ``top_fd`` and below (a hard-linked file's blocks once); stops
    at ``bound`` entries and at ``MAX_DEPTH`` (deeper entries are not counted)."""
    seen: set[tuple[int, int]] = set()
    total = [counted(os.fstat(top_fd)), 0]

    def walk(fd: int, depth: int) -> None:
        for name in children(fd):
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
            total[0] += counted(st)
            if stat.S_ISDIR(st.st_mode) and depth < MAX_DEPTH:
                try:
                    sub = subdir(fd, name)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                try:
                    walk(sub, depth + 1)
                finally:
                    os.close(sub)

    walk(top_fd, 1)
    return total[0], total[1]


def empty_tree(top_fd: int, depth: int = 1) -> tuple[int, int]:
    """Remove everything below ``top_fd`` (depth first, by descriptor, links never followed);
    (counted bytes, entries) removed."""
    _too_deep(depth)
    used = entries = 0
    for name in children(top_fd):
        st = os.stat(name, dir_fd=top_fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            fd = subdir(top_fd, name)
            try:
                sub_used, sub_entries = empty_tree(fd, depth + 1)
            finally:
                os.close(fd)
            used, entries = used + sub_used, entries + sub_entries
            os.rmdir(name, dir_fd=top_fd)
        else:
            os.unlink(name, dir_fd=top_fd)
        entries += 1
        used += counted(st) if stat.S_ISDIR(st.st_mode) or st.st_nlink <= 1 else 0
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
        for name in sorted(children(sfd)):
            try:
                st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if (st.st_dev, st.st_ino) == into:
                    continue
                count(BLOCK, 1)
                os.mkdir(name, 0o700, dir_fd=dfd)
                sub_s = subdir(sfd, name)
                try:
                    sub_d = subdir(dfd, name)
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
        dst = os.open(name, NEW_FILE, 0o600, dir_fd=dfd)
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




__all__ = ["BLOCK", "GUEST_GID", "GUEST_UID", "MAX_DEPTH", "MAX_TREE_ENTRIES", "MODE_MASK", "counted",
           "empty_tree", "export", "make", "tree_usage"]
