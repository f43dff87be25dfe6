"""A diff's changes as a unified patch (``patch -p1`` applies it) or as a tar of the changed files.

Both are built in memory from content read off the two disks (``OpenDiff.content``, bounded per
file and per request), never from the host's filesystem: a guest's path only ever names a member
of the patch or the tar, relative (``a/…``, ``b/…``, ``work/…``), never a file on the host.
"""

from __future__ import annotations

import difflib
import io
import re
import tarfile
import time

from forkd.controller.diffs import Change, OpenDiff

_LINES = re.compile(rb"[^\n]*\n|[^\n]+\Z")
NO_NEWLINE = "\\ No newline at end of file\n"
# How much of a file is looked at to call it binary (a NUL byte, or not UTF-8), as git does.
BINARY_PROBE = 8000


def is_binary(data: bytes) -> bool:
    if b"\x00" in data[:BINARY_PROBE]:
        return True
    try:
        data.decode()
    except UnicodeDecodeError:
        return True
    return False


def _lines(data: bytes) -> list[str]:
    return [m.decode() for m in _LINES.findall(data)]


def unified(path: str, old: bytes | None, new: bytes | None) -> str:
    """One file's unified diff, git-style names (``a/``, ``b/``, ``/dev/null`` for a side that does
    not exist), a last line without its newline marked as ``diff`` marks it."""
    rel = path.lstrip("/")
    head = f"diff --git a/{rel} b/{rel}\n"
    if (old is not None and is_binary(old)) or (new is not None and is_binary(new)):
        left = f"a/{rel}" if old is not None else "/dev/null"
        right = f"b/{rel}" if new is not None else "/dev/null"
        return f"{head}Binary files {left} and {right} differ\n"
    before, after = _lines(old or b""), _lines(new or b"")
    out = [head]
    body = list(difflib.unified_diff(before, after, fromfile=f"a/{rel}" if old is not None else "/dev/null",
                                     tofile=f"b/{rel}" if new is not None else "/dev/null", n=3))
    if not body:  # an empty file added or deleted
        mode = "new" if old is None else "deleted"
        return f"{head}{mode} file mode 100644\n" if old is None or new is None else ""
    for line in body:
        out.append(line if line.endswith("\n") else line + "\n" + NO_NEWLINE)
    return "".join(out)


async def patch(opened: OpenDiff) -> bytes:
    """Every changed regular file's unified diff, in path order; other kinds named in a comment."""
    parts: list[str] = []
    for change in opened.changes:
        if not change.content_changed:
            continue
        old = await _content(opened, change, new=False)
        new = await _content(opened, change, new=True)
        if old is None and new is None:
            continue  # a directory, a link, a device: the JSON form lists it
        parts.append(unified(change.path, old, new))
    return "".join(parts).encode()


async def _content(opened: OpenDiff, change: Change, *, new: bool) -> bytes | None:
    stat = change.new if new else change.old
    if stat is None or stat.kind != "regular":
        return None
    return await opened.content(stat, new=new)


async def tar(opened: OpenDiff) -> bytes:
    """The added and modified paths as they are now (files with their content, directories, links;
    mode and owner kept), relative to the guest's root. Deletions are in the JSON form."""
    buf = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for change in opened.changes:
            stat = change.new
            if stat is None:
                continue
            info = tarfile.TarInfo(change.path.lstrip("/"))
            info.mode, info.uid, info.gid, info.mtime = stat.mode, stat.uid, stat.gid, now
            if stat.kind == "directory":
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            elif stat.kind == "symlink":
                if change.new_target is None:
                    continue
                info.type, info.linkname = tarfile.SYMTYPE, change.new_target
                archive.addfile(info)
            elif stat.kind == "regular":
                data = await opened.content(stat, new=True)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return buf.getvalue()
