"""The agent's server: one request a thread, dispatched to the job modules, replies by id.

Its own module so that each job stays a plain function of a request, and the
framing, the concurrency and the rule that PID 1 outlives any bad request live
in one place. ``serve`` reads the port (or, in tests, a pipe or a socket); the
wire format is ``forkd.guest.protocol``'s.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from forkd.guest import protocol
from forkd.guest.agent import AGENT_VERSION
from forkd.guest.agent.contexts import CodeContexts
from forkd.guest.agent.evaluator import Evaluator
from forkd.guest.agent.exec import run_exec
from forkd.guest.agent.files import Files
from forkd.guest.agent.freeze import RootFreezer
from forkd.guest.agent.reaper import Reaper
from forkd.guest.agent.restore import RESTORES_KEY, reseed_after_restore
from forkd.guest.agent.uploads import Uploads
from forkd.guest.agent.warm import warm_up
from forkd.guest.protocol import RequestError

READ_CHUNK = 1 << 16

Handler = Callable[[dict[str, Any]], dict[str, Any]]


class Agent:
    def __init__(self, warm: list[str]) -> None:
        self.namespace: dict[str, Any] = {"__name__": "__forkd__", RESTORES_KEY: [0]}
        self.warm_errors = warm_up(warm, self.namespace)
        self.warm = warm
        self.evaluator = Evaluator(self.namespace)
        self.contexts = CodeContexts(self.namespace, self.evaluator)
        self.reaper = Reaper()
        self.fs = RootFreezer()
        self.files = Files()
        self.uploads = Uploads()
        self.write_lock = threading.Lock()
        self.out_fd = -1
        self.max_line = protocol.MAX_REQUEST_LINE
        self.handlers: dict[str, Handler] = {
            protocol.PING: lambda _req: self.ping(),
            protocol.EXEC: lambda req: run_exec(req, self.reaper),
            protocol.EVAL: self.eval,
            protocol.RESTORED: self.restored,
            protocol.SYNC: lambda _req: self.sync(),
            protocol.FSFREEZE: lambda _req: {"frozen": self.fs.freeze()},
            protocol.FSTHAW: lambda _req: {"thawed": self.fs.thaw()},
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
        }

    # ------------------------------------------------------------- actions

    def ping(self) -> dict[str, Any]:
        numpy = sys.modules.get("numpy")
        return {
            "pong": True,
            "numpy_version": getattr(numpy, "__version__", None),
            "pid": os.getpid(),
            "agent_version": AGENT_VERSION,
            "python_version": sys.version.split()[0],
            "warm": self.warm,
            "warm_errors": self.warm_errors,
            "restores": self.namespace.get(RESTORES_KEY, [0])[0],
        }

    def eval(self, req: dict[str, Any]) -> dict[str, Any]:
        timeout = protocol.request_timeout(req, protocol.EVAL_DEFAULT_TIMEOUT_SECS)
        return self.evaluator.evaluate(req.get("code"), timeout)

    def restored(self, req: dict[str, Any]) -> dict[str, Any]:
        result = reseed_after_restore(req, self.namespace)
        # A live branch froze the filesystem while its state was captured;
        # children restored from that state must thaw their copy.
        result["thawed"] = self.fs.thaw()
        return result

    @staticmethod
    def sync() -> dict[str, Any]:
        os.sync()
        return {"synced": True}

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        action = req.get("action")
        handler = self.handlers.get(action) if isinstance(action, str) else None
        if handler is None:
            raise RequestError(f"unknown action {action!r}")
        return handler(req)

    # ------------------------------------------------------------- serving

    def respond(self, message: dict[str, Any]) -> None:
        data = protocol.encode(message)
        with self.write_lock:
            view = memoryview(data)
            while view:
                try:
                    n = os.write(self.out_fd, view)
                except InterruptedError:
                    continue
                except OSError:
                    time.sleep(0.01)  # host not connected: nothing else we can do
                    return
                view = view[n:]

    def serve_one(self, line: bytes) -> None:
        # Parsing is separate so that only a bad line is called malformed: a
        # ValueError raised while handling a valid request is an agent error.
        try:
            req = protocol.decode(line)  # bytes: invalid UTF-8 raises UnicodeDecodeError
        except ValueError as exc:
            self.respond(protocol.error_reply(None, f"malformed request: {exc}"))
            return
        req_id = req.get("id") if isinstance(req, dict) else None
        try:
            if not isinstance(req, dict):
                raise RequestError("a request must be a JSON object")
            reply = protocol.ok_reply(req_id, self.handle(req))
        except RequestError as exc:
            reply = protocol.error_reply(req_id, str(exc), exc.kind)
        except Exception as exc:  # the agent must outlive any bug in one request
            reply = protocol.error_reply(req_id, f"agent error: {type(exc).__name__}: {exc}")
        self.respond(reply)

    def serve(self, in_fd: int, out_fd: int, stop_at_eof: bool = False) -> None:
        """Read requests forever; an empty read means the host is not connected yet.

        With ``stop_at_eof`` (test mode over pipes) an empty read ends serving,
        after the requests already read have been answered.
        """
        self.out_fd = out_fd
        buf = bytearray()
        discarding = False  # inside an oversized line: drop bytes up to its newline
        in_flight: set[threading.Thread] = set()
        while True:
            try:
                chunk = os.read(in_fd, READ_CHUNK)
            except InterruptedError:
                continue
            except OSError:
                time.sleep(0.02)
                continue
            if not chunk:
                if stop_at_eof:
                    for t in list(in_flight):
                        t.join()
                    return
                time.sleep(0.005)
                continue
            scanned = len(buf)  # bytes already known to hold no newline
            buf += chunk
            while True:
                nl = buf.find(b"\n", scanned)
                scanned = 0
                if nl < 0:
                    if len(buf) > self.max_line and not discarding:
                        discarding = True
                        self.respond(protocol.error_reply(None, "request too large"))
                    if discarding:
                        buf.clear()
                    break
                line = bytes(buf[:nl])
                del buf[: nl + 1]
                if discarding:  # the tail of the oversized line, not a request
                    discarding = False
                    continue
                if line.strip():
                    in_flight = {t for t in in_flight if t.is_alive()}
                    t = threading.Thread(target=self.serve_one, args=(line,), daemon=True)
                    in_flight.add(t)
                    t.start()
