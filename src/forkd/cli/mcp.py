"""``forkd mcp``: serve forkd's MCP server over stdio (default) or streamable HTTP.

The server is a client of the daemon, found like every other command's
(``--url``/``FORKD_URL``, ``--token``/``FORKD_TOKEN``). Over HTTP it listens on
loopback by default; a non-loopback address needs ``--token-file``, whose token
MCP clients must then send as ``Authorization: Bearer``.
"""

from __future__ import annotations

import asyncio
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from forkd.api.settings import ConfigError, is_loopback, parse_bind
from forkd.cli import output
from forkd.cli.context import handle_errors, state, usage_error, want_json

DEFAULT_MCP_BIND = "127.0.0.1:8890"
MCP_PATH = "/mcp"


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
                     help="http only: a file with the bearer token MCP clients must send."),
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

    from forkd.api.auth import BearerAuthMiddleware, load_token  # starlette: forkd[mcp]

    try:
        host, port = parse_bind(bind)
        token = load_token(token_file) if token_file is not None else None
    except ConfigError as exc:
        usage_error(ctx, str(exc))
    if token is None and not is_loopback(host):
        usage_error(ctx, f"refusing to serve MCP on {bind} without --token-file: whoever reaches it "
                         "can run commands in your sandboxes. Bind to 127.0.0.1 or pass --token-file.")
    app = server.streamable_http_app(streamable_http_path=MCP_PATH, host=host)
    asgi = BearerAuthMiddleware(app, token=token) if token is not None else app
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}{MCP_PATH}"
    config = uvicorn.Config(asgi, host=host, port=port, log_level="warning", lifespan="on")
    uv = uvicorn.Server(config)

    def announce() -> None:
        if want_json(ctx, json_):
            output.emit_json_line({"listening": True, "url": url, "auth": "bearer" if token else "none"})
        else:
            print(f"forkd MCP server (streamable HTTP) on {url}", file=sys.stderr, flush=True)

    async def serve() -> None:
        # Announced once the socket listens, so a script can wait for the line.
        serving = asyncio.create_task(uv.serve())
        while not uv.started and not serving.done():
            await asyncio.sleep(0.05)
        if uv.started:
            announce()
        await serving

    asyncio.run(serve())
