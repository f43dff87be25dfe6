"""Snapshots that travel: ``forkd pack`` / ``forkd unpack`` (local files, no daemon on the data
dir: api/offline.py) and ``forkd push`` / ``forkd pull`` (the daemon and its object store)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from forkd.api import offline
from forkd.cli import output
from forkd.cli.context import JsonFlag, handle_errors, state, want_json
from forkd.cli.image import DataDirOpt


@handle_errors
def pack(
    ctx: typer.Context,
    tag: Annotated[str, typer.Argument(help="Snapshot to pack (with every ancestor its disk needs).")],
    out: Annotated[Path, typer.Option("--output", "-o", help="Archive to write (must not exist).")],
    no_base: Annotated[
        bool, typer.Option("--no-base", help="Leave the base image out (the receiving host has the same "
                           "guest image, byte for byte).")
    ] = False,
    data_dir: DataDirOpt = None,
    json_: JsonFlag = False,
) -> None:
    """Pack a snapshot into one zstd archive that any compatible host can unpack. Runs locally.

    It works on the data dir alone: while a daemon runs on it, it refuses (use
    `forkd push`, or stop the daemon).

    The archive holds the snapshot and its ancestors whole (memory, device state,
    disk layers), the base image unless --no-base, and a manifest with the sha256
    of every file, the QEMU version, accelerator and CPU model, the image recipe
    and the lineage. Memory files are read sparsely (holes are never read).

    Examples:
      forkd pack checkpoint-3 -o checkpoint-3.forkd
      forkd pack py -o py.forkd --no-base      # the other host built the same image
    """
    started = time.monotonic()
    with output.transfer_bar(f"packing {escape(tag)}", None) as advance:
        result = offline.pack(data_dir, tag, out, include_base=not no_base, progress=advance)
    if want_json(ctx, json_):
        output.emit_json(result)
        return
    output.console.print(f"[green]packed[/] [cyan]{escape(tag)}[/] ({' → '.join(result['lineage'])}) "
                         f"into {escape(str(out))}: {result['bytes'] / 2**20:.1f} MiB in "
                         f"{output.elapsed(started)}")


@handle_errors
def unpack(
    ctx: typer.Context,
    archive: Annotated[Path, typer.Argument(help="Archive written by forkd pack.")],
    data_dir: DataDirOpt = None,
    json_: JsonFlag = False,
) -> None:
    """Verify an archive and register its snapshots on this host. Runs locally, without a daemon.

    Refuses a corrupt or tampered archive (checksums), an unsafe one (paths,
    links, devices) and one this host cannot restore (accelerator, CPU model,
    QEMU release), each with an error saying which. Ancestors this host already
    has (same content) are reused; nothing is registered unless all of it is.
    While a daemon runs on the data dir it refuses (use `forkd pull`, or stop
    the daemon).

    Example:
      forkd unpack checkpoint-3.forkd && forkd fork --tag checkpoint-3
    """
    started = time.monotonic()
    with output.transfer_bar(f"unpacking {escape(archive.name)}", None) as advance:
        result = offline.unpack(data_dir, archive, progress=advance)
    if want_json(ctx, json_):
        output.emit_json(result)
        return
    created = ", ".join(result["created"]) or "nothing new"
    output.console.print(f"[green]unpacked[/] [cyan]{escape(result['tag'])}[/] in {output.elapsed(started)}: "
                         f"registered {escape(created)}; base image {result['base']}")


@handle_errors
def push(
    ctx: typer.Context,
    tag: Annotated[str, typer.Argument(help="Snapshot to publish.")],
    force: Annotated[
        bool, typer.Option("--force", help="Replace a different snapshot of this tag in the store.")
    ] = False,
    json_: JsonFlag = False,
) -> None:
    """Publish a snapshot (and the chain its disk needs) to the daemon's object store.

    The store is content-addressed: blobs it already holds (a shared base, a
    parent's disk) are not sent again. Any host with the same store can then
    pull or simply fork the tag.

    Example:
      forkd push checkpoint-3        # then, on another host: forkd fork --tag checkpoint-3
    """
    started = time.monotonic()
    with output.spinner(f"pushing {escape(tag)}"):
        result = state(ctx).controller().push_snapshot(tag, force=force)
    if want_json(ctx, json_):
        output.emit_json(result)
        return
    output.console.print(
        f"[green]pushed[/] [cyan]{escape(tag)}[/] to {escape(result['store'])} in {output.elapsed(started)}: "
        f"{result['blobs_uploaded']} of {result['blobs']} blobs uploaded "
        f"({result['bytes_uploaded'] / 2**20:.1f} MiB), lineage {' → '.join(result['lineage'])}")


@handle_errors
def pull(
    ctx: typer.Context,
    tag: Annotated[str, typer.Argument(help="Snapshot to fetch.")],
    json_: JsonFlag = False,
) -> None:
    """Fetch a snapshot from the daemon's object store onto its host (a spawn does this by itself).

    Example:
      forkd pull checkpoint-3
    """
    started = time.monotonic()
    with output.spinner(f"pulling {escape(tag)}"):
        result = state(ctx).controller().pull_snapshot(tag)
    if want_json(ctx, json_):
        output.emit_json(result)
        return
    created = ", ".join(result["created"]) or "nothing (already here)"
    output.console.print(f"[green]pulled[/] [cyan]{escape(tag)}[/] in {output.elapsed(started)}: registered "
                         f"{escape(created)} ({result['bytes_downloaded'] / 2**20:.1f} MiB downloaded)")
