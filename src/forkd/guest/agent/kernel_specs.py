"""Which kernel languages this guest runs, and how jupyter_client finds forkd's own kernels.

Python is IPython's kernel (``python3``, from Debian's python3-ipykernel); bash
and JavaScript are forkd's wrapper kernels beside this file (``kernel_bash.py``
and ``kernel_js.py``, which need ``bash`` and ``node`` on the PATH); R is
IRkernel, R's own Jupyter kernel (Debian's r-cran-irkernel, run by ``R``).

jupyter_client finds a kernel by the kernel.json file in a kernels directory.
The runner writes forkd's into a directory of its own (``write``) and hands
their KernelManagers a KernelSpecManager that looks there alone: nothing is
installed into the image's system directories at build time, so the files
always name the python3 that runs the runner and the scripts of the agent that
the image carries, and an image built before these kernels needs no rebuild
step for them (only the agent's files, which every build installs anew).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
KERNEL_NAMES = {"python": "python3", "bash": "forkd-bash", "javascript": "forkd-javascript", "r": "forkd-r"}
SCRIPTS = {"bash": "kernel_bash.py", "javascript": "kernel_js.py"}
PROGRAMS = {"bash": "bash", "javascript": "node", "r": "R"}  # what a language's kernel needs on the PATH
# IRkernel, as its own installspec() writes it (R's --slave is --no-echo): the kernel reads the
# connection file from R's trailing arguments.
R_ARGV = ["R", "--slave", "-e", "IRkernel::main()", "--args", "{connection_file}"]


def jupyter() -> bool:
    """Whether this guest has Jupyter (jupyter_client and ipykernel): then it runs IPython's kernel."""
    return importlib.util.find_spec("jupyter_client") is not None and \
        importlib.util.find_spec("ipykernel") is not None


def languages(has_jupyter: bool | None = None) -> tuple[str, ...]:
    """The kernel languages this guest runs now: none without Jupyter; bash, JavaScript and R where
    the image has bash, node and R. ``has_jupyter``: what ``jupyter()`` said (None: ask it)."""
    if not (jupyter() if has_jupyter is None else has_jupyter):
        return ()
    return ("python", *(language for language, program in PROGRAMS.items() if shutil.which(program)))


def missing(language: str) -> str:
    """Why this guest cannot run ``language``'s kernel, said to whoever asked for it."""
    if not jupyter():
        return "this image has no Jupyter kernel (see forkd image build --name code-interpreter)"
    return (f"this image has no {PROGRAMS.get(language, language)} for {language} kernels (the "
            "code-interpreter image of this forkd has it: forkd image build --name code-interpreter)")


def specs(python: str = sys.executable) -> dict[str, dict[str, object]]:
    """forkd's kernel.json contents, by kernel name: its wrapper kernels (run by ``python``) and R's."""
    out: dict[str, dict[str, object]] = {}
    for language, script in SCRIPTS.items():
        out[KERNEL_NAMES[language]] = {
            "argv": [python, os.path.join(HERE, script), "-f", "{connection_file}"],
            "display_name": f"{language} (forkd)", "language": language, "interrupt_mode": "signal"}
    out[KERNEL_NAMES["r"]] = {"argv": R_ARGV, "display_name": "R (forkd)", "language": "R",
                              "interrupt_mode": "signal"}
    return out


def write(folder: str, python: str = sys.executable) -> str:
    """forkd's kernel.json files under ``folder``; the kernels directory to hand KernelSpecManager."""
    kernels = os.path.join(folder, "kernels")
    for name, spec in specs(python).items():
        spec_dir = os.path.join(kernels, name)
        os.makedirs(spec_dir, exist_ok=True)
        with open(os.path.join(spec_dir, "kernel.json"), "w", encoding="utf-8") as f:
            json.dump(spec, f)
    return kernels
