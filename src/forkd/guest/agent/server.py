"""The agent's server: the serve loop, and dispatch of each request to the job that answers it.

Its own module so that each job stays a plain function of a request, and the framing, the
concurrency, the check of each request against its type (``forkd.guest.messages.check_request``)
and the rule that PID 1 outlives any bad request live in one place. ``serve`` reads the port (or,
in tests, a pipe or a socket); the wire format is ``forkd.guest.protocol``'s.

Where a request runs: on the serve loop itself, what never blocks (``ping``, handing an eval to the
evaluator, every process request but a start, a shared volume's polls and replies); on a worker
(``forkd.guest.agent.workers``), what may block (starting a process, the file actions, the
post-restore call, ``sync``, freezing, mounting a volume). Nothing the agent runs wakes it while
it is idle: the serve loop blocks in ``read`` on the port; while no host is connected (the read
returns at once) it waits for the port's SIGIO, which the kernel sends when a host connects.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from forkd.guest import messages, protocol
from forkd.guest.agent import kernel_specs
from forkd.guest.agent.channel import Channel
from forkd.guest.agent.contexts import CodeContexts
from forkd.guest.agent.evaluator import Evaluator
from forkd.guest.agent.files import Files
from forkd.guest.agent.freeze import RootFreezer, check_freeze_mounts
from forkd.guest.agent.hostwait import HostWait
from forkd.guest.agent.kernels import Kernels
from forkd.guest.agent.processes import Processes
from forkd.guest.agent.reaper import Reaper
from forkd.guest.agent.restore import RESTORES_KEY, capabilities, reseed_after_restore
from forkd.guest.agent.setup import pid1_defaults
from forkd.guest.agent.spawn import bool_field, decode_b64, int_field, parse_exec, parse_size, parse_start
from forkd.guest.agent.uploads import Uploads
from forkd.guest.agent.volume_mounts import VolumeMounts
from forkd.guest.agent.warm import warm_up
from forkd.guest.agent.watches import Watches
from forkd.guest.agent.workers import Workers
from forkd.guest.capabilities import AGENT_VERSION

READ_CHUNK = 1 << 16
# A signal request waits at most this long for the process to end (``wait_ms``).
MAX_SIGNAL_WAIT_SECS = 10.0

# A handler answers with a result, or None when the answer comes later (a stream,
# an eval, an exec), through the channel.
Handler = Callable[[dict[str, Any]], Mapping[str, Any] | None]

# Requests answered on the serve loop: none of them blocks. (A signal may wait for the end.)
INLINE = frozenset({protocol.PING, protocol.EVAL, protocol.EVAL_CANCEL, protocol.PROC_ATTACH,
                    protocol.PROC_DETACH, protocol.PROC_ACK, protocol.PROC_LIST, protocol.PROC_INFO,
                    protocol.PROC_INPUT, protocol.PROC_RESIZE, protocol.VOL_POLL, protocol.VOL_REPLY})


class Agent:
    def __init__(self, warm: list[str]) -> None:
        self.namespace: dict[str, Any] = {"__name__": "__forkd__", RESTORES_KEY: [0]}
        self.warm_errors = warm_up(warm, self.namespace)
        self.warm = warm
        self.channel = Channel()
        self.evaluator = Evaluator(self.namespace)
        self.contexts = CodeContexts(self.namespace, self.evaluator, kernel_specs.languages)
        self.reaper = Reaper()
        self.processes = Processes(self.reaper, self.channel)
        self.kernels = Kernels(self.channel, self.reaper, self.contexts)
        self.workers = Workers()
        self.fs = RootFreezer()
        self.files = Files()
        self.uploads = Uploads()
        self.watches = Watches()
        self.volumes = VolumeMounts(self.channel)
        self.max_line = protocol.MAX_REQUEST_LINE
        self._host_wait: HostWait | None = None
        self.handlers: dict[str, Handler] = {
            protocol.PING: lambda _req: self.ping(),
            protocol.EXEC: self.exec,
            protocol.EVAL: self.eval,
            protocol.EVAL_CANCEL: lambda _req: {"cancelled": self.evaluator.cancel()},
            protocol.RESTORED: self.restored,
            protocol.SYNC: lambda _req: self.fs.sync(),
            protocol.FSFREEZE: lambda req: {"frozen": self.fs.freeze(check_freeze_mounts(req.get("mounts")))},
            protocol.FSTHAW: lambda _req: {"thawed": self.fs.thaw()},
            protocol.PID1_DEFAULTS: pid1_defaults,
            protocol.FILE_STAT: self.files.stat,
            protocol.FILE_LIST: self.files.list,
            protocol.FILE_MKDIR: self.files.mkdir,
            protocol.FILE_REMOVE: self.files.remove,
            protocol.FILE_READ: self.files.read,
            protocol.FILE_WRITE_OPEN: self.uploads.write_open,
            protocol.FILE_WRITE: self.uploads.write,
            protocol.FILE_WRITE_CLOSE: self.uploads.write_close,
            protocol.FILE_MOVE: self.files.move,
            protocol.CONTEXT: self.contexts.handle,
            protocol.KERNEL: self.kernels.handle,
            protocol.WATCH: self.watches.handle,
            protocol.PROC_START: lambda req: self.processes.start(
                req.get("id"), parse_start(req), stream=bool_field(req, "stream", False)),
            protocol.PROC_ATTACH: lambda req: self.processes.attach(
                req.get("id"), int_field(req, "pid"), bool_field(req, "from_start", True)),
            protocol.PROC_DETACH: lambda req: (self.kernels if self.kernels.owns(req.get("stream"))
                                               else self.processes).detach(req.get("stream")),
            protocol.PROC_ACK: lambda req: (self.kernels if self.kernels.owns(req.get("stream")) else
                                            self.processes).ack(req.get("stream"), int_field(req, "bytes")),
            protocol.PROC_LIST: lambda _req: {"processes": self.processes.list()},
            protocol.PROC_INFO: lambda req: self.processes.info(int_field(req, "pid")),
            protocol.PROC_INPUT: lambda req: self.processes.write_input(
                int_field(req, "pid"), decode_b64(req.get("data", ""), "data"),
                bool_field(req, "eof", False)),
            protocol.PROC_RESIZE: lambda req: self.processes.resize(int_field(req, "pid"), parse_size(req)),
            protocol.VOL_MOUNT: self.volumes.mount, protocol.VOL_POLL: self.volumes.poll,
            protocol.VOL_REPLY: self.volumes.reply,
            protocol.PROC_SIGNAL: lambda req: self.processes.send_signal(
                int_field(req, "pid"), req.get("signal"), bool_field(req, "group", True),
                wait=min(max(0, req.get("wait_ms", 0)) / 1000, MAX_SIGNAL_WAIT_SECS)),  # int: checked
        }

    # ------------------------------------------------------------- actions

    def ping(self) -> messages.PingReply:
        numpy = sys.modules.get("numpy")
        return {
            "pong": True,
            "numpy_version": getattr(numpy, "__version__", None),
            "pid": os.getpid(),
            "agent_version": AGENT_VERSION,
            "capabilities": capabilities(),  # the host refuses more
            "python_version": sys.version.split()[0],
            "warm": self.warm,
            "warm_errors": self.warm_errors,
            "restores": self.namespace.get(RESTORES_KEY, [0])[0],
        }

    def eval(self, req: dict[str, Any]) -> None:
        timeout = protocol.request_timeout(req, protocol.EVAL_DEFAULT_TIMEOUT_SECS)
        req_id = req.get("id")
        self.evaluator.submit(req.get("code"), timeout, lambda result: self.channel.reply(req_id, result))

    def exec(self, req: dict[str, Any]) -> dict[str, Any] | None:
        spec, cap = parse_exec(req)
        return self.processes.exec(req.get("id"), spec, cap)

    def restored(self, req: dict[str, Any]) -> messages.RestoredReply:
        result = reseed_after_restore(req, self.namespace)
        # A live branch froze the filesystem while its state was captured;
        # children restored from that state must thaw their copy.
        result["thawed"] = self.fs.thaw()
        # Streams watched by the host this guest was copied from are nobody's here.
        self.processes.detach_all()
        self.kernels.detach_all()
        self.watches.drop_all()
        self.volumes.host_gone()  # the ops the parent's host took are this child's host's to answer
        self.kernels.restored(req.get("env") or {})  # checked by reseed_after_restore
        return result

    def handle(self, req: dict[str, Any]) -> Mapping[str, Any] | None:
        action = req.get("action")
        handler = self.handlers.get(action) if isinstance(action, str) else None
        if handler is None:
            raise protocol.RequestError(f"unknown action {action!r}")
        messages.check_request(str(action), req)  # its fields' types, before any handler reads them
        return handler(req)

    # ------------------------------------------------------------- serving

    def answer(self, req: dict[str, Any]) -> None:
        """Run one request and reply, unless its answer comes later or it is a notification."""
        has_id = "id" in req
        req_id = req.get("id")
        try:
            result = self.handle(req)
            if result is None or not has_id:
                return
            self.channel.reply(req_id, result)
        except protocol.RequestError as exc:
            if has_id:
                self.channel.error(req_id, str(exc), exc.kind)
        except Exception as exc:  # the agent must outlive any bug in one request
            if has_id:
                self.channel.error(req_id, f"agent error: {type(exc).__name__}: {exc}")

    def serve_one(self, line: bytes) -> None:
        # Parsing is separate so that only a bad line is called malformed: a
        # ValueError raised while handling a valid request is an agent error.
        try:
            req = protocol.decode(line)  # bytes: invalid UTF-8 raises UnicodeDecodeError
        except ValueError as exc:
            self.channel.send_reply(protocol.error_reply(None, f"malformed request: {exc}"))
            return
        if not isinstance(req, dict):
            self.channel.send_reply(protocol.error_reply(None, "a request must be a JSON object"))
            return
        if "id" in req:
            self.channel.opened(req["id"])
        if req.get("action") in INLINE:
            self.answer(req)
        else:
            self.workers.submit(lambda: self.answer(req))

    def serve(self, in_fd: int, out_fd: int, stop_at_eof: bool = False) -> None:
        """Read requests forever; an empty read means the host is not connected (yet, or any more).

        With ``stop_at_eof`` (test mode over pipes) an empty read ends serving,
        after the requests already read have been answered.
        """
        self.channel.out_fd = out_fd
        buf = bytearray()
        discarding = False  # inside an oversized line: drop bytes up to its newline
        while True:
            try:
                chunk = os.read(in_fd, READ_CHUNK)
            except InterruptedError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                if stop_at_eof:
                    self.channel.wait_idle()
                    return
                # The host went away: whatever it watched, nobody watches now (its cells stop).
                self.processes.detach_all()
                self.kernels.detach_all(interrupt=True)
                self.volumes.host_gone()
                buf.clear()
                discarding = False
                self._host_wait = self._host_wait or HostWait.for_port(in_fd)
                self._host_wait.wait()
                continue
            scanned = len(buf)  # bytes already known to hold no newline
            buf += chunk
            while True:
                nl = buf.find(b"\n", scanned)
                scanned = 0
                if nl < 0:
                    if len(buf) > self.max_line and not discarding:
                        discarding = True
                        self.channel.send_reply(protocol.error_reply(None, "request too large"))
                    if discarding:
                        buf.clear()
                    break
                line = bytes(buf[:nl])
                del buf[: nl + 1]
                if discarding:  # the tail of the oversized line, not a request
                    discarding = False
                    continue
                if line.strip():
                    self.serve_one(line)
