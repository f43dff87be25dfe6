"""``forkd secret set|ls|show|rm``: write-only secrets that header rules put into a sandbox's
requests at egress (``${secrets.NAME}``), so that no sandbox ever holds them.

A value is read from stdin or an environment variable, never from the command line: an
argument would be in the shell's history and in every ``ps`` listing.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from forkd.cli import output
from forkd.cli.context import JsonFlag, handle_errors, show_details, state, want_json

secret_app = typer.Typer(
    name="secret",
    help="Write-only secrets, put into requests to hosts with a header rule at egress (${secrets.NAME}).",
    no_args_is_help=True,
)

NameArg = Annotated[str, typer.Argument(help="Secret name: letters, digits and _, e.g. API_TOKEN.")]


def _value(from_env: str | None) -> str:
    if from_env is not None:
        value = os.environ.get(from_env)
        if value is None:
            raise typer.BadParameter(f"${from_env} is not set", param_hint="--from-env")
        return value
    if sys.stdin.isatty():
        raise typer.BadParameter("give the value on stdin (e.g. `printf %s \"$TOKEN\" | forkd secret set "
                                 "NAME`) or name an environment variable with --from-env")
    return sys.stdin.read().removesuffix("\n")


@secret_app.command("set")
@handle_errors
def set_(
    ctx: typer.Context,
    name: NameArg,
    from_env: Annotated[
        str | None,
        typer.Option("--from-env", metavar="VAR", help="Take the value from this environment variable."),
    ] = None,
    json_: JsonFlag = False,
) -> None:
    """Create a secret, or give an existing one a new value (its version goes up). The value comes
    from stdin or --from-env, never from an argument.

    Examples:
      printf %s "$OPENAI_API_KEY" | forkd secret set OPENAI_API_KEY
      forkd secret set GH_TOKEN --from-env GH_TOKEN
    """
    value = _value(from_env)
    controller = state(ctx).controller()
    known = {s.get("name") for s in controller.list_secrets()}
    info = (controller.update_secret(name, value=value) if name in known
            else controller.create_secret(name, value))
    show_details(ctx, info, json_)


@secret_app.command("ls")
@handle_errors
def ls(ctx: typer.Context, json_: JsonFlag = False) -> None:
    """List secrets: names, versions and labels (never a value)."""
    secrets = state(ctx).controller().list_secrets()
    if want_json(ctx, json_):
        output.emit_json(secrets)
        return
    table = Table()
    table.add_column("NAME", style="cyan", no_wrap=True)
    table.add_column("VERSION", justify="right")
    table.add_column("LABELS")
    for s in secrets:
        labels = ", ".join(f"{k}={v}" for k, v in (s.get("metadata") or {}).items()) or "-"
        table.add_row(escape(str(s.get("name"))), output.fmt(s.get("version")), escape(labels))
    output.console.print(table)


@secret_app.command("show")
@handle_errors
def show(ctx: typer.Context, name: NameArg, json_: JsonFlag = False) -> None:
    """Show one secret's name, version and labels (never its value)."""
    show_details(ctx, state(ctx).controller().get_secret(name), json_)


@secret_app.command("rm")
@handle_errors
def rm(ctx: typer.Context, name: NameArg, json_: JsonFlag = False) -> None:
    """Delete a secret (a placeholder naming it is then left as it is)."""
    state(ctx).controller().delete_secret(name)
    if want_json(ctx, json_):
        output.emit_json({"deleted": name})
    else:
        output.console.print(f"deleted secret {escape(name)}")


__all__ = ["secret_app"]
