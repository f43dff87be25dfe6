"""Running code in a sandbox: ``forkd exec`` (a command; ``--stream`` and ``--detach`` are
processes.py's) and ``forkd eval`` (Python in the warm PID 1 interpreter)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from forkd import bounds
from forkd.cli import output, processes
from forkd.cli.context import JsonFlag, handle_errors, parse_pairs, state, usage_error, want_json
from forkd.cli.processes import SandboxId


def _read_input(ctx: typer.Context, source: str) -> str:
    if source == "-":
        return sys.stdin.read()
    try:
        return Path(source).read_text()
    except OSError as exc:
        usage_error(ctx, f"cannot read {source}: {exc.strerror or exc}")


@handle_errors
def exec_(
    ctx: typer.Context,
    sandbox_id: SandboxId,
    command: Annotated[
        list[str], typer.Argument(metavar="CMD", help="Command and its arguments (after --).")
    ],
    timeout: Annotated[
        float | None, typer.Option("--timeout", min=0.001, help="Kill the command after this many "
                                   "seconds (default 30; with --stream or --detach: no limit).")
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", "-e", metavar="KEY=VALUE", help="Environment variable (repeatable)."),
    ] = None,
    cwd: Annotated[str | None, typer.Option("--cwd", help="Working directory in the guest.")] = None,
    stdin: Annotated[
        str | None,
        typer.Option("--stdin", metavar="FILE", help="Feed FILE to the command's stdin ('-': own stdin)."),
    ] = None,
    user: Annotated[str | None, typer.Option("--user", "-u", help="Run as this guest user (e.g. 'user': "
                                             "uid 1000, its HOME, cwd /home/user); default root.")] = None,
    stream: Annotated[bool, typer.Option("--stream", help="Show the output as it is produced "
                                         "(Ctrl-C kills the command).")] = False,
    interactive: Annotated[bool, typer.Option("--interactive", "-i", help="With --stream: copy forkd's "
                                              "own stdin to the command while it runs.")] = False,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="Start it in the background and print "
                                         "its pid (see forkd ps, attach, kill-proc).")] = False,
    tag: Annotated[str | None, typer.Option("--tag", help="With --detach or --stream: a label shown "
                                            "by forkd ps.")] = None,
    json_: JsonFlag = False,
) -> None:
    """Run a command in a sandbox; prints its output and exits with its exit code.

    Put -- before the command so that its own options are not read as forkd's.
    A timed-out command exits 124; one killed by signal N exits 128+N.
    --stream shows output as it comes (--json: one event per line);
    --detach leaves it running in the background.

    Examples:
      forkd exec sb-67a1b3-0000 -- python3 -c "print(2+2)"
      forkd exec sb-67a1b3-0000 --timeout 120 -e DEBUG=1 -- sh -c "make test"
      forkd exec sb-67a1b3-0000 --user user -- id
      echo hello | forkd exec sb-67a1b3-0000 --stdin - -- cat
      forkd exec sb-67a1b3-0000 --stream -- sh -c "for i in 1 2 3; do echo $i; sleep 1; done"
      forkd exec sb-67a1b3-0000 --stream -i -- python3 -i
      forkd exec sb-67a1b3-0000 --detach --tag server -- python3 -m http.server
    """
    if stream and detach:
        usage_error(ctx, "--stream and --detach exclude each other (forkd attach watches a detached one)")
    if interactive and not stream:
        usage_error(ctx, "--interactive needs --stream")
    if tag is not None and not (stream or detach):
        usage_error(ctx, "--tag needs --stream or --detach")
    stdin_text = _read_input(ctx, stdin) if stdin is not None else None
    env_map = parse_pairs(ctx, env, "--env")
    as_json = want_json(ctx, json_)
    if stream:
        processes.run_streamed(ctx, sandbox_id, command, timeout=timeout, env=env_map, cwd=cwd,
                               stdin_text=stdin_text, interactive=interactive, as_json=as_json, user=user)
        return
    if detach:
        processes.start_detached(ctx, sandbox_id, command, timeout=timeout, env=env_map, cwd=cwd,
                                 stdin_text=stdin_text, tag=tag, as_json=as_json, user=user)
        return
    limit = timeout if timeout is not None else 30
    result = state(ctx).controller().exec(
        sandbox_id, command, timeout_secs=limit, env=env_map, cwd=cwd, stdin=stdin_text, user=user,
    )
    status = processes.exit_status(result.get("exit_code"))
    if as_json:
        output.emit_json(result)
        raise typer.Exit(status)
    # Written verbatim: click.echo would strip ANSI colours from the command's
    # output whenever forkd's own stdout is not a terminal.
    for text, out in ((result.get("stdout"), sys.stdout), (result.get("stderr"), sys.stderr)):
        if text:
            out.write(text)
            out.flush()
    for name in ("stdout", "stderr"):
        if result.get(f"{name}_truncated"):
            output.warn(f"{name} was truncated by the guest agent")
    if result.get("timed_out"):
        output.error(f"command timed out after {limit:g}s")
    elif result.get("error") and result.get("exit_code") in (None, 0):
        output.error(str(result["error"]))
    raise typer.Exit(status)


@handle_errors
def eval_(
    ctx: typer.Context,
    sandbox_id: SandboxId,
    code: Annotated[
        str, typer.Argument(help="Python expression or statements; '-' reads them from stdin.")
    ],
    timeout: Annotated[
        float | None, typer.Option("--timeout", min=0.001, max=bounds.EVAL_TIMEOUT.high,
                                   help="Interrupt it after this many seconds (default 60).")
    ] = None,
    json_: JsonFlag = False,
) -> None:
    """Evaluate Python in a sandbox's warm PID 1 interpreter and print the result.

    State persists between evals in the same sandbox. Exits non-zero if the
    code raised or was interrupted (forkd cancel-eval interrupts it early).

    Examples:
      forkd eval sb-67a1b3-0000 "numpy.zeros(5).sum()"
      forkd eval sb-67a1b3-0000 - < script.py
      forkd eval sb-67a1b3-0000 --timeout 5 "slow()"
    """
    if code == "-":
        code = sys.stdin.read()
    reply = state(ctx).controller().eval(sandbox_id, code, timeout=timeout)
    exit_code = reply.get("exit_code")
    status = processes.exit_status(exit_code) if exit_code else (1 if reply.get("error") else 0)
    if want_json(ctx, json_):
        output.emit_json(reply)
        raise typer.Exit(status)
    if reply.get("error"):
        output.error(str(reply["error"]))
    elif reply.get("result") is not None:
        typer.echo(reply["result"])
    raise typer.Exit(status)
