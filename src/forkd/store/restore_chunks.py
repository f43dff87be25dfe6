"""Which chunks of a snapshot's ``mem`` a restore touches: recorded once, carried, fetched first.

The first child restored from a snapshot on this host, once its agent has answered the
post-restore call, has touched (read or written) the guest pages a restore needs. Its
QEMU's pagemap over the guest-RAM mapping of ``mem`` says which (host/memdiff.py), and the
``GRID`` chunks (store/chunked.py, the unit a lazy import fetches) holding them are written,
once and atomically, to ``restore-chunks.json`` in the snapshot's directory. An export puts
them in the manifest (``restore_chunks``), and a lazy import fetches them before the rest
(store/lazyblob.py ``LazyBlob.fill``).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from forkd import bounds, jsondepth
from forkd.host import memdiff
from forkd.store.chunked import GRID
from forkd.store.manifest import BadManifest, parse_restore_chunks

FILE = "restore-chunks.json"


def chunks_of(runs: list[memdiff.Run], grid: int = GRID) -> list[int]:
    """The sorted chunk positions holding any page of ``runs``."""
    per = grid // memdiff.PAGE
    out: set[int] = set()
    for first, count in runs:
        out.update(range(first // per, (first + count - 1) // per + 1))
    return sorted(out)


def recorded(snapshot_dir: Path) -> bool:
    return (snapshot_dir / FILE).exists()


def record(snapshot_dir: Path, ram: memdiff.RamMapping, proc: Path = Path("/proc")) -> list[int] | None:
    """Write the chunks ``ram``'s process has touched to ``snapshot_dir``, unless already there
    (then None): written under a temporary name, then linked into place, so a reader never sees
    half a file and the first of several children restored at once wins."""
    target = snapshot_dir / FILE
    if target.exists():
        return None
    chunks = chunks_of(ram.touched(proc))
    tmp = snapshot_dir / f".{FILE}.{os.getpid()}.{ram.pid}.tmp"
    try:
        with open(tmp, "x") as f:
            json.dump({"grid": GRID, "chunks": chunks}, f)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, target)
        except FileExistsError:
            return None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return chunks


def read(snapshot_dir: Path, mem_size: int) -> tuple[int, ...]:
    """The recorded chunks of ``snapshot_dir`` (checked against its ``mem`` of ``mem_size``
    bytes); () when none were recorded or the file is unusable (it is only a hint)."""
    try:
        d = jsondepth.loads((snapshot_dir / FILE).read_bytes(), bounds.MAX_JSON_DEPTH)
    except (OSError, ValueError):
        return ()
    if not isinstance(d, dict) or d.get("grid") != GRID:
        return ()
    try:
        return parse_restore_chunks(d.get("chunks"), mem_size, str(snapshot_dir / FILE))
    except BadManifest:
        return ()


__all__ = ["FILE", "chunks_of", "read", "record", "recorded"]
