"""``forkd template build``: a Dockerfile built into a snapshot by the daemon, layer by cached layer.

The build context (a directory) is sent as one tar, streamed from a temporary
file; ``.dockerignore`` in it is honoured when ``e2b-dockerfile-utils`` (a
daemon dependency) is installed, and refused otherwise rather than ignored.
"""

from __future__ import annotations

import os
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from forkd.cli import output
from forkd.cli.context import JsonFlag, handle_errors, parse_pairs, state, usage_error, want_json
from forkd.cli.network import AllowInternet, AllowOut, DenyOut, network_policy

template_app = typer.Typer(
    name="template",
    help="Templates as code: build a Dockerfile into a snapshot (docs/TEMPLATES.md).",
    no_args_is_help=True,
)


def _ignored(root: Path) -> Any:
    """A predicate for the paths ``.dockerignore`` excludes (relative, slash-separated)."""
    ignore = root / ".dockerignore"
    if not ignore.is_file():
        return lambda _rel: False
    try:
        from e2b_dockerfile_utils import PatternMatcher
    except ImportError:
        raise typer.BadParameter(".dockerignore needs e2b-dockerfile-utils (pip install "
                                 "e2b-dockerfile-utils), or remove it") from None
    patterns = [line.strip() for line in ignore.read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    return PatternMatcher(patterns).matches


def write_context(root: Path, out: Any) -> int:
    """Tar ``root`` into ``out`` (paths relative to it, ``.dockerignore`` applied); the entries."""
    ignored = _ignored(root)
    count = 0
    with tarfile.open(fileobj=out, mode="w:") as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            base = Path(dirpath)
            for name in sorted(dirnames + filenames):
                path = base / name
                rel = path.relative_to(root).as_posix()
                if ignored(rel):
                    if name in dirnames:
                        dirnames.remove(name)
                    continue
                if path.is_symlink() or path.is_file() or path.is_dir():
                    tar.add(path, arcname=rel, recursive=False)
                    count += 1
            dirnames.sort()
    return count


@template_app.command("build")
@handle_errors
def build(
    ctx: typer.Context,
    context: Annotated[Path, typer.Argument(help="The build context: the directory COPY reads from.",
                                            file_okay=False, exists=True)] = Path("."),
    tag: Annotated[str, typer.Option("--tag", "-t", help="Tag of the template's snapshot.")] = "",
    file: Annotated[Path | None, typer.Option("--file", "-f", help="The Dockerfile (default: "
                                              "CONTEXT/Dockerfile).")] = None,
    build_arg: Annotated[list[str] | None, typer.Option("--build-arg", metavar="KEY=VALUE",
                                                        help="A value for an ARG; repeatable.")] = None,
    mem_mib: Annotated[int | None, typer.Option("--mem-mib", help="Guest RAM in MiB.")] = None,
    vcpus: Annotated[int | None, typer.Option("--vcpus", help="Guest vCPUs.")] = None,
    nic: Annotated[bool, typer.Option("--nic", help="Give the template, and every child, a network "
                                      "device.")] = False,
    allow_internet_access: AllowInternet = False,
    allow_out: AllowOut = None,
    deny_out: DenyOut = None,
    replace: Annotated[bool, typer.Option("--replace", help="Replace an existing snapshot of this tag "
                                          "once the build has succeeded.")] = False,
    json_: JsonFlag = False,
) -> None:
    """Build a Dockerfile into a snapshot: each RUN and COPY runs in a VM and is cached as a layer.

    FROM names a forkd image (forkd image build; e.g. FROM default or forkd/default).
    A rebuild runs only the steps after the first one that changed.

    Examples:
      forkd template build -t web .
      forkd template build -t web -f web.Dockerfile --build-arg VERSION=2 ./app
      forkd template build -t ml --nic --allow-internet-access --replace .
    """
    if not tag:
        usage_error(ctx, "--tag is required")
    dockerfile = (file or context / "Dockerfile")
    if not dockerfile.is_file():
        usage_error(ctx, f"no Dockerfile at {dockerfile}")
    text = dockerfile.read_text()
    controller = state(ctx).controller()
    as_json = want_json(ctx, json_)
    started = time.monotonic()
    extra: dict[str, Any] = {"replace": replace, "nic": nic or allow_internet_access
                             or bool(allow_out or deny_out)}
    for key, value in (("build_args", parse_pairs(ctx, build_arg, "--build-arg")), ("mem_mib", mem_mib),
                       ("vcpus", vcpus), ("network", network_policy(allow_out, deny_out))):
        if value is not None:
            extra[key] = value
    if allow_internet_access:
        extra["allow_internet_access"] = True
    with tempfile.TemporaryFile() as tar:
        entries = write_context(context, tar)
        size = tar.tell()
        tar.seek(0)
        with output.spinner(f"sending the build context ({entries} entries, {size} bytes)"):
            uploaded = controller.put_build_context(tar)
    done: dict[str, Any] = {}
    for event in controller.build_template(tag, text, context=uploaded["context"], **extra):
        if as_json:
            output.emit_json_line(event)
        kind = event.get("type")
        if kind == "done":
            done = event
        if as_json:
            continue
        if kind == "step":
            mark = "[dim]cached[/]" if event.get("cached") else "[yellow]run[/]"
            output.console.print(f"[bold]step {event.get('index')}/{event.get('of')}[/] {mark} "
                                 f"{escape(str(event.get('text')))}")
        elif kind == "log" and event.get("stream") == "status":  # the daemon's own progress lines
            output.console.print(f"  {escape(str(event.get('data', '')))}", style="dim")
        elif kind == "log":  # the step's output, as it came (its own line breaks)
            output.console.print(escape(str(event.get("data", ""))), end="", style="dim")
        elif kind == "plan":
            for warning in event.get("warnings") or []:
                output.console.print(f"[yellow]warning:[/] {escape(str(warning))}")
    if not as_json and done:
        output.console.print(
            f"[green]built[/] [cyan]{escape(tag)}[/] in {output.elapsed(started)}: "
            f"{done.get('steps_run')} step(s) run, {done.get('cache_hits')} from the cache")
