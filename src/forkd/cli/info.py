"""``forkd version`` and ``forkd doctor``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from forkd.cli import output
from forkd.cli.context import JsonFlag, handle_errors, state, want_json
from forkd.config import API_VERSION, VERSION
from forkd.errors import ForkdError
from forkd.sdk.models import Version


@handle_errors
def version(ctx: typer.Context, json_: JsonFlag = False) -> None:
    """Show the client's version and, if it is reachable, the daemon's.

    An unreachable daemon is only a warning here.

    Example:
      forkd version
    """
    controller = state(ctx).controller()
    daemon: Version | None
    problem = None
    try:
        daemon = controller.version()
    except ForkdError as exc:  # the client version is worth printing on its own
        daemon, problem = None, str(exc)
    if want_json(ctx, json_):
        output.emit_json({
            "client": {"version": VERSION, "api": API_VERSION},
            "daemon": daemon,
            "url": controller.url,
        })
        return
    output.console.print(f"forkd {VERSION} (client, API {API_VERSION})")
    if daemon is not None:
        output.console.print(
            f"daemon {escape(str(daemon.get('version')))} at {escape(controller.url)} "
            f"(API {escape(str(daemon.get('api')))})"
        )
    else:
        output.warn(problem or "daemon not reachable")


def _check_json(check: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(check) and not isinstance(check, type):
        return dataclasses.asdict(check)
    return {k: getattr(check, k, None) for k in ("name", "ok", "detail", "fix", "required")}


@handle_errors
def doctor(
    ctx: typer.Context,
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", envvar="FORKD_DATA_DIR", help="State directory to check."),
    ] = None,
    probe: Annotated[
        bool,
        typer.Option(
            "--probe",
            help="First boot-probe the accelerator (KVM, else TCG) and cache the answer.",
        ),
    ] = False,
    json_: JsonFlag = False,
) -> None:
    """Check that this host can run forkd, and say how to fix what is missing.

    Runs locally (no daemon needed) and changes nothing, except that --probe
    boots a tiny guest to find out whether KVM really works here. Exits 1 if a
    required check fails; optional features only warn.

    Examples:
      sudo forkd doctor
      sudo forkd doctor --probe
    """
    from forkd import doctor as doctor_mod

    as_json = want_json(ctx, json_)
    if probe:
        _probe(data_dir, quiet=as_json)
    checks = doctor_mod.run_checks(data_dir)
    passed = getattr(doctor_mod, "passed", None)
    ok = passed(checks) if passed else all(c.ok for c in checks)
    if as_json:
        output.emit_json({"ok": ok, "checks": [_check_json(c) for c in checks]})
        raise typer.Exit(0 if ok else 1)

    table = Table()
    table.add_column("", no_wrap=True)
    table.add_column("CHECK", no_wrap=True)
    table.add_column("DETAIL")
    table.add_column("FIX")
    for c in checks:
        required = getattr(c, "required", True)
        mark = "[green]✓[/]" if c.ok else ("[red]✗[/]" if required else "[yellow]![/]")
        table.add_row(mark, escape(c.name), escape(c.detail), escape(c.fix or "") if not c.ok else "")
    output.console.print(table)
    failed = [c.name for c in checks if not c.ok and getattr(c, "required", True)]
    if ok:
        output.console.print("[green]all required checks passed[/]")
    else:
        output.console.print(
            f"[red]{len(failed)} required check(s) failed:[/] {escape(', '.join(failed))}"
        )
    raise typer.Exit(0 if ok else 1)


def _probe(data_dir: Path | None, quiet: bool) -> None:
    from forkd import doctor as doctor_mod

    with output.spinner("boot-probing the accelerator (KVM, then TCG)"):
        result = doctor_mod.probe_accel(data_dir)
    if not quiet:
        detail = f"guests boot under {result.get('accel')} (cpu {result.get('cpu')})"
        if result.get("kvm_error"):
            detail += f"; KVM unusable: {result['kvm_error']}"
        output.console.print(escape(detail))
