"""The kernel runner: a helper process that drives the contexts' Jupyter kernels with jupyter_client.

PID 1 is stdlib only, so it never imports jupyter_client: the agent
(``forkd.guest.agent.kernels``) starts this script with the guest's python3
(``python3 -u kernel_runner.py``) the first time a cell runs on a kernel, and
talks to it in JSON lines over its stdin and stdout. This file, ``kernel_client``
and forkd's kernels (``kernel_wrap``, ``kernel_bash``, ``kernel_js``) are the
parts of the agent package that need more than the stdlib
(``python3-jupyter-client`` and ``python3-ipykernel``, which the
``code-interpreter`` image has); the agent never imports them.

One kernel per context, started on the context's first cell: IPython's for
python, forkd's wrapper kernels for bash and javascript (``kernel_specs``;
their per-cell environment and a restored copy's reseeding travel as cell
metadata, see ``kernel_wrap``), IRkernel for r (those as silent cells of R,
``kernel_r``). The kernels, this runner and the ZMQ sockets
between them all live inside the guest, so a snapshot taken after a cell keeps
them alive: every child restored from it continues the same kernel session.

Requests (one JSON object a line): ``{"id", "op": "run", "context", "language",
"code", "timeout", "env", "cwd", "silent"}``, ``{"op": "interrupt", "context"}``,
``{"op": "restored", "env"}`` (a restored child: reseed, take its environment), ``{"id", "op":
"shutdown"|"restart", "context"}``. Answers carry the request's id:
``{"type": "stdout"|"stderr", "text"}``, ``{"type": "result", "data": {mime:
value}, "is_main_result"}``, ``{"type": "error", "name", "value",
"traceback"}``, then ``{"type": "end", "execution_count", "timed_out",
"restarted"}``. A cell past its timeout is interrupted (SIGINT to the kernel);
a kernel that ignores that for ``INTERRUPT_GRACE_SECS`` is restarted.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from typing import Any

if __name__ == "__main__":  # run as a script: import the agent package from its root, not this folder
    sys.path[0] = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

from forkd.guest.agent.kernel_client import Kernel

INTERRUPT_GRACE_SECS = 5.0
TEXT_CHUNK = 256 << 10  # characters of stream output in one answer
MAX_VALUE_CHARS = 1536 << 10  # one MIME value; a larger one is replaced by a note

_out_lock = threading.Lock()


def send(msg: dict[str, Any]) -> None:
    line = json.dumps(msg, separators=(",", ":"), default=str) + "\n"
    with _out_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def _bundle(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mime, value in data.items():
        size = len(value) if isinstance(value, str) else len(json.dumps(value, default=str))
        out[mime] = value if size <= MAX_VALUE_CHARS else f"[forkd: {mime} of {size} characters dropped]"
    return out


class Runner:
    def __init__(self) -> None:
        self.kernels: dict[str, Kernel] = {}
        self.jobs: queue.Queue[dict[str, Any]] = queue.Queue()

    def kernel(self, context: str, cwd: str, language: str) -> Kernel:
        kernel = self.kernels.get(context)
        if kernel is None:
            kernel = self.kernels[context] = Kernel(cwd, language)
        elif kernel.language != language:  # the agent checks first: this is a last guard
            raise ValueError(f"context {context!r} runs {kernel.language}, not {language}")
        return kernel

    def read_requests(self) -> None:
        for line in sys.stdin:
            try:
                req = json.loads(line)
            except ValueError:
                continue
            if req.get("op") == "interrupt":  # at once, beside the cell that runs
                kernel = self.kernels.get(str(req.get("context")))
                if kernel is not None:
                    kernel.km.interrupt_kernel()
            else:
                self.jobs.put(req)
        os._exit(0)  # the agent went away: the kernels go with this process group

    def serve(self) -> None:
        threading.Thread(target=self.read_requests, daemon=True).start()
        while True:
            req = self.jobs.get()
            rid = req.get("id")
            try:
                if req.get("op") == "run":
                    self.run(req)
                elif req.get("op") == "restored":
                    env = dict(req.get("env") or {})
                    os.environ.update(env)  # and the kernels started from now on
                    for live in self.kernels.values():
                        live.restored(env)
                elif req.get("op") in ("shutdown", "restart"):
                    found = self.kernels.get(str(req.get("context")))
                    if found is not None and req["op"] == "restart":
                        found.restart()
                    elif found is not None:
                        del self.kernels[str(req.get("context"))]
                        found.shutdown()
                    send({"id": rid, "type": "end", "execution_count": 0})
            except Exception as exc:  # one bad request must not end the runner
                send({"id": rid, "type": "error", "name": type(exc).__name__, "value": str(exc),
                      "traceback": ""})
                send({"id": rid, "type": "end", "execution_count": 0, "failed": True})

    def run(self, req: dict[str, Any]) -> None:
        rid = req.get("id")
        kernel = self.kernel(str(req.get("context") or "default"), str(req.get("cwd") or "/"),
                             str(req.get("language") or "python"))
        env = dict(req.get("env") or {})
        timeout = float(req.get("timeout") or 300)
        silent = req.get("silent") is True  # a warm-up: no output, no execution count
        msg_id = kernel.execute(str(req.get("code") or ""), silent, **kernel.env_in(env))
        deadline = time.monotonic() + timeout
        count = 0
        timed_out = restarted = False
        while True:
            try:
                msg = kernel.kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                now = time.monotonic()
                if now < deadline:
                    continue
                if not timed_out:
                    timed_out = True
                    kernel.km.interrupt_kernel()
                    deadline = now + INTERRUPT_GRACE_SECS
                    continue
                kernel.restart()  # it ignored SIGINT: its state goes, the next cell runs
                restarted = True
                send({"id": rid, "type": "error", "name": "TimeoutError",
                      "value": f"the cell ran past {timeout:g}s and ignored the interrupt; "
                               "the kernel was restarted", "traceback": ""})
                break
            if msg["parent_header"].get("msg_id") != msg_id:
                continue  # a silent run's, or an interrupted cell's late output
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                text = content.get("text", "")
                for at in range(0, len(text), TEXT_CHUNK):
                    send({"id": rid, "type": content.get("name", "stdout"),
                          "text": text[at:at + TEXT_CHUNK]})
            elif kind in ("execute_result", "display_data"):
                send({"id": rid, "type": "result", "data": _bundle(content.get("data", {})),
                      "is_main_result": kind == "execute_result"})
            elif kind == "error":
                send({"id": rid, "type": "error", "name": content.get("ename", ""),
                      "value": content.get("evalue", ""),
                      "traceback": "\n".join(content.get("traceback", []))})
            elif kind == "execute_input":
                count = int(content.get("execution_count") or 0)
            elif kind == "status" and content.get("execution_state") == "idle":
                break
        while True:  # the shell replies: not needed, only not left to pile up
            try:
                kernel.kc.get_shell_msg(timeout=0)
            except queue.Empty:
                break
        if not restarted:
            kernel.env_out(env)
        send({"id": rid, "type": "end", "execution_count": count, "timed_out": timed_out,
              "restarted": restarted})


if __name__ == "__main__":
    Runner().serve()
