"""Reaping zombies: PID 1 inherits every orphan in the guest and must wait for them.

Without it, a process that a user's command left behind (``server &``) becomes
a zombie for ever when it exits.
"""

from __future__ import annotations

import contextlib
import os
import threading


class Reaper:
    """Reaps orphans re-parented to PID 1 without stealing ``subprocess``'s children.

    ``os.waitpid(-1)`` would race with ``Popen.wait`` and lose exit codes, so the
    reaper only waits for zombie children it does not own: pids spawned by exec
    are registered under the same lock that guards the scan.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owned: set[int] = set()
        self.wake = threading.Event()  # set from the SIGCHLD handler

    def reap_orphans(self) -> int:
        # Cheap first: no zombie child at all (ours are reaped as they exit) means no scan.
        try:
            if os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                return 0
        except ChildProcessError:
            return 0
        # The scan of /proc runs without the lock, so that it never delays a spawn;
        # each candidate is checked again under it (a spawn holds the lock until
        # its pid is in ``owned``, so a fresh child's zombie is never taken).
        me = os.getpid()
        candidates = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[-1].split()
            if len(fields) > 1 and fields[0] == "Z" and int(fields[1]) == me:
                candidates.append(int(entry))
        reaped = 0
        for pid in candidates:
            with self.lock:
                if pid in self.owned:
                    continue
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
                    reaped += 1
        return reaped

    def run_forever(self) -> None:
        # Woken by SIGCHLD only, never by a timer: scanning /proc, or merely
        # waking, in every one of N idle children costs real CPU under TCG. A
        # signal is never lost: its Python handler runs on the main thread,
        # whose reads and selects are interrupted for it.
        while True:
            self.wake.wait()
            self.wake.clear()
            with contextlib.suppress(Exception):
                self.reap_orphans()
