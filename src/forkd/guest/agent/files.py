"""The file actions: stat, list, mkdir, remove, and chunked reads and writes.

Its own job because a file transfer must never hold the channel: the host moves
a file in ``FILE_CHUNK`` pieces, one request each, so exec and eval requests
interleave with a transfer and no line ever grows past about 1.4 MiB.

Reads are stateless (``pread`` at an offset). Writes go to a temp file beside
the target, opened by ``file_write_open``; pieces land with ``pwrite`` at their
offset (so the host may keep a few in flight, in any order), and
``file_write_close`` renames the temp file over the target, or removes it, so a
failed upload never leaves half a file at the target path. A handle nobody
touched for ``IDLE_HANDLE_SECS`` (its host went away) is dropped on the next open.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import os
import secrets
import shutil
import stat
import tempfile
import threading
import time
from typing import Any

from forkd.guest.protocol import (
    CONFLICT,
    FILE_CHUNK,
    FILE_LIST_MAX,
    INVALID,
    NOT_FOUND,
    RequestError,
    check_path,
)

MAX_OPEN_WRITES = 64
IDLE_HANDLE_SECS = 600.0
TEMP_PREFIX = ".forkd-upload-"

_KIND_OF_ERRNO = {
    errno.ENOENT: NOT_FOUND,
    errno.ENOTDIR: CONFLICT,
    errno.EISDIR: CONFLICT,
    errno.ENOTEMPTY: CONFLICT,
    errno.EEXIST: CONFLICT,
    errno.ENAMETOOLONG: INVALID,
    errno.EINVAL: INVALID,
    errno.ELOOP: INVALID,
}


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


def info(path: str, st: os.stat_result) -> dict[str, Any]:
    return {
        "path": path,
        "name": os.path.basename(path.rstrip("/")) or "/",
        "type": file_type(st.st_mode),
        "size": st.st_size,
        "mode": stat.S_IMODE(st.st_mode),
        "mtime": st.st_mtime,
    }


def _int_arg(req: dict[str, Any], name: str, low: int, high: int) -> int:
    value = req.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RequestError(f"{name!r} must be an integer in {low}..{high}", INVALID)
    return value


class _Upload:
    def __init__(self, fd: int, temp: str, target: str, mode: int) -> None:
        self.fd = fd
        self.temp = temp
        self.target = target
        self.mode = mode
        self.touched = time.monotonic()

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        with contextlib.suppress(OSError):
            os.unlink(self.temp)


class Files:
    """The file actions; owns the uploads in progress."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.uploads: dict[str, _Upload] = {}

    # --------------------------------------------------------------- metadata

    @staticmethod
    def stat(req: dict[str, Any]) -> dict[str, Any]:
        path = check_path(req.get("path"))
        try:
            return info(path, os.stat(path))
        except FileNotFoundError:
            try:  # a dangling symlink is still there
                return info(path, os.lstat(path))
            except OSError as exc:
                raise os_error(path, exc) from None
        except OSError as exc:
            raise os_error(path, exc) from None

    @staticmethod
    def list(req: dict[str, Any]) -> dict[str, Any]:
        path = check_path(req.get("path"))
        entries: list[dict[str, Any]] = []
        truncated = False
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
                    entries.append(info(os.path.join(path, entry.name), st))
        except OSError as exc:
            raise os_error(path, exc) from None
        entries.sort(key=lambda e: str(e["name"]))
        return {"path": path, "entries": entries, "truncated": truncated}

    @staticmethod
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
    def remove(req: dict[str, Any]) -> dict[str, Any]:
        path = check_path(req.get("path"))
        if os.path.normpath(path) == "/":
            raise RequestError("refusing to remove /", INVALID)
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

    # ------------------------------------------------------------------ reads

    @staticmethod
    def read(req: dict[str, Any]) -> dict[str, Any]:
        path = check_path(req.get("path"))
        offset = _int_arg(req, "offset", 0, 1 << 62)
        length = _int_arg(req, "length", 1, FILE_CHUNK)
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

    # ----------------------------------------------------------------- writes

    def write_open(self, req: dict[str, Any]) -> dict[str, Any]:
        target = check_path(req.get("path"))
        if target.endswith("/"):
            raise RequestError(f"{target}: a file path cannot end with /", INVALID)
        mode = req.get("mode")
        if mode is not None:
            mode = _int_arg(req, "mode", 0, 0o7777)
        self._drop_idle()
        parent = os.path.dirname(target) or "/"
        try:
            st = os.stat(target)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise os_error(target, exc) from None
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise RequestError(f"{target}: is a directory", CONFLICT)
        if mode is None:
            # Overwriting keeps the file's permissions; a new file gets the usual 0644.
            mode = stat.S_IMODE(st.st_mode) if st is not None else 0o644
        if not os.path.isdir(parent):
            kind = NOT_FOUND if not os.path.exists(parent) else CONFLICT
            raise RequestError(f"{parent}: parent directory does not exist", kind)
        with self.lock:
            if len(self.uploads) >= MAX_OPEN_WRITES:
                raise RequestError(f"too many uploads in progress (at most {MAX_OPEN_WRITES})")
            try:
                fd, temp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=parent)
            except OSError as exc:
                raise os_error(parent, exc) from None
            handle = secrets.token_hex(8)
            self.uploads[handle] = _Upload(fd, temp, target, mode)
        return {"handle": handle}

    def _upload(self, req: dict[str, Any]) -> _Upload:
        handle = req.get("handle")
        with self.lock:
            upload = self.uploads.get(handle) if isinstance(handle, str) else None
        if upload is None:
            raise RequestError(f"no upload in progress with handle {handle!r}", NOT_FOUND)
        upload.touched = time.monotonic()
        return upload

    def write(self, req: dict[str, Any]) -> dict[str, Any]:
        upload = self._upload(req)
        offset = _int_arg(req, "offset", 0, 1 << 62)
        encoded = req.get("data")
        if not isinstance(encoded, str) or len(encoded) > 4 * (FILE_CHUNK // 3 + 1):
            raise RequestError(f"'data' must be base64 of at most {FILE_CHUNK} bytes", INVALID)
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise RequestError("'data' is not valid base64", INVALID) from None
        view = memoryview(data)
        try:
            while view:
                n = os.pwrite(upload.fd, view, offset)
                view = view[n:]
                offset += n
        except OSError as exc:
            raise os_error(upload.target, exc) from None
        return {"written": len(data)}

    def write_close(self, req: dict[str, Any]) -> dict[str, Any]:
        upload = self._upload(req)
        with self.lock:
            self.uploads.pop(str(req.get("handle")), None)
        if not req.get("commit"):
            upload.discard()
            return {"aborted": True}
        # The host closes only once every piece it sent has been answered.
        try:
            os.fchmod(upload.fd, upload.mode)
            os.close(upload.fd)
            os.replace(upload.temp, upload.target)
            return info(upload.target, os.stat(upload.target))
        except OSError as exc:
            upload.discard()
            raise os_error(upload.target, exc) from None

    def _drop_idle(self) -> None:
        cutoff = time.monotonic() - IDLE_HANDLE_SECS
        with self.lock:
            stale = [h for h, u in self.uploads.items() if u.touched < cutoff]
            dropped = [self.uploads.pop(h) for h in stale]
        for upload in dropped:
            upload.discard()
