"""forkd's bash kernel: a Jupyter kernel around one persistent bash (``kernel_wrap.ChildKernel``).

bash runs as an interactive shell (``-i``), without line editing, prompts,
history or job control, because that is what makes an interrupt behave as at a
terminal: SIGINT aborts the whole cell, a loop of builtins included, and bash
goes on to its next command. A cell's code is written to a file and sourced at
the top level (``. /proc/self/fd/N </dev/null``, N an unlinked file that bash holds
open, so nothing is left behind however the kernel ends): its variables,
functions and working directory persist, a syntax error fails that cell alone,
and a command that reads stdin reads nothing rather than the kernel's next
requests. The command
after it (``__forkd_end``) ends the cell: it writes the mark with the cell's
exit status, and leaves that status in ``$?`` for the next cell.

A non-zero status is reported as E2B's bash kernel (bash_kernel) reports it: an
error with an empty name, the status as its value, and no traceback.
Per-cell environment variables are assignments in front of the ``.``, which
bash exports to that cell alone.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from typing import Any

if __name__ == "__main__":  # run as a script: import the agent package from its root, not this folder
    sys.path[0] = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

from forkd.guest.agent.kernel_wrap import ChildKernel, launch, popen

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # what bash can hold as a variable


class BashKernel(ChildKernel):
    language = "bash"
    language_info = {"name": "bash", "mimetype": "text/x-sh", "file_extension": ".sh",
                     "codemirror_mode": "shell", "pygments_lexer": "bash"}
    child_name = "bash"

    def spawn(self) -> subprocess.Popen[bytes]:
        self.cell, path = tempfile.mkstemp(prefix="forkd-bash-cell-")
        os.unlink(path)
        child = popen(["bash", "--norc", "--noprofile", "--noediting", "-i"], stdin=subprocess.PIPE,
                      pass_fds=(self.cell,))
        self.stdin = child.stdin
        mark = "$'\\036" + self.mark[1:] + "'"
        self.send("set +m +H +o history; PS1= PS2= PS0=; unset PROMPT_COMMAND HISTFILE MAILCHECK",
                  f"__forkd_end() {{ local s=$?; printf '%s%s\\n' {mark} \"$s\"; printf '%s\\n' {mark} >&2; "
                  "return \"$s\"; }", "__forkd_end")
        return child

    def send(self, *lines: str) -> None:
        assert self.stdin is not None
        try:
            self.stdin.write("".join(line + "\n" for line in lines).encode())
            self.stdin.flush()
        except OSError:
            pass  # bash is gone: its pipes' end says so

    def submit(self, code: str, env: dict[str, str]) -> None:
        os.ftruncate(self.cell, 0)
        os.pwrite(self.cell, (code if code.endswith("\n") else code + "\n").encode(), 0)
        assign = "".join(f"{k}={shlex.quote(v)} " for k, v in env.items() if NAME.match(k))
        # /proc/self/fd, not /dev/fd: an image's /dev need not have the link (the agent makes it,
        # but an older agent's template lacks it), and `.` opens the path as it is written.
        self.send(f"{assign}. /proc/self/fd/{self.cell} </dev/null", "__forkd_end")

    def restored(self, env: dict[str, str], seed: str) -> None:
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if NAME.match(k))
        seed32 = int(seed[:8] or "0", 16)
        self.send(f"export {exports}" if exports else ":", f"RANDOM={seed32}", "__forkd_end")

    def answer(self, payload: str, silent: bool) -> dict[str, Any]:
        status = payload.strip()
        if status == "0":
            return self.ok()
        return self.error("", status if status.isdigit() else "1", [], silent)

    def closed(self) -> None:
        if self.stdin is not None:
            self.stdin.close()
        os.close(self.cell)


if __name__ == "__main__":
    launch(BashKernel)
