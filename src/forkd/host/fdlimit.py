"""The daemon's file-descriptor limit, raised to what the host allows.

A live sandbox holds about three descriptors in the process that drives it (its
QMP and agent sockets, the child watcher's pidfd), so the usual soft limit of
1024 would cap a host at roughly 300 sandboxes long before memory or CPU do.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("forkd.fdlimit")


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; the soft limit in force afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, target, exc)
    return soft
