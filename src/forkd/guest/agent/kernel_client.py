"""One context's Jupyter kernel, as the kernel runner (``kernel_runner.py``) drives it.

A helper of the runner, with the runner's needs (the guest's python3 with
jupyter_client; never imported by the agent). The kernel is IPython's for
python, one of forkd's wrapper kernels for bash and javascript, IRkernel for r:
the kernel.json files of the last three are written by the runner on first use
into a directory of its own (``kernel_specs``). What differs by language is
here: IPython gets a cell's environment variables and a restored copy's new
seed as silent cells of Python, IRkernel as silent cells of R (``kernel_r``);
forkd's kernels get them as the metadata of a cell (``kernel_wrap``).
"""

from __future__ import annotations

import os
import queue
import tempfile
import time
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

from forkd.guest.agent import kernel_r, kernel_specs

START_TIMEOUT_SECS = 300.0

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


# Run silently in every new kernel, E2B's result fields as extra MIME types of a display:
# a DataFrame's {column: [values]} ("e2b/data", the ``data`` field) and a matplotlib figure's
# chart data ("e2b/chart", the ``chart`` field: what the ``e2b_charts`` package the
# code-interpreter image has makes of it; none for a blank figure, or without that package).
# And as in E2B's sandboxes, a PIL image saved to a file name is also displayed.
SETUP_CELL = """\
def __forkd_setup():
    import json, sys
    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from IPython.display import display
    from traitlets import Unicode

    class TableData(BaseFormatter):
        format_type = Unicode("e2b/data")

        def __call__(self, obj):
            pandas = sys.modules.get("pandas")
            if pandas is None or not isinstance(obj, pandas.DataFrame):
                return None
            columns = json.loads(obj.to_json(orient="columns", date_format="iso"))
            return {name: list(cells.values()) for name, cells in columns.items()}

    class ChartData(BaseFormatter):
        format_type = Unicode("e2b/chart")

        def __call__(self, obj):
            figure = sys.modules.get("matplotlib.figure")
            if figure is None or not isinstance(obj, figure.Figure):
                return None
            try:
                from e2b_charts import chart_figure_to_dict
                return chart_figure_to_dict(obj) or None
            except Exception:  # no e2b_charts, or a figure it cannot read: the PNG alone
                return None

    formatter = get_ipython().display_formatter
    formatter.formatters["e2b/data"] = TableData(parent=formatter)
    formatter.formatters["e2b/chart"] = ChartData(parent=formatter)
    try:
        from PIL import Image
    except ImportError:
        return
    save = Image.Image.save

    def save_and_display(image, fp, format=None, **params):
        if isinstance(fp, str):
            display(image)
        return save(image, fp, format, **params)

    Image.Image.save = save_and_display
__forkd_setup(); del __forkd_setup
"""


_specs: list[KernelSpecManager] = []  # forkd's kernel.json files, written on first use


def forkd_specs() -> KernelSpecManager:
    if not _specs:
        run = "/run" if os.access("/run", os.W_OK) else None  # the guest's tmpfs, beside the runner's log
        folder = kernel_specs.write(tempfile.mkdtemp(prefix="forkd-kernelspecs-", dir=run))
        _specs.append(KernelSpecManager(kernel_dirs=[folder], ensure_native_kernel=False))
    return _specs[0]


class Kernel:
    def __init__(self, cwd: str, language: str) -> None:
        self.language = language
        # (jupyter_client's constructors are untyped)
        name = kernel_specs.KERNEL_NAMES[language]
        if language == "python":  # IPython's kernel, as jupyter_client finds it
            self.km = KernelManager(kernel_name=name)  # type: ignore[no-untyped-call]
        else:
            self.km = KernelManager(kernel_name=name, kernel_spec_manager=forkd_specs())  # type: ignore[no-untyped-call]
        self.km.start_kernel(cwd=cwd if os.path.isdir(cwd) else "/")
        self.kc = self.km.blocking_client()  # type: ignore[no-untyped-call]
        self.kc.start_channels()
        self.restart(now=False)

    def restart(self, now: bool = True) -> None:
        if now:
            self.km.restart_kernel(now=True)
        self.kc.wait_for_ready(timeout=START_TIMEOUT_SECS)
        if self.language == "python":
            self.silent(SETUP_CELL)

    def shutdown(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)

    def execute(self, code: str, silent: bool = False, **metadata: Any) -> str:
        """Send a cell; forkd's kernels take its environment and the like as metadata."""
        content = {"code": code, "silent": silent, "store_history": not silent, "user_expressions": {},
                   "allow_stdin": False, "stop_on_error": False}
        msg = self.kc.session.msg("execute_request", content, metadata=metadata)
        self.kc.shell_channel.send(msg)
        return str(msg["header"]["msg_id"])

    def silent(self, code: str, **metadata: Any) -> None:
        """Run code that shows nothing (the cell's environment variables), and wait for it."""
        self._drain_until_idle(self.execute(code, silent=True, **metadata), 30.0)

    def env_in(self, env: dict[str, str]) -> dict[str, Any]:
        """A cell's own environment variables: set in IPython and IRkernel by a silent cell
        (``env_out`` undoes it); the metadata of the cell itself for forkd's kernels."""
        if self.language not in ("python", "r"):
            return {"forkd_env": env} if env else {}
        if env and self.language == "r":
            self.silent(kernel_r.env_in(env))
        elif env:
            self.silent(f"import os as __forkd_os; __forkd_saved = {{k: __forkd_os.environ.get(k) "
                        f"for k in {list(env)!r}}}; __forkd_os.environ.update({env!r})")
        return {}

    def env_out(self, env: dict[str, str]) -> None:
        if env and self.language == "r":
            self.silent(kernel_r.ENV_OUT)
        elif env and self.language == "python":
            self.silent("[__forkd_os.environ.pop(k, None) if v is None else "
                        "__forkd_os.environ.__setitem__(k, v) for k, v in __forkd_saved.items()]; "
                        "del __forkd_saved")

    def restored(self, env: dict[str, str]) -> None:
        seed = os.urandom(16)
        if self.language == "r":
            self.silent(kernel_r.restored(env, seed))
        elif self.language != "python":
            self.silent("", forkd_restored={"env": env, "seed": seed.hex()})
        else:
            seed32 = int.from_bytes(seed[:4], "big")
            self.silent(RESTORED_CELL.format(env=env, seed=seed.hex(), seed32=seed32))

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
