"""A guest's shared-volume ops performed on the volume's files: ``apply``, which never raises.

Its own module because reading a hostile guest's op is one job (its op name, path and fields
checked and bounded, its answer built, every failure an errno) and the files are another
(``volume_dir.HostDir``: confinement and quota). The wire is ``guest/volume_messages.py``.
"""

from __future__ import annotations

import base64
import binascii
import errno
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from forkd.guest.volume_messages import (
    MAX_IO,
    MUTATING,
    OPS,
    READDIR_PAGE,
    VolOp,
    VolReplyNotice,
    VolStatfs,
    check_path,
)
from forkd.vmm.beneath import Refused
from forkd.vmm.volume_tree import BLOCK, MAX_TREE_ENTRIES, MODE_MASK

if TYPE_CHECKING:
    from forkd.vmm.volume_dir import HostDir

log = logging.getLogger("forkd.volume_ops")

MAX_ID = (1 << 32) - 2  # a uid/gid; (1 << 32) - 1 is chown's "no change"
MAX_TIME_NS = 1 << 62
MAX_OFFSET = 1 << 62  # an offset or a size a guest names (a file is no larger than the quota anyway)
RENAME_NOREPLACE = 1
_MAX_B64 = 4 * ((MAX_IO + 2) // 3)  # a write's base64, bounded before it is decoded

Handler = Callable[["HostDir", VolOp, str, VolReplyNotice], None]


def apply(files: HostDir, op: VolOp, slot: int, *, read_only: bool) -> VolReplyNotice:
    """Perform one op of a guest's FUSE server on ``files``; never raises (an errno instead)."""
    seq = op.get("seq", 0)
    reply = VolReplyNotice(slot=slot, seq=seq if isinstance(seq, int) else 0, errno=0)
    name = op.get("op")
    try:
        if name not in OPS:
            raise Refused(errno.ENOSYS, f"unknown op {str(name)[:40]!r}")
        if read_only and name in MUTATING:
            raise Refused(errno.EROFS)
        HANDLERS[str(name)](files, op, _path(op.get("path"), "path"), reply)
    except Refused as exc:
        return VolReplyNotice(slot=slot, seq=reply["seq"], errno=exc.errno)
    except OSError as exc:
        return VolReplyNotice(slot=slot, seq=reply["seq"], errno=exc.errno or errno.EIO)
    except Exception:
        log.exception("volume %s: op %s failed", files.root, str(name)[:40])
        return VolReplyNotice(slot=slot, seq=reply["seq"], errno=errno.EIO)
    return reply


def _int(op: VolOp, key: str, lo: int, hi: int, default: int | None = None) -> int:
    value = op.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise Refused(errno.EINVAL, f"{key} must be an integer in [{lo}, {hi}]")
    return value


def _path(value: object, what: str) -> str:
    try:
        return check_path(value, what)
    except ValueError as exc:
        raise Refused(errno.EINVAL, str(exc)) from None


def _ids(op: VolOp) -> tuple[int, int]:
    return _int(op, "uid", 0, MAX_ID), _int(op, "gid", 0, MAX_ID)


def _getattr(files: HostDir, op: VolOp, path: str, reply: VolReplyNotice) -> None:
    reply["attr"] = files.attr(path)


def _statfs(files: HostDir, op: VolOp, path: str, reply: VolReplyNotice) -> None:
    used, entries = files.usage()
    reply["statfs"] = VolStatfs(bsize=BLOCK, blocks=files.quota // BLOCK,
                                bfree=max(0, files.quota - used) // BLOCK, files=files.max_entries,
                                ffree=max(0, files.max_entries - entries))


def _readdir(files: HostDir, op: VolOp, path: str, reply: VolReplyNotice) -> None:
    offset = _int(op, "offset", 0, MAX_TREE_ENTRIES, 0)
    entries = files.entries(path)
    reply["entries"] = entries[offset:offset + READDIR_PAGE]
    reply["more"] = offset + READDIR_PAGE < len(entries)


def _mkdir(files: HostDir, op: VolOp, path: str, reply: VolReplyNotice) -> None:
    uid, gid = _ids(op)
    mode = _int(op, "mode", 0, 0o7777, 0o755) & MODE_MASK
    reply["attr"] = files.make_dir(path, mode, uid, gid)


def _create(files: HostDir, op: VolOp, path: str, reply: VolReplyNotice) -> None:
    uid, gid = _ids(op)
    mode = _int(op, "mode", 0, 0o7777, 0o644) & MODE_MASK
    reply["attr"] = files.create(path, mode, uid, gid, op.get("exclusive") is True)


def _unlink(files: HostDir, op: VolOp, path: str, reply: VolReplyNotice) -> None:
    files.remove_entry(path, directory=False)


def _rmdir(files: HostDir, op: VolOp, path: str, reply: VolReplyNotice) -> None:
    files.remove_entry(path, directory=True)


def _rename(files: HostDir, op: VolOp, path: str, reply: VolReplyNotice) -> None:
    files.move(path, _path(op.get("to"), "to"), _int(op, "flags", 0, RENAME_NOREPLACE, 0))


def _setattr(files: HostDir, op: VolOp, path: str, reply: VolReplyNotice) -> None:
    mode = _int(op, "mode", 0, 0o7777) & MODE_MASK if "mode" in op else None
    uid = _int(op, "owner_uid", 0, MAX_ID) if "owner_uid" in op else None
    gid = _int(op, "owner_gid", 0, MAX_ID) if "owner_gid" in op else None
    size = _int(op, "size", 0, MAX_OFFSET) if "size" in op else None
    atime, mtime = (_int(op, key, -MAX_TIME_NS, MAX_TIME_NS) if key in op else None
                    for key in ("atime_ns", "mtime_ns"))
    if size is not None:
        files.truncate(path, size)
    if uid is not None or gid is not None or mode is not None:
        files.set_mode_owner(path, mode, uid, gid)
    if atime is not None or mtime is not None:
        files.set_times(path, atime, mtime)
    reply["attr"] = files.attr(path)


def _read(files: HostDir, op: VolOp, path: str, reply: VolReplyNotice) -> None:
    data = files.read_at(path, _int(op, "offset", 0, MAX_OFFSET), _int(op, "size", 0, MAX_IO))
    reply["data"] = base64.b64encode(data).decode("ascii")


def _write(files: HostDir, op: VolOp, path: str, reply: VolReplyNotice) -> None:
    raw = op.get("data")
    if not isinstance(raw, str) or len(raw) > _MAX_B64:
        raise Refused(errno.EINVAL, "data must be base64 of at most MAX_IO bytes")
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise Refused(errno.EINVAL, "data is not base64") from None
    if len(data) > MAX_IO:
        raise Refused(errno.EINVAL, "data is longer than MAX_IO")
    append = op.get("append") is True
    offset = 0 if append else _int(op, "offset", 0, MAX_OFFSET)
    reply["written"] = files.write_at(path, data, offset, append)


def _symlink(files: HostDir, op: VolOp, path: str, reply: VolReplyNotice) -> None:
    target = op.get("target")
    raw = os.fsencode(target) if isinstance(target, str) else b""
    if not raw or len(raw) >= 4096 or b"\0" in raw:
        raise Refused(errno.EINVAL, "a symlink's target is 1 to 4095 bytes without NUL")
    uid, gid = _ids(op)
    reply["attr"] = files.symlink(path, os.fsdecode(raw), uid, gid)


def _readlink(files: HostDir, op: VolOp, path: str, reply: VolReplyNotice) -> None:
    reply["target"] = files.readlink(path)


def _link(files: HostDir, op: VolOp, path: str, reply: VolReplyNotice) -> None:
    to = _path(op.get("to"), "to")
    if to == "":
        raise Refused(errno.EEXIST)
    reply["attr"] = files.link(path, to)


def _fsync(files: HostDir, op: VolOp, path: str, reply: VolReplyNotice) -> None:
    files.fsync(path)


HANDLERS: dict[str, Handler] = {
    "getattr": _getattr, "statfs": _statfs, "readdir": _readdir, "mkdir": _mkdir, "create": _create,
    "unlink": _unlink, "rmdir": _rmdir, "rename": _rename, "setattr": _setattr, "read": _read,
    "write": _write, "symlink": _symlink, "readlink": _readlink, "link": _link, "fsync": _fsync,
}
assert set(HANDLERS) == set(OPS)

__all__ = ["HANDLERS", "MAX_ID", "RENAME_NOREPLACE", "apply"]
