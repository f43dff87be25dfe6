"""``forkd daemon``: run the REST API in the foreground."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer

from forkd.cli.context import handle_errors, usage_error


@handle_errors
def daemon(
    ctx: typer.Context,
    bind: Annotated[
        str | None,
        typer.Option(
            "--bind", envvar="FORKD_BIND", metavar="HOST:PORT",
            help="Address to listen on (default 127.0.0.1:8889). Non-loopback needs --token-file.",
        ),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file", envvar="FORKD_TOKEN_FILE",
            help="File holding the bearer token clients must send.",
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option("--tls-cert", envvar="FORKD_TLS_CERT", help="PEM certificate: serve HTTPS."),
    ] = None,
    tls_key: Annotated[
        Path | None,
        typer.Option("--tls-key", envvar="FORKD_TLS_KEY", help="PEM private key for --tls-cert."),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir", envvar="FORKD_DATA_DIR",
            help="State directory (default ~/.local/share/forkd).",
        ),
    ] = None,
    keep_sandboxes: Annotated[
        bool,
        typer.Option(
            "--keep-sandboxes", envvar="FORKD_KEEP_SANDBOXES",
            help="Leave sandboxes running on shutdown; the next daemon re-adopts them.",
        ),
    ] = False,
    branch_concurrency: Annotated[
        int | None,
        typer.Option(
            "--branch-concurrency", envvar="FORKD_BRANCH_CONCURRENCY", min=1, max=64,
            help="BRANCH requests served at once; more get 503 (default 4).",
        ),
    ] = None,
    log_level: Annotated[
        str,
        typer.Option("--log-level", help="debug, info, warning or error."),
    ] = "info",
) -> None:
    """Run the forkd daemon (REST API v1) in the foreground until Ctrl-C / SIGTERM.

    Every option can also be set through its FORKD_* environment variable.

    Examples:
      forkd daemon
      forkd daemon --data-dir /var/lib/forkd --keep-sandboxes
      forkd daemon --bind 0.0.0.0:8889 --token-file /etc/forkd/token \\
                   --tls-cert cert.pem --tls-key key.pem
    """
    if (tls_cert is None) != (tls_key is None):
        usage_error(ctx, "--tls-cert and --tls-key must be given together")
    if log_level.lower() not in {"debug", "info", "warning", "error"}:
        usage_error(ctx, f"--log-level must be debug, info, warning or error, not {log_level!r}")

    # Imported here: the server pulls in uvicorn, FastAPI and the VMM stack,
    # which no other command needs.
    from forkd.api.server import serve
    from forkd.api.settings import Settings, parse_bind

    # Start from the environment (it also carries settings without a flag, such
    # as FORKD_BRANCH_CONCURRENCY) and apply what was given on the command line.
    settings = Settings.from_env()
    overrides: dict[str, Any] = {
        "token_file": token_file,
        "tls_cert": tls_cert,
        "tls_key": tls_key,
        "data_dir": data_dir,
        "branch_concurrency": branch_concurrency,
    }
    if bind is not None:
        try:
            overrides["host"], overrides["port"] = parse_bind(bind)
        except ValueError as exc:
            usage_error(ctx, str(exc))
    if keep_sandboxes:
        overrides["keep_sandboxes"] = True
    settings = dataclasses.replace(
        settings, **{k: v for k, v in overrides.items() if v is not None}
    )
    serve(settings, log_level=log_level.lower())
