"""forkd's records in the shapes of the E2B SDK's own models (``e2b.api.client.models``).

The JSON is produced by the pinned SDK's model classes (``to_dict``), so field
names, required fields and date formats are the ones the SDK parses.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from e2b.api.client.models import (
    ListedSandbox,
    Sandbox,
    SandboxDetail,
    SandboxMetric,
    SandboxState,
    SandboxVolumeMount,
)

from forkd.api.e2b.tokens import AccessTokens
from forkd.controller.results import SandboxView

# The envd protocol version this layer speaks. Every gate of the pinned SDK (e2b/envd/versions.py,
# get_metrics' 0.1.5 and 0.2.4) refuses or warns below a version, and each is served here:
# >= 0.4.0 no default user, >= 0.5.2 close_stdin, >= 0.5.7 octet-stream uploads,
# >= 0.6.2 file metadata (xattrs), >= 0.6.3 watch events with their entry (include_entry),
# >= 0.6.4 allow_network_mounts on a watch (accepted: a forkd guest has no network mounts).
ENVD_VERSION = "0.6.4"
CLIENT_ID = "forkd"
# A sandbox without a deadline (forked through /v1 without timeout_secs) "ends" here.
NO_END = dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC)


def when(unix: float | None) -> dt.datetime:
    return NO_END if unix is None else dt.datetime.fromtimestamp(unix, dt.UTC)


def created(sandbox_id: str, template: str, tokens: AccessTokens) -> dict[str, Any]:
    """What create, connect and each fork answer: E2B's ``Sandbox``."""
    body: dict[str, Any] = Sandbox(
        template_id=template, sandbox_id=sandbox_id, client_id=CLIENT_ID, envd_version=ENVD_VERSION,
        envd_access_token=tokens.envd(sandbox_id), traffic_access_token=tokens.traffic(sandbox_id),
    ).to_dict()
    return body


def detail(info: SandboxView, tokens: AccessTokens) -> dict[str, Any]:
    """``SandboxDetail`` (get_info) from ``described`` below."""
    body: dict[str, Any] = SandboxDetail(
        template_id=info["template"], sandbox_id=info["id"], client_id=CLIENT_ID,
        started_at=when(info["started"]), end_at=when(info["ends"]), envd_version=ENVD_VERSION,
        cpu_count=info["vcpus"], memory_mb=info["mem_mib"], disk_size_mb=info["disk_mb"],
        state=SandboxState(info["state"]), metadata=info["metadata"],
        envd_access_token=tokens.envd(info["id"]),
        allow_internet_access=info["egress"]["allow_internet_access"],
        volume_mounts=[SandboxVolumeMount(name=m["name"], path=m["path"]) for m in info["volume_mounts"]],
    ).to_dict()
    return body


def listed(info: SandboxView) -> dict[str, Any]:
    """``ListedSandbox`` (one entry of list)."""
    body: dict[str, Any] = ListedSandbox(
        template_id=info["template"], sandbox_id=info["id"], client_id=CLIENT_ID,
        started_at=when(info["started"]), end_at=when(info["ends"]), cpu_count=info["vcpus"],
        memory_mb=info["mem_mib"], disk_size_mb=info["disk_mb"], state=SandboxState(info["state"]),
        envd_version=ENVD_VERSION, metadata=info["metadata"],
    ).to_dict()
    return body


def metric(at: float, figures: dict[str, float]) -> dict[str, Any]:
    """``SandboxMetric``: one sample (``guest_metrics.guest_metrics``'s figures) taken at ``at``."""
    body: dict[str, Any] = SandboxMetric(
        timestamp=when(at), timestamp_unix=int(at), cpu_count=int(figures["cpu_count"]),
        cpu_used_pct=float(figures["cpu_used_pct"]), mem_used=int(figures["mem_used"]),
        mem_total=int(figures["mem_total"]), mem_cache=int(figures["mem_cache"]),
        disk_used=int(figures["disk_used"]), disk_total=int(figures["disk_total"]),
    ).to_dict()
    return body
