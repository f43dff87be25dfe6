"""``forkd network log ID``: what a sandbox's guest asked its resolver, and which connections it made
by name, each allowed or refused, and why.

The daemon's resolver and inspector of a sandbox with names in its egress policy keep their
latest decisions (host/dnsguard.py); this prints them, oldest first.
"""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from forkd.cli import output
from forkd.cli.context import JsonFlag, handle_errors, state, want_json

network_app = typer.Typer(help="A sandbox's network: what its egress policy allowed and refused.",
                          no_args_is_help=True)
SandboxId = Annotated[str, typer.Argument(metavar="ID", help="Sandbox id, e.g. sb-67a1b3-0000.")]


@network_app.command("log")
@handle_errors
def log(ctx: typer.Context, sandbox_id: SandboxId, json_: JsonFlag = False) -> None:
    """The latest names the sandbox's guest asked its resolver for (egress by name), each allowed
    with the addresses it opened, or refused and why; and its connections to those addresses, each
    let through or refused by the name it carried (TLS SNI or HTTP Host).

    Example:
      forkd network log sb-67a1b3-0000
    """
    got = state(ctx).controller().network_log(sandbox_id)
    if want_json(ctx, json_):
        output.emit_json(got)
        return
    entries = got.get("entries") or []
    if not entries:
        output.console.print(f"{escape(sandbox_id)}: no names asked for or connected to "
                             "(or no names in its egress policy)")
        return
    table = Table(title=f"egress by name of {sandbox_id}", title_justify="left")
    for col in ("time", "kind", "name", "address", "", "detail"):
        table.add_column(col)
    for e in entries:
        when = time.strftime("%H:%M:%S", time.localtime(float(e.get("time", 0))))
        verdict = "[green]allowed[/]" if e.get("allowed") else "[red]refused[/]"
        table.add_row(when, escape(str(e.get("kind", ""))), escape(str(e.get("name", "")) or "(none)"),
                      escape(str(e.get("address", ""))), verdict, escape(str(e.get("detail", ""))))
    output.console.print(table)
