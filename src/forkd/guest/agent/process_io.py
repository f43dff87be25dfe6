"""The one thread that moves the bytes of every process: pipes, stdin, exits, deadlines.

Its own module because it is the only code that waits: on every process's
stdout and stderr, on its stdin while there is input for it, on a pidfd per
process for its exit (``selectors``, epoll), and until the nearest deadline (a
timeout, an output grace). Nothing due, it blocks for ever, so an idle guest is
never woken by it. It is the only code that registers or closes a process's
fds; the table's other users change state under the lock and ``wake`` it.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import threading
import time
from typing import TYPE_CHECKING

from forkd.guest import protocol
from forkd.guest.agent.process import Process
from forkd.guest.agent.ring import STDERR, STDOUT

if TYPE_CHECKING:
    from forkd.guest.agent.processes import Processes

# Once a process has exited (or its group was killed), how long to keep reading
# its pipes: a background process it left behind may hold them open for ever.
OUTPUT_GRACE_SECS = 1.0
# How often an exit is checked for where no pidfd could be opened (a kernel before 5.3).
NO_PIDFD_POLL_SECS = 1.0


class ProcessIO:
    def __init__(self, table: Processes) -> None:
        self.table = table
        self.selector = selectors.DefaultSelector()
        self.registered: dict[int, tuple[int, tuple[str, Process | None]]] = {}
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.selector.register(self.wake_r, selectors.EVENT_READ, ("wake", None))
        self.registered[self.wake_r] = (selectors.EVENT_READ, ("wake", None))
        self.thread = threading.Thread(target=self.run, name="forkd-processes", daemon=True)
        self.thread.start()

    def wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self.wake_w, b"\0")

    def run(self) -> None:
        lock = self.table.lock
        while True:
            with lock:
                self.sync_registrations()
                timeout = self.next_timeout()
            ready = self.selector.select(timeout)
            with lock:
                for key, _ in ready:
                    kind, proc = key.data
                    if kind == "wake":
                        with contextlib.suppress(BlockingIOError):
                            while os.read(self.wake_r, 4096):
                                pass
                    elif proc is None or proc.ended:
                        continue
                    elif kind == "exit":
                        self.on_exit(proc)
                    elif kind == "stdin":
                        self.write_stdin(proc)
                    else:
                        self.read(proc, kind)
                self.run_timers(time.monotonic())

    # ------------------------------------------------------- registrations

    def sync_registrations(self) -> None:
        """What the selector waits for, from the processes' state."""
        wanted: dict[int, tuple[int, tuple[str, Process | None]]] = {
            self.wake_r: (selectors.EVENT_READ, ("wake", None))}
        for proc in list(self.table.running.values()):
            if proc.pidfd is not None and proc.returncode is None:
                wanted[proc.pidfd] = (selectors.EVENT_READ, ("exit", proc))
            if not proc.held_back():
                for name in (STDOUT, STDERR):
                    if name in proc.pipes:
                        wanted[proc.pipes[name].fileno()] = (selectors.EVENT_READ, (name, proc))
            if "stdin" in proc.pipes:
                if proc.stdin_pending:
                    wanted[proc.pipes["stdin"].fileno()] = (selectors.EVENT_WRITE, ("stdin", proc))
                elif proc.close_stdin_after:
                    self.close_pipe(proc, "stdin")
        for fd, entry in list(self.registered.items()):
            if wanted.get(fd) != entry:
                self.forget_fd(fd)
        for fd, (events, data) in wanted.items():
            if fd not in self.registered:
                self.selector.register(fd, events, data)
                self.registered[fd] = (events, data)

    def next_timeout(self) -> float | None:
        now = time.monotonic()
        running = self.table.running.values()
        due = [t for p in running for t in (p.deadline, p.grace_until) if t is not None]
        if any(p.pidfd is None and p.returncode is None for p in running):
            due.append(now + NO_PIDFD_POLL_SECS)
        return max(0.0, min(due) - now) if due else None

    def forget_fd(self, fd: int) -> None:
        if self.registered.pop(fd, None) is not None:
            self.selector.unregister(fd)

    def close_pipe(self, proc: Process, name: str) -> None:
        pipe = proc.pipes.pop(name, None)
        if pipe is not None:
            self.forget_fd(pipe.fileno())
            with contextlib.suppress(OSError):
                pipe.close()

    # -------------------------------------------------------------- events

    def read(self, proc: Process, name: str) -> None:
        try:
            data = os.read(proc.pipes[name].fileno(), protocol.OUTPUT_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close_pipe(proc, name)
            if proc.returncode is not None and not proc.reading:
                self.table.end(proc)
            return
        for watch in proc.output(name, data, self.table.channel):
            self.table.unwatch(watch.id)

    def write_stdin(self, proc: Process) -> None:
        try:
            n = os.write(proc.pipes["stdin"].fileno(), proc.stdin_pending[:protocol.OUTPUT_CHUNK])
        except BlockingIOError:
            return
        except OSError:  # it closed its stdin (EPIPE): what it did not read is gone
            proc.stdin_pending.clear()
            proc.close_stdin_after = True
            self.close_pipe(proc, "stdin")
            return
        del proc.stdin_pending[:n]

    def on_exit(self, proc: Process) -> None:
        if proc.popen.poll() is None:
            return
        proc.returncode = proc.popen.returncode
        reaper = self.table.reaper
        with reaper.lock:
            reaper.owned.discard(proc.pid)
        if proc.pidfd is not None:
            fd, proc.pidfd = proc.pidfd, None
            self.forget_fd(fd)
            os.close(fd)
        if proc.reading:
            proc.grace_until = time.monotonic() + OUTPUT_GRACE_SECS
        else:
            self.table.end(proc)

    def run_timers(self, now: float) -> None:
        for proc in list(self.table.running.values()):
            if proc.pidfd is None and proc.returncode is None:
                self.on_exit(proc)
            if proc.deadline is not None and now >= proc.deadline and proc.returncode is None:
                proc.deadline = None
                proc.timed_out = True
                self.kill_group(proc)
            if proc.grace_until is not None and now >= proc.grace_until:
                if proc.held_back():  # a lossless watcher still reads: wait for it
                    proc.grace_until = now + OUTPUT_GRACE_SECS
                    continue
                proc.grace_until = None
                if proc.timed_out:
                    self.kill_group(proc)  # what it left behind in its group too
                self.table.end(proc)

    def close_all(self, proc: Process) -> None:
        for name in (STDOUT, STDERR, "stdin"):
            self.close_pipe(proc, name)

    @staticmethod
    def kill_group(proc: Process) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
