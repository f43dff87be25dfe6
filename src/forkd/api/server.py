"""Run the daemon: validate settings, then serve the app with uvicorn."""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import Callable
from pathlib import Path

import uvicorn

from forkd import bounds
from forkd.api.app import create_app
from forkd.api.auth import check_bind_safety, load_token, token_warnings
from forkd.api.connections import (
    ACCEPT_BATCH,
    HTTP_PARSERS,
    http_protocol,
    install_log_filter,
    raise_fd_limit,
)
from forkd.api.settings import (
    HEADER_TIMEOUT_RANGE,
    MAX_BRANCH_CONCURRENCY,
    MIN_MAX_BODY_BYTES,
    ConfigError,
    Settings,
)
from forkd.errors import InvalidRequest
from forkd.host.netplan import AddressPlan
from forkd.store.objectstore import StoreURL

log = logging.getLogger(__name__)

# In-flight requests get this long to finish on SIGTERM/SIGINT before they are
# cancelled; a snapshot build can take minutes and must not hold shutdown hostage.
GRACEFUL_SHUTDOWN_SECS = 30
KEEP_ALIVE_SECS = 65  # longer than clients keep idle connections pooled before reusing them


def _readable(path: Path, what: str) -> None:
    if not path.is_file():
        raise ConfigError(f"{what} {path} does not exist or is not a file")
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc}") from None


def validate_settings(settings: Settings) -> None:
    """Everything that would make the daemon unsafe or unusable, checked before binding."""
    check_bind_safety(settings)
    if settings.token_file is not None:
        load_token(settings.token_file)
    if (settings.tls_cert is None) != (settings.tls_key is None):
        raise ConfigError("TLS needs both --tls-cert and --tls-key (or neither)")
    if settings.tls_cert is not None and settings.tls_key is not None:
        _readable(settings.tls_cert, "TLS certificate")
        _readable(settings.tls_key, "TLS key")
        # Load them once here so a mismatched pair or a PEM typo is reported
        # as such, not as an SSL traceback from inside uvicorn.
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                settings.tls_cert, settings.tls_key
            )
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"cannot load TLS certificate {settings.tls_cert} with key {settings.tls_key}: {exc}"
            ) from None
    if not 1 <= settings.branch_concurrency <= MAX_BRANCH_CONCURRENCY:
        raise ConfigError(f"branch concurrency must be between 1 and {MAX_BRANCH_CONCURRENCY}")
    if settings.max_body_bytes < MIN_MAX_BODY_BYTES:
        raise ConfigError(f"max body size must be at least {MIN_MAX_BODY_BYTES} bytes")
    if settings.max_file_bytes < 0:
        raise ConfigError("max file size must not be negative")
    try:
        bounds.DISK_QUOTA_MIB.check(settings.disk_quota_mib)
    except InvalidRequest as exc:
        raise ConfigError(f"--disk-quota-mib: {exc}") from None
    try:
        settings.host_limits()
    except ValueError as exc:
        raise ConfigError(f"--max-sandboxes / --memory-reserve-mib: {exc}") from None
    if not 0 < settings.port <= 65535:
        raise ConfigError(f"port {settings.port} is out of range")
    try:
        AddressPlan.from_env()  # FORKD_NET_CIDR: the sandboxes' address plan
    except InvalidRequest as exc:
        raise ConfigError(str(exc)) from None
    validate_fleet_settings(settings)
    low, high = HEADER_TIMEOUT_RANGE
    if not low <= settings.header_timeout <= high:  # also refuses nan
        raise ConfigError(f"--header-timeout must be between {low:g} and {high:g} seconds")
    if settings.http_parser not in HTTP_PARSERS:
        raise ConfigError(f"unknown HTTP parser {settings.http_parser!r}: "
                          f"use one of {', '.join(HTTP_PARSERS)}")


def validate_fleet_settings(settings: Settings) -> None:
    """--store, --host-id, --etcd and friends: each checked, and the combinations that need each other."""
    if settings.store is not None:
        try:
            StoreURL.parse(settings.store)
        except InvalidRequest as exc:
            raise ConfigError(f"--store: {exc}") from None
    if settings.host_id is not None and not bounds.HOST_ID_RE.match(settings.host_id):
        raise ConfigError(f"--host-id {settings.host_id!r}: use 1 to 16 lower-case letters and digits")
    if settings.etcd and settings.host_id is None:
        raise ConfigError("--etcd needs --host-id: a fleet host names itself in every sandbox id it makes")
    if settings.etcd and settings.advertise_url is None and settings.host in ("0.0.0.0", "::"):
        raise ConfigError("--etcd with a wildcard --bind needs --advertise-url: the URL the gateway "
                          "reaches this host at, e.g. http://10.0.0.5:8889")
    if not 2 <= settings.lease_ttl <= 3600:
        raise ConfigError("--lease-ttl must be between 2 and 3600 seconds")
    if settings.capacity is not None and settings.capacity < 1:
        raise ConfigError("--capacity must be at least 1")


class _Server(uvicorn.Server):
    """A uvicorn server that says when it is ready: runtime open and socket bound."""

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[], None] | None) -> None:
        super().__init__(config)
        self.on_ready = on_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self.on_ready is not None:
            self.on_ready()


def serve(settings: Settings, log_level: str = "info", on_ready: Callable[[], None] | None = None) -> None:
    """Validate ``settings`` and serve until SIGINT/SIGTERM (uvicorn handles both).

    ``on_ready`` is called once the runtime is open and the socket listens
    (``forkd daemon --json`` prints its line then). Raises ConfigError for
    unsafe or broken settings and SystemExit(3) if the runtime fails to open
    or the address cannot be bound during start-up.
    """
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    validate_settings(settings)
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        ssl_certfile=settings.tls_cert,
        ssl_keyfile=settings.tls_key,
        log_level=log_level,
        lifespan="on",  # a runtime that cannot open must stop the daemon, not be ignored
        # The daemon is not meant to sit behind a proxy; trusting
        # X-Forwarded-For would let local callers forge the audit log's client.
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECS,
        # Bounded connections: first-request and head timeouts, a cap with eviction and a reserve
        # for /healthz and credentialed requests (api/connections.py).
        http=http_protocol(settings.http_parser, settings.header_timeout),
        # A kept-alive connection waits this long for its next request. uvicorn's 5 s races clients
        # that pause about that long and then reuse their connection (E2B's SDK over TLS: "connection
        # closed before message completed"); the cap above still evicts idle ones under pressure.
        timeout_keep_alive=KEEP_ALIVE_SECS,
        # The audit log already writes one line per request (api/audit.py); uvicorn's access
        # line would say the same again, at a cost in CPU on every request.
        access_log=False,
        # asyncio accepts up to `backlog` sockets per wake-up before any of them is checked
        # against the cap; a smaller batch keeps a burst's peak of fds well under the limit.
        backlog=ACCEPT_BATCH,
    )
    install_log_filter()  # after uvicorn.Config: it sets up uvicorn's own handlers
    fd_limit = raise_fd_limit()
    server = _Server(config, on_ready)
    if settings.token_file is not None:
        for warning in token_warnings(settings.token_file, load_token(settings.token_file)):
            log.warning("%s", warning)
    log.info(
        "forkd API serving on %s (auth: %s, audit log: %s, file descriptors: %d)",
        settings.url,
        "bearer token" if settings.token_file else "none, loopback only",
        settings.audit_log_path(),
        fd_limit,
    )
    server.run()
    if not server.started:
        raise SystemExit(3)
