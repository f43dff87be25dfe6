"""``forkd mcp``: serve forkd's MCP server over stdio (default) or streamable HTTP.

The server is a client of the daemon, found like every other command's
(``--url``/``FORKD_URL``, ``--token``/``FORKD_TOKEN``). Over HTTP it listens on
loopback by default, and *always* wants a bearer token (``Authorization:
Bearer``), compared in constant time: loopback is reachable by every local user,
and whoever reaches the server acts with the daemon's token. The token is
``--token-file``'s, or, without one, a fresh random one written to a new 0600
file whose path is printed (and removed when the server stops). A non-loopback
address needs ``--token-file``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import sys
import tempfile
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from forkd.api.settings import ConfigError, is_loopback, parse_bind
from forkd.cli import output
from forkd.cli.context import handle_errors, state, usage_error, want_json

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer
    from starlette.types import ASGIApp

DEFAULT_MCP_BIND = "127.0.0.1:8890"
MCP_PATH = "/mcp"


def generated_token_file() -> tuple[str, Path]:
    """A fresh random token in a new file only this user can read (mkstemp: 0600, O_EXCL, a
    name nobody can guess), in $XDG_RUNTIME_DIR when there is one."""
    token = secrets.token_urlsafe(32)
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    fd, name = tempfile.mkstemp(prefix="forkd-mcp-token-",
                                dir=runtime_dir if runtime_dir and os.path.isdir(runtime_dir) else None)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, Path(name)


def http_app(server: MCPServer[Any], host: str, token: str) -> ASGIApp:
    """The streamable-HTTP app behind the bearer token (401 without it, whatever the path)."""
    from forkd.api.auth import BearerAuthMiddleware  # starlette: forkd[mcp]

    if not token:
        raise ValueError("the MCP HTTP transport needs a token")
    app = server.streamable_http_app(streamable_http_path=MCP_PATH, host=host)
    return BearerAuthMiddleware(app, token=token)


class Transport(StrEnum):
    stdio = "stdio"
    http = "http"


@handle_errors
def mcp(
    ctx: typer.Context,
    transport: Annotated[
        Transport,
        typer.Option("--transport", "-t", help="stdio (an MCP client starts `forkd mcp`) or http "
                     "(streamable HTTP at http://BIND/mcp)."),
    ] = Transport.stdio,
    bind: Annotated[
        str,
        typer.Option("--bind", envvar="FORKD_MCP_BIND", metavar="HOST:PORT",
                     help="Where the http transport listens. Non-loopback needs --token-file."),
    ] = DEFAULT_MCP_BIND,
    token_file: Annotated[
        Path | None,
        typer.Option("--token-file", envvar="FORKD_MCP_TOKEN_FILE",
                     help="http only: a file with the bearer token MCP clients must send. Without "
                          "it, a random token goes to a new 0600 file whose path is printed."),
    ] = None,
    json_: Annotated[
        bool, typer.Option("--json", help="http only: print one JSON line once listening.")
    ] = False,
) -> None:
    """Serve forkd's sandboxes as MCP tools (snapshots, spawn, exec, eval, background
    processes, files, branch, fork, fork-tree, promote, kill), talking to the daemon at --url.

    \b
    Claude Desktop / any stdio MCP client:
      {"command": "forkd", "args": ["mcp"], "env": {"FORKD_URL": "...", "FORKD_TOKEN": "..."}}
    Streamable HTTP:
      forkd mcp --transport http --bind 127.0.0.1:8890     # http://127.0.0.1:8890/mcp
    Over HTTP every request needs 'Authorization: Bearer <token>': --token-file's, or a
    generated one (its file's path is printed).
    """
    try:
        from forkd.mcp.server import DaemonAddress, build_server
    except ModuleNotFoundError as exc:
        output.fail(f"the MCP server needs {exc.name!r}: pip install 'forkd[mcp]'")

    cli = state(ctx)
    server = build_server(DaemonAddress(url=cli.url, token=cli.token, ca_cert=cli.ca_cert))
    if transport is Transport.stdio:
        if token_file is not None:
            usage_error(ctx, "--token-file applies to --transport http only")
        server.run("stdio")
        return

    import uvicorn

    from forkd.api.auth import load_token
    from forkd.api.connections import http_protocol

    try:
        host, port = parse_bind(bind)
        token = load_token(token_file) if token_file is not None else None
    except ConfigError as exc:
        usage_error(ctx, str(exc))
    if token is None and not is_loopback(host):
        usage_error(ctx, f"refusing to serve MCP on {bind} without --token-file: whoever reaches it "
                         "can run commands in your sandboxes. Bind to 127.0.0.1 or pass --token-file.")
    generated: Path | None = None
    if token is None:
        token, generated = generated_token_file()
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}{MCP_PATH}"
    # The daemon's guarded protocol: uvicorn's own httptools one bounds no header.
    config = uvicorn.Config(http_app(server, host, token), host=host, port=port, log_level="warning",
                            lifespan="on", http=http_protocol())
    uv = uvicorn.Server(config)
    where = generated or token_file

    def announce() -> None:
        if want_json(ctx, json_):
            output.emit_json_line({"listening": True, "url": url, "auth": "bearer",
                                   "token_file": str(where), "token_generated": generated is not None})
        else:
            print(f"forkd MCP server (streamable HTTP) on {url}; clients send "
                  f"'Authorization: Bearer <the token in {where}>'", file=sys.stderr, flush=True)

    async def serve() -> None:
        # Announced once the socket listens, so a script can wait for the line.
        serving = asyncio.create_task(uv.serve())
        while not uv.started and not serving.done():
            await asyncio.sleep(0.05)
        if uv.started:
            announce()
        await serving

    if generated is not None:
        # uvicorn re-raises a SIGTERM it caught once it has shut down; with the default
        # handler that would end the process before the generated token's file is removed.
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    try:
        asyncio.run(serve())
    finally:
        if generated is not None:
            with contextlib.suppress(OSError):
                generated.unlink()
