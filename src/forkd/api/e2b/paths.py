"""Which requests are E2B's: by path (its control plane) or by header (in-sandbox traffic).

Kept free of the E2B layer's imports so that the fleet gateway, which routes E2B's
requests to their hosts without serving them itself, can recognise them cheaply.
"""

from __future__ import annotations

import re

from starlette.types import Scope

# Where the control plane's routes start; none of them is forkd's own (that lives under /v1).
PREFIXES = ("/sandboxes", "/v2/sandboxes", "/v3/sandboxes", "/templates", "/v2/templates",
            "/v3/templates", "/snapshots", "/volumes", "/secrets", "/tags", "/teams", "/nodes",
            "/access-tokens", "/api-keys")
# E2B's volume content API (``E2B_VOLUME_API_URL``): the files of a volume, under its own token.
VOLUME_CONTENT = "/volumecontent/"
SANDBOX_HEADER = b"e2b-sandbox-id"
_UNDER = tuple(p + "/" for p in PREFIXES)  # one C-level startswith per request (every request asks)


def is_control_path(path: str) -> bool:
    return path.startswith(_UNDER) or path in PREFIXES


def is_volume_content_path(path: str) -> bool:
    return path.startswith(VOLUME_CONTENT)


def is_volume_upload(scope: Scope) -> bool:
    """A volume content upload (``PUT /volumecontent/{id}/file``): its body is a file, streamed
    under the daemon's --max-file-bytes, which a JSON body limit (the daemon's or a gateway's)
    must not buffer."""
    path = str(scope.get("path", ""))
    return scope.get("method") == "PUT" and path.startswith(VOLUME_CONTENT) and path.endswith("/file")


def is_sandbox_request(scope: Scope) -> bool:
    """In-sandbox traffic (envd's services) carries ``E2b-Sandbox-Id``."""
    return scope["type"] == "http" and any(name == SANDBOX_HEADER for name, _ in scope.get("headers", ()))


# E2B's host name form for a sandbox's port (envd's, or one it serves): {port}-{id}.{domain}.
SANDBOX_HOST = re.compile(r"^(?P<port>[0-9]{1,5})-(?P<id>sb-[a-z0-9-]{1,80})\.")


def addressed_sandbox(scope: Scope) -> str | None:
    """The sandbox in-sandbox traffic names: its ``E2b-Sandbox-Id`` header, else its Host's
    ``{port}-{id}.`` form; None for any other request."""
    if scope["type"] != "http":
        return None
    host = b""
    for name, value in scope.get("headers", ()):
        if name == SANDBOX_HEADER:
            return str(value.decode("latin-1")).strip()
        if name == b"host":
            host = value
    m = SANDBOX_HOST.match(host.decode("latin-1"))
    return m.group("id") if m else None


def is_e2b_request(scope: Scope) -> bool:
    if is_sandbox_request(scope):
        return True
    path = str(scope["path"]) if scope["type"] == "http" else ""
    return is_control_path(path) or is_volume_content_path(path)


__all__ = ["PREFIXES", "SANDBOX_HOST", "VOLUME_CONTENT", "addressed_sandbox", "is_control_path",
           "is_e2b_request", "is_sandbox_request", "is_volume_content_path", "is_volume_upload"]
