"""Bearer-token authentication for every route except ``/healthz`` and the console's files (``/ui``).

Enforced as ASGI middleware rather than a FastAPI dependency so that nothing
escapes it: unknown paths, ``/openapi.json``, ``/docs`` and ``/metrics`` are all
behind the token, and an unauthenticated caller cannot probe which routes exist.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import os
import re
import stat
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from forkd.api.settings import ConfigError, Settings, is_loopback

MIN_TOKEN_CHARS = 16
UNAUTHENTICATED_PATHS = frozenset({"/healthz"})
# The web console's static files (forkd.api.ui): no data, no secret; the API they call needs the token.
UNAUTHENTICATED_PREFIX = "/ui"


def is_public(path: str) -> bool:
    """Routes anyone may fetch: ``/healthz`` and the console's own files."""
    return path in UNAUTHENTICATED_PATHS or path == UNAUTHENTICATED_PREFIX or path.startswith(
        UNAUTHENTICATED_PREFIX + "/"
    )
UNAUTHORIZED_MESSAGE = "missing or invalid bearer token"

# Values people paste from examples. Compared after lower-casing and dropping
# everything but letters and digits, so "<your-token>", "CHANGE_ME" and
# "change-me" all match.
_PLACEHOLDERS = frozenset(
    {
        "changeme",
        "changemeplease",
        "replaceme",
        "token",
        "yourtoken",
        "yourtokenhere",
        "mytoken",
        "secret",
        "yoursecret",
        "mysecret",
        "password",
        "passw0rd",
        "example",
        "exampletoken",
        "placeholder",
        "test",
        "testtoken",
        "dummy",
        "default",
        "forkd",
        "forkdtoken",
        "apikey",
        "bearer",
        "todo",
        "fixme",
        "inserttokenhere",
    }
)
# Substrings that only ever appear in a placeholder, never in a generated token.
_PLACEHOLDER_MARKERS = ("changeme", "replaceme", "placeholder", "yourtoken", "tokenhere")
# A token drawn from a real RNG has many distinct characters; "xxxxxxxxxxxxxxxx",
# "0000…" or "abababab…" do not.
_MIN_DISTINCT_CHARS = 6


def _is_repetition_of_placeholder(norm: str) -> bool:
    for word in _PLACEHOLDERS:
        if len(norm) >= len(word) and len(norm) % len(word) == 0 and norm == word * (len(norm) // len(word)):
            return True
    return False


def validate_token(token: str, source: str = "token") -> str:
    """Return ``token`` if it is usable as a shared secret, else raise ConfigError."""
    if not token:
        raise ConfigError(f"{source} is empty; put a random secret in it (e.g. `openssl rand -hex 32`)")
    if any(ch.isspace() for ch in token) or not token.isprintable():
        raise ConfigError(f"{source} contains whitespace or control characters")
    norm = re.sub(r"[^a-z0-9]", "", token.lower())
    placeholder_msg = (
        f"{source} looks like a placeholder, not a secret; generate one with `openssl rand -hex 32`"
    )
    if (
        norm in _PLACEHOLDERS
        or "<" in token
        or ">" in token
        or any(marker in norm for marker in _PLACEHOLDER_MARKERS)
        or _is_repetition_of_placeholder(norm)
    ):
        raise ConfigError(placeholder_msg)
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"{source} is {len(token)} characters; use at least {MIN_TOKEN_CHARS} "
            "(e.g. `openssl rand -hex 32`)"
        )
    if len(set(token.lower())) < _MIN_DISTINCT_CHARS:
        raise ConfigError(placeholder_msg)
    return token


def load_token(path: Path) -> str:
    """Read the token file (surrounding whitespace, e.g. a trailing newline, is ignored)."""
    try:
        raw = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"token file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read token file {path}: {exc}") from None
    return validate_token(raw.strip(), source=f"token file {path}")


# A token the daemon accepts but warns about: shorter than this, or of one character class.
STRONG_TOKEN_CHARS = 32


def token_warnings(path: Path, token: str) -> list[str]:
    """What is weak about an accepted token and its file (logged at start, not refused).

    A file other users may read (group/other bits) hands them the daemon, and a
    short or single-class token (``abcdefghijklmnop``) is guessable; both were
    accepted silently.
    """
    out: list[str] = []
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = 0
    if mode & 0o077:
        out.append(f"token file {path} has mode {mode:04o}: other local users may read the token; "
                   f"make it private with chmod 600 {path}")
    classes = [any(c.islower() for c in token), any(c.isupper() for c in token),
               any(c.isdigit() for c in token), any(not c.isalnum() for c in token)]
    if len(token) < STRONG_TOKEN_CHARS or sum(classes) < 2:
        out.append(f"the token in {path} is weak ({len(token)} characters"
                   f"{', of one kind only' if sum(classes) < 2 else ''}): use at least "
                   f"{STRONG_TOKEN_CHARS} random characters, e.g. `openssl rand -hex 32`")
    return out


def check_bind_safety(settings: Settings) -> None:
    """Refuse to expose an unauthenticated daemon beyond this machine.

    Whoever reaches the API can run arbitrary commands in sandboxes and point
    snapshot builds at host files, so a non-loopback bind needs a token.
    """
    if settings.token_file is None and not is_loopback(settings.host):
        raise ConfigError(
            f"refusing to listen on {settings.bind} without a bearer token: the address is "
            "reachable from other machines. Pass --token-file (FORKD_TOKEN_FILE) or bind "
            "to 127.0.0.1."
        )


def _bearer_from_scope(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, credential = value.partition(b" ")
            if scheme.lower() == b"bearer" and credential.strip():
                token: bytes = credential.strip()
                return token
            return None
    return None


# A browser cannot set headers on a WebSocket: it offers the token as a subprotocol instead,
# ``bearer.<base64url of the token, unpadded>``, beside the one it speaks (the server never echoes it).
WS_BEARER_PREFIX = "bearer."


def _bearer_from_subprotocols(scope: Scope) -> bytes | None:
    for offered in scope.get("subprotocols", ()):
        if offered.startswith(WS_BEARER_PREFIX):
            encoded = offered[len(WS_BEARER_PREFIX):]
            try:
                return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
            except (binascii.Error, ValueError):
                return None
    return None


class BearerAuthMiddleware:
    """Rejects requests without ``Authorization: Bearer <token>`` with 401 ``{"error"}``; a
    WebSocket without it (or its ``bearer.`` subprotocol) is closed before the handshake (403)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._token = token.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            presented = _bearer_from_scope(scope) or _bearer_from_subprotocols(scope)
            if presented is not None and hmac.compare_digest(presented, self._token):
                await self.app(scope, receive, send)
                return
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008, "reason": UNAUTHORIZED_MESSAGE[:120]})
            return
        if scope["type"] != "http" or is_public(scope["path"]):
            await self.app(scope, receive, send)
            return
        presented = _bearer_from_scope(scope)
        # compare_digest keeps the comparison time independent of where the
        # first differing byte is, so the token cannot be guessed byte by byte.
        if presented is not None and hmac.compare_digest(presented, self._token):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"error": UNAUTHORIZED_MESSAGE}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b'Bearer realm="forkd"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
