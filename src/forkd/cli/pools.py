"""``forkd pool TAG [N]``: show or set a snapshot's warm pool; the pools table of ``forkd ls``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from forkd import bounds
from forkd.cli import output
from forkd.cli.context import JsonFlag, handle_errors, show_details, state
from forkd.cli.network import AllowInternet, AllowOut, DenyOut, network_policy
from forkd.sdk import Controller, NotFoundError
from forkd.sdk.models import PoolInfo


@handle_errors
def pool(
    ctx: typer.Context,
    tag: Annotated[str, typer.Argument(help="Snapshot tag.")],
    size: Annotated[
        int | None,
        typer.Argument(min=int(bounds.POOL_SIZE.low), max=int(bounds.POOL_SIZE.high),
                       help="Paused children to keep ready (0 drains). Omit to show the pool."),
    ] = None,
    memory_limit_mib: Annotated[
        int | None,
        typer.Option("--memory-limit-mib", metavar="MIB", min=int(bounds.MEMORY_LIMIT_MIB.low),
                     max=int(bounds.MEMORY_LIMIT_MIB.high),
                     help="Members' cgroup memory limit; only forks asking for it draw from the pool."),
    ] = None,
    per_child_netns: Annotated[
        bool, typer.Option("--per-child-netns", help="Members run in forkd-child-<i> namespaces.")
    ] = False,
    live_fork: Annotated[
        bool, typer.Option("--live-fork", help="Members can take --live branches.")
    ] = False,
    allow_internet_access: AllowInternet = False,
    allow_out: AllowOut = None,
    deny_out: DenyOut = None,
    json_: JsonFlag = False,
) -> None:
    """Show or set the warm pool of a snapshot: children restored, reseeded and paused.

    `forkd fork` of TAG with the same options is served from the pool first
    (resumed, reseeded, clock stepped); the pool refills in the background.
    One pool per snapshot; setting it again replaces its options.

    Examples:
      forkd pool py 4                # keep 4 children of py ready
      forkd pool py 2 --memory-limit-mib 256
      forkd pool py                  # target, ready, claims, misses
      forkd pool py 0                # drain it
    """
    controller = state(ctx).controller()
    if size is None:
        info = controller.get_pool(tag)
    else:
        with output.spinner(f"setting the pool of {escape(tag)} to {size}"):
            info = controller.set_pool(tag, size, memory_limit_mib=memory_limit_mib,
                                       per_child_netns=per_child_netns, live_fork=live_fork,
                                       allow_internet_access=allow_internet_access,
                                       network=network_policy(allow_out, deny_out))
    show_details(ctx, info, json_)


def active_pools(controller: Controller) -> list[PoolInfo]:
    """The pools worth listing (a target or members); none from a daemon without pools."""
    try:
        pools = controller.list_pools()
    except NotFoundError:  # an older daemon: no /v1/pools
        return []
    return [p for p in pools if p.get("size") or p.get("ready")]


def pools_table(pools: Iterable[Mapping[str, Any]], title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("SNAPSHOT", style="cyan", no_wrap=True)
    table.add_column("READY", justify="right")
    table.add_column("TARGET", justify="right")
    table.add_column("OPTIONS")
    table.add_column("CLAIMS", justify="right")
    table.add_column("MISSES", justify="right")
    table.add_column("LAST ERROR")
    for p in pools:
        limit = p.get("memory_limit_mib")
        options = [f"{limit} MiB" if limit is not None else "",
                   "netns" if p.get("per_child_netns") else "", "live" if p.get("live_fork") else ""]
        table.add_row(
            output.fmt(p.get("tag")), output.fmt(p.get("ready")), output.fmt(p.get("size")),
            output.fmt([o for o in options if o]), output.fmt(p.get("claims")),
            output.fmt(p.get("misses")), output.fmt(p.get("last_error")),
        )
    return table


__all__ = ["active_pools", "pool", "pools_table"]
