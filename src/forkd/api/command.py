"""The daemon's command line: ``forkd daemon`` and ``python -m forkd.api``, the REST API in the foreground.

The daemon has one command line, defined here, in the daemon's package:
``forkd daemon`` is this command inside the ``forkd`` CLI (cli/main.py), and
``python -m forkd.api`` runs the very same command on its own (:func:`main`).
Every option is also read from its ``FORKD_*`` environment variable; a flag
wins over the variable. It depends on typer alone, not on the CLI package,
which sits above the daemon (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NoReturn, ParamSpec, TypeVar

import typer

from forkd import bounds
from forkd.api.settings import (
    DEFAULT_BRANCH_CONCURRENCY,
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_LEASE_TTL,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_FILE_BYTES,
    MAX_BRANCH_CONCURRENCY,
    MIN_MAX_BODY_BYTES,
    ConfigError,
    Settings,
    parse_bind,
    parse_endpoints,
    parse_mirrors,
    parse_pools,
)
from forkd.config import API_VERSION, DEFAULT_BIND, MAX_SANDBOXES_LIMIT, VERSION
from forkd.errors import ForkdError

P = ParamSpec("P")
R = TypeVar("R")


def fail(message: str, code: int = 1) -> NoReturn:
    """``error: <message>`` on stderr and exit ``code``, as every forkd command reports."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def usage_error(ctx: typer.Context, message: str) -> NoReturn:
    """A wrong combination of flags, reported like click does: usage line, exit 2."""
    typer.echo(ctx.get_usage(), err=True)
    typer.echo(f"Try '{ctx.command_path} --help' for help.\n", err=True)
    fail(message, code=2)


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """forkd's errors as ``error: <message>`` and exit status 1, no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except ForkdError as exc:
            fail(str(exc))
        except KeyboardInterrupt:
            fail("interrupted", code=130)

    return wrapper


def want_json(ctx: typer.Context, flag: bool) -> bool:
    """``--json`` here, or the CLI's global one (``forkd --json daemon``)."""
    return flag or bool(getattr(ctx.find_root().obj, "json", False))


class LogLevel(StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


class HttpParser(StrEnum):
    httptools = "httptools"
    h11 = "h11"


@handle_errors
def daemon(
    ctx: typer.Context,
    bind: Annotated[
        str,
        typer.Option(
            "--bind", envvar="FORKD_BIND", metavar="HOST:PORT",
            help="Address to listen on (\\[v6addr]:PORT for IPv6). Non-loopback needs --token-file.",
        ),
    ] = DEFAULT_BIND,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file", envvar="FORKD_TOKEN_FILE",
            help="File holding the bearer token clients must send. Without it: no auth, loopback only.",
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
            help="State directory: snapshots, sandboxes, registry (default ~/.local/share/forkd).",
        ),
    ] = None,
    keep_sandboxes: Annotated[
        bool,
        typer.Option(
            "--keep-sandboxes/--no-keep-sandboxes", envvar="FORKD_KEEP_SANDBOXES",
            help="Leave sandboxes running on shutdown; the next daemon re-adopts them.",
        ),
    ] = False,
    audit_log: Annotated[
        Path | None,
        typer.Option(
            "--audit-log", envvar="FORKD_AUDIT_LOG",
            help="Append one JSON line per request here (default <data-dir>/audit.log).",
        ),
    ] = None,
    max_body_bytes: Annotated[
        int,
        typer.Option(
            "--max-body-bytes", envvar="FORKD_MAX_BODY_BYTES", min=MIN_MAX_BODY_BYTES, metavar="BYTES",
            help="Largest request body accepted; bigger ones get 413.",
        ),
    ] = DEFAULT_MAX_BODY_BYTES,
    max_file_bytes: Annotated[
        int,
        typer.Option(
            "--max-file-bytes", envvar="FORKD_MAX_FILE_BYTES", min=0, metavar="BYTES",
            help="Largest file accepted by PUT /v1/sandboxes/{id}/files (streamed); bigger ones get 413.",
        ),
    ] = DEFAULT_MAX_FILE_BYTES,
    branch_concurrency: Annotated[
        int,
        typer.Option(
            "--branch-concurrency", envvar="FORKD_BRANCH_CONCURRENCY", min=1,
            max=MAX_BRANCH_CONCURRENCY, metavar="N",
            help="BRANCH requests served at once; more get 503.",
        ),
    ] = DEFAULT_BRANCH_CONCURRENCY,
    pools: Annotated[
        list[str] | None,
        typer.Option(
            "--pools", "--pool", envvar="FORKD_POOLS", metavar="TAG=N[,TAG=N]",
            help="Warm pool of N paused children for snapshot TAG, set at start-up (repeatable; a "
            "tag with no snapshot yet fills once it exists). Variable: FORKD_POOLS=\"a=2,b=3\".",
        ),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(
            "--store", envvar="FORKD_STORE", metavar="s3://BUCKET/PREFIX",
            help="Object store for push/pull; a spawn of a tag this host lacks fetches it from there. "
            "Endpoint and credentials: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
            "AWS_REGION.",
        ),
    ] = None,
    registry_mirror: Annotated[
        list[str] | None,
        typer.Option(
            "--registry-mirror", envvar="FORKD_REGISTRY_MIRROR", metavar="REGISTRY=URL",
            help="Pull REGISTRY's images (FROM, POST /v1/images) from this mirror instead, e.g. "
            "docker.io=http://127.0.0.1:5000 (an http:// mirror is spoken to without TLS; repeatable; "
            "variable: comma-separated).",
        ),
    ] = None,
    registry_auth: Annotated[
        Path | None,
        typer.Option(
            "--registry-auth", envvar="FORKD_REGISTRY_AUTH", metavar="CONFIG_JSON",
            help="Registry credentials for image pulls, in Docker's config.json format ({\"auths\": ...}).",
        ),
    ] = None,
    host_id: Annotated[
        str | None,
        typer.Option(
            "--host-id", envvar="FORKD_HOST_ID", metavar="ID",
            help="This host's name in a fleet (1-16 of a-z0-9); sandbox ids become sb-ID-<hex>-<n>.",
        ),
    ] = None,
    etcd: Annotated[
        list[str] | None,
        typer.Option(
            "--etcd", envvar="FORKD_ETCD", metavar="URL[,URL]",
            help="Join a fleet: register this host in etcd under a lease (needs --host-id).",
        ),
    ] = None,
    advertise_url: Annotated[
        str | None,
        typer.Option(
            "--advertise-url", envvar="FORKD_ADVERTISE_URL", metavar="URL",
            help="Where the fleet gateway reaches this daemon (default: its --bind address).",
        ),
    ] = None,
    lease_ttl: Annotated[
        int,
        typer.Option(
            "--lease-ttl", envvar="FORKD_LEASE_TTL", min=2, max=3600, metavar="SECS",
            help="Seconds this host stays in the fleet after its last keepalive (if it dies).",
        ),
    ] = DEFAULT_LEASE_TTL,
    capacity: Annotated[
        int | None,
        typer.Option(
            "--capacity", envvar="FORKD_CAPACITY", min=1, metavar="N",
            help="Sandboxes this host is planned for, for fleet placement (default: one per 512 MiB RAM).",
        ),
    ] = None,
    disk_quota_mib: Annotated[
        int,
        typer.Option(
            "--disk-quota-mib", envvar="FORKD_DISK_QUOTA_MIB", min=0, metavar="MIB",
            help="Disk quota of a sandbox whose spawn gives none: a sandbox whose own disk layers "
            "grow past it is stopped. 0: no quota.",
        ),
    ] = bounds.DEFAULT_DISK_QUOTA_MIB,
    max_sandboxes: Annotated[
        int | None,
        typer.Option(
            "--max-sandboxes", envvar="FORKD_MAX_SANDBOXES", min=1, max=MAX_SANDBOXES_LIMIT, metavar="N",
            help="Most sandboxes this host holds with a VM (running or paused; hibernated ones hold none). "
            "A spawn or fork past it is answered 503 with code no_capacity and Retry-After. "
            "Default: no limit.",
        ),
    ] = None,
    memory_reserve_mib: Annotated[
        int,
        typer.Option(
            "--memory-reserve-mib", envvar="FORKD_MEMORY_RESERVE_MIB", min=0, metavar="MIB",
            help="Memory this host keeps free: while less is available (MemAvailable), a spawn or fork is "
            "answered 503 no_capacity. 0: none.",
        ),
    ] = 0,
    http_parser: Annotated[
        HttpParser,
        typer.Option(
            "--http-parser", envvar="FORKD_HTTP_PARSER", case_sensitive=False,
            help="The HTTP/1.1 parser: httptools (C; the default) or h11 (pure Python, more CPU per "
            "request).",
        ),
    ] = HttpParser.httptools,
    header_timeout: Annotated[
        float,
        typer.Option(
            "--header-timeout", envvar="FORKD_HEADER_TIMEOUT", metavar="SECS",
            help="Seconds a client has to finish a request's line and headers once it began sending "
            "them; a slower one is answered 408 and disconnected.",
        ),
    ] = DEFAULT_HEADER_TIMEOUT,
    fast_path: Annotated[
        bool,
        typer.Option(
            "--fast-path/--no-fast-path", envvar="FORKD_FAST_PATH",
            help="Serve plain JSON routes (eval, exec, ping, ...) without FastAPI's per-request "
            "routing: the same answers for less CPU. --no-fast-path sends every request through FastAPI.",
        ),
    ] = True,
    log_level: Annotated[
        LogLevel,
        typer.Option("--log-level", envvar="FORKD_LOG_LEVEL", case_sensitive=False,
                     help="Daemon log verbosity (the log goes to stderr)."),
    ] = LogLevel.info,
    json_: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Once listening, print one JSON object on stdout: url, pid, version, data_dir, "
            "audit_log and the other settings (never the token). For scripts that start the daemon.",
        ),
    ] = False,
) -> None:
    """Run the forkd daemon (REST API v1) in the foreground until Ctrl-C / SIGTERM.

    Also runs as `python -m forkd.api` with the same options. Every option can
    also be set through its FORKD_* environment variable; a flag wins.
    Exit status: 2 for unsafe or unusable settings (the message says which),
    3 if the address cannot be bound or the state directory cannot be opened.

    Examples:
      forkd daemon                                   # http://127.0.0.1:8889, no auth
      forkd daemon --data-dir /var/lib/forkd --keep-sandboxes
      forkd daemon --bind 0.0.0.0:8889 --token-file /etc/forkd/token \\
                   --tls-cert cert.pem --tls-key key.pem
      FORKD_BRANCH_CONCURRENCY=8 forkd daemon --audit-log /var/log/forkd-audit.log
      forkd daemon --json > daemon.json &             # one JSON line once it listens
      forkd daemon --pool py=4                        # keep 4 children of py restored and paused
      forkd daemon --store s3://snaps/forkd --host-id h1 --etcd http://etcd:2379   # a fleet host
    """
    if (tls_cert is None) != (tls_key is None):
        usage_error(ctx, "--tls-cert and --tls-key must be given together")
    try:
        host, port = parse_bind(bind)
        pool_sizes = parse_pools(pools)
        etcd_urls = parse_endpoints(etcd)
        mirrors = parse_mirrors(registry_mirror)
    except ConfigError as exc:
        usage_error(ctx, str(exc))
    settings = Settings(
        host=host, port=port, token_file=token_file, tls_cert=tls_cert, tls_key=tls_key,
        data_dir=data_dir, keep_sandboxes=keep_sandboxes, audit_log=audit_log,
        max_body_bytes=max_body_bytes, max_file_bytes=max_file_bytes,
        branch_concurrency=branch_concurrency, pools=pool_sizes, store=store, host_id=host_id,
        etcd=etcd_urls, advertise_url=advertise_url, lease_ttl=lease_ttl, capacity=capacity,
        disk_quota_mib=disk_quota_mib, max_sandboxes=max_sandboxes, memory_reserve_mib=memory_reserve_mib,
        http_parser=http_parser.value, fast_path=fast_path,
        header_timeout=header_timeout, registry_mirrors=mirrors, registry_auth=registry_auth,
    )
    # Imported here: the server pulls in uvicorn, FastAPI and the VMM stack, which no other
    # command needs and `pip install forkd` (the SDK and CLI) does not bring.
    try:
        from forkd.api.server import serve
    except ModuleNotFoundError as exc:
        fail(f"the daemon needs {exc.name!r}: pip install 'forkd[daemon]'")

    def announce() -> None:
        typer.echo(json.dumps(describe(settings), separators=(",", ":")))
        sys.stdout.flush()

    try:
        serve(settings, log_level=log_level.value, on_ready=announce if want_json(ctx, json_) else None)
    except ConfigError as exc:
        fail(str(exc), code=2)


def describe(settings: Settings) -> dict[str, object]:
    """What ``forkd daemon --json`` prints once the daemon listens."""
    return {
        "listening": True,
        "url": settings.url,
        "bind": settings.bind,
        "pid": os.getpid(),
        "version": VERSION,
        "api": API_VERSION,
        "auth": "bearer" if settings.token_file is not None else "none",
        "tls": settings.tls,
        "data_dir": str(settings.data().root),
        "audit_log": str(settings.audit_log_path()),
        "keep_sandboxes": settings.keep_sandboxes,
        "branch_concurrency": settings.branch_concurrency,
        "max_body_bytes": settings.max_body_bytes,
        "max_file_bytes": settings.max_file_bytes,
        "pools": settings.pools,
        "store": settings.store,
        "host_id": settings.host_id,
        "etcd": settings.etcd,
        "advertise_url": settings.reachable_url if settings.etcd else None,
        "disk_quota_mib": settings.disk_quota_mib,
        "max_sandboxes": settings.max_sandboxes,
        "memory_reserve_mib": settings.memory_reserve_mib,
        "http_parser": settings.http_parser,
        "fast_path": settings.fast_path,
        "header_timeout": settings.header_timeout,
        "registry_mirrors": settings.registry_mirrors,
    }


def standalone() -> typer.Typer:
    """The daemon command as a program of its own (``python -m forkd.api``)."""
    app = typer.Typer(
        add_completion=False,
        context_settings={"help_option_names": ["-h", "--help"]},
        pretty_exceptions_show_locals=False,
    )
    app.command()(daemon)
    return app


def main(argv: list[str] | None = None, prog_name: str = "python -m forkd.api") -> int:
    """Run :func:`daemon` with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    command = typer.main.get_command(standalone())
    try:
        command.main(args=argv if argv is not None else sys.argv[1:], prog_name=prog_name)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    return 0


__all__ = ["daemon", "describe", "main", "standalone"]
