"""Worker threads for requests that block: fork/exec, disk I/O, the post-restore call.

Its own module because starting a thread per request costs more than most
requests (under TCG, a thread start is a large part of a round trip). Workers
are started as they are needed, up to a limit, and then kept: an idle worker
blocks on the queue and is never woken until there is work.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable

MAX_WORKERS = 32

Job = Callable[[], None]


class Workers:
    def __init__(self, limit: int = MAX_WORKERS) -> None:
        self.limit = limit
        self._jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0  # workers free to take a job, less the jobs already promised to them

    @property
    def threads(self) -> int:
        return self._threads

    def submit(self, job: Job) -> None:
        """Run ``job`` on a worker: an idle one, else a new one, else the next one free."""
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
            elif self._threads < self.limit:
                self._threads += 1
                threading.Thread(target=self._work, name=f"forkd-worker-{self._threads}", daemon=True).start()
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            with contextlib.suppress(BaseException):  # a job answers its own errors; the worker lives on
                job()
            with self._lock:
                self._idle += 1
