"""Process commands: ``exec --stream``/``--detach``, ``ps``, ``attach``, ``send-stdin``, ``kill-proc``,
``cancel-eval``.

Streams are shown as they come: the command's stdout to forkd's stdout, its
stderr to forkd's stderr, verbatim; ``--json`` prints each event as one JSON
line instead. A streamed command exits forkd with the command's own status.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from forkd.cli import output
from forkd.cli.context import JsonFlag, handle_errors, state, want_json
from forkd.sdk import Controller

SandboxId = Annotated[str, typer.Argument(metavar="ID", help="Sandbox id, e.g. sb-67a1b3-0000.")]
Pid = Annotated[int, typer.Argument(metavar="PID", min=1, help="The process's pid in the guest (forkd ps).")]
STDIN_PIECE = 64 << 10


def exit_status(code: Any) -> int:
    """A shell-style exit status: signals as 128+N, unknown as 1."""
    if not isinstance(code, int):
        return 1
    if code < 0:
        return 128 - code
    return min(code, 255)


def show_events(events: Iterator[dict[str, Any]], as_json: bool) -> dict[str, Any] | None:
    """Print a process stream as it comes; the exit event (None if the stream ended without one)."""
    end = None
    for event in events:
        kind = event.get("type")
        if as_json:
            output.emit_json_line(event)
        elif kind in ("stdout", "stderr"):
            # Written verbatim: click.echo would strip ANSI colours whenever forkd's own
            # stdout is not a terminal.
            stream = sys.stdout if kind == "stdout" else sys.stderr
            stream.write(str(event.get("data", "")))
            stream.flush()
        elif kind == "dropped":
            output.warn(f"{event.get('bytes')} bytes of output were lost before they could be shown")
        if kind == "exit":
            end = event
    return end


def finish(end: dict[str, Any] | None, as_json: bool) -> None:
    if end is None:
        output.fail("the stream ended before the process exited")
    if not as_json:
        if end.get("timed_out"):
            output.error(str(end.get("error") or "command timed out"))
        elif end.get("signal"):
            output.error(f"killed by signal {end['signal']}")
    raise typer.Exit(exit_status(end.get("exit_code")))


def forward_stdin(controller: Controller, sandbox_id: str, pid: int) -> threading.Thread:
    """Copy forkd's own stdin to the process as it is typed or piped, then close it."""

    def pump() -> None:
        with contextlib.suppress(Exception):  # the process may end first: nothing to report
            source = sys.stdin.buffer
            while chunk := (source.read1(STDIN_PIECE) if hasattr(source, "read1") else source.read(1)):
                controller.send_stdin(sandbox_id, pid, chunk)
            controller.close_stdin(sandbox_id, pid)

    thread = threading.Thread(target=pump, name="forkd-stdin", daemon=True)
    thread.start()
    return thread


def run_streamed(ctx: typer.Context, sandbox_id: str, command: list[str], *, timeout: float | None,
                 env: Mapping[str, str] | None, cwd: str | None, stdin_text: str | None,
                 interactive: bool, as_json: bool, user: str | None = None) -> None:
    """``forkd exec --stream``: the command's output as it comes; Ctrl-C kills it."""
    controller = state(ctx).controller()
    events = controller.exec_stream(sandbox_id, command, timeout_secs=timeout, env=env, cwd=cwd,
                                    stdin=stdin_text, stdin_open=interactive, user=user)

    def watched() -> Iterator[dict[str, Any]]:
        for event in events:
            if interactive and event.get("type") == "start":
                forward_stdin(controller, sandbox_id, int(event["pid"]))
            yield event

    with contextlib.closing(events):
        end = show_events(watched(), as_json)
    finish(end, as_json)


def start_detached(ctx: typer.Context, sandbox_id: str, command: list[str], *, timeout: float | None,
                   env: Mapping[str, str] | None, cwd: str | None, stdin_text: str | None,
                   tag: str | None, as_json: bool, user: str | None = None) -> None:
    """``forkd exec --detach``: start it in the background, print its pid."""
    info = state(ctx).controller().start_process(sandbox_id, command, timeout_secs=timeout, env=env,
                                                 cwd=cwd, stdin=stdin_text, tag=tag, user=user)
    if as_json:
        output.emit_json(info)
        return
    output.console.print(f"started pid {info['pid']} in {escape(sandbox_id)}; "
                         f"watch it with: forkd attach {escape(sandbox_id)} {info['pid']}")


def processes_table(processes: Iterable[Mapping[str, Any]]) -> Table:
    table = Table(title="processes")
    for column in ("PID", "TAG", "STARTED", "STDIN", "COMMAND"):
        table.add_column(column)
    for proc in processes:
        table.add_row(str(proc["pid"]), escape(str(proc.get("tag") or "")),
                      output.fmt_age(proc.get("started_at")), "open" if proc.get("stdin_open") else "",
                      escape(" ".join(proc.get("args") or [])))
    return table


@handle_errors
def ps(ctx: typer.Context, sandbox_id: SandboxId, json_: JsonFlag = False) -> None:
    """List the running processes that forkd started in a sandbox (exec, exec --detach, SDK).

    Example:
      forkd ps sb-67a1b3-0000
    """
    processes = state(ctx).controller().list_processes(sandbox_id)
    if want_json(ctx, json_):
        output.emit_json(processes)
    elif processes:
        output.console.print(processes_table(processes))
    else:
        output.console.print("no processes running")


@handle_errors
def attach(
    ctx: typer.Context,
    sandbox_id: SandboxId,
    pid: Pid,
    new: Annotated[bool, typer.Option("--new", help="Only output from now on (default: also what "
                                      "the guest kept from before, up to 1 MiB).")] = False,
    json_: JsonFlag = False,
) -> None:
    """Show a process's output until it exits, then exit with its status.

    Ctrl-C stops watching; the process keeps running.

    Example:
      forkd exec sb-67a1b3-0000 --detach -- python3 -u train.py
      forkd attach sb-67a1b3-0000 117
    """
    as_json = want_json(ctx, json_)
    events = state(ctx).controller().stream_process(sandbox_id, pid, from_start=not new)
    with contextlib.closing(events):
        end = show_events(events, as_json)
    finish(end, as_json)


@handle_errors
def send_stdin(
    ctx: typer.Context,
    sandbox_id: SandboxId,
    pid: Pid,
    data: Annotated[str | None, typer.Argument(
        help="Text to write; '-' (default) copies forkd's stdin.")] = "-",
    close: Annotated[bool, typer.Option("--close", help="Close the process's stdin afterwards.")] = False,
    json_: JsonFlag = False,
) -> None:
    """Write to the stdin of a process started with its stdin open.

    Examples:
      echo "hello" | forkd send-stdin sb-67a1b3-0000 117
      forkd send-stdin sb-67a1b3-0000 117 "quit" --close
    """
    controller = state(ctx).controller()
    written = 0
    if data == "-":
        while chunk := sys.stdin.buffer.read(STDIN_PIECE):
            written += int(controller.send_stdin(sandbox_id, pid, chunk)["written"])
    elif data:
        written += int(controller.send_stdin(sandbox_id, pid, data)["written"])
    if close:
        controller.close_stdin(sandbox_id, pid)
    if want_json(ctx, json_):
        output.emit_json({"pid": pid, "written": written, "closed": close})
    else:
        closed = " and closed its stdin" if close else ""
        output.console.print(f"wrote {written} bytes to pid {pid}{closed}")


@handle_errors
def kill_proc(
    ctx: typer.Context,
    sandbox_id: SandboxId,
    pid: Pid,
    signal: Annotated[str, typer.Option("--signal", "-s", metavar="SIG",
                                        help="Signal to send instead of SIGKILL (TERM, INT, HUP, 15, ...).")]
    = "KILL",
    json_: JsonFlag = False,
) -> None:
    """Kill a process in a sandbox (its whole process group), or send it another signal.

    Examples:
      forkd kill-proc sb-67a1b3-0000 117
      forkd kill-proc sb-67a1b3-0000 117 --signal TERM
    """
    reply = state(ctx).controller().signal_process(sandbox_id, pid, signal)
    if want_json(ctx, json_):
        output.emit_json(reply)
    else:
        output.console.print(f"sent signal {reply['signal']} to pid {pid} in {escape(sandbox_id)}")


@handle_errors
def cancel_eval(ctx: typer.Context, sandbox_id: SandboxId, json_: JsonFlag = False) -> None:
    """Interrupt the eval running in a sandbox (it answers CancelledError).

    Example:
      forkd cancel-eval sb-67a1b3-0000
    """
    reply = state(ctx).controller().cancel_eval(sandbox_id)
    if want_json(ctx, json_):
        output.emit_json(reply)
    else:
        output.console.print("cancelled the running eval" if reply["cancelled"] else "no eval was running")
