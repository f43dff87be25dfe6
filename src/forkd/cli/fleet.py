"""``forkd gateway``: one endpoint serving the REST API in front of a fleet of forkd hosts."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from forkd.api.settings import (
    DEFAULT_MAX_BODY_BYTES,
    MIN_MAX_BODY_BYTES,
    ConfigError,
    is_loopback,
    parse_bind,
)
from forkd.cli import output
from forkd.cli.context import handle_errors, usage_error

DEFAULT_GATEWAY_BIND = "127.0.0.1:8890"


@handle_errors
def gateway(
    ctx: typer.Context,
    etcd: Annotated[
        list[str],
        typer.Option("--etcd", envvar="FORKD_ETCD", metavar="URL[,URL]",
                     help="etcd client URL(s) where the hosts register (repeatable)."),
    ],
    bind: Annotated[
        str, typer.Option("--bind", envvar="FORKD_GATEWAY_BIND", metavar="HOST:PORT",
                          help="Address to listen on. Non-loopback needs --token-file."),
    ] = DEFAULT_GATEWAY_BIND,
    token_file: Annotated[
        Path | None,
        typer.Option("--token-file", envvar="FORKD_TOKEN_FILE",
                     help="Bearer token clients must send (and, unless --host-token-file, the "
                     "hosts' token)."),
    ] = None,
    host_token_file: Annotated[
        Path | None,
        typer.Option("--host-token-file", envvar="FORKD_HOST_TOKEN_FILE",
                     help="Bearer token the hosts accept, if not the same as --token-file."),
    ] = None,
    request_timeout: Annotated[
        float, typer.Option("--request-timeout", envvar="FORKD_REQUEST_TIMEOUT", min=1, metavar="SECS",
                            help="Longest a proxied request may take (long execs, snapshot set-ups)."),
    ] = 3600.0,
    poll_interval: Annotated[
        float, typer.Option("--poll-interval", envvar="FORKD_POLL_INTERVAL", min=0.1, metavar="SECS",
                            help="How often the fleet is re-read from etcd."),
    ] = 0.5,
    publish: Annotated[
        bool, typer.Option("--publish/--no-publish", envvar="FORKD_PUBLISH",
                           help="Have hosts push snapshots created or branched through the gateway to "
                           "the object store, so any host can fork them."),
    ] = True,
    max_body_bytes: Annotated[
        int, typer.Option("--max-body-bytes", envvar="FORKD_MAX_BODY_BYTES", min=MIN_MAX_BODY_BYTES,
                          metavar="BYTES", help="Largest JSON request body accepted (413 above)."),
    ] = DEFAULT_MAX_BODY_BYTES,
    log_level: Annotated[
        str, typer.Option("--log-level", envvar="FORKD_LOG_LEVEL", help="debug, info, warning or error."),
    ] = "info",
) -> None:
    """Serve the forkd REST API, and E2B's, in front of every host registered in etcd.

    Clients and SDKs (forkd's, and E2B's with E2B_API_URL and E2B_SANDBOX_URL
    set to its address) use it as one daemon. Spawns go to a host holding the
    snapshot, else to the least-loaded host (which pulls it from the object
    store); X-Forkd-Host: HOST pins a request to one host. Per-sandbox calls go
    to the host the sandbox id names; lists merge every host's. A host whose
    lease expires is gone: its sandboxes answer 404 and new work goes
    elsewhere; a full host (503 no_capacity) is passed over for the next. GET
    /v1/fleet lists the hosts.

    Examples:
      forkd gateway --etcd http://127.0.0.1:2379
      forkd gateway --etcd http://etcd:2379 --bind 0.0.0.0:8890 --token-file /etc/forkd/token
    """
    from forkd.api.settings import parse_endpoints

    try:
        from forkd.api.auth import load_token
        from forkd.gateway import GatewaySettings, create_gateway_app
    except ModuleNotFoundError as exc:
        output.fail(f"the gateway needs {exc.name!r}: pip install 'forkd[fleet]'")

    try:
        host, port = parse_bind(bind)
        endpoints = parse_endpoints(etcd)
        if not endpoints:
            raise ConfigError("--etcd needs at least one URL")
        if token_file is None and not is_loopback(host):
            raise ConfigError(f"refusing to serve on {bind} without --token-file: anyone who reaches it "
                              "could run code in every sandbox of the fleet")
        for path in (token_file, host_token_file):
            if path is not None:
                load_token(path)
    except ConfigError as exc:
        usage_error(ctx, str(exc))
    settings = GatewaySettings(
        etcd=endpoints, host=host, port=port, token_file=token_file, host_token_file=host_token_file,
        request_timeout=request_timeout, poll_interval=poll_interval, publish=publish,
        max_body_bytes=max_body_bytes)
    import uvicorn

    from forkd.api.connections import http_protocol

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not one line per proxied call and etcd read
    config = uvicorn.Config(create_gateway_app(settings), host=host, port=port, log_level=log_level,
                            lifespan="on", proxy_headers=False, server_header=False,
                            timeout_graceful_shutdown=10,
                            # The daemon's guarded protocol: uvicorn's own httptools one bounds no header.
                            http=http_protocol())
    server = uvicorn.Server(config)
    server.run()
    if not server.started:
        output.fail(f"the gateway could not start on {bind} (see the log above)", code=3)
