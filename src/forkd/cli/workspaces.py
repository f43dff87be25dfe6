"""``forkd workspace create|ls|show|suspend|resume|rm``: named sandboxes that survive suspend/resume.

A workspace is forkd 0.5's name for what E2B calls pause/resume: suspend branches
the running sandbox to a state snapshot and stops it (it then costs disk only);
resume starts it again, under the same sandbox id, from that state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from forkd import bounds
from forkd.cli import output
from forkd.cli.context import JsonFlag, handle_errors, show_details, state, want_json

workspace_app = typer.Typer(
    name="workspace",
    help="Named sandboxes you can suspend to disk and resume later (E2B's pause/resume).",
    no_args_is_help=True,
)

NameArg = Annotated[str, typer.Argument(help="Workspace name.")]


def workspaces_table(workspaces: Iterable[Mapping[str, Any]]) -> Table:
    table = Table()
    table.add_column("NAME", style="cyan", no_wrap=True)
    table.add_column("STATUS", no_wrap=True)
    table.add_column("SANDBOX", no_wrap=True)
    table.add_column("FROM", no_wrap=True)
    table.add_column("STATE SNAPSHOT", no_wrap=True)
    table.add_column("ACTIVE", justify="right", no_wrap=True)
    for ws in workspaces:
        table.add_row(
            output.fmt(ws.get("name")), output.fmt(ws.get("status")), output.fmt(ws.get("live_sandbox_id")),
            output.fmt(ws.get("source_snapshot_tag")), output.fmt(ws.get("current_state_tag")),
            output.fmt_age(ws.get("last_active_unix")),
        )
    return table


@workspace_app.command("create")
@handle_errors
def create(
    ctx: typer.Context,
    name: NameArg,
    snapshot_tag: Annotated[str, typer.Argument(help="Snapshot its sandbox is forked from.")],
    per_child_netns: Annotated[
        bool, typer.Option("--per-child-netns", help="Run it in a forkd-child-<i> namespace.")
    ] = False,
    memory_limit_mib: Annotated[
        int | None,
        typer.Option("--memory-limit-mib", metavar="MIB", min=int(bounds.MEMORY_LIMIT_MIB.low),
                     max=int(bounds.MEMORY_LIMIT_MIB.high), help="cgroup memory limit."),
    ] = None,
    json_: JsonFlag = False,
) -> None:
    """Fork a sandbox of SNAPSHOT_TAG and name it.

    Example:
      forkd workspace create agent-1 py
    """
    with output.spinner(f"forking {escape(snapshot_tag)} as workspace {escape(name)}"):
        info = state(ctx).controller().create_workspace(
            name, snapshot_tag, per_child_netns=per_child_netns, memory_limit_mib=memory_limit_mib)
    show_details(ctx, info, json_)


@workspace_app.command("ls")
@handle_errors
def ls(ctx: typer.Context, json_: JsonFlag = False) -> None:
    """List workspaces: running, suspended (resumable) or stale (resume starts afresh)."""
    workspaces = state(ctx).controller().list_workspaces()
    if want_json(ctx, json_):
        output.emit_json(workspaces)
        return
    output.console.print(workspaces_table(workspaces))


@workspace_app.command("show")
@handle_errors
def show(ctx: typer.Context, name: NameArg, json_: JsonFlag = False) -> None:
    """Show one workspace."""
    show_details(ctx, state(ctx).controller().get_workspace(name), json_)


@workspace_app.command("suspend")
@handle_errors
def suspend(
    ctx: typer.Context,
    name: NameArg,
    diff: Annotated[
        bool, typer.Option("--diff", help="Pause it for less time: state as of the end of the copy.")
    ] = False,
    json_: JsonFlag = False,
) -> None:
    """Branch its running sandbox to a state snapshot, then stop it.

    Example:
      forkd workspace suspend agent-1
    """
    with output.spinner(f"suspending {escape(name)}"):
        info = state(ctx).controller().suspend_workspace(name, diff=diff)
    show_details(ctx, info, json_)


@workspace_app.command("resume")
@handle_errors
def resume(ctx: typer.Context, name: NameArg, json_: JsonFlag = False) -> None:
    """Start its sandbox again, under the same id, from its saved state.

    Example:
      forkd workspace resume agent-1
    """
    with output.spinner(f"resuming {escape(name)}"):
        info = state(ctx).controller().resume_workspace(name)
    show_details(ctx, info, json_)


@workspace_app.command("rm")
@handle_errors
def rm(ctx: typer.Context, name: NameArg, json_: JsonFlag = False) -> None:
    """Kill its sandbox (or drop its saved state) and forget the name."""
    state(ctx).controller().delete_workspace(name)
    if want_json(ctx, json_):
        output.emit_json({"deleted": name})
    else:
        output.console.print(f"deleted workspace {escape(name)}")


__all__ = ["workspace_app", "workspaces_table"]
