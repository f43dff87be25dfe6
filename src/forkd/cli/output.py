"""Rendering: JSON for scripts, rich tables and spinners for people.

Human-facing progress goes to stderr so that stdout stays parseable
(``forkd fork --tag py -n 3 --json | jq``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

# Console() resolves sys.stdout/sys.stderr at print time, so test runners that
# swap the streams still capture what is printed.
# soft_wrap: messages are not broken at 80 columns when piped; tables still fit.
console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def emit_json(data: Any) -> None:
    """Raw JSON on stdout, no colour or wrapping (rich would add both on a tty)."""
    typer.echo(json.dumps(data, indent=2))


def emit_json_line(data: Any) -> None:
    """One compact JSON object on its own line, flushed at once (for long-running commands)."""
    typer.echo(json.dumps(data, separators=(",", ":")))
    sys.stdout.flush()


def error(message: str) -> None:
    err_console.print(f"[bold red]error:[/] [red]{escape(message)}[/]")


def warn(message: str) -> None:
    err_console.print(f"[yellow]warning:[/] {escape(message)}")


def fail(message: str, code: int = 1) -> NoReturn:
    error(message)
    raise typer.Exit(code)


def fmt_time(unix: Any) -> str:
    if not isinstance(unix, (int, float)):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix))


def fmt_age(unix: Any, now: float | None = None) -> str:
    """Compact age for tables: ``42s``, ``5m``, ``3h``, ``2d``."""
    if not isinstance(unix, (int, float)):
        return "-"
    secs = max(0, int((time.time() if now is None else now) - unix))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit}"
    return f"{secs}s"


def fmt(value: Any) -> str:
    """One cell: ``-`` for missing, lists comma-joined, everything escaped for rich."""
    if value is None or value == "" or value == []:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return escape(", ".join(str(v) for v in value))
    if isinstance(value, dict):
        return escape(", ".join(f"{k}={v}" for k, v in value.items()))
    return escape(str(value))


_STATUS_STYLE = {"ready": "green", "writing": "yellow", "failed": "red"}


def fmt_status(status: Any) -> str:
    status = status or "ready"  # omitted on the wire for synchronous snapshots
    style = _STATUS_STYLE.get(str(status), "")
    return f"[{style}]{escape(str(status))}[/]" if style else escape(str(status))


LABELS_MIN_WIDTH = 120


def sandboxes_table(sandboxes: Iterable[Mapping[str, Any]], title: str | None = None) -> Table:
    rows = list(sandboxes)
    # Labels (fork-trees, --label) get a column only when some sandbox has them
    # and the terminal is wide: at 80 columns it would only squeeze the others
    # (--json always has them).
    labelled = console.width >= LABELS_MIN_WIDTH and any(sb.get("metadata") for sb in rows)
    # A STATE column only once some sandbox sits paused (idle_pause_secs) or hibernated.
    stateful = any(sb.get("state") in ("paused", "hibernated") for sb in rows)
    table = Table(title=title, title_justify="left")
    table.add_column("ID", style="cyan", no_wrap=True)
    table.add_column("SNAPSHOT", no_wrap=True)
    table.add_column("PID", justify="right")
    table.add_column("NETNS")
    table.add_column("IP", no_wrap=True)
    table.add_column("MEM", justify="right", no_wrap=True)
    table.add_column("LIVE")
    table.add_column("AGE", justify="right", no_wrap=True)
    if stateful:
        table.add_column("STATE", no_wrap=True)
    if labelled:
        table.add_column("LABELS", overflow="fold")  # one per line
    for sb in rows:
        limit = sb.get("memory_limit_mib")
        cells = [
            fmt(sb.get("id")),
            fmt(sb.get("snapshot_tag")),
            fmt(sb.get("pid")),
            fmt(sb.get("netns")),
            fmt(sb.get("ip")),
            f"{limit} MiB" if limit is not None else "-",
            fmt(sb.get("live_fork")),
            fmt_age(sb.get("created_at_unix")),
        ]
        if stateful:
            cells.append(fmt(sb.get("state")))
        if labelled:
            labels = sb.get("metadata") or {}
            cells.append("\n".join(escape(f"{k}={v}") for k, v in labels.items()) or "-")
        table.add_row(*cells)
    return table


def snapshots_table(snapshots: Iterable[Mapping[str, Any]], title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("TAG", style="cyan", no_wrap=True)
    table.add_column("STATUS")
    table.add_column("BRANCHED FROM")
    table.add_column("PAUSE", justify="right", no_wrap=True)
    table.add_column("AGE", justify="right", no_wrap=True)
    for snap in snapshots:
        pause = snap.get("pause_ms")
        table.add_row(
            fmt(snap.get("tag")),
            fmt_status(snap.get("status")),
            fmt(snap.get("branched_from")),
            f"{pause:.0f} ms" if isinstance(pause, (int, float)) else "-",
            fmt_age(snap.get("created_at_unix")),
        )
    return table


def details_table(info: Mapping[str, Any]) -> Table:
    """Key/value view of one object; timestamps and status rendered for people."""
    table = Table(show_header=False, box=None, padding=(0, 2, 0, 0))
    table.add_column(style="bold")
    table.add_column()
    for key, value in info.items():
        if key.endswith("_unix"):
            shown = fmt_time(value)
        elif key == "status":
            shown = fmt_status(value)
        elif key == "pause_ms" and isinstance(value, (int, float)):
            shown = f"{value:.0f} ms"
        else:
            shown = fmt(value)
        table.add_row(escape(key), shown)
    return table


@contextmanager
def spinner(message: str) -> Iterator[None]:
    """A spinner with elapsed time on stderr while a long request is in flight."""
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    )
    with progress:
        progress.add_task(message, total=None)
        yield


@contextmanager
def transfer_bar(description: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A byte progress bar on stderr (only on a terminal); yields ``advance(bytes_so_far)``."""
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
        disable=not err_console.is_terminal,
    )
    with progress:
        task = progress.add_task(description, total=total)
        yield lambda done: progress.update(task, completed=done)


def elapsed(started: float) -> str:
    secs = time.monotonic() - started
    return f"{secs * 1000:.0f} ms" if secs < 1 else f"{secs:.1f} s"
