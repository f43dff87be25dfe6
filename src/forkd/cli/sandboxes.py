"""Sandbox commands: fork, branch, ls, kill, timeout, ping (exec and eval: run.py; promote and
checkpoints: forks.py; streamed and background processes: processes.py)."""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import typer
from rich.markup import escape

from forkd import bounds
from forkd.cli import forks, output
from forkd.cli.context import JsonFlag, handle_errors, parse_pairs, state, usage_error, want_json
from forkd.cli.network import AllowInternet, AllowOut, DenyOut, network_policy
from forkd.cli.pools import active_pools, pools_table
from forkd.cli.snapshots import branch_mode, parse_volume, print_branch
from forkd.sdk import ForkdAPIError, Snapshot


class SandboxStateChoice(enum.StrEnum):
    """The states ``forkd ls --state`` filters on (SandboxInfo's ``state``)."""

    RUNNING = "running"
    PAUSED = "paused"
    HIBERNATED = "hibernated"

N = Annotated[
    int,
    typer.Option("-n", "--n", min=int(bounds.SPAWN_N.low), max=int(bounds.SPAWN_N.high),
                 help="Number of sandboxes."),
]
PerChildNetns = Annotated[
    bool,
    typer.Option(
        "--per-child-netns",
        help="Put child i in network namespace forkd-child-<i> (made if missing, removed with it).",
    ),
]
MemoryLimit = Annotated[
    int | None,
    typer.Option("--memory-limit-mib", metavar="MIB", min=int(bounds.MEMORY_LIMIT_MIB.low),
                 max=int(bounds.MEMORY_LIMIT_MIB.high), help="cgroup memory limit per child."),
]
LiveFork = Annotated[
    bool,
    typer.Option("--live-fork", help="Spawn so that the sandboxes can later take --live branches."),
]
SandboxId = Annotated[str, typer.Argument(metavar="ID", help="Sandbox id, e.g. sb-67a1b3-0000.")]
Lifetime = Annotated[
    float | None,
    typer.Option("--timeout", metavar="SECS", min=0.001, max=bounds.SANDBOX_TIMEOUT_SECS.high,
                 help="Kill each child this many seconds after the fork (forkd timeout ID SECS moves it)."),
]
IdlePause = Annotated[
    float | None,
    typer.Option("--idle-pause", metavar="SECS", min=bounds.IDLE_PAUSE_SECS.low,
                 max=bounds.IDLE_PAUSE_SECS.high,
                 help="Pause each child after this many seconds without a request (it then costs no "
                 "CPU); its next request resumes it. Not for children with background work."),
]
IdleHibernate = Annotated[
    float | None,
    typer.Option("--idle-hibernate", metavar="SECS", min=bounds.IDLE_HIBERNATE_SECS.low,
                 max=bounds.IDLE_HIBERNATE_SECS.high,
                 help="Hibernate each child (to disk, its QEMU released) after this many seconds "
                 "without a request; its next request wakes it."),
]
DiskQuota = Annotated[
    int | None,
    typer.Option("--disk-quota-mib", metavar="MIB", min=0, max=int(bounds.DISK_QUOTA_MIB.high),
                 help="Stop each child once its own disk layers grow past this many MiB on the host "
                 "(default: the daemon's --disk-quota-mib; 0: no quota)."),
]

Hostname = Annotated[
    str | None,
    typer.Option("--hostname", metavar="NAME", help="Each child's hostname in the guest, set at its "
                 "restore (RFC 1123; the daemon checks it)."),
]


EnvPairs = Annotated[
    list[str] | None,
    typer.Option("--env", "-e", metavar="KEY=VALUE",
                 help="Environment variable every child gets (repeatable)."),
]
LabelPairs = Annotated[
    list[str] | None,
    typer.Option("--label", "-l", metavar="KEY=VALUE",
                 help="Label stored with every child; filter with forkd ls --label (repeatable)."),
]


@handle_errors
def fork(
    ctx: typer.Context,
    tag: Annotated[
        str | None, typer.Option("--tag", "-t", help="Snapshot to fork from.")
    ] = None,
    from_sandbox: Annotated[
        str | None,
        typer.Option("--from-sandbox", metavar="ID",
                     help="Fork this running sandbox instead (it pauses briefly and keeps running)."),
    ] = None,
    n: N = 1,
    tree: Annotated[
        bool,
        typer.Option("--tree", help="With --from-sandbox: make the children one fork-tree "
                     "(forkd promote keeps one of them)."),
    ] = False,
    env: EnvPairs = None,
    label: LabelPairs = None,
    keep_snapshot: Annotated[
        bool,
        typer.Option("--keep-snapshot", help="With --from-sandbox: keep the intermediate snapshot "
                     "(by default it is deleted with its last child)."),
    ] = False,
    per_child_netns: PerChildNetns = False,
    memory_limit_mib: MemoryLimit = None,
    live_fork: LiveFork = False,
    timeout: Lifetime = None,
    idle_pause: IdlePause = None,
    idle_hibernate: IdleHibernate = None,
    disk_quota_mib: DiskQuota = None,
    hostname: Hostname = None,
    allow_internet_access: AllowInternet = False,
    allow_out: AllowOut = None,
    deny_out: DenyOut = None,
    volume: Annotated[
        list[str] | None,
        typer.Option("--volume", metavar="NAME:GUEST[:ro]",
                     help="With --tag: mount a hostdir volume (forkd volume create --fs hostdir) in each "
                     "child at GUEST, shared with every sandbox that mounts it; repeatable."),
    ] = None,
    json_: JsonFlag = False,
) -> None:
    """Fork N sandboxes copy-on-write from a snapshot, or from a running sandbox.

    Each child resumes the warm state (processes, memory, disk) and diverges
    privately from there. With --from-sandbox the source is branched once and
    keeps running; each child comes up or fails on its own, and a partial fork
    lists the failures and exits 1.

    Examples:
      forkd fork --tag py -n 10
      forkd fork --tag checkpoint-1 -n 5 --per-child-netns --memory-limit-mib 256
      forkd fork --tag py --live-fork -e MODE=test --label team=ml
      forkd fork --tag py --timeout 300
      forkd fork --tag py -n 50 --idle-pause 30
      forkd fork --tag py -n 50 --idle-hibernate 300
      forkd fork --tag py --disk-quota-mib 256
      forkd fork --tag py --hostname worker-1
      forkd fork --tag py-net -n 2 --allow-out 10.201.0.1:8080 --allow-out 192.0.2.0/24
      forkd fork --tag py-net --allow-internet-access --deny-out 203.0.113.0/24
      forkd fork --tag py -n 2 --volume team:/mnt/team
      forkd fork --from-sandbox sb-67a1b3-0042 -n 3
      forkd fork --from-sandbox sb-67a1b3-0042 -n 4 --tree -e SEED=7
    """
    if (tag is None) == (from_sandbox is None):
        usage_error(ctx, "give --tag (fork a snapshot) or --from-sandbox (fork a running sandbox)")
    if from_sandbox is not None and idle_pause is not None:
        usage_error(ctx, "--idle-pause applies to forks of a snapshot (--tag) only")
    if from_sandbox is not None and idle_hibernate is not None:
        usage_error(ctx, "--idle-hibernate applies to forks of a snapshot (--tag) only")
    if from_sandbox is not None and disk_quota_mib is not None:
        usage_error(ctx, "--disk-quota-mib applies to forks of a snapshot (--tag) only")
    if from_sandbox is not None and volume:
        usage_error(ctx, "--volume applies to forks of a snapshot (--tag) only; a running sandbox's "
                    "children get its volumes")
    volumes = [parse_volume(ctx, text) for text in volume or ()]
    if from_sandbox is None:
        extras = [flag for flag, on in (("--tree", tree), ("--keep-snapshot", keep_snapshot)) if on]
        if extras:
            verb = "apply" if len(extras) > 1 else "applies"
            usage_error(ctx, f"{', '.join(extras)} only {verb} with --from-sandbox")
    env_map = parse_pairs(ctx, env, "--env")
    labels = parse_pairs(ctx, label, "--label")
    network = network_policy(allow_out, deny_out)
    controller = state(ctx).controller()
    as_json = want_json(ctx, json_)
    started = time.monotonic()
    plural = "ren" if n != 1 else ""
    if from_sandbox is not None:
        fork_call = controller.fork_tree if tree else controller.fork_sandbox
        with output.spinner(f"forking {escape(from_sandbox)} into {n} child{plural}"):
            result = fork_call(
                from_sandbox, n, per_child_netns=per_child_netns, memory_limit_mib=memory_limit_mib,
                live_fork=live_fork, env=env_map, metadata=labels, keep_snapshot=keep_snapshot,
                timeout_secs=timeout, allow_internet_access=allow_internet_access, network=network,
                hostname=hostname,
            )
        if as_json:
            output.emit_json(result)
        else:
            forks.print_fork(result, n, started)
        if result.get("errors"):
            raise typer.Exit(1)
        return
    assert tag is not None
    with output.spinner(f"forking {n} sandbox{'es' if n != 1 else ''} from {escape(tag)}"):
        sandboxes = controller.spawn_sandboxes(
            tag, n=n, per_child_netns=per_child_netns,
            memory_limit_mib=memory_limit_mib, live_fork=live_fork, env=env_map, metadata=labels,
            timeout_secs=timeout, idle_pause_secs=idle_pause, allow_internet_access=allow_internet_access,
            network=network, disk_quota_mib=disk_quota_mib, idle_hibernate_secs=idle_hibernate,
            hostname=hostname, volumes=volumes or None,
        )
    if as_json:
        output.emit_json(sandboxes)
        return
    output.console.print(output.sandboxes_table(sandboxes))
    output.console.print(
        f"[green]forked {len(sandboxes)}[/] from [cyan]{escape(tag)}[/] in {output.elapsed(started)}"
    )


@handle_errors
def branch(
    ctx: typer.Context,
    from_sandbox: Annotated[
        str, typer.Option("--from-sandbox", metavar="ID", help="Running sandbox to branch.")
    ],
    n: N = 1,
    tag: Annotated[
        str | None,
        typer.Option("--tag", "-t", help="Tag of the branch snapshot (default branch-<id>-<seq>)."),
    ] = None,
    diff: Annotated[bool, typer.Option("--diff", help="Diff branch (short pause).")] = False,
    live: Annotated[
        bool, typer.Option("--live", help="Live branch (shortest pause; --live-fork source).")
    ] = False,
    per_child_netns: PerChildNetns = False,
    memory_limit_mib: MemoryLimit = None,
    live_fork: LiveFork = False,
    allow_internet_access: AllowInternet = False,
    allow_out: AllowOut = None,
    deny_out: DenyOut = None,
    json_: JsonFlag = False,
) -> None:
    """Branch a running sandbox and fork N sandboxes from the branch, in one go.

    Same as forkd snapshot --from-sandbox followed by forkd fork, waiting for
    the branch to be ready in between. --diff and --live are mutually exclusive.

    Examples:
      forkd branch --from-sandbox sb-67a1b3-0042 -n 5
      forkd branch --from-sandbox sb-67a1b3-0042 -n 3 --tag try-1 --live
    """
    mode = branch_mode(ctx, diff, live)
    controller = state(ctx).controller()
    as_json = want_json(ctx, json_)
    started = time.monotonic()
    with output.spinner(f"branching {escape(from_sandbox)}"):
        snap = controller.branch_sandbox(from_sandbox, tag=tag, mode=mode)
    if not as_json:
        print_branch(snap, from_sandbox, started)
    if snap.get("status", "ready") != "ready":  # a live branch may still be writing memory
        with output.spinner(f"waiting for {escape(snap['tag'])} to be written"):
            snap = Snapshot(snap, controller=controller).wait_ready().info
    started = time.monotonic()
    with output.spinner(f"forking {n} from {escape(snap['tag'])}"):
        sandboxes = controller.spawn_sandboxes(
            snap["tag"], n=n, per_child_netns=per_child_netns,
            memory_limit_mib=memory_limit_mib, live_fork=live_fork,
            allow_internet_access=allow_internet_access, network=network_policy(allow_out, deny_out),
        )
    if as_json:
        output.emit_json({"snapshot": snap, "sandboxes": sandboxes})
        return
    output.console.print(output.sandboxes_table(sandboxes))
    output.console.print(
        f"[green]forked {len(sandboxes)}[/] from [cyan]{escape(snap['tag'])}[/] "
        f"in {output.elapsed(started)}"
    )


@handle_errors
def ls(
    ctx: typer.Context,
    snapshots: Annotated[bool, typer.Option("--snapshots", help="Only list snapshots.")] = False,
    sandboxes: Annotated[bool, typer.Option("--sandboxes", help="Only list sandboxes.")] = False,
    tag: Annotated[
        str | None,
        typer.Option("--tag", "-t", help="Only sandboxes forked from this snapshot (implies --sandboxes)."),
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option("--label", "-l", metavar="KEY=VALUE",
                     help="Only sandboxes with this label (repeatable, all must match; implies "
                     "--sandboxes)."),
    ] = None,
    in_state: Annotated[
        SandboxStateChoice | None,
        typer.Option("--state", help="Only sandboxes in this state (implies --sandboxes)."),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=1, max=1000, help="At most this many sandboxes, oldest first (a page; "
                     "implies --sandboxes)."),
    ] = None,
    after: Annotated[
        str | None,
        typer.Option("--after", metavar="SANDBOX_ID", help="The page after this sandbox id (implies "
                     "--sandboxes)."),
    ] = None,
    json_: JsonFlag = False,
) -> None:
    """List sandboxes and snapshots.

    With --json and neither filter, prints {"sandboxes": [...], "snapshots": [...]}
    (plus "pools" when a snapshot has a warm pool); with one filter, just that list.

    Examples:
      forkd ls
      forkd ls --sandboxes --json
      forkd ls --label fork_tree_id=ft-0123456789ab
      forkd ls --state hibernated --limit 100
    """
    labels = parse_pairs(ctx, label, "--label")
    filtered = tag is not None or bool(labels) or in_state is not None
    if filtered or limit is not None or after is not None:
        if snapshots:
            usage_error(ctx, "--tag, --label, --state, --limit and --after list sandboxes; they cannot be "
                        "used with --snapshots")
        sandboxes = True
    both = snapshots == sandboxes  # neither flag (or both) shows everything
    controller = state(ctx).controller()
    result: dict[str, Sequence[Mapping[str, Any]]] = {}
    if sandboxes or both:
        result["sandboxes"] = controller.list_sandboxes(
            snapshot_tag=tag, metadata=labels, state=in_state.value if in_state else None, limit=limit,
            after=after)
    if snapshots or both:
        result["snapshots"] = controller.list_snapshots()
    if both and (pools := active_pools(controller)):
        result["pools"] = pools
    if want_json(ctx, json_):
        output.emit_json(result if both else next(iter(result.values())))
        return
    if "sandboxes" in result:
        if result["sandboxes"]:
            output.console.print(output.sandboxes_table(result["sandboxes"], title="sandboxes"))
        else:
            output.console.print("no sandboxes match" if filtered else "no sandboxes running")
    if "snapshots" in result:
        if result["snapshots"]:
            output.console.print(output.snapshots_table(result["snapshots"], title="snapshots"))
        else:
            output.console.print("no snapshots; create one with: forkd snapshot --tag NAME")
    if "pools" in result:
        output.console.print(pools_table(result["pools"], title="warm pools"))


@handle_errors
def kill(
    ctx: typer.Context,
    ids: Annotated[
        list[str] | None, typer.Argument(metavar="ID", help="Sandbox id(s) to kill.")
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="Kill every running sandbox.")] = False,
    json_: JsonFlag = False,
) -> None:
    """Kill sandbox(es). Snapshots branched from them are kept.

    Exits 1 if any of them could not be killed.

    Examples:
      forkd kill sb-67a1b3-0000 sb-67a1b3-0001
      forkd kill --all
    """
    if bool(ids) == all_:
        usage_error(ctx, "give sandbox ID(s) or --all (not both)")
    controller = state(ctx).controller()
    as_json = want_json(ctx, json_)
    targets = [sb["id"] for sb in controller.list_sandboxes()] if all_ else list(ids or [])
    killed: list[str] = []
    failed: dict[str, str] = {}
    for sandbox_id in targets:
        try:
            controller.kill_sandbox(sandbox_id)
        except ForkdAPIError as exc:  # per-sandbox failure; connection errors abort
            failed[sandbox_id] = str(exc)
            if not as_json:
                output.error(f"{sandbox_id}: {exc}")
            continue
        killed.append(sandbox_id)
        if not as_json:
            output.console.print(f"killed {escape(sandbox_id)}")
    if as_json:
        output.emit_json({"killed": killed, "failed": failed})
    elif all_ and not targets:
        output.console.print("no sandboxes running")
    if failed:
        raise typer.Exit(1)


@handle_errors
def timeout(
    ctx: typer.Context,
    sandbox_id: SandboxId,
    secs: Annotated[float, typer.Argument(metavar="SECS", min=0.001, max=bounds.SANDBOX_TIMEOUT_SECS.high,
                                          help="Kill it this many seconds from now.")],
    json_: JsonFlag = False,
) -> None:
    """Kill a sandbox SECS seconds from now (sooner or later than its previous deadline).

    Example:
      forkd timeout sb-67a1b3-0000 600
    """
    info = state(ctx).controller().set_timeout(sandbox_id, secs)
    if want_json(ctx, json_):
        output.emit_json(info)
        return
    at = time.strftime("%H:%M:%S", time.localtime(float(info["expires_at_unix"] or 0)))
    output.console.print(f"{escape(sandbox_id)} expires at {at} (in {secs:g} s)")


@handle_errors
def hibernate(ctx: typer.Context, sandbox_id: SandboxId, json_: JsonFlag = False,
              disk_only: Annotated[bool, typer.Option(
                  "--disk-only", help="Keep its disk alone, not its memory: the wake cold-boots it "
                  "(files survive; processes and memory do not).")] = False) -> None:
    """Put a sandbox to disk (its changed memory and device state) and release its QEMU; its next
    request of any kind (exec, eval, ping, files, ...) wakes it.

    Example:
      forkd hibernate sb-67a1b3-0000
      forkd hibernate --disk-only sb-67a1b3-0000
    """
    info = state(ctx).controller().hibernate(sandbox_id, memory=not disk_only)
    if want_json(ctx, json_):
        output.emit_json(info)
        return
    saved: Mapping[str, Any] = info.get("hibernation") or {}
    kept = "" if saved.get("memory", True) else " (disk only: its wake cold-boots it)"
    output.console.print(f"{escape(sandbox_id)} hibernated{kept}: {saved.get('disk_mib', 0):g} MiB on "
                         f"disk, {saved.get('pause_ms', 0):g} ms stopped")


@handle_errors
def ping(ctx: typer.Context, sandbox_id: SandboxId, json_: JsonFlag = False) -> None:
    """Round trip to a sandbox's guest agent.

    Prints the latency and what the agent reports (pid, numpy version).

    Example:
      forkd ping sb-67a1b3-0000
    """
    started = time.monotonic()
    reply = state(ctx).controller().ping(sandbox_id)
    if want_json(ctx, json_):
        output.emit_json(reply)
        return
    extras = ", ".join(f"{k} {v}" for k, v in reply.items() if k != "pong")
    output.console.print(
        f"[green]pong[/] from {escape(sandbox_id)} in {output.elapsed(started)}"
        + (f" ({escape(extras)})" if extras else "")
    )


@handle_errors
def memory(ctx: typer.Context, sandbox_id: SandboxId, json_: JsonFlag = False) -> None:
    """What a sandbox costs the host: RAM shared with its snapshot and siblings, RAM of its own,
    and its own disk layers (read from the host, not the guest).

    Example:
      forkd memory sb-67a1b3-0000
    """
    cost: Mapping[str, Any] = state(ctx).controller().sandbox_memory(sandbox_id)
    if want_json(ctx, json_):
        output.emit_json(cost)
        return

    def mib(key: str) -> str:
        return f"{int(cost.get(key) or 0) / (1 << 20):,.1f} MiB"

    output.console.print(
        f"{escape(sandbox_id)}: RAM {mib('ram_bytes')}: shared {mib('shared_bytes')} (with its snapshot "
        f"and siblings), private {mib('private_bytes')} (its own), untouched {mib('untouched_bytes')}; "
        f"own disk layers {mib('disk_bytes')}")
