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
        reaped = 0
        me = os.getpid()
        with self.lock:
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                pid = int(entry)
                if pid in self.owned:
                    continue
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        stat = f.read()
                except OSError:
                    continue
                fields = stat.rsplit(")", 1)[-1].split()
                if len(fields) > 1 and fields[0] == "Z" and int(fields[1]) == me:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)
                        reaped += 1
        return reaped

    def run_forever(self, fallback_interval: float = 30.0) -> None:
        # Woken by SIGCHLD rather than polling: scanning /proc every second in
        # every one of N idle children costs real CPU under TCG.
        while True:
            self.wake.wait(fallback_interval)
            self.wake.clear()
            with contextlib.suppress(Exception):
                self.reap_orphans()
