"""``forkd bench``: a one-minute probe of an install's latency, against its running daemon.

Spawn, exec, eval, branch and a fan-out of 5, each timed from this client (so
the network and the daemon are in the figures, as a user sees them). It
cleans up what it made: the children it spawned, the branch snapshot, and the
template snapshot when it made one (no ``--tag``). The full benchmarks, side by
side with the alternatives, are ``make bench`` (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import contextlib
import math
import secrets
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from forkd.cli import output
from forkd.cli.context import JsonFlag, handle_errors, state, want_json
from forkd.sdk import Controller

FANOUT = 5


def _percentile(samples: list[float], q: float) -> float:
    s = sorted(samples)
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _stats(samples: list[float]) -> dict[str, Any]:
    return {"n": len(samples), "p50_ms": round(statistics.median(samples) * 1000, 2),
            "p99_ms": round(_percentile(samples, 0.99) * 1000, 2),
            "max_ms": round(max(samples) * 1000, 2)}


def _timed(call: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    result = call()
    return time.perf_counter() - t0, result


class _Probe:
    """The steps, each one a progress task; what it made, so that it can all be removed."""

    def __init__(self, c: Controller, progress: Progress, samples: int) -> None:
        self.c = c
        self.progress = progress
        self.samples = samples
        self.sandboxes: list[str] = []
        self.snapshots: list[str] = []  # deleted newest first
        self.out: dict[str, Any] = {}

    @contextlib.contextmanager
    def step(self, what: str, total: int | None = None) -> Iterator[Callable[[], None]]:
        task = self.progress.add_task(what, total=total)
        try:
            yield lambda: self.progress.advance(task)
        finally:
            self.progress.update(task, completed=total if total is not None else 1, total=total or 1)

    def spawn(self, tag: str, n: int = 1) -> tuple[float, list[str]]:
        secs, infos = _timed(lambda: self.c.spawn_sandboxes(tag, n))
        ids = [str(i["id"]) for i in infos]
        self.sandboxes += ids
        return secs, ids

    def kill(self, ids: list[str]) -> None:
        for i in ids:
            with contextlib.suppress(Exception):
                self.c.kill_sandbox(i)
            if i in self.sandboxes:
                self.sandboxes.remove(i)

    def run(self, tag: str | None) -> None:
        if tag is None:
            tag = f"forkd-bench-{secrets.token_hex(3)}"
            with self.step("creating a template snapshot (boots a VM)"):
                secs, _ = _timed(lambda: self.c.create_snapshot(tag))
            self.snapshots.append(tag)
            self.out["template_s"] = round(secs, 3)
        self.out["tag"] = tag
        with self.step("spawn: 1 child, 3 times", 3) as tick:
            spawns = []
            for _ in range(3):
                secs, ids = self.spawn(tag)
                spawns.append(secs)
                self.kill(ids)
                tick()
        self.out["spawn"] = _stats(spawns)
        _, (child,) = self.spawn(tag)
        calls: list[tuple[str, Callable[[], Any]]] = [
            ("exec", lambda: self.c.exec(child, ["true"])), ("eval", lambda: self.c.eval(child, "1 + 1"))]
        for name, call in calls:
            with self.step(f"{name}: {self.samples} calls", self.samples) as tick:
                call()  # warm
                samples = []
                for _ in range(self.samples):
                    samples.append(_timed(call)[0])
                    tick()
            self.out[name] = _stats(samples)
        with self.step("branch (diff) of the running child"):
            secs, snap = _timed(lambda: self.c.branch_sandbox(child, mode="diff"))
        self.snapshots.append(str(snap["tag"]))
        self.out["branch"] = {"total_ms": round(secs * 1000, 1), "pause_ms": snap.get("pause_ms")}
        self.kill([child])
        with self.step(f"fan-out: {FANOUT} children, each pinged"):
            t0 = time.perf_counter()
            _, ids = self.spawn(tag, FANOUT)
            for i in ids:
                self.c.ping(i)
            took = time.perf_counter() - t0
            self.out["fanout"] = {"children": FANOUT, "all_answered_ms": round(took * 1000, 1)}
        self.kill(ids)

    def clean_up(self) -> None:
        self.kill(list(self.sandboxes))
        for tag in reversed(self.snapshots):
            with contextlib.suppress(Exception):
                self.c.delete_snapshot(tag)


@handle_errors
def bench(
    ctx: typer.Context,
    tag: Annotated[
        str | None,
        typer.Option("--tag", "-t", help="Fork this existing snapshot; without it a template snapshot is "
                     "made first (one boot, tens of seconds under TCG) and deleted at the end."),
    ] = None,
    samples: Annotated[
        int, typer.Option("--samples", "-s", min=5, max=1000, help="exec and eval calls timed each.")
    ] = 30,
    json_: JsonFlag = False,
) -> None:
    """Probe this install's latency: spawn, exec, eval, branch, fan-out of 5.

    Timed from this client against the running daemon (FORKD_URL), about a minute
    under TCG. Everything it creates is removed at the end, also on Ctrl-C.
    docs/PERFORMANCE.md has the full benchmarks (make bench).

    Examples:
      forkd bench
      forkd bench --tag py --samples 100 --json
    """
    controller = state(ctx).controller()
    as_json = want_json(ctx, json_)
    started = time.monotonic()
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                        console=output.err_console, disable=as_json or not output.err_console.is_terminal)
    probe = _Probe(controller, progress, samples)
    try:
        with progress:
            probe.run(tag)
    finally:
        probe.clean_up()
    result = {**probe.out, "url": controller.url, "elapsed_s": round(time.monotonic() - started, 1)}
    if as_json:
        output.emit_json(result)
        return
    table = Table(title=f"forkd bench against {controller.url}", title_justify="left")
    table.add_column("what")
    table.add_column("p50", justify="right")
    table.add_column("p99 / detail", justify="right")
    for name, label in (("spawn", "spawn 1 child (until it answered)"), ("exec", "exec true"),
                        ("eval", "eval 1 + 1")):
        s = result[name]
        table.add_row(label, f"{s['p50_ms']:.1f} ms", f"{s['p99_ms']:.1f} ms (n={s['n']})")
    b = result["branch"]
    table.add_row("branch (diff), whole call", f"{b['total_ms']:.0f} ms", f"source paused {b['pause_ms']} ms")
    f = result["fanout"]
    table.add_row(f"fan-out of {f['children']}, every child pinged", f"{f['all_answered_ms']:.0f} ms", "")
    output.console.print(table)
    output.console.print(f"done in {output.elapsed(started)}; everything it created was removed")
