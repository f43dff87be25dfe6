"""A cache of file digests (store/chunked.py's), so pushing the same snapshot or base twice reads it once.

Snapshot files and guest images never change once written, so a digest stays
valid while the file's identity and stamps (device, inode, size, mtime, ctime)
do; any change to those makes it miss. Kept as one small JSON file, written
atomically; a damaged cache is simply rebuilt.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path

from forkd.store import chunked

MAX_ENTRIES = 4096


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


class DigestCache:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()

    def _load(self) -> dict[str, dict[str, object]]:
        try:
            data = json.loads(self._path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def sha256(self, path: Path) -> str:
        """The digest of ``path``'s logical content (see store/chunked.py), cached."""
        key = str(path.resolve())
        stamp = _stamp(os.stat(path))
        with self._lock:
            entry = self._load().get(key)
        if entry and entry.get("stamp") == stamp and isinstance(entry.get("sha256"), str):
            return str(entry["sha256"])
        sha, _ = chunked.digest(path)
        if _stamp(os.stat(path)) != stamp:  # changed while we read it: do not remember
            return sha
        with self._lock:
            data = self._load()
            data[key] = {"stamp": stamp, "sha256": sha}
            if len(data) > MAX_ENTRIES:  # drop entries of files that are gone, then the oldest
                data = {k: v for k, v in data.items() if os.path.exists(k)}
                data = dict(list(data.items())[-MAX_ENTRIES:])
            tmp = self._path.with_name(f".{self._path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
            try:
                self._path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(json.dumps(data))
                os.replace(tmp, self._path)
            except OSError:  # a read-only images dir, a full disk: only a cache, the digest stands
                with contextlib.suppress(OSError):
                    tmp.unlink(missing_ok=True)
        return sha


__all__ = ["DigestCache"]
