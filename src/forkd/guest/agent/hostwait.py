"""Waiting, without polling, for a host to connect to the agent's virtio-serial port.

Its own module because it is the one place where the agent would otherwise
wake up while idle: with no host connected, a read of the port returns at once,
and so does poll().
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import threading

# While no host is connected: how long to wait for the port's SIGIO before
# looking again anyway (a safety net; a connecting host wakes the agent at once).
HOST_WAIT_SECS = 30.0


class HostWait:
    """Waiting, without polling, for a host to connect to the virtio-serial port.

    While no host is connected a read returns at once, and so does poll(). The
    kernel's virtio_console driver sends SIGIO to the port's owner when the host
    side opens or closes (``O_ASYNC``), so the wait is for that signal: its
    handler writes to a wake-up pipe (``signal.set_wakeup_fd``). ``O_ASYNC`` is
    on only while waiting, so requests do not raise signals.
    """

    def __init__(self, fd: int, wake_r: int | None) -> None:
        self.fd = fd
        self.wake_r = wake_r  # None: no SIGIO (not the main thread, not a port): sleep and retry

    @classmethod
    def for_port(cls, fd: int) -> HostWait:
        if threading.current_thread() is not threading.main_thread():
            return cls(fd, None)
        try:
            wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            signal.signal(signal.SIGIO, lambda _sig, _frame: None)
            signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
            fcntl.fcntl(fd, fcntl.F_SETOWN, os.getpid())
        except (OSError, ValueError):
            return cls(fd, None)
        return cls(fd, wake_r)

    def wait(self) -> None:
        if self.wake_r is None:
            select.select([], [], [], 1.0)
            return
        flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
        fcntl.fcntl(self.fd, fcntl.F_SETFL, flags | os.O_ASYNC)
        try:
            while self._host_gone():
                select.select([self.wake_r], [], [], HOST_WAIT_SECS)
        finally:
            fcntl.fcntl(self.fd, fcntl.F_SETFL, flags & ~os.O_ASYNC)

    def _host_gone(self) -> bool:
        assert self.wake_r is not None
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wake_r, 4096):  # signals seen so far: start afresh
                pass
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        # The port reports POLLHUP while no host is connected (and POLLIN, as a read returns at once).
        return any(events & select.POLLHUP for _, events in poller.poll(0))
