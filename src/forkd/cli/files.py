"""``forkd cp``: copy a file into or out of a sandbox, docker-cp style.

``SB:PATH`` names a path in sandbox SB; the other side is a local path, or
``-`` for stdin/stdout. The file streams through the daemon (never read whole
on either side), with a progress bar on a terminal. A download lands in a
temp file beside its target and is renamed at the end, so an interrupted copy
leaves no half file; an upload is made atomic by the guest the same way.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Annotated, Any

import typer
from rich.markup import escape

from forkd import bounds
from forkd.cli import output
from forkd.cli.context import JsonFlag, handle_errors, state, usage_error, want_json
from forkd.sdk import Controller, NotFoundError
from forkd.sdk.models import FileInfo

_REMOTE = re.compile(r"^(?P<id>" + bounds.SANDBOX_ID_RE.pattern.strip("^$") + r"):(?P<path>.*)$")


def split_remote(spec: str) -> tuple[str, str] | None:
    """``("sb-…", "/path")`` for ``SB:PATH``, None for a local path."""
    m = _REMOTE.match(spec)
    return (m.group("id"), m.group("path")) if m else None


def _remote_target(c: Controller, sandbox_id: str, path: str, local_name: str) -> str:
    """Where an upload lands: into an existing directory (or one named with a trailing /) by name."""
    if path.endswith("/"):
        return posixpath.join(path, local_name)
    with contextlib.suppress(NotFoundError):
        if c.file_stat(sandbox_id, path)["type"] == "dir":
            return posixpath.join(path, local_name)
    return path


def _upload(ctx: typer.Context, src: str, sandbox_id: str, path: str) -> FileInfo:
    c = state(ctx).controller()
    if src == "-":
        if path.endswith("/"):
            usage_error(ctx, "copying from stdin needs a file path in the sandbox, not a directory")
        return c.write_file(sandbox_id, path, sys.stdin.buffer)
    local = Path(src)
    if local.is_dir():
        usage_error(ctx, f"{src} is a directory; forkd cp copies single files")
    target = _remote_target(c, sandbox_id, path, local.name)
    try:
        source = local.open("rb")
    except OSError as exc:
        output.fail(f"cannot read {src}: {exc.strerror or exc}")
    with source, output.transfer_bar(f"{local.name} → {sandbox_id}", local.stat().st_size) as advance:
        return c.write_file(sandbox_id, target, source, progress=advance)


def _download(ctx: typer.Context, sandbox_id: str, path: str, dst: str) -> dict[str, Any]:
    c = state(ctx).controller()
    info = c.file_stat(sandbox_id, path)  # 404/409 before any local file is touched
    if info["type"] == "dir":
        output.fail(f"{sandbox_id}:{path} is a directory; forkd cp copies single files")
    if dst == "-":
        size = c.read_file_into(sandbox_id, path, sys.stdout.buffer)
        sys.stdout.buffer.flush()
        return {**info, "size": size, "local": "-"}
    target = Path(dst)
    if target.is_dir() or dst.endswith("/"):
        target = target / posixpath.basename(path.rstrip("/"))
    partial: IO[bytes] = tempfile.NamedTemporaryFile(  # noqa: SIM115 (renamed or removed below)
        dir=target.parent, prefix=f".{target.name}.", suffix=".partial", delete=False)
    try:
        with partial, output.transfer_bar(f"{sandbox_id} → {target.name}", int(info["size"])) as advance:
            size = c.read_file_into(sandbox_id, path, partial, progress=advance)
        os.replace(partial.name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial.name)
        raise
    return {**info, "size": size, "local": str(target)}


@handle_errors
def cp(
    ctx: typer.Context,
    src: Annotated[str, typer.Argument(metavar="SRC", help="LOCAL, SB:PATH or - (stdin).")],
    dst: Annotated[str, typer.Argument(metavar="DST", help="SB:PATH, LOCAL or - (stdout).")],
    json_: JsonFlag = False,
) -> None:
    """Copy a file between the host and a sandbox (docker cp style).

    One side is SB:PATH (PATH absolute in the guest); the other a local path or
    - for stdin/stdout. Copying into a directory keeps the file's name. The
    file streams through the daemon, so size is bounded only by the daemon's
    --max-file-bytes.

    Examples:
      forkd cp data.csv sb-67a1b3-0000:/work/
      forkd cp sb-67a1b3-0000:/work/out.json ./out.json
      tar c src | forkd cp - sb-67a1b3-0000:/tmp/src.tar
    """
    remote_src, remote_dst = split_remote(src), split_remote(dst)
    if (remote_src is None) == (remote_dst is None):
        usage_error(ctx, "exactly one of SRC and DST must be SB:PATH (a sandbox id, a colon, a path)")
    if remote_dst is not None:
        info: Mapping[str, Any] = _upload(ctx, src, *remote_dst)
        where = f"{remote_dst[0]}:{info['path']}"
    else:
        assert remote_src is not None
        info = _download(ctx, *remote_src, dst)
        where = str(info["local"])
    if want_json(ctx, json_):
        output.emit_json(info)
    elif where != "-":
        output.err_console.print(f"copied {info['size']} bytes to {escape(where)}")
