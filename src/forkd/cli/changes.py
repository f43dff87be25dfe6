"""``forkd diff`` and ``forkd apply``: keep what won. A sandbox's changes since its snapshot (or
against another snapshot or sandbox) as a list, a patch or a tar; a child's changes applied to
its parent."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.markup import escape

from forkd.cli import output
from forkd.cli.context import JsonFlag, handle_errors, state, want_json

SandboxId = Annotated[str, typer.Argument(metavar="ID", help="Sandbox id, e.g. sb-67a1b3-0000.")]


class DiffFormat(StrEnum):
    json = "json"
    patch = "patch"
    tar = "tar"


@handle_errors
def diff(
    ctx: typer.Context,
    sandbox_id: SandboxId,
    against: Annotated[str, typer.Option(help="parent, snapshot:TAG or sandbox:ID.")] = "parent",
    include: Annotated[list[str] | None, typer.Option(help="Only under this path (or matching this name).")]
    = None,
    exclude: Annotated[list[str] | None, typer.Option(
        help="Leave this out (replaces the defaults: /proc, /sys, /tmp, caches, ...).")] = None,
    format: Annotated[DiffFormat, typer.Option("--format", "-f", help="json (a list), patch or tar.")]
    = DiffFormat.json,
    json_: JsonFlag = False,
) -> None:
    """What a sandbox's filesystem changed since its snapshot, read from its disk layers.

    Examples:
      forkd diff sb-67a1b3-0001
      forkd diff sb-67a1b3-0001 --format patch --include /work > fix.patch
      forkd diff sb-67a1b3-0001 --format tar > changed.tar
    """
    result = state(ctx).controller().sandbox_diff(sandbox_id, against, include=include, exclude=exclude,
                                                  format=format.value)
    if format is DiffFormat.patch:
        sys.stdout.write(result)
        return
    if format is DiffFormat.tar:
        sys.stdout.buffer.write(result)
        return
    if want_json(ctx, json_):
        output.emit_json(result)
        return
    for mark, key in (("A", "added"), ("M", "modified"), ("D", "deleted")):
        for change in result.get(key) or []:
            output.console.print(f"{mark} {escape(_describe(change))}")
    output.console.print(f"[dim]{len(result.get('added') or [])} added, {len(result.get('modified') or [])} "
                         f"modified, {len(result.get('deleted') or [])} deleted against "
                         f"{escape(str(result.get('against')))} in {result.get('elapsed_ms')} ms[/dim]")


def _describe(change: Mapping[str, Any]) -> str:
    extra = []
    if change.get("old_mode") is not None:
        extra.append(f"mode {int(change['old_mode']):o} -> {int(change['mode']):o}")
    if change.get("old_uid") is not None or change.get("old_gid") is not None:
        extra.append(f"owner -> {change['uid']}:{change['gid']}")
    return f"{change['path']}" + (f" ({', '.join(extra)})" if extra else "")


@handle_errors
def apply(
    ctx: typer.Context,
    sandbox_id: SandboxId,
    source: Annotated[str, typer.Option("--from", help="The sandbox whose changes to apply (a child).")],
    path: Annotated[list[str] | None, typer.Option("--path", help="Only changes under this path.")] = None,
    json_: JsonFlag = False,
) -> None:
    """Apply a child's changes since its snapshot onto a sandbox (its parent, typically). A path both
    changed differently is a conflict: every one is named and nothing is written.

    Example:
      forkd apply sb-67a1b3-0000 --from sb-67a1b3-0001
    """
    result: Mapping[str, Any] = state(ctx).controller().apply_changes(sandbox_id, source, path)
    if want_json(ctx, json_):
        output.emit_json(result)
        return
    for mark, key in (("W", "written"), ("D", "deleted"), ("=", "unchanged")):
        for name in result.get(key) or []:
            output.console.print(f"{mark} {escape(str(name))}")
