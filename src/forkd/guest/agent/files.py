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

from forkd.guest.agent.users import as_requester, group_name, user_name
from forkd.guest.protocol import (
    CONFLICT,
    FILE_CHUNK,
    FILE_LIST_MAX,
    INVALID,
    MAX_REPLY_LINE,
    METADATA_MAX_KEYS,
    METADATA_TOTAL_MAX,
    METADATA_XATTR_PREFIX,
    NOT_FOUND,
    RequestError,
    check_metadata,
    check_path,
    metadata_size,
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


def file_type(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def read_metadata(path: str, follow: bool) -> dict[str, str]:
    """The file's metadata: its ``user.e2b.*`` extended attributes, prefix stripped. Only pairs
    that ``check_metadata`` accepts, within its bounds (a pair set out of band that is not, or
    that would outgrow them, is left out), so the host's check of the reply holds. A file whose
    attributes cannot be read (a filesystem without them, a file the user may not read) has none.
    """
    found: dict[str, str] = {}
    total = 0
    try:
        names = sorted(os.listxattr(path, follow_symlinks=follow))
    except OSError:
        return found
    for name in names:
        if not name.startswith(METADATA_XATTR_PREFIX) or len(found) >= METADATA_MAX_KEYS:
            continue
        key = name[len(METADATA_XATTR_PREFIX):]
        try:
            value = os.getxattr(path, name, follow_symlinks=follow).decode("ascii")
            check_metadata({key: value})
        except (OSError, UnicodeDecodeError, RequestError):
            continue  # gone meanwhile, unreadable, or not a pair E2B could have written
        if total + metadata_size(key, value) > METADATA_TOTAL_MAX:
            continue
        total += metadata_size(key, value)
        found[key] = value
    return found


def info(path: str, st: os.stat_result, target: str | None = None, *,
         follow: bool = False) -> dict[str, Any]:
    """A FileInfo; ``target``: where a symbolic link at ``path`` resolves to (absolute);
    ``follow``: ``st`` is what a link at ``path`` points to, so its metadata is the target's."""
    out: dict[str, Any] = {
        "path": path,
        "name": os.path.basename(path.rstrip("/")) or "/",
        "type": file_type(st.st_mode),
        "size": st.st_size,
        "mode": stat.S_IMODE(st.st_mode),
        "mtime": st.st_mtime,
        "owner": user_name(st.st_uid),
        "group": group_name(st.st_gid),
    }
    if target is not None:
        out["target"] = target
    metadata = read_metadata(path, follow)
    if metadata:
        out["metadata"] = metadata
    return out


def stat_info(path: str) -> dict[str, Any]:
    """``path``'s FileInfo as ``file_stat`` answers it: a symbolic link shows its target's type,
    size and metadata (and the resolved ``target``). Raises OSError."""
    st = os.lstat(path)
    if not stat.S_ISLNK(st.st_mode):
        return info(path, st)
    target = os.path.realpath(path)
    try:
        return info(path, os.stat(path), target, follow=True)
    except FileNotFoundError:  # a dangling symlink is still there
        return info(path, st, target)


def int_arg(req: dict[str, Any], name: str, low: int, high: int) -> int:
    value = req.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RequestError(f"{name!r} must be an integer in {low}..{high}", INVALID)
    return value


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
    @as_requester
    def mkdir(req: dict[str, Any]) -> dict[str, Any]:
        path = check_path(req.get("path"))
        parents = bool(req.get("parents", False))
        try:
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
