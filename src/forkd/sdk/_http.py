"""Transport-independent plumbing shared by the sync and async controllers.

Each REST call is described once, as a :class:`Call` built by the functions in
:mod:`forkd.sdk._calls`; :class:`~forkd.sdk.Controller` and
:class:`~forkd.sdk.async_client.AsyncController` only differ in how they send
it. Keeping request shapes in one place means the two clients cannot drift,
and ``client.py`` itself is generated from ``async_client.py`` by
``scripts/unasync_sdk.py``.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from forkd.config import VERSION
from forkd.errors import ForkdError
from forkd.sdk.errors import (
    ForkdConnectionError,
    ForkdTimeoutError,
    ServerError,
    SnapshotFailedError,
    error_for_status,
)

DEFAULT_URL = "http://127.0.0.1:8889"
DEFAULT_TIMEOUT = 30.0
# How long waiting for a snapshot to become ready may take by default.
DEFAULT_WAIT_SECS = 600.0
USER_AGENT = f"forkd-sdk/{VERSION}"
# Bytes read from a file object per piece of an upload.
UPLOAD_PIECE = 1 << 20
# Called with the bytes moved so far during an upload or a download.
Progress = Callable[[int], None]

Default = Literal["default"]


@dataclass(frozen=True)
class Call:
    """One HTTP request to the daemon.

    ``read_timeout`` overrides only the read timeout: ``"default"`` keeps the
    client's, ``None`` waits as long as the daemon takes (snapshot builds, spawns
    and branches legitimately take minutes under TCG; the daemon bounds an eval
    itself, see :func:`forkd.sdk._calls.eval_`), a number waits that many seconds.
    ``error_events``: in an NDJSON answer, an ``{"type": "error"}`` line is an event
    like any other (a cell's exception, ``/code``) rather than the stream breaking.
    """

    method: str
    path: str
    json: Any = None
    # A list value repeats the parameter (``?metadata=a=1&metadata=b=2``).
    params: Mapping[str, str | list[str]] = field(default_factory=dict)
    read_timeout: float | Default | None = "default"
    expect: Literal["json", "text", "bytes"] = "json"
    error_events: bool = False


def resolve_url(url: str | None) -> str:
    """``url``, else ``$FORKD_URL``, else the default; ``host:port`` gets ``http://``."""
    url = (url or os.environ.get("FORKD_URL") or DEFAULT_URL).strip().rstrip("/")
    if "://" not in url:
        url = f"http://{url}"
    return url


def resolve_token(token: str | None) -> str | None:
    """``token``, else ``$FORKD_TOKEN``, else the contents of ``$FORKD_TOKEN_FILE``."""
    if token:
        return token
    if env := os.environ.get("FORKD_TOKEN"):
        return env.strip()
    if path := os.environ.get("FORKD_TOKEN_FILE"):
        try:
            return Path(path).read_text().strip() or None
        except OSError as exc:
            raise ForkdError(f"cannot read FORKD_TOKEN_FILE {path}: {exc.strerror or exc}") from None
    return None


def resolve_verify(verify: bool | str | ssl.SSLContext | None) -> bool | ssl.SSLContext:
    """TLS verification for httpx.

    ``None`` means ``$FORKD_CA_CERT`` if set (a daemon serving a self-signed
    ``--tls-cert``), else the system/certifi roots. A path (file or directory of
    CA certificates) becomes an SSLContext, as httpx 0.28 deprecates string paths.
    """
    if verify is None:
        verify = os.environ.get("FORKD_CA_CERT") or True
    if isinstance(verify, str):
        try:
            if os.path.isdir(verify):
                return ssl.create_default_context(capath=verify)
            return ssl.create_default_context(cafile=verify)
        except (OSError, ssl.SSLError) as exc:
            raise ForkdError(f"cannot load CA certificate {verify}: {exc}") from None
    return verify


def headers(token: str | None) -> dict[str, str]:
    out = {"User-Agent": USER_AGENT, "Accept": "application/json"}
    if token:
        out["Authorization"] = f"Bearer {token}"
    return out


def timeout_for(call: Call, base: float | None) -> httpx.Timeout:
    if call.read_timeout == "default":
        return httpx.Timeout(base)
    return httpx.Timeout(base, read=call.read_timeout)


def error_message(response: httpx.Response) -> str:
    """The server's ``{"error": ...}`` text, or the best substitute available."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, str):
            return error
        detail = body.get("detail")
        if isinstance(detail, str):
            return detail
        if isinstance(detail, list):  # pydantic validation errors
            parts = []
            for item in detail:
                if isinstance(item, dict):
                    loc = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
                    parts.append(f"{loc}: {item.get('msg')}" if loc else str(item.get("msg")))
            if parts:
                return "; ".join(parts)
    text = response.text.strip()
    if text:
        return text[:500]
    return f"HTTP {response.status_code} {response.reason_phrase}".strip()


def error_code(response: httpx.Response) -> str | None:
    """The answer's machine-readable ``code`` (e.g. ``no_capacity``), if it has one."""
    try:
        body = response.json()
    except ValueError:
        return None
    code = body.get("code") if isinstance(body, dict) else None
    return code if isinstance(code, str) else None


def retry_after(response: httpx.Response) -> float | None:
    """The Retry-After header in seconds (the delay form; an HTTP date is not used by forkd)."""
    value = response.headers.get("retry-after", "")
    return float(value) if value.isdigit() else None


def parse_response(call: Call, response: httpx.Response) -> Any:
    """The decoded body of a successful response; raises the mapped error otherwise."""
    if not response.is_success:
        raise error_for_status(response.status_code, error_message(response), error_code(response),
                               retry_after(response))
    if response.status_code == 204 or not response.content:
        return None
    if call.expect == "text":
        return response.text
    if call.expect == "bytes":
        return response.content
    try:
        return response.json()
    except ValueError:
        raise ServerError(
            response.status_code,
            f"daemon sent a non-JSON answer to {call.method} {call.path}: {response.text[:200]!r}",
        ) from None


def stream_event(call: Call, line: str) -> dict[str, Any]:
    """One line of an NDJSON stream; an ``error`` event (the stream broke) raises, unless the call
    has ``error_events`` (then it is returned as any other event)."""
    try:
        event = json.loads(line)
    except ValueError:
        raise ServerError(502, f"daemon sent a non-JSON line in {call.method} {call.path}: "
                               f"{line[:200]!r}") from None
    if not isinstance(event, dict):
        raise ServerError(502, f"daemon sent a non-object line in {call.method} {call.path}")
    if event.get("type") == "error" and not call.error_events:
        raise ServerError(502, str(event.get("error")))
    return event


def translate(exc: httpx.HTTPError, url: str, call: Call) -> ForkdError:
    """Turn an httpx transport failure into the SDK's exceptions."""
    if isinstance(exc, httpx.ConnectTimeout):
        return ForkdConnectionError(url, "connection timed out")
    if isinstance(exc, httpx.ConnectError):
        return ForkdConnectionError(url, str(exc) or "connection failed")
    if isinstance(exc, httpx.TimeoutException):
        return ForkdTimeoutError(
            f"{call.method} {call.path}: the daemon at {url} did not answer in time "
            "(raise the client timeout for slow operations)"
        )
    if isinstance(exc, (httpx.UnsupportedProtocol, httpx.InvalidURL)):
        return ForkdError(f"invalid forkd URL {url!r}: {exc}")
    return ForkdError(f"{call.method} {call.path} to {url} failed: {exc or type(exc).__name__}")


def snapshot_is_ready(info: Mapping[str, Any]) -> bool:
    """True once a snapshot can be forked; raises if its background write failed.

    ``status`` is omitted on snapshots that were written synchronously, which
    are ready by construction.
    """
    status = info.get("status", "ready")
    if status == "failed":
        raise SnapshotFailedError(str(info.get("tag")), info.get("error"))
    return bool(status == "ready")
