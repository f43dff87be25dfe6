"""What a fleet gateway is started with (``forkd gateway``'s options)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forkd.api.settings import DEFAULT_MAX_BODY_BYTES


@dataclass
class GatewaySettings:
    etcd: list[str]
    host: str = "127.0.0.1"
    port: int = 8890
    token_file: Path | None = None  # what clients must present (None: no auth, loopback only)
    host_token_file: Path | None = None  # what the hosts accept (default: token_file)
    request_timeout: float = 3600.0  # longest a proxied call may take (a long exec, a setup)
    connect_timeout: float = 3.0
    list_timeout: float = 15.0  # per host, for the merged lists
    poll_interval: float = 0.5  # how often membership is re-read from etcd
    publish: bool = True
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


__all__ = ["GatewaySettings"]
