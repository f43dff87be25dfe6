"""Commands for the children of a running sandbox: ``forkd promote``, ``forkd checkpoints``.

``forkd fork --from-sandbox`` itself lives with the other fork in sandboxes.py;
how its answer is shown is here (:func:`print_fork`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.markup import escape

from forkd import bounds
from forkd.cli import output
from forkd.cli.context import JsonFlag, handle_errors, state, usage_error, want_json

SandboxId = Annotated[str, typer.Argument(metavar="ID", help="Sandbox id, e.g. sb-67a1b3-0000.")]


class CheckpointMode(StrEnum):
    diff = "diff"
    live = "live"


def print_fork(result: Mapping[str, Any], asked: int, started: float) -> None:
    """A fork's children as a table, each failed child as an error, then one summary line."""
    children = result.get("children") or []
    errors = result.get("errors") or []
    if children:
        output.console.print(output.sandboxes_table(children))
    for failure in errors:
        output.error(f"child {failure.get('index')} failed: {failure.get('error')}")
    pause = result.get("pause_ms")
    details = [f"via [cyan]{escape(str(result.get('snapshot_tag')))}[/]"]
    if isinstance(pause, (int, float)):
        details.append(f"source paused {pause:.0f} ms")
    if result.get("tree_id"):
        details.append(f"tree [cyan]{escape(str(result['tree_id']))}[/]")
    colour = "green" if not errors else "yellow" if children else "red"
    count = f"{len(children)}" if not errors else f"{len(children)} of {asked}"
    output.console.print(
        f"[{colour}]forked {count}[/] from [cyan]{escape(str(result.get('parent_id')))}[/] "
        f"in {output.elapsed(started)} ({', '.join(details)})"
    )
    if result.get("tree_id") and children:
        output.console.print("[dim]keep one child and kill the others: forkd promote CHILD_ID[/]")


@handle_errors
def promote(
    ctx: typer.Context,
    sandbox_id: SandboxId,
    tree_id: Annotated[
        str | None,
        typer.Option("--tree-id", metavar="TREE", help="The fork-tree (default: the child's own)."),
    ] = None,
    cleanup_siblings: Annotated[
        bool,
        typer.Option("--cleanup-siblings/--no-cleanup-siblings",
                     help="Kill every other live child of the tree."),
    ] = True,
    replace_parent: Annotated[
        bool,
        typer.Option("--replace-parent",
                     help="Also kill the tree's source; its id then names this sandbox everywhere."),
    ] = False,
    json_: JsonFlag = False,
) -> None:
    """Keep one child of a fork-tree (forkd fork --from-sandbox ID --tree).

    Kills its siblings, and with --replace-parent the source too, whose id
    then names the promoted child. Exits 1 if a sandbox could not be killed.

    Examples:
      forkd promote sb-67a1b3-0003
      forkd promote sb-67a1b3-0003 --replace-parent
      forkd promote sb-67a1b3-0003 --tree-id ft-0123456789ab --no-cleanup-siblings
    """
    with output.spinner(f"promoting {escape(sandbox_id)}"):
        result = state(ctx).controller().promote_sandbox(
            sandbox_id, tree_id=tree_id, cleanup_siblings=cleanup_siblings,
            replace_parent=replace_parent,
        )
    deleted = result.get("deleted") or []
    failed = [d for d in deleted if not d.get("deleted")]
    if want_json(ctx, json_):
        output.emit_json(result)
    else:
        winner = result.get("winner") or {}
        output.console.print(
            f"[green]promoted[/] [cyan]{escape(str(winner.get('id', sandbox_id)))}[/] "
            f"of tree [cyan]{escape(str(result.get('tree_id')))}[/]"
        )
        parent = result.get("replaced_parent")
        for entry in deleted:
            what = "parent " if parent and entry.get("id") == parent else ""
            if entry.get("deleted"):
                output.console.print(f"killed {what}{escape(str(entry.get('id')))}")
            else:
                output.error(f"{what}{entry.get('id')} was not killed: {entry.get('error') or 'unknown'}")
        if parent:
            output.console.print(
                f"[cyan]{escape(str(parent))}[/] now names "
                f"[cyan]{escape(str(winner.get('id', sandbox_id)))}[/]"
            )
    if failed:
        raise typer.Exit(1)


@handle_errors
def checkpoints(
    ctx: typer.Context,
    sandbox_id: SandboxId,
    every: Annotated[
        int | None,
        typer.Option("--every", metavar="N", min=int(bounds.CHECKPOINT_EVERY.low),
                     max=int(bounds.CHECKPOINT_EVERY.high),
                     help="Branch the sandbox after every N exec/eval calls."),
    ] = None,
    keep: Annotated[
        int | None,
        typer.Option("--keep", metavar="K", min=int(bounds.CHECKPOINT_KEEP.low),
                     max=int(bounds.CHECKPOINT_KEEP.high),
                     help="Keep the newest K checkpoints (daemon default 3); needs --every."),
    ] = None,
    mode: Annotated[
        CheckpointMode | None,
        typer.Option("--mode", help="Branch mode (live needs a --live-fork sandbox); needs --every."),
    ] = None,
    off: Annotated[
        bool, typer.Option("--off", help="Stop checkpointing (the checkpoints taken stay).")
    ] = False,
    json_: JsonFlag = False,
) -> None:
    """Show or set a sandbox's auto-checkpoint policy.

    Without options, shows the policy and the kept checkpoints (oldest first).
    Fork a checkpoint (forkd fork --tag TAG) to go back to it.

    Examples:
      forkd checkpoints sb-67a1b3-0000
      forkd checkpoints sb-67a1b3-0000 --every 5 --keep 3
      forkd checkpoints sb-67a1b3-0000 --every 1 --mode live
      forkd checkpoints sb-67a1b3-0000 --off
    """
    if off and every is not None:
        usage_error(ctx, "--off and --every are mutually exclusive")
    if every is None and (keep is not None or mode is not None):
        usage_error(ctx, "--keep and --mode need --every")
    controller = state(ctx).controller()
    if off:
        result = controller.delete_checkpoints(sandbox_id)
    elif every is not None:
        result = controller.set_checkpoints(
            sandbox_id, every, keep=keep, mode=mode.value if mode is not None else None
        )
    else:
        result = controller.get_checkpoints(sandbox_id)
    if want_json(ctx, json_):
        output.emit_json(result)
        return
    print_checkpoints(result)


def print_checkpoints(result: Mapping[str, Any]) -> None:
    policy = result.get("policy")
    who = escape(str(result.get("sandbox_id")))
    if policy:
        output.console.print(
            f"[cyan]{who}[/] checkpoints every {policy.get('every')} exec/eval calls, "
            f"keeps {policy.get('keep')}, mode {escape(str(policy.get('mode')))} "
            f"({result.get('calls', 0)} calls counted)"
        )
    else:
        output.console.print(f"[cyan]{who}[/] has no checkpoint policy")
    kept = result.get("checkpoints") or []
    if kept:
        output.console.print(output.snapshots_table(kept, title="checkpoints"))
    else:
        output.console.print("no checkpoints kept")
    if result.get("last_error"):
        output.warn(f"the latest checkpoint failed: {result['last_error']}")


__all__ = ["CheckpointMode", "checkpoints", "print_checkpoints", "print_fork", "promote"]
