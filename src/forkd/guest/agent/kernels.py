"""The ``kernel`` action: cells run on Jupyter kernels, their output streamed as it comes.

PID 1 stays stdlib only: it starts ``kernel_runner.py`` (beside this file) with
the guest's python3 the first time a kernel is needed, writes it requests as
JSON lines, and relays what it answers to the host. A ``run`` is a stream: the
runner's ``stdout``/``stderr``/``result``/``error`` answers go to the host as
events, its ``end`` as the reply. The stream is flow-controlled like a process
stream: each event costs its line's length (``protocol.line_cost``) against the
window the host acknowledges with ``proc_ack``; while the window is full the
runner is not read, so it stops reading its kernel.

Each context's kernel runs its language (``code_messages.KERNEL_LANGUAGES``):
as its cell asks, else as the context was made (``contexts``) or its kernel
started, else python; a cell in another language than its context's is
refused. A cell without a context runs on its language's default context, in
that context's cwd. Which languages the image runs: ``kernel_specs``.

A host that stops watching a cell (``proc_detach``: its client went away)
interrupts the cell's kernel, so the next cell runs at once. The runner and its
kernels survive a snapshot like any process of the guest: every child restored
from it continues their sessions.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
from typing import IO, Any

from forkd.guest import code_messages, protocol
from forkd.guest.agent import kernel_specs
from forkd.guest.agent.channel import Channel
from forkd.guest.agent.contexts import CONTEXT_ID, CodeContexts
from forkd.guest.agent.reaper import Reaper
from forkd.guest.protocol import CONFLICT, INVALID, NOT_FOUND, RequestError

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_runner.py")
RUNNER_LOG = "/run/forkd-kernel-runner.log"
MAX_RUNS = 32  # requests in the runner's queue at once
CALL_OPS = ("shutdown", "restart")


class _Run:
    def __init__(self, host_id: Any, context: str) -> None:
        self.host_id = host_id
        self.context = context
        self.credit = protocol.STREAM_WINDOW
        self.detached = False


class Kernels:
    def __init__(self, channel: Channel, reaper: Reaper, contexts: CodeContexts | None = None) -> None:
        self.channel = channel
        self.reaper = reaper
        self.contexts = contexts
        self.languages: dict[str, str] = {}  # context -> the language its kernel was started in
        self.cond = threading.Condition()
        self.proc: subprocess.Popen[bytes] | None = None
        self.ids = itertools.count(1)
        self.runs: dict[int, _Run] = {}  # runner request id -> run
        self.streams: dict[Any, _Run] = {}  # host request id -> run
        self._available: bool | None = None

    def available(self) -> bool:
        if self._available is None:
            self._available = kernel_specs.jupyter()
        return self._available

    def handle(self, req: dict[str, Any]) -> dict[str, Any] | None:
        op = req.get("op")
        if op == "available":
            with self.cond:
                return {"available": self.available(), "running": self.proc is not None,
                        "languages": list(kernel_specs.languages(self.available()))}
        language = None if req.get("language") is None else code_messages.kernel_language(req.get("language"))
        context = req.get("context") or code_messages.default_context(language or "python")
        if not isinstance(context, str) or not CONTEXT_ID.match(context):
            raise RequestError("context must be 1 to 64 letters, digits, '_' or '-'", INVALID)
        if op == "interrupt":
            with self.cond:
                running = self.proc is not None
                if running:
                    self._send({"op": "interrupt", "context": context})
            return {"interrupted": running}
        if op == "run":
            code = req.get("code")
            if not isinstance(code, str):
                raise RequestError("kernel run needs 'code': a string", INVALID)
            env = protocol.check_env(req.get("env"))
            language, cwd = self._settle(context, language, req.get("cwd"))
            timeout = protocol.request_timeout(req, protocol.EVAL_DEFAULT_TIMEOUT_SECS)
            self._submit(req.get("id"), context, {"op": "run", "context": context, "language": language,
                                                   "code": code, "env": env, "cwd": cwd, "timeout": timeout,
                                                   "silent": req.get("silent") is True})
            return None
        if op in CALL_OPS:
            with self.cond:
                if self.proc is None:
                    return {"type": "end", "execution_count": 0}
            self._submit(req.get("id"), context, {"op": op, "context": context})
            return None
        raise RequestError(f"kernel op must be run, interrupt, available, shutdown or restart, not {op!r}",
                           INVALID)

    def _settle(self, context: str, language: str | None, cwd: object) -> tuple[str, str]:
        """The language and working directory of a cell's kernel (see the module's docstring)."""
        made = self.contexts.describe(context) if self.contexts is not None else None
        with self.cond:
            known = self.languages.get(context) or (made or {}).get("language")
        if known is not None and language is not None and language != known:
            raise RequestError(f"context {context!r} runs {known}, not {language}", INVALID)
        language = language or known or "python"
        if self.available() and language not in kernel_specs.languages(True):
            raise RequestError(kernel_specs.missing(language), NOT_FOUND)
        home = code_messages.KERNEL_HOME
        cwd = cwd or (made or {}).get("cwd") or (home if os.path.isdir(home) else "/")  # as E2B's kernels
        if not isinstance(cwd, str) or not cwd.startswith("/") or "\0" in cwd:
            raise RequestError("cwd must be an absolute path", INVALID)
        return language, cwd

    def _submit(self, host_id: Any, context: str, msg: dict[str, Any]) -> None:
        if not self.available():
            raise RequestError("this image has no Jupyter kernel (see forkd image build --name "
                               "code-interpreter)", NOT_FOUND)
        with self.cond:
            if len(self.runs) >= MAX_RUNS:
                raise RequestError(f"{MAX_RUNS} cells are already queued on the kernels", CONFLICT)
            if self.proc is None:
                self._start()
            rid = next(self.ids)
            if msg["op"] == "run":
                self.languages.setdefault(context, msg["language"])
            elif msg["op"] == "shutdown":
                self.languages.pop(context, None)
            run = _Run(host_id, context)
            self.runs[rid] = run
            self.streams[host_id] = run
            self._send({"id": rid, **msg})

    # ---------------------------------------------------------------- runner

    def _start(self) -> None:
        log = open(RUNNER_LOG, "ab")  # noqa: SIM115 - the runner keeps it
        try:
            with self.reaper.lock:
                proc = subprocess.Popen([sys.executable, "-u", RUNNER], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=log, start_new_session=True)
                self.reaper.owned.add(proc.pid)
        finally:
            log.close()
        self.proc = proc
        assert proc.stdout is not None
        threading.Thread(target=self._pump, args=(proc, proc.stdout), daemon=True,
                         name="kernel-runner").start()

    def _send(self, msg: dict[str, Any]) -> None:
        """One request to the runner (under ``cond``)."""
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:
            pass  # it died: its reader fails every run

    def _pump(self, proc: subprocess.Popen[bytes], out: IO[bytes]) -> None:
        """The runner's answers, to the host, each within its stream's window."""
        for raw in out:
            try:
                msg = json.loads(raw)
                rid = msg.pop("id")
            except (ValueError, KeyError, AttributeError):
                continue
            with self.cond:
                run = self.runs.get(rid) if isinstance(rid, int) else None
                if run is None:
                    continue
                if msg.get("type") == "end":
                    self._finish(rid, run)
                    if not run.detached:
                        self.channel.reply(run.host_id, msg)
                    continue
                line = protocol.encode(protocol.event(run.host_id, msg))
                if len(line) > self.channel.max_line:
                    note = f"[forkd: a {msg.get('type')} of {len(line)} bytes was dropped: too large]\n"
                    line = protocol.encode(protocol.event(run.host_id, {"type": "stderr", "text": note}))
                cost = protocol.line_cost(len(line) - 1)
                self.cond.wait_for(lambda r=run, c=cost: r.detached or r.credit >= c)  # type: ignore[misc]
                if not run.detached:
                    run.credit -= cost
                    self.channel.send_line(line)
        with self.cond:  # the runner is gone, and the kernels with it
            if self.proc is proc:
                self.proc = None
                self.languages.clear()
            for rid, run in list(self.runs.items()):
                self._finish(rid, run)
                if not run.detached:
                    self.channel.error(run.host_id, f"the kernel runner exited (see {RUNNER_LOG})")

    def _finish(self, rid: int, run: _Run) -> None:
        self.runs.pop(rid, None)
        self.streams.pop(run.host_id, None)

    def restored(self, env: dict[str, str]) -> None:
        """A restored copy of the guest: each live kernel reseeds its RNGs (its siblings share
        their state) and takes the child's environment, before any cell of this child runs."""
        with self.cond:
            if self.proc is not None:
                self._send({"op": "restored", "env": env})

    # -------------------------------------------------------- the host's side

    def owns(self, stream_id: Any) -> bool:
        with self.cond:
            return stream_id in self.streams

    def ack(self, stream_id: Any, consumed: int) -> dict[str, Any]:
        with self.cond:
            run = self.streams.get(stream_id)
            if run is not None:
                run.credit = min(protocol.STREAM_WINDOW, run.credit + max(0, consumed))
                self.cond.notify_all()
        return {}

    def detach(self, stream_id: Any, interrupt: bool = True) -> dict[str, Any]:
        """The host stops watching a cell: it is interrupted, its output dropped."""
        with self.cond:
            run = self.streams.pop(stream_id, None)
            if run is None:
                return {"detached": False}
            run.detached = True
            self.channel.forget(stream_id)
            self.cond.notify_all()
            if interrupt and self.proc is not None:
                self._send({"op": "interrupt", "context": run.context})
        return {"detached": True}

    def detach_all(self, interrupt: bool = False) -> None:
        """The host is gone, or this is a restored copy: nobody watches these cells any more."""
        with self.cond:
            ids = list(self.streams)
        for stream_id in ids:
            self.detach(stream_id, interrupt)
