"""The kernel runner: a helper process that drives IPython kernels with jupyter_client.

PID 1 is stdlib only, so it never imports jupyter_client: the agent
(``forkd.guest.agent.kernels``) starts this script with the guest's python3
(``python3 -u kernel_runner.py``) the first time a cell runs on a kernel, and
talks to it in JSON lines over its stdin and stdout. This file is the one part
of the agent package that needs more than the stdlib (``python3-jupyter-client``
and ``python3-ipykernel``, which the ``code-interpreter`` image has); the agent
never imports it.

One IPython kernel per context, started on the context's first cell. The
kernels, this runner and the ZMQ sockets between them all live inside the
guest, so a snapshot taken after a cell keeps them alive: every child restored
from it continues the same kernel session.

Requests (one JSON object a line): ``{"id", "op": "run", "context", "code",
"timeout", "env", "cwd", "silent"}``, ``{"op": "interrupt", "context"}``,
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

from jupyter_client.manager import KernelManager

INTERRUPT_GRACE_SECS = 5.0
START_TIMEOUT_SECS = 300.0
TEXT_CHUNK = 256 << 10  # characters of stream output in one answer
MAX_VALUE_CHARS = 1536 << 10  # one MIME value; a larger one is replaced by a note

_out_lock = threading.Lock()


def send(msg: dict[str, Any]) -> None:
    line = json.dumps(msg, separators=(",", ":"), default=str) + "\n"
    with _out_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


# Run silently in every kernel of a restored child: fresh RNG state (the siblings share the
# template's), and the child's own environment variables.
RESTORED_CELL = """\
import os as __o, random as __r, sys as __s
__o.environ.update({env!r})
__r.seed({seed!r})
if 'numpy' in __s.modules:
    __s.modules['numpy'].random.seed({seed32})
del __o, __r, __s
"""


# Run silently in every new kernel: DataFrames also display as {column: [values]}, under the
# MIME type E2B's ``data`` result field carries ("e2b/data").
SETUP_CELL = """\
def __forkd_setup():
    import json, sys
    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from traitlets import Unicode

    class TableData(BaseFormatter):
        format_type = Unicode("e2b/data")

        def __call__(self, obj):
            pandas = sys.modules.get("pandas")
            if pandas is None or not isinstance(obj, pandas.DataFrame):
                return None
            columns = json.loads(obj.to_json(orient="columns", date_format="iso"))
            return {name: list(cells.values()) for name, cells in columns.items()}

    formatter = get_ipython().display_formatter
    formatter.formatters["e2b/data"] = TableData(parent=formatter)
__forkd_setup(); del __forkd_setup
"""


class Kernel:
    def __init__(self, cwd: str) -> None:
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(cwd=cwd if os.path.isdir(cwd) else "/")
        self.kc = self.km.blocking_client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=START_TIMEOUT_SECS)
        self.silent(SETUP_CELL)

    def restart(self) -> None:
        self.km.restart_kernel(now=True)
        self.kc.wait_for_ready(timeout=START_TIMEOUT_SECS)
        self.silent(SETUP_CELL)

    def shutdown(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)

    def silent(self, code: str) -> None:
        """Run code that shows nothing (the cell's environment variables), and wait for it."""
        msg_id = self.kc.execute(code, silent=True, store_history=False)
        self._drain_until_idle(msg_id, 30.0)

    def _drain_until_idle(self, msg_id: str, secs: float) -> None:
        deadline = time.monotonic() + secs
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.5)
            except queue.Empty:
                continue
            if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                    and msg["content"].get("execution_state") == "idle"):
                return


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

    def kernel(self, context: str, cwd: str) -> Kernel:
        kernel = self.kernels.get(context)
        if kernel is None:
            kernel = self.kernels[context] = Kernel(cwd)
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
                    for live in self.kernels.values():
                        seed = os.urandom(16)
                        live.silent(RESTORED_CELL.format(env=dict(req.get("env") or {}), seed=seed.hex(),
                                                         seed32=int.from_bytes(seed[:4], "big")))
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
        kernel = self.kernel(str(req.get("context") or "default"), str(req.get("cwd") or "/"))
        env = req.get("env") or {}
        if env:
            kernel.silent(f"import os as __forkd_os; __forkd_saved = {{k: __forkd_os.environ.get(k) "
                          f"for k in {list(env)!r}}}; __forkd_os.environ.update({env!r})")
        timeout = float(req.get("timeout") or 300)
        silent = req.get("silent") is True  # a warm-up: no output, no execution count
        msg_id = kernel.kc.execute(str(req.get("code") or ""), silent=silent, store_history=not silent,
                                   allow_stdin=False)
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
        if env and not restarted:
            kernel.silent("[__forkd_os.environ.pop(k, None) if v is None else "
                          "__forkd_os.environ.__setitem__(k, v) for k, v in __forkd_saved.items()]; "
                          "del __forkd_saved")
        send({"id": rid, "type": "end", "execution_count": count, "timed_out": timed_out,
              "restarted": restarted})


if __name__ == "__main__":
    Runner().serve()
