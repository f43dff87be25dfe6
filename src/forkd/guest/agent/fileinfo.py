"""What a FileInfo says of a path: its type, size, mode, times, owner and group by name, a
link's target, and its metadata (``user.e2b.*`` extended attributes, envd 0.6.2).

Its own module because three agent parts describe files the same way: the file actions
(``files``), an upload's landing (``uploads``) and the entries of directory-watch events
(``watches``), and the host checks one shape.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from forkd.guest.agent.users import group_name, user_name
from forkd.guest.protocol import (
    METADATA_MAX_KEYS,
    METADATA_TOTAL_MAX,
    METADATA_XATTR_PREFIX,
    RequestError,
    check_metadata,
    metadata_size,
)


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


__all__ = ["file_type", "info", "read_metadata", "stat_info"]
