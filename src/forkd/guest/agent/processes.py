"""The table of processes the agent started, addressed by pid, and the requests on it.

Its own job because output must flow while the agent serves other requests, to
any number of watchers, without a thread per pipe and without growing without
bound. The table bounds how many processes run (``MAX_PROCESSES``) and how many
ended ones it keeps for their exit code and output (``MAX_EXITED_PROCESSES``);
each process keeps its newest output in a ring (``ring``), and one thread moves
every process's bytes (``process_io``, started with the first process).

A process ends when it has exited and its pipes are closed, or a short grace
after it exited (a background child it left, ``server &``, may hold them for
ever). Then every watcher gets its remaining output and the exit, and an exec's
summary goes back.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import OrderedDict
from typing import Any

from forkd.guest import protocol
from forkd.guest.agent.channel import Channel
from forkd.guest.agent.process import Process, b64
from forkd.guest.agent.process_io import ProcessIO
from forkd.guest.agent.reaper import Reaper
from forkd.guest.agent.ring import STDERR, STDOUT, Capture, Watch
from forkd.guest.agent.spawn import ProcessSpec, SpawnError, exec_result, set_size, spawn
from forkd.guest.protocol import CONFLICT, INVALID, NOT_FOUND, RequestError


class Processes:
    def __init__(self, reaper: Reaper, channel: Channel) -> None:
        self.reaper = reaper
        self.channel = channel
        self.lock = threading.Lock()
        self.running: dict[int, Process] = {}
        self.exited: OrderedDict[int, Process] = OrderedDict()
        self.watched: dict[Any, Process] = {}  # stream id -> the process it watches
        self.ended_cond = threading.Condition(self.lock)  # notified when a process ends
        self._io: ProcessIO | None = None

    # ------------------------------------------------------------ requests

    def start(self, req_id: Any, spec: ProcessSpec, *, stream: bool) -> dict[str, Any] | None:
        """Start a process to watch; with ``stream``, ``req_id`` watches it losslessly from its
        first byte and is answered at its end (returns None), else answered now."""
        popen = self._spawn(spec)
        proc = Process(popen, spec, retain=True)
        with self.lock:
            self._add(proc)
            if not stream:
                return proc.info()
            self.channel.event(req_id, {"type": protocol.EV_START, "pid": proc.pid})
            self._watch(proc, Watch(req_id, 0, lossless=True))
        return None

    def exec(self, req_id: Any, spec: ProcessSpec, cap: int) -> dict[str, Any] | None:
        """The ``exec`` action: output goes ahead as events, the summary answers at the end."""
        started = time.monotonic()
        try:
            popen = self._spawn(spec, raw=True)
        except SpawnError as exc:
            self.channel.event(req_id, {"type": STDERR, "data": b64(f"{exc}\n".encode())})
            return exec_result(exc.exit_code, str(exc), started)
        proc = Process(popen, spec, retain=False)
        proc.capture = Capture(req_id, cap, started)
        with self.lock:
            self._add(proc)
        return None

    def attach(self, req_id: Any, pid: int, from_start: bool) -> None:
        with self.lock:
            proc = self._find(pid)
            if len(proc.watches) >= protocol.MAX_STREAMS_PER_PROCESS:
                raise RequestError(f"process {pid} already has {len(proc.watches)} watchers", CONFLICT)
            self.channel.event(req_id, {"type": protocol.EV_START, "pid": proc.pid})
            # From the start: offset 0, so that output the ring no longer holds is reported (dropped).
            self._watch(proc, Watch(req_id, 0 if from_start else proc.ring.end, False))

    def detach(self, stream_id: Any) -> dict[str, Any]:
        """The host stops watching (usually a notification: the stream ends without a reply)."""
        with self.lock:
            proc = self.watched.pop(stream_id, None)
            if proc is not None:
                proc.watches.pop(stream_id, None)
                self.channel.forget(stream_id)
                self._consumed(proc)
        return {"detached": proc is not None}

    def ack(self, stream_id: Any, consumed: int) -> dict[str, Any]:
        """The host consumed ``consumed`` of a stream's window: it may send that much more."""
        with self.lock:
            proc = self.watched.get(stream_id)
            watch = proc.watches.get(stream_id) if proc is not None else None
            if proc is None or watch is None:
                return {}
            watch.credit = min(protocol.STREAM_WINDOW, watch.credit + max(0, consumed))
            if proc.pump(watch, self.channel):
                self.watched.pop(stream_id, None)
            self._consumed(proc)
        return {}

    def detach_all(self) -> None:
        """The host that watched is gone (disconnected, or this is a restored copy of the guest):
        no stream or exec capture is waited for any more; the processes run on."""
        with self.lock:
            for stream_id, proc in list(self.watched.items()):
                proc.watches.pop(stream_id, None)
                self.channel.forget(stream_id)
                self._consumed(proc)
            self.watched.clear()
            for proc in self.running.values():
                if proc.capture is not None:
                    self.channel.forget(proc.capture.req_id)
                    proc.capture = None

    def list(self) -> list[dict[str, Any]]:
        with self.lock:
            return [p.info() for p in self.running.values()]

    def info(self, pid: int) -> dict[str, Any]:
        with self.lock:
            return self._find(pid).info()

    def write_input(self, pid: int, data: bytes, eof: bool) -> dict[str, Any]:
        with self.lock:
            proc = self._find(pid)
            if not proc.stdin_open:
                raise RequestError(f"process {pid} has no open stdin (start it with stdin open)", CONFLICT)
            if len(proc.stdin_pending) + len(data) > protocol.STDIN_BUFFER_BYTES:
                raise RequestError(f"process {pid} has {len(proc.stdin_pending)} bytes of stdin it has "
                                   "not read yet; retry once it reads", CONFLICT)
            proc.stdin_pending += data
            proc.close_stdin_after = eof
            self._wake()
            return {"written": len(data)}

    def resize(self, pid: int, size: tuple[int, int]) -> dict[str, Any]:
        """Set the size (cols, rows) of a running process's terminal."""
        with self.lock:
            proc = self._find(pid)
            if proc.spec.pty is None:
                raise RequestError(f"process {pid} was not started on a terminal (pty)", CONFLICT)
            side = proc.pipes.get("stdin") or proc.pipes.get(STDOUT)
            if proc.ended or side is None:
                raise RequestError(f"process {pid} is not running", NOT_FOUND)
            set_size(side.fileno(), *size)
            proc.spec.pty = size
        return {"resized": True}

    def send_signal(self, pid: int, signum: object, group: bool, wait: float = 0) -> dict[str, Any]:
        """Signal a running process; with ``wait``, answer once it has ended (or ``wait`` s passed)."""
        if isinstance(signum, bool) or not isinstance(signum, int) or signum not in signal.valid_signals():
            raise RequestError(f"'signal' must be a signal number, not {signum!r}", INVALID)
        with self.lock:
            proc = self.running.get(pid)
            if proc is None or proc.returncode is not None:
                raise RequestError(f"process {pid} is not running", NOT_FOUND)
            try:
                if group:
                    os.killpg(pid, signum)  # its own session: the group id is its pid
                else:
                    os.kill(pid, signum)
            except ProcessLookupError:
                raise RequestError(f"process {pid} is not running", NOT_FOUND) from None
            ended = self.ended_cond.wait_for(lambda: proc.ended, wait) if wait > 0 else proc.ended
        return {"signalled": True, "ended": ended}

    # ----------------------------------------------- for the I/O thread

    def end(self, proc: Process) -> None:
        """It exited and its output is read (or the grace is over): answer, keep or forget it."""
        assert self._io is not None
        self._io.close_all(proc)
        proc.ended = True
        proc.ended_at = time.time()
        proc.grace_until = None
        self.ended_cond.notify_all()
        self.running.pop(proc.pid, None)
        if proc.retain:
            self.exited[proc.pid] = proc
            while len(self.exited) > protocol.MAX_EXITED_PROCESSES:
                self.exited.popitem(last=False)
        capture, proc.capture = proc.capture, None
        if capture is not None:
            self.channel.reply(capture.req_id, proc.exec_summary(capture))
        for watch in list(proc.watches.values()):
            if proc.pump(watch, self.channel):
                self.watched.pop(watch.id, None)

    def unwatch(self, stream_id: Any) -> None:
        """A watch that got its end."""
        self.watched.pop(stream_id, None)

    # ----------------------------------------------------------- the table

    def _spawn(self, spec: ProcessSpec, raw: bool = False) -> Any:
        with self.lock:
            if len(self.running) >= protocol.MAX_PROCESSES:
                raise RequestError(f"the sandbox already runs {len(self.running)} processes started by "
                                   "forkd; wait for one to end or kill one", CONFLICT)
        try:
            return spawn(spec, self.reaper)
        except SpawnError as exc:
            if raw:
                raise
            raise RequestError(str(exc), INVALID) from None

    def _find(self, pid: object) -> Process:
        if isinstance(pid, bool) or not isinstance(pid, int):
            raise RequestError("'pid' must be an integer", INVALID)
        proc = self.running.get(pid) or self.exited.get(pid)
        if proc is None:
            raise RequestError(f"no process {pid} (it may have ended long ago)", NOT_FOUND)
        return proc

    def _add(self, proc: Process) -> None:
        self.exited.pop(proc.pid, None)  # a pid the kernel reused
        self.running[proc.pid] = proc
        try:
            proc.pidfd = os.pidfd_open(proc.pid)
        except OSError:
            proc.pidfd = None  # the I/O thread then asks now and then
        if self._io is None:
            self._io = ProcessIO(self)
        self._wake()

    def _watch(self, proc: Process, watch: Watch) -> None:
        proc.watches[watch.id] = watch
        self.watched[watch.id] = proc
        if proc.pump(watch, self.channel):
            self.watched.pop(watch.id, None)

    def _consumed(self, proc: Process) -> None:
        """A watch moved on or went: the ring may shrink, and a held-back process be read again."""
        if proc.evict():
            self._wake()

    def _wake(self) -> None:
        if self._io is not None:
            self._io.wake()
