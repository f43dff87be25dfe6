"""The upload actions: a file written in pieces to a temp file, then renamed over its target.

Its own job because an upload is the agent's only state that spans requests:
``file_write_open`` makes a temp file beside the target and a handle for it;
the upload's metadata (extended attributes) is set on the temp file first;
pieces land with ``pwrite`` at their offset (so the host may keep a few in
flight, in any order); ``file_write_close`` renames the temp file over the
target, or removes it, so a failed upload never leaves half a file at the
target path. A handle nobody touched for ``IDLE_HANDLE_SECS`` (its host went
away) is dropped on the next open.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import secrets
import stat
import tempfile
import threading
import time
from typing import Any

from forkd.guest.agent.fileinfo import info
from forkd.guest.agent.files import int_arg, os_error
from forkd.guest.agent.users import GuestUser, as_requester, as_user, user_field
from forkd.guest.protocol import (
    CONFLICT,
    FILE_CHUNK,
    INVALID,
    METADATA_XATTR_PREFIX,
    NOT_FOUND,
    RequestError,
    check_metadata,
    check_path,
)

MAX_OPEN_WRITES = 64
IDLE_HANDLE_SECS = 600.0
TEMP_PREFIX = ".forkd-upload-"
# Whether each recent upload's target existed before its temp file was renamed over it, for
# the directory watchers (``watches``): envd writes in place, so its watchers see a new file's
# create or an old one's write, never our temp file; this is how ours can say the same.
LANDED_MAX = 256
_landed: dict[str, bool] = {}


def landed_over(target: str) -> bool | None:
    """Whether the upload renamed onto ``target`` replaced a file (None: not an upload's)."""
    return _landed.pop(target, None)


def _note_landing(target: str) -> None:
    if len(_landed) >= LANDED_MAX:
        _landed.pop(next(iter(_landed)), None)  # the oldest: nobody watched it land
    _landed[target] = os.path.lexists(target)


class _Upload:
    def __init__(self, fd: int, temp: str, target: str, mode: int, user: GuestUser | None) -> None:
        self.fd = fd
        self.user = user  # who writes it: the temp file is theirs, and so is the rename over the target
        self.temp = temp
        self.target = target
        self.mode = mode
        self.touched = time.monotonic()

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        with contextlib.suppress(OSError):
            os.unlink(self.temp)


class Uploads:
    """The uploads in progress, by handle."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.uploads: dict[str, _Upload] = {}

    def write_open(self, req: dict[str, Any]) -> dict[str, Any]:
        return as_requester(self._write_open)(req)

    def _write_open(self, req: dict[str, Any]) -> dict[str, Any]:
        target = check_path(req.get("path"))
        if target.endswith("/"):
            raise RequestError(f"{target}: a file path cannot end with /", INVALID)
        mode = req.get("mode")
        if mode is not None:
            mode = int_arg(req, "mode", 0, 0o7777)
        metadata = check_metadata(req.get("metadata"))
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
            try:
                # Before any data, so a filesystem without them refuses the upload at once; on
                # the temp file, so the target changes, metadata and all, only at the rename.
                for key, value in metadata.items():
                    os.setxattr(fd, METADATA_XATTR_PREFIX + key, value.encode("ascii"))
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                raise os_error(target, exc) from None
            handle = secrets.token_hex(8)
            self.uploads[handle] = _Upload(fd, temp, target, mode, user_field(req))
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
        offset = int_arg(req, "offset", 0, 1 << 62)
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
            with as_user(upload.user):
                os.fchmod(upload.fd, upload.mode)
                os.close(upload.fd)
                _note_landing(upload.target)
                os.replace(upload.temp, upload.target)
                return info(upload.target, os.stat(upload.target), follow=True)
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
