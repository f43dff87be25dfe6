"""Reading a snapshot's memory file into the host's page cache (forkd 0.5's ``prewarm``).

Children map the file privately and fault its pages in as the guest touches
them; from a cold cache each such fault waits on the disk, and so does the
first BRANCH, which reads every page. Reading the file once beforehand turns
those waits into page-cache hits for every child of the snapshot. Holes (pages
that were zero) cost nothing to read.
"""

from __future__ import annotations

import os
from pathlib import Path

_CHUNK = 1 << 20


def prefetch(path: Path) -> int:
    """Read ``path`` through the page cache; returns the bytes read."""
    total = 0
    buf = bytearray(_CHUNK)
    with open(path, "rb", buffering=0) as f:
        # Starts readahead of the whole file at once; the reads below wait for it.
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
        while n := f.readinto(buf):
            total += n
    return total
