#!/usr/bin/env python3
"""forkd demo: warm a parent microVM once, fork 10 children copy-on-write, use them.

1. starts a forkd daemon (loopback, random token, throwaway data dir) — or uses the
   one at $FORKD_URL / $FORKD_TOKEN if you set them;
2. snapshots a warm parent: numpy imported and a 1M-element dataset loaded into
   the agent's interpreter (PID 1);
3. forks 10 children from it and evaluates in each — the dataset is already
   there, shared copy-on-write, and every child has its own random stream;
4. shows that the children are isolated VMs (a change in one is invisible to the others);
5. BRANCHes a running child mid-computation (its in-memory state and its disk),
   while it keeps running;
6. forks that running child into a fork-tree of three, one "fix" per child
   (handed to each through its environment), tries them in parallel, keeps the
   best child and kills the others (``Sandbox.explore``);
7. builds the ``code-interpreter`` image (a Jupyter kernel, pandas, matplotlib;
   cached after the first time, which takes a few minutes), snapshots a template
   whose kernel is warm, forks a child and runs a notebook cell in it: its output
   streams, a DataFrame's result comes back, and a plot comes back as a PNG with
   its chart data (``Sandbox.run_code``); ``--no-code-interpreter`` skips this;
8. cleans up everything it made.

Run with `make demo` (does all set-up first) or `.venv/bin/python examples/demo.py`.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time

import httpx
from rich.console import Console
from rich.table import Table

from forkd import Controller, Sandbox
from forkd.config import DataDir

console = Console()
STEP = "state['step']"
RUN_BUGGY = "import sys; sys.path.insert(0, '/root'); import buggy; print(buggy.f(21))"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalDaemon:
    """`forkd daemon` in a subprocess, on loopback with a fresh token."""

    def __init__(self) -> None:
        # A throwaway data dir sharing the built guest image and the accelerator probe.
        data = DataDir.scratch("forkd-demo-")
        self.dir = data.root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = secrets.token_urlsafe(24)
        token_file = self.dir / "token"
        token_file.write_text(self.token)
        token_file.chmod(0o600)
        env = dict(os.environ, FORKD_IMAGES_DIR=str(data.images))
        self.log = open(self.dir / "daemon.log", "wb")  # noqa: SIM115 (lives as long as the daemon)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "forkd.cli", "daemon", "--bind", f"127.0.0.1:{self.port}",
             "--data-dir", str(self.dir), "--token-file", str(token_file)],
            stdout=self.log, stderr=subprocess.STDOUT, env=env,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"daemon exited:\n{(self.dir / 'daemon.log').read_text()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise SystemExit("daemon did not come up within 60 s")

    def stop(self) -> None:
        self.proc.terminate()  # the daemon stops its sandboxes on SIGTERM
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


CELL = """import matplotlib.pyplot as plt
import pandas as pd
df = pd.DataFrame({"x": range(10), "y": [v * v for v in range(10)]})
print(f"{len(df)} rows loaded")
plt.plot(df.x, df.y)
plt.title("y = x squared")
plt.show()
int(df.y.sum())
"""


def code_interpreter(c: Controller, tag: str, made: list[dict]) -> None:
    """Step 7: a notebook cell on a warm Jupyter kernel in a forked child."""
    forkd = shutil.which("forkd", path=os.path.dirname(sys.executable)) or "forkd"
    t0 = time.monotonic()
    with console.status("building the code-interpreter image (first time: a few minutes; then cached)"):
        subprocess.run([forkd, "image", "build", "--name", "code-interpreter"], check=True,
                       stdout=subprocess.DEVNULL)
    t1 = time.monotonic()
    with console.status(f"snapshotting '{tag}': boot, then a warm IPython kernel (pandas, matplotlib)"):
        c.create_snapshot(tag, image="code-interpreter", mem_mib=1024, boot_wait_secs=300)
    t2 = time.monotonic()
    [child] = c.spawn_sandboxes(tag, n=1)
    made.append(dict(child))
    console.print(f"[bold]code interpreter[/]: image {t1 - t0:.1f} s, template {t2 - t1:.1f} s, "
                  f"child {child['id']} forked with its kernel already running")
    t3 = time.monotonic()
    ex = Sandbox(sandbox_id=child["id"], controller=c).run_code(
        CELL, on_stdout=lambda text: console.print(f"  [dim]stdout while the cell runs:[/] {text.strip()}"))
    plot = next(r for r in ex.results if r.png)
    chart = plot.chart or {}
    points = sum(len(e.get("points", [])) for e in chart.get("elements", []))
    console.print(f"  the cell took {time.monotonic() - t3:.2f} s: result {ex.text}; a "
                  f"{len(plot.png or '')}-char base64 PNG, and its chart data: a {chart.get('type')} "
                  f"chart titled {chart.get('title')!r} with {points} points")


def main() -> int:
    skip_code = "--no-code-interpreter" in sys.argv[1:]
    daemon = None
    if os.environ.get("FORKD_URL"):
        c = Controller()
        console.print(f"using the daemon at {os.environ['FORKD_URL']}")
    else:
        with console.status("starting a forkd daemon on loopback"):
            daemon = LocalDaemon()
        c = Controller(url=daemon.url, token=daemon.token)
        console.print(f"daemon up at {daemon.url}")
    tag = f"demo-{secrets.token_hex(3)}"
    ci_tag = f"{tag}-ci"
    sandboxes: list[dict] = []
    try:
        t0 = time.monotonic()
        with console.status(f"snapshotting a warm parent '{tag}' (cold boot + numpy + dataset)"):
            snap = c.create_snapshot(
                tag,
                warm_imports=["numpy"],
                setup_eval=["data = numpy.arange(1_000_000, dtype=numpy.float64)"],
            )
        boot_s = time.monotonic() - t0
        console.print(f"[bold]snapshot[/] {snap['tag']} ready in {boot_s:.1f} s -> {snap['dir']}")

        t0 = time.monotonic()
        sandboxes = c.spawn_sandboxes(tag, n=10)
        fork_s = time.monotonic() - t0
        console.print(f"[bold]forked[/] {len(sandboxes)} children in {fork_s * 1000:.0f} ms "
                      f"({boot_s / max(fork_s, 1e-9):.0f}x faster than the parent's cold boot)")

        table = Table("sandbox", "QEMU pid", "data.mean() (inherited)", "numpy.random.random()", "eval ms")
        for sb in sandboxes:
            t = time.monotonic()
            mean = c.eval(sb["id"], "float(data.mean())")["result"]
            ms = (time.monotonic() - t) * 1000
            rnd = c.eval(sb["id"], "round(numpy.random.random(), 6)")["result"]
            table.add_row(sb["id"], str(sb["pid"]), mean, rnd, f"{ms:.1f}")
        console.print(table)

        a, b = sandboxes[0]["id"], sandboxes[1]["id"]
        c.eval(a, "data[:] = 0")
        c.exec(a, ["sh", "-c", "echo only-in-A > /root/note.txt"])
        console.print(f"[bold]isolation[/]: after zeroing data in {a}: "
                      f"{a} sees mean {c.eval(a, 'float(data.mean())')['result']}, "
                      f"{b} still sees {c.eval(b, 'float(data.mean())')['result']}; "
                      f"/root/note.txt exists in {b}: "
                      f"{c.exec(b, ['test', '-e', '/root/note.txt'])['exit_code'] == 0}")
        res = c.exec(b, ["python3", "-c", "print(2+2)"])
        console.print(f"[bold]exec[/] python3 -c 'print(2+2)' in {b}: stdout={res['stdout']!r} "
                      f"exit={res['exit_code']}")

        # --- BRANCH: an agent mid-task, checkpointed while it runs -------------------
        src = sandboxes[2]["id"]
        c.eval(src, "import threading, time\n"
                    "state = {'step': 0, 'notes': ['loaded data']}\n"
                    "def _work():\n"
                    "    while True:\n"
                    "        state['step'] += 1; time.sleep(0.01)\n"
                    "threading.Thread(target=_work, daemon=True).start()")
        c.exec(src, ["sh", "-c", "echo 'def f(x): return x / 0' > /root/buggy.py"])
        for mode in ("full", "diff"):
            t0 = time.monotonic()
            br = c.branch_sandbox(src, tag=f"{tag}-{mode}", mode=mode)
            console.print(f"[bold]branch[/] ({mode}) of running {src} -> {br['tag']}: source paused "
                          f"{br['pause_ms']:.0f} ms, snapshot ready in {time.monotonic() - t0:.1f} s")
        step_now = c.eval(src, STEP)["result"]
        time.sleep(0.5)
        console.print(f"the source kept running: its step counter went {step_now} -> "
                      f"{c.eval(src, STEP)['result']}")

        # --- best of N: fork the running source into a tree, one fix per child --------
        fixes = {"return x / 1": "divide by one", "return x * 0": "multiply by zero",
                 "return x": "identity"}

        def try_fix(child: Sandbox, fix: str) -> str:
            # The fix arrives as the child's own environment (child_env), not as a request.
            c.exec(child.id, ["sh", "-c", 'sed -i "s|return x / 0|$FIX|" /root/buggy.py'])
            out = c.exec(child.id, ["python3", "-c", RUN_BUGGY])
            if out["exit_code"] != 0:
                raise RuntimeError(out["stderr"].strip().splitlines()[-1])
            return out["stdout"].strip()

        source = Sandbox(sandbox_id=src, controller=c)  # attached: this object never kills it
        t0 = time.monotonic()
        best = source.explore(list(fixes), try_fix,
                              lambda _child, _fix, out: 1.0 if float(out) == 21.0 else 0.0,
                              child_env=[{"FIX": fix} for fix in fixes])
        explore_s = time.monotonic() - t0
        table = Table("child (fork-tree)", "step (continued from the source)", "fix tried", "f(21) ->",
                      "score")
        for o in best.outcomes:
            step = c.eval(o.sandbox_id, STEP)["result"] if o.sandbox_id and o is best.best else "(killed)"
            table.add_row(o.sandbox_id or "-", step, fixes[o.candidate], str(o.result or o.error),
                          "-" if o.score is None else f"{o.score:g}")
        console.print(table)
        winner = best.winner
        assert winner is not None
        sandboxes.append(winner.info)
        console.print(f"[bold]explore[/]: forked {len(fixes)} children of running {src} in one call "
                      f"(fork-tree {best.tree_id}), tried the fixes in parallel, kept {winner.id} and "
                      f"killed the rest, in {explore_s:.1f} s; the source still has the bug: "
                      f"{'x / 0' in c.exec(src, ['cat', '/root/buggy.py'])['stdout']}")
        if not skip_code:
            code_interpreter(c, ci_tag, sandboxes)
    finally:
        with console.status("cleaning up"):
            for sb in sandboxes:
                try:
                    c.kill_sandbox(sb["id"])
                except Exception as exc:  # keep cleaning up the rest
                    console.print(f"[red]kill {sb['id']}: {exc}")
            for snapshot in (tag, ci_tag):
                try:
                    c.delete_snapshot(snapshot, cascade=True)  # the branches are layered on it
                except Exception as exc:
                    if snapshot == tag or "not found" not in str(exc).lower():
                        console.print(f"[red]delete snapshot {snapshot}: {exc}")
            c.close()
            if daemon is not None:
                daemon.stop()
    console.print("[green]demo finished; nothing left running[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
