"""The file actions: stat, list, mkdir, remove, move, and chunked reads (writes: ``uploads``).

Its own job because a file transfer must never hold the channel: the host moves
a file in ``FILE_CHUNK`` pieces, one request each, so exec and eval requests
interleave with a transfer and no line ever grows past about 1.4 MiB. Reads are
stateless (``pread`` at an offset), so the host may keep a few in flight.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import shutil
import stat
from typing import Any

from forkd.guest.agent.fileinfo import info, stat_info
from forkd.guest.agent.users import GuestUser, as_requester, as_user, user_field
from forkd.guest.protocol import (
    CONFLICT,
    FILE_CHUNK,
    FILE_LIST_MAX,
    INVALID,
    MAX_REPLY_LINE,
    NOT_FOUND,
    RequestError,
    check_path,
)

# A listing stops (truncated) before its reply would outgrow the line limit.
LIST_REPLY_BUDGET = MAX_REPLY_LINE - (64 << 10)

_KIND_OF_ERRNO = {
    errno.ENOENT: NOT_FOUND,
    errno.ENOTDIR: CONFLICT,
    errno.EISDIR: CONFLICT,
    errno.ENOTEMPTY: CONFLICT,
    errno.EEXIST: CONFLICT,
    errno.ENAMETOOLONG: INVALID,
    errno.EINVAL: INVALID,
    errno.ELOOP: INVALID,
    # Acting as a user (``users.as_user``): a path they may not touch is their request's fault.
    errno.EACCES: INVALID,
    errno.EPERM: INVALID,
    # Setting metadata: a filesystem without user extended attributes (tmpfs before Linux 6.6),
    # or more than the inode holds.
    errno.EOPNOTSUPP: INVALID,
    errno.E2BIG: INVALID,
    errno.ERANGE: INVALID,
}


def is_root(path: str) -> bool:
    """Whether ``path`` is the root directory by any name: ``//`` (which normpath keeps),
    ``/./``, ``/proc/self/root/``, a bind mount of ``/``. Compared by device and inode."""
    if os.path.normpath(path) in ("/", "//"):
        return True
    try:
        # lstat: a symbolic link to / is only a link (removing or moving it is harmless).
        return os.path.samestat(os.lstat(path), os.stat("/"))
    except OSError:
        return False


def os_error(path: str, exc: OSError) -> RequestError:
    """An OSError as a refusal whose kind the host maps to a status (others are 502s)."""
    return RequestError(f"{path}: {exc.strerror or exc}", _KIND_OF_ERRNO.get(exc.errno or 0))


def int_arg(req: dict[str, Any], name: str, low: int, high: int) -> int:
    value = req.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RequestError(f"{name!r} must be an integer in {low}..{high}", INVALID)
    return value


def ensure_dirs(path: str, user: GuestUser) -> bool:
    """Make each missing directory of ``path`` (itself included) and hand it to ``user``, as
    E2B's envd does for a write or a MakeDir (its ``permissions.EnsureDirs``): made by the agent
    (root), so a user may write into a new folder under a root-owned one (``/opt/new/x``);
    existing directories keep their owner. Whether the last one was made.

    The user is no boundary here: any caller of the agent may act as root.
    """
    current = "/"
    created = False
    for part in os.path.normpath(path).split("/"):
        if part in ("", "."):
            continue
        current = os.path.join(current, part)
        try:
            os.mkdir(current, 0o755)
        except FileExistsError:
            if not os.path.isdir(current):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), current) from None
            created = False
            continue
        os.chown(current, user.uid, user.gid, follow_symlinks=False)
        created = True
    return created


class Files:
    """The stateless file actions, each as the request's ``user``."""

    # --------------------------------------------------------------- metadata

    @staticmethod
    @as_requester
    def stat(req: dict[str, Any]) -> dict[str, Any]:
        path = check_path(req.get("path"))
        try:
            return stat_info(path)
        except OSError as exc:
            raise os_error(path, exc) from None

    @staticmethod
    @as_requester
    def list(req: dict[str, Any]) -> dict[str, Any]:
        path = check_path(req.get("path"))
        entries: list[dict[str, Any]] = []
        truncated = False
        size = 0  # of the entries as the reply will encode them
        try:
            with os.scandir(path) as it:
                for entry in it:
                    if len(entries) >= FILE_LIST_MAX:
                        truncated = True
                        break
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue  # removed while listing
                    full = os.path.join(path, entry.name)
                    item = info(full, st, os.path.realpath(full) if stat.S_ISLNK(st.st_mode) else None)
                    size += len(json.dumps(item)) + 1
                    if size > LIST_REPLY_BUDGET:
                        truncated = True
                        break
                    entries.append(item)
        except OSError as exc:
            raise os_error(path, exc) from None
        entries.sort(key=lambda e: str(e["name"]))
        return {"path": path, "entries": entries, "truncated": truncated}

    @staticmethod
    def mkdir(req: dict[str, Any]) -> dict[str, Any]:
        """Make ``path``; with ``parents``, its missing parents too, and as a user those are
        theirs even under a root-owned folder (``ensure_dirs``, E2B's rule)."""
        path = check_path(req.get("path"))
        parents = bool(req.get("parents", False))
        user = user_field(req)
        try:
            if parents and user is not None and user.uid != 0:
                return {"created": ensure_dirs(path, user)}
            with as_user(user):
                if parents:
                    existed = os.path.isdir(path)
                    os.makedirs(path, exist_ok=True)
                    return {"created": not existed}
                os.mkdir(path)
        except OSError as exc:
            raise os_error(path, exc) from None
        return {"created": True}

    @staticmethod
    @as_requester
    def remove(req: dict[str, Any]) -> dict[str, Any]:
        path = check_path(req.get("path"))
        if is_root(path):
            # CONFLICT: a valid path, in a state that forbids it.
            raise RequestError(f"refusing to remove / ({path!r} is /)", CONFLICT)
        recursive = bool(req.get("recursive", False))
        try:
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                if recursive:
                    shutil.rmtree(path)
                else:
                    os.rmdir(path)
            else:
                os.unlink(path)
        except OSError as exc:
            if exc.errno == errno.ENOTEMPTY:
                raise RequestError(f"{path}: directory not empty (use recursive)", CONFLICT) from None
            raise os_error(path, exc) from None
        return {"removed": True}

    @staticmethod
    @as_requester
    def move(req: dict[str, Any]) -> dict[str, Any]:
        """Rename ``source`` to ``destination`` (its parents made first), as E2B's envd Move does;
        an existing file at the destination is replaced, a non-empty directory is a conflict."""
        source = check_path(req.get("source"))
        destination = check_path(req.get("destination"))
        if is_root(source) or is_root(destination):
            raise RequestError("refusing to move /", CONFLICT)
        try:
            os.lstat(source)
            os.makedirs(os.path.dirname(destination) or "/", exist_ok=True)
            try:
                os.rename(source, destination)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                shutil.move(source, destination)  # another filesystem: copy, then remove
            return info(destination, os.lstat(destination))
        except OSError as exc:
            where = destination if exc.filename == destination else source
            raise os_error(where, exc) from None

    # ------------------------------------------------------------------ reads

    @staticmethod
    @as_requester
    def read(req: dict[str, Any]) -> dict[str, Any]:
        path = check_path(req.get("path"))
        offset = int_arg(req, "offset", 0, 1 << 62)
        length = int_arg(req, "length", 1, FILE_CHUNK)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise os_error(path, exc) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                # A device (/dev/zero) would never end; a directory cannot be read.
                raise RequestError(f"{path}: not a regular file", CONFLICT)
            data = os.pread(fd, length, offset)
        except OSError as exc:
            raise os_error(path, exc) from None
        finally:
            os.close(fd)
        return {"data": base64.b64encode(data).decode("ascii"), "eof": len(data) < length}
