"""``forkd volume create|ls|show|cp|rm``: named volumes that snapshots and sandboxes attach (``--volume``).

An ext4 volume is a disk of a fixed size. ``forkd snapshot --volume NAME:/mnt/data`` attaches
it; every child of that snapshot gets its own copy-on-write view of it, and a branch carries
what was written forward. A hostdir volume (``--fs hostdir``) is files on the daemon's host that
running sandboxes share: ``forkd fork --tag T --volume NAME:/mnt/shared`` mounts it in each
child (docs/BRANCHING.md).
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

volume_app = typer.Typer(
    name="volume",
    help="Named volumes: ext4 disks that snapshots attach, hostdir files that sandboxes share (--volume).",
    no_args_is_help=True,
)

NameArg = Annotated[str, typer.Argument(help="Volume name.")]


def volumes_table(volumes: Iterable[Mapping[str, Any]]) -> Table:
    table = Table()
    table.add_column("NAME", style="cyan", no_wrap=True)
    table.add_column("SIZE MIB", justify="right", no_wrap=True)
    table.add_column("USED MIB", justify="right", no_wrap=True)
    table.add_column("FS", no_wrap=True)
    table.add_column("SNAPSHOTS")
    table.add_column("SANDBOXES")
    for vol in volumes:
        table.add_row(output.fmt(vol.get("name")), output.fmt(vol.get("size_mib")),
                      output.fmt(vol.get("used_mib")), output.fmt(vol.get("fs")),
                      ", ".join(vol.get("snapshots") or []) or "-",
                      ", ".join(vol.get("sandboxes") or []) or "-")
    return table


@volume_app.command("create")
@handle_errors
def create(
    ctx: typer.Context,
    name: NameArg,
    size_mib: Annotated[
        int | None,
        typer.Option("--size-mib", metavar="MIB", min=int(bounds.VOLUME_SIZE_MIB.low),
                     max=int(bounds.VOLUME_SIZE_MIB.high),
                     help=f"Its size: the most a guest writes (default {bounds.DEFAULT_VOLUME_SIZE_MIB})."),
    ] = None,
    source: Annotated[
        str | None,
        typer.Option("--from", metavar="PATH",
                     help="A directory or tarball on the daemon's host to fill it from."),
    ] = None,
    fs: Annotated[
        str | None,
        typer.Option("--fs", metavar="ext4|hostdir",
                     help="ext4 (the default): a disk each child of a snapshot copies; hostdir: files "
                     "running sandboxes share (fork shared)."),
    ] = None,
    json_: JsonFlag = False,
) -> None:
    """Create a volume, empty or filled from a host directory or tarball.

    Examples:
      forkd volume create data --size-mib 2048
      forkd volume create fixtures --from /srv/fixtures.tar.gz
      forkd volume create team --fs hostdir --size-mib 512
    """
    with output.spinner(f"creating volume {escape(name)}"):
        info = state(ctx).controller().create_volume(name, size_mib=size_mib, source=source, fs=fs)
    show_details(ctx, info, json_)


@volume_app.command("ls")
@handle_errors
def ls(ctx: typer.Context, json_: JsonFlag = False) -> None:
    """List volumes, with the snapshots that attach each."""
    volumes = state(ctx).controller().list_volumes()
    if want_json(ctx, json_):
        output.emit_json(volumes)
        return
    output.console.print(volumes_table(volumes))


@volume_app.command("show")
@handle_errors
def show(ctx: typer.Context, name: NameArg, json_: JsonFlag = False) -> None:
    """Show one volume."""
    show_details(ctx, state(ctx).controller().get_volume(name), json_)


@volume_app.command("cp")
@handle_errors
def cp(
    ctx: typer.Context,
    name: NameArg,
    dest: Annotated[str, typer.Argument(help="A new directory on the daemon's host.")],
    snapshot: Annotated[
        str | None,
        typer.Option("--snapshot", metavar="TAG", help="Copy the volume as this snapshot holds it."),
    ] = None,
    json_: JsonFlag = False,
) -> None:
    """Copy a volume's files out into a new host directory (to copy files in, create a volume
    with --from).

    Examples:
      forkd volume cp data /srv/export/data
      forkd volume cp data /srv/export/after-setup --snapshot db
    """
    with output.spinner(f"copying volume {escape(name)} to {escape(dest)}"):
        info = state(ctx).controller().export_volume(name, dest, snapshot=snapshot)
    show_details(ctx, info, json_)


@volume_app.command("rm")
@handle_errors
def rm(ctx: typer.Context, name: NameArg, json_: JsonFlag = False) -> None:
    """Delete a volume (refused while a snapshot attaches it)."""
    state(ctx).controller().delete_volume(name)
    if want_json(ctx, json_):
        output.emit_json({"deleted": name})
    else:
        output.console.print(f"deleted volume {escape(name)}")


__all__ = ["volume_app", "volumes_table"]
