"""How much of a child's RAM its guest has written since the restore, read from the host.

A child maps its snapshot's memory file privately (copy-on-write, see
``forkd.vmm.cmdline``): a page the guest writes becomes an anonymous page of
QEMU's, a page it only reads stays the file's. So the ``Anonymous`` (plus
``Swap``, for such pages swapped out) of that one mapping in
``/proc/<pid>/smaps`` is exactly the set of pages a dirty-page diff since the
restore would have to save. forkd 0.5's ``measure_diff`` reports that size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from forkd.errors import VMError

_KIB = 1024


def _mapping_size_kib(header: str) -> int | None:
    """The size in KiB of a smaps mapping header line ``start-end perms ... path``."""
    span = header.split(maxsplit=1)[0]
    start, sep, end = span.partition("-")
    if not sep:
        return None
    try:
        return (int(end, 16) - int(start, 16)) // _KIB
    except ValueError:
        return None


@dataclass(frozen=True)
class RamUsage:
    """Where a child's guest RAM is on the host, from its one mapping of the snapshot's memory file.

    ``private_bytes``: pages the guest wrote since the restore (anonymous copies, swapped ones
    included): the child's own. ``shared_bytes``: pages of the snapshot's file it has read and
    not written: in the page cache once, shared with the snapshot and every sibling that read them.
    Pages it never touched are neither.
    """

    ram_bytes: int
    private_bytes: int
    shared_bytes: int


def ram_usage(pid: int, ram_bytes: int, proc: Path = Path("/proc")) -> RamUsage:
    """The RAM mapping's private and shared bytes (see ``RamUsage``).

    The RAM mapping is the one file-backed mapping of exactly ``ram_bytes``;
    QEMU maps nothing else of the guest RAM's size from a file.
    """
    want_kib = ram_bytes // _KIB
    try:
        text = (proc / str(pid) / "smaps").read_text()
    except OSError as exc:
        raise VMError(f"cannot read the memory map of QEMU pid {pid}: {exc.strerror or exc}") from exc
    kib = {"Rss:": 0, "Anonymous:": 0, "Swap:": 0}
    found = False
    inside = False
    for line in text.splitlines():
        first = line.split(maxsplit=1)[0] if line.strip() else ""
        if "-" in first and not first.endswith(":"):  # a mapping header, not a "Key: value" line
            fields = line.split(maxsplit=5)
            inside = (len(fields) == 6 and fields[5].startswith("/")
                      and _mapping_size_kib(line) == want_kib)
            found = found or inside
        elif inside and first in kib:
            kib[first] += int(line.split()[1])
    if not found:
        raise VMError(f"QEMU pid {pid} has no file mapping of its {ram_bytes >> 20} MiB guest RAM")
    # Rss counts the resident anonymous copies too: what is left of it is the file's pages.
    return RamUsage(ram_bytes=ram_bytes, private_bytes=(kib["Anonymous:"] + kib["Swap:"]) * _KIB,
                    shared_bytes=max(0, kib["Rss:"] - kib["Anonymous:"]) * _KIB)


def written_ram_bytes(pid: int, ram_bytes: int, proc: Path = Path("/proc")) -> int:
    """Bytes of guest RAM the child has written since its restore (its private copies)."""
    return ram_usage(pid, ram_bytes, proc).private_bytes
