"""A guest's serial console on the host: a capped log file.

The guest is hostile: it can write to its serial port without end, and QEMU
appends all of it to ``console.log`` (39 MB in two minutes was measured from
one ``head -c … /dev/zero > /dev/ttyS0``). QEMU opens the file in append mode
(``-chardev file,append=on``), so the daemon can cut it under QEMU's feet:
when a log grows past ``MAX_BYTES``, its last ``KEEP_BYTES`` go to
``console.log.prev`` and the log starts again from zero. A log therefore
never holds more than what the guest writes between two checks beyond the
cap, and the last words a failure message quotes are kept.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

MAX_BYTES = 1 << 20
KEEP_BYTES = 64 << 10
CHECK_INTERVAL_SECS = 1.0


def previous(log: Path) -> Path:
    return log.with_name(log.name + ".prev")


def cap(log: Path, max_bytes: int = MAX_BYTES, keep: int = KEEP_BYTES) -> bool:
    """Cut ``log`` if it is over ``max_bytes``, keeping its tail in ``.prev``; True if cut."""
    try:
        size = log.stat().st_size
    except OSError:
        return False
    if size <= max_bytes:
        return False
    with open(log, "rb") as f:
        f.seek(max(0, size - keep))
        tail = f.read(keep)
    tmp = previous(log).with_suffix(".tmp")
    tmp.write_bytes(tail)
    os.replace(tmp, previous(log))
    # QEMU writes with O_APPEND: after the truncation its next write lands at 0.
    with contextlib.suppress(OSError):
        os.truncate(log, 0)
    return True


def cap_all(logs: Iterable[Path], max_bytes: int = MAX_BYTES) -> int:
    """Cap every log in ``logs``; how many were cut."""
    return sum(cap(log, max_bytes) for log in logs)


def read_tail(log: Path, lines: int) -> str:
    """The last ``lines`` lines of the console, across the cut if there was one."""
    text = ""
    for path in (previous(log), log):
        with contextlib.suppress(OSError), open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - KEEP_BYTES))
            text += f.read().decode(errors="replace")
    return "\n".join(text.strip().splitlines()[-lines:])


# The test suite names a directory here: a sandbox's console is copied into it when its run
# directory goes, so a failed test can keep the consoles of the VMs it used (tests/integration).
KEEP_DIR_ENV = "FORKD_KEEP_CONSOLES"


def keep_for_debugging(run_dir: Path) -> None:
    """Copy ``run_dir``'s console (its tail too) to ``$FORKD_KEEP_CONSOLES/<run dir name>.console.log``,
    if that is set; best effort, never in the way of a teardown."""
    keep = os.environ.get(KEEP_DIR_ENV)
    if not keep:
        return
    log = run_dir / "console.log"
    with contextlib.suppress(OSError):
        if not log.exists():
            return
        # An empty one says something too: a restored guest prints nothing unless it fails.
        data = b"".join(p.read_bytes() for p in (previous(log), log) if p.exists())
        Path(keep).mkdir(parents=True, exist_ok=True)
        (Path(keep) / f"{run_dir.name}.console.log").write_bytes(data[-(MAX_BYTES + KEEP_BYTES):])
