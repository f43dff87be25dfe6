"""Daemon settings: one dataclass, filled from flags or ``FORKD_*`` environment variables.

The command line (``forkd daemon`` = ``python -m forkd.api``, in
``forkd.api.command``) reads each option from its flag or variable;
:meth:`Settings.from_env` reads the same variables for programs that embed
the daemon, and a unit test checks that both read them alike.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from forkd import bounds
from forkd.config import DEFAULT_BIND, DataDir, HostLimits
from forkd.errors import ForkdError

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
MIN_MAX_BODY_BYTES = 1024  # below this even a spawn request does not fit
# Uploaded files (PUT /v1/sandboxes/{id}/files) stream past the body limit, under their own.
DEFAULT_MAX_FILE_BYTES = 1 << 30
DEFAULT_BRANCH_CONCURRENCY = 4
DEFAULT_LEASE_TTL = 10  # seconds a fleet host stays listed after its last keepalive
# Seconds a client has to complete a request head it began (api/connections.py: slowloris).
DEFAULT_HEADER_TIMEOUT = 10.0
HEADER_TIMEOUT_RANGE = (0.1, 600.0)
MAX_BRANCH_CONCURRENCY = 64
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class ConfigError(ForkdError, ValueError):
    """The daemon refuses to start with these settings; the message says why.

    Also a ``ValueError`` so that callers that only know about bad values
    (argument parsers, the CLI) can catch it without importing forkd.errors.
    """

    status = 500


def parse_bind(bind: str) -> tuple[str, int]:
    """``host:port`` (``[v6addr]:port`` for IPv6) -> (host, port)."""
    text = bind.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ConfigError(f"bad bind address {bind!r}: expected [addr]:port")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or ":" in host:
            raise ConfigError(f"bad bind address {bind!r}: expected host:port ([addr]:port for IPv6)")
    if not host:
        raise ConfigError(f"bad bind address {bind!r}: missing host")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"bad bind address {bind!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"bad bind address {bind!r}: port out of range")
    return host, port


def is_loopback(host: str) -> bool:
    """True only for addresses that cannot be reached from another machine.

    Host names other than ``localhost`` count as non-loopback: we cannot know
    what they resolve to at bind time, so we assume the worst.
    """
    if host.lower() in {"localhost", "localhost.localdomain", "ip6-localhost"}:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r}: expected one of 1/0, true/false, yes/no, on/off")


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected an integer") from None


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected a number") from None


def parse_pools(items: list[str] | str | None) -> dict[str, int]:
    """``--pool TAG=N`` (repeatable) or ``FORKD_POOLS="a=2,b=3"`` -> ``{"a": 2, "b": 3}``."""
    if items is None:
        return {}
    parts = [p for item in ([items] if isinstance(items, str) else items) for p in item.split(",")]
    out: dict[str, int] = {}
    for raw in parts:
        item = raw.strip()
        if not item:
            continue
        tag, sep, size = item.partition("=")
        tag = tag.strip()
        if not sep or not bounds.TAG_RE.match(tag):
            raise ConfigError(f"pool {item!r}: expected TAG=N with a snapshot tag")
        try:
            n = int(size)
        except ValueError:
            raise ConfigError(f"pool {item!r}: {size.strip()!r} is not a whole number") from None
        if not bounds.POOL_SIZE.low <= n <= bounds.POOL_SIZE.high:
            raise ConfigError(f"pool {item!r}: size must be between {bounds.POOL_SIZE.low:.0f} and "
                              f"{bounds.POOL_SIZE.high:.0f}")
        out[tag] = n
    return out


def parse_endpoints(items: list[str] | str | None) -> list[str]:
    """``--etcd URL`` (repeatable) or ``FORKD_ETCD="http://a:2379,http://b:2379"`` -> a list of URLs."""
    if items is None:
        return []
    parts = [p.strip() for item in ([items] if isinstance(items, str) else items) for p in item.split(",")]
    urls = [p for p in parts if p]
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"etcd endpoint {url!r} must be an http:// or https:// URL")
    return urls


def parse_mirrors(items: list[str] | str | None) -> dict[str, str]:
    """``--registry-mirror docker.io=http://host:5000`` (repeatable) or ``FORKD_REGISTRY_MIRROR``
    (comma-separated) -> ``{"docker.io": "http://host:5000"}``."""
    if items is None:
        return {}
    parts = [p.strip() for item in ([items] if isinstance(items, str) else items) for p in item.split(",")]
    out: dict[str, str] = {}
    for item in filter(None, parts):
        registry, sep, url = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?", registry) \
                or not re.fullmatch(r"https?://[A-Za-z0-9.:\[\]-]+/?", url):
            raise ConfigError(f"registry mirror {item[:200]!r}: expected REGISTRY=http[s]://HOST[:PORT]")
        out[registry] = url.rstrip("/")
    return out


def _env_path(name: str) -> Path | None:
    raw = os.environ.get(name)
    return Path(raw) if raw else None


@dataclass
class Settings:
    host: str = "127.0.0.1"
    port: int = 8889
    token_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    data_dir: Path | None = None  # None -> forkd.config.default_data_dir()
    keep_sandboxes: bool = False  # on shutdown, leave child VMs running for the next daemon
    audit_log: Path | None = None  # None -> <data_dir>/audit.log
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    branch_concurrency: int = DEFAULT_BRANCH_CONCURRENCY
    # Warm pool targets applied at start-up (snapshot tag -> size); see controller/pools.py.
    pools: dict[str, int] = field(default_factory=dict)
    # Object store for push/pull and for fetching tags a spawn lacks (controller/travel.py).
    store: str | None = None
    # Fleet (forkd/fleet): this host's id (in every sandbox id), etcd, and what it tells the gateway.
    host_id: str | None = None
    etcd: list[str] = field(default_factory=list)
    advertise_url: str | None = None
    lease_ttl: int = DEFAULT_LEASE_TTL
    capacity: int | None = None  # sandboxes this host is planned for (None: one per 512 MiB of RAM)
    # The disk quota of a spawn that gives none, MiB (0: none; controller/disk_quota.py).
    disk_quota_mib: int = bounds.DEFAULT_DISK_QUOTA_MIB
    # The host's ceilings: sandboxes holding a VM, and memory kept free (controller/capacity.py).
    max_sandboxes: int | None = None
    memory_reserve_mib: int = 0
    # The HTTP/1.1 parser uvicorn serves with (api/connections.py): "httptools" (C, the default
    # when installed) or "h11" (pure Python: more CPU per request; kept to compare and fall back).
    http_parser: str = "httptools"
    # Seconds a client has to complete a request head once it began sending it (api/connections.py).
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    # Plain JSON routes served without FastAPI's per-request routing (api/fast_path.py); off: every
    # request goes through FastAPI (the same answers, more CPU: kept to compare and fall back).
    fast_path: bool = True
    # Image pulls (controller/images.py): a mirror per registry, and Docker's config.json for credentials.
    registry_mirrors: dict[str, str] = field(default_factory=dict)
    registry_auth: Path | None = None

    def __post_init__(self) -> None:
        # Accept str for the paths too (CLI and tests pass them): normalise once here.
        for name in ("token_file", "tls_cert", "tls_key", "data_dir", "audit_log", "registry_auth"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                setattr(self, name, Path(value))

    @classmethod
    def from_env(cls) -> Settings:
        host, port = parse_bind(os.environ.get("FORKD_BIND") or DEFAULT_BIND)
        return cls(
            host=host,
            port=port,
            token_file=_env_path("FORKD_TOKEN_FILE"),
            tls_cert=_env_path("FORKD_TLS_CERT"),
            tls_key=_env_path("FORKD_TLS_KEY"),
            data_dir=_env_path("FORKD_DATA_DIR"),
            keep_sandboxes=_env_bool("FORKD_KEEP_SANDBOXES", False),
            audit_log=_env_path("FORKD_AUDIT_LOG"),
            max_body_bytes=_env_int("FORKD_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES),
            max_file_bytes=_env_int("FORKD_MAX_FILE_BYTES", DEFAULT_MAX_FILE_BYTES),
            branch_concurrency=_env_int("FORKD_BRANCH_CONCURRENCY", DEFAULT_BRANCH_CONCURRENCY),
            pools=parse_pools(os.environ.get("FORKD_POOLS")),
            store=os.environ.get("FORKD_STORE") or None,
            host_id=os.environ.get("FORKD_HOST_ID") or None,
            etcd=parse_endpoints(os.environ.get("FORKD_ETCD")),
            advertise_url=os.environ.get("FORKD_ADVERTISE_URL") or None,
            lease_ttl=_env_int("FORKD_LEASE_TTL", DEFAULT_LEASE_TTL),
            capacity=_env_int("FORKD_CAPACITY", 0) or None,
            disk_quota_mib=_env_int("FORKD_DISK_QUOTA_MIB", bounds.DEFAULT_DISK_QUOTA_MIB),
            max_sandboxes=_env_int("FORKD_MAX_SANDBOXES", 0) or None,
            memory_reserve_mib=_env_int("FORKD_MEMORY_RESERVE_MIB", 0),
            http_parser=os.environ.get("FORKD_HTTP_PARSER") or "httptools",
            header_timeout=_env_float("FORKD_HEADER_TIMEOUT", DEFAULT_HEADER_TIMEOUT),
            fast_path=_env_bool("FORKD_FAST_PATH", True),
            registry_mirrors=parse_mirrors(os.environ.get("FORKD_REGISTRY_MIRROR")),
            registry_auth=_env_path("FORKD_REGISTRY_AUTH"),
        )

    def host_limits(self) -> HostLimits:
        """The ceilings the runtime admits new VMs against."""
        return HostLimits(max_sandboxes=self.max_sandboxes, memory_reserve_mib=self.memory_reserve_mib)

    @property
    def bind(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.bind}"

    @property
    def reachable_url(self) -> str:
        """Where other hosts and the gateway reach this daemon (``--advertise-url``, else its bind)."""
        return self.advertise_url or self.url

    def data(self) -> DataDir:
        return DataDir.from_env(self.data_dir)

    def audit_log_path(self) -> Path:
        return self.audit_log if self.audit_log is not None else self.data().root / "audit.log"
