"""forkd's JavaScript kernel: a Jupyter kernel around one persistent node (``kernel_wrap.ChildKernel``).

node runs ``kernel_js_driver.js`` (beside this file), which evaluates every cell
in one ``vm`` context: declarations persist from cell to cell, top-level
``await`` works, and ``console.log``/``console.error`` write to node's own
stdout and stderr, which stream as the cell runs. Requests go to the driver as
JSON lines on a pipe of their own (``FORKD_JS_FD``), so a cell that reads stdin
never reads them; the driver answers each with the mark and JSON: the last
expression's value as node's ``util.inspect`` shows it (a ``text/plain``
execute_result), or the error's name, message and stack (a Jupyter ``error``).

The interrupt reaches node as SIGINT: a cell that is computing stops
(``vm``'s ``breakOnSigint``), one that awaits is abandoned, and the context is
kept. A cell that ignores it (a busy loop after an ``await``) is ended with
node, which starts anew (``kernel_wrap``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from typing import Any

if __name__ == "__main__":  # run as a script: import the agent package from its root, not this folder
    sys.path[0] = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

from forkd.guest.agent.kernel_wrap import ChildKernel, launch, popen

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_js_driver.js")


class JavaScriptKernel(ChildKernel):
    language = "javascript"
    language_info = {"name": "javascript", "mimetype": "application/javascript", "file_extension": ".js",
                     "codemirror_mode": "javascript", "pygments_lexer": "javascript"}
    child_name = "node"

    def spawn(self) -> subprocess.Popen[bytes]:
        read, self.requests = os.pipe()
        env = {**os.environ, "FORKD_JS_FD": str(read), "FORKD_JS_MARK": self.mark}
        try:
            return popen(["node", "--experimental-vm-modules", DRIVER], stdin=subprocess.DEVNULL, env=env,
                         pass_fds=(read,))
        finally:
            os.close(read)

    def request(self, **req: Any) -> None:
        with contextlib.suppress(OSError):  # node is gone: its pipes' end says so
            os.write(self.requests, json.dumps(req).encode() + b"\n")

    def submit(self, code: str, env: dict[str, str]) -> None:
        self.request(op="run", code=code, env=env)

    def restored(self, env: dict[str, str], seed: str) -> None:
        self.request(op="restored", env=env, seed=seed)

    def answer(self, payload: str, silent: bool) -> dict[str, Any]:
        try:
            reply = json.loads(payload)
        except ValueError:
            reply = {"error": {"name": "Error", "value": f"node answered {payload[:200]!r}"}}
        error = reply.get("error")
        if isinstance(error, dict):
            traceback = error.get("traceback")
            return self.error(str(error.get("name", "Error")), str(error.get("value", "")),
                              [str(x) for x in traceback] if isinstance(traceback, list) else [], silent)
        value = reply.get("value")
        if isinstance(value, str) and not silent:
            self.publish("execute_result", {"execution_count": self.execution_count,
                                            "data": {"text/plain": value}, "metadata": {}})
        return self.ok()

    def closed(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.requests)


if __name__ == "__main__":
    launch(JavaScriptKernel)
