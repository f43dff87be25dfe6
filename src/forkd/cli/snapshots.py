"""Snapshot commands: ``forkd snapshot``, ``forkd snapshot-info``, ``forkd rmi``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Annotated, Any

import typer
from rich.markup import escape

from forkd.cli import output
from forkd.cli.context import JsonFlag, handle_errors, show_details, state, usage_error, want_json
from forkd.cli.image import split_csv
from forkd.cli.network import AllowInternet, AllowOut, DenyOut, network_policy
from forkd.sdk import ForkdAPIError
from forkd.sdk.models import CreateSnapshotExtra, VolumeSpec


def branch_mode(ctx: typer.Context, diff: bool, live: bool, no_wait: bool = False) -> str | None:
    """The ``mode`` to send for ``--diff`` / ``--live``; None means the daemon's default (full)."""
    if diff and live:
        usage_error(ctx, "--diff and --live are mutually exclusive")
    if no_wait and not live:
        usage_error(ctx, "--no-wait requires --live (full and diff branches are synchronous)")
    return "diff" if diff else "live" if live else None


def print_branch(info: Mapping[str, Any], source: str, started: float) -> None:
    pause = info.get("pause_ms")
    pause_text = f", source paused {pause:.0f} ms" if isinstance(pause, (int, float)) else ""
    output.console.print(
        f"[green]branched[/] {escape(source)} → [cyan]{escape(str(info.get('tag')))}[/] "
        f"in {output.elapsed(started)}{pause_text}, status {output.fmt_status(info.get('status'))}"
    )


@handle_errors
def snapshot(
    ctx: typer.Context,
    tag: Annotated[
        str | None,
        typer.Option("--tag", "-t", help="Tag of the new snapshot (optional with --from-sandbox)."),
    ] = None,
    image: Annotated[
        str | None, typer.Option("--image", help="Guest image to boot (forkd image build --name).")
    ] = None,
    mem_mib: Annotated[int | None, typer.Option("--mem-mib", help="Guest RAM in MiB.")] = None,
    vcpus: Annotated[int | None, typer.Option("--vcpus", help="Guest vCPUs.")] = None,
    boot_wait_secs: Annotated[
        float | None,
        typer.Option("--boot-wait-secs", help="Max seconds to wait for the guest agent after boot."),
    ] = None,
    warm: Annotated[
        list[str] | None,
        typer.Option(
            "--warm", metavar="MOD,MOD",
            help="Python modules PID 1 imports before the snapshot (default numpy; '' for none).",
        ),
    ] = None,
    setup: Annotated[
        list[str] | None,
        typer.Option(
            "--setup", metavar="CMD",
            help="Shell command run in the guest (via sh -c) before the snapshot; repeatable.",
        ),
    ] = None,
    kernel: Annotated[
        str | None, typer.Option("--kernel", help="Host path of a vmlinux instead of the image's.")
    ] = None,
    rootfs: Annotated[
        str | None, typer.Option("--rootfs", help="Host path of an ext4 rootfs instead of the image's.")
    ] = None,
    nic: Annotated[
        bool,
        typer.Option("--nic", help="Give the template, and every child, a network device (eth0 with an "
                     "address, route and DNS; each child reachable from the host at its own ip)."),
    ] = False,
    allow_internet_access: AllowInternet = False,
    allow_out: AllowOut = None,
    deny_out: DenyOut = None,
    volume: Annotated[
        list[str] | None,
        typer.Option(
            "--volume", metavar="SOURCE:GUEST[:ro]",
            help="Attach a volume, mounted at GUEST: SOURCE is a volume's name (forkd volume create) or "
            "a host directory (starting with /, copied into a new volume); repeatable.",
        ),
    ] = None,
    from_sandbox: Annotated[
        str | None,
        typer.Option("--from-sandbox", metavar="ID", help="Branch this running sandbox instead."),
    ] = None,
    diff: Annotated[
        bool, typer.Option("--diff", help="Branch mode diff: write only dirty pages (short pause).")
    ] = False,
    live: Annotated[
        bool,
        typer.Option("--live", help="Branch mode live: shortest pause; needs a --live-fork source."),
    ] = False,
    no_wait: Annotated[
        bool,
        typer.Option("--no-wait", help="With --live: return while the memory copy is still writing."),
    ] = False,
    json_: JsonFlag = False,
) -> None:
    """Create a snapshot: boot and warm a template VM, or branch a running sandbox.

    Building boots the guest image, imports the --warm modules in PID 1, runs the
    --setup commands and snapshots the VM (tens of seconds under TCG).
    With --from-sandbox the sandbox pauses briefly, is snapshotted as a new tag
    and resumes. --diff and --live are mutually exclusive; --no-wait requires --live.

    Examples:
      forkd snapshot --tag py
      forkd snapshot --tag ml --image ml --mem-mib 1024 --warm numpy,pandas
      forkd snapshot --tag web --setup "pip install requests" --setup "mkdir /work"
      forkd snapshot --tag py-net --nic
      forkd snapshot --tag db --volume data:/mnt/data --volume /srv/fixtures:/fixtures:ro
      forkd snapshot --tag web-net --nic --allow-internet-access --setup "pip install requests"
      forkd snapshot --from-sandbox sb-67a1b3-0000 --tag checkpoint-1 --diff
      forkd snapshot --from-sandbox sb-67a1b3-0000 --live --no-wait
    """
    mode = branch_mode(ctx, diff, live, no_wait)
    if from_sandbox is None:
        if diff or live or no_wait:
            usage_error(ctx, "--diff, --live and --no-wait only apply with --from-sandbox")
        if tag is None:
            usage_error(ctx, "--tag is required (or --from-sandbox ID to branch a running sandbox)")
    else:
        build_only = {
            "--image": image, "--mem-mib": mem_mib, "--vcpus": vcpus,
            "--boot-wait-secs": boot_wait_secs, "--warm": warm, "--setup": setup,
            "--kernel": kernel, "--rootfs": rootfs,
            "--nic": nic or None, "--allow-internet-access": allow_internet_access or None,
            "--allow-out": allow_out, "--deny-out": deny_out, "--volume": volume,
        }
        given = [flag for flag, value in build_only.items() if value is not None]
        if given:
            usage_error(ctx, f"{', '.join(given)} cannot be used with --from-sandbox")

    volumes = [parse_volume(ctx, text) for text in volume or ()]
    extra: CreateSnapshotExtra = {"volumes": volumes} if volumes else {}
    controller = state(ctx).controller()
    as_json = want_json(ctx, json_)
    started = time.monotonic()

    if from_sandbox is not None:
        with output.spinner(f"branching {escape(from_sandbox)}"):
            info = controller.branch_sandbox(from_sandbox, tag=tag, mode=mode, wait=not no_wait)
        if as_json:
            output.emit_json(info)
            return
        print_branch(info, from_sandbox, started)
        if info.get("status") == "writing":
            output.console.print(
                f"memory is still being written; check with: forkd snapshot-info {escape(info['tag'])}"
            )
        return

    assert tag is not None
    with output.spinner(f"building snapshot {escape(tag)} (boot, warm up, snapshot)"):
        info = controller.create_snapshot(
            tag,
            image=image,
            kernel=kernel,
            rootfs=rootfs,
            mem_mib=mem_mib,
            vcpus=vcpus,
            boot_wait_secs=boot_wait_secs,
            warm_imports=split_csv(warm) if warm is not None else None,
            setup=setup,
            nic=nic,
            allow_internet_access=allow_internet_access,
            network=network_policy(allow_out, deny_out),
            **extra,
        )
    if as_json:
        output.emit_json(info)
        return
    output.console.print(
        f"[green]snapshot[/] [cyan]{escape(tag)}[/] [green]ready[/] in {output.elapsed(started)}"
    )
    output.console.print(output.details_table(info))


def parse_volume(ctx: typer.Context, text: str) -> VolumeSpec:
    """The seeds' ``--volume SOURCE:GUEST[:ro]``: SOURCE is a host path when it starts with ``/``
    (a directory copied into a new volume), else a volume's name. The daemon checks the rest."""
    parts = text.split(":")
    read_only = False
    if len(parts) == 3 and parts[2] in ("ro", "rw"):
        read_only = parts.pop() == "ro"
    if len(parts) != 2 or not all(parts):
        usage_error(ctx, f"--volume {text!r}: expected SOURCE:GUEST_PATH[:ro]")
    source, mount = parts
    out: VolumeSpec = {"mount": mount, "read_only": read_only}
    out["host_path" if source.startswith("/") else "name"] = source
    return out


@handle_errors
def snapshot_info(
    ctx: typer.Context,
    tag: Annotated[str, typer.Argument(help="Snapshot tag.")],
    json_: JsonFlag = False,
) -> None:
    """Show one snapshot with its lineage (ancestors, dependents).

    Ancestors are the snapshots this one was branched from, nearest first;
    dependents are snapshots branched from sandboxes of this one.

    Example:
      forkd snapshot-info checkpoint-1
    """
    info = state(ctx).controller().get_snapshot(tag)
    if want_json(ctx, json_):
        output.emit_json(info)
        return
    shown = {k: v for k, v in info.items() if k not in ("ancestors", "dependents")}
    output.console.print(output.details_table(shown))
    ancestors = [str(a) for a in info.get("ancestors") or []]
    dependents = [str(d) for d in info.get("dependents") or []]
    output.console.print()
    # ancestors come nearest first, so the chain reads child ← parent ← grandparent.
    output.console.print(
        "[bold]lineage[/]     " + escape(" ← ".join([str(info.get("tag")), *ancestors]))
    )
    output.console.print("[bold]dependents[/]  " + (escape(", ".join(dependents)) or "-"))


@handle_errors
def compact(
    ctx: typer.Context,
    tag: Annotated[str, typer.Argument(help="Snapshot to copy.")],
    to: Annotated[str, typer.Argument(help="Tag of the new, standalone snapshot.")],
    json_: JsonFlag = False,
) -> None:
    """Copy a snapshot into a standalone one: its disk chain flattened, no parent.

    The copy no longer depends on TAG's ancestors, so they can be deleted
    (or the copy packed and moved) on their own.

    Example:
      forkd compact checkpoint-3 checkpoint-3-flat
    """
    with output.spinner(f"compacting {escape(tag)} into {escape(to)}"):
        info = state(ctx).controller().compact_snapshot(tag, to)
    show_details(ctx, info, json_)


@handle_errors
def rmi(
    ctx: typer.Context,
    tags: Annotated[list[str], typer.Argument(help="Snapshot tag(s) to delete.")],
    cascade: Annotated[
        bool, typer.Option("--cascade", help="Also delete snapshots branched from it.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Also kill sandboxes still running from it.")
    ] = False,
    json_: JsonFlag = False,
) -> None:
    """Delete snapshot(s) and their files.

    A snapshot that others depend on, or that sandboxes still run from, is
    refused (409) unless --cascade / --force say otherwise.

    Examples:
      forkd rmi checkpoint-1
      forkd rmi py --cascade --force
    """
    controller = state(ctx).controller()
    deleted: list[str] = []
    failed: dict[str, str] = {}
    for tag in tags:
        try:
            controller.delete_snapshot(tag, cascade=cascade, force=force)
        except ForkdAPIError as exc:  # per-tag failure; connection errors abort
            failed[tag] = str(exc)
            if not want_json(ctx, json_):
                output.error(f"{tag}: {exc}")
            continue
        deleted.append(tag)
        if not want_json(ctx, json_):
            output.console.print(f"deleted {escape(tag)}")
    if want_json(ctx, json_):
        output.emit_json({"deleted": deleted, "failed": failed})
    if failed:
        raise typer.Exit(1)
