"""Per-sandbox access tokens: what E2B calls ``envdAccessToken`` and ``trafficAccessToken``.

The SDK sends ``X-Access-Token`` with every in-sandbox request (commands, files,
``/execute``) and ``E2B-Traffic-Access-Token`` with the code interpreter's
requests (the ``/contexts`` calls carry nothing else). Each token is an HMAC of
the sandbox id under a secret the daemon keeps, so it needs no storage, holds
across daemon restarts and across pause/resume (the id stays), and one
sandbox's token opens no other sandbox.

The secret is the daemon's bearer token when it has one; otherwise a random
key kept in ``<data dir>/e2b.key`` (mode 0600), made on first use.

A file URL the SDK signs (``download_url``/``upload_url``) carries no token, only
``signature=v1_<base64 sha256 of "path:operation:user:envd token[:expiration]">``;
``file_signature`` computes the same, so only a holder of the sandbox's token could
have made it.

A volume's token (``VolumeAndToken.token``, the bearer of E2B's volume content calls) is an
HMAC of its name and its creation time under the same secret: it opens that volume alone, and
dies with it (a volume made again under the name gets another).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from collections.abc import Callable
from pathlib import Path

KEY_FILE = "e2b.key"
# Sandbox ids whose envd token is kept computed (a sandbox id is at most 64 bytes).
MAX_KEPT_TOKENS = 1 << 16


def load_or_make_key(data_root: Path) -> bytes:
    path = data_root / KEY_FILE
    try:
        return bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError):
        pass
    data_root.mkdir(parents=True, exist_ok=True)
    key = secrets.token_hex(32)
    tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    os.replace(tmp, path)
    return bytes.fromhex(key)


class AccessTokens:
    """``secret``: the key, or how to get it (read or made on first use, not at start-up)."""

    def __init__(self, secret: bytes | Callable[[], bytes]) -> None:
        self._secret = secret
        self._envd_tokens: dict[str, str] = {}

    def _key(self) -> bytes:
        if callable(self._secret):
            self._secret = self._secret()
        return self._secret

    def _token(self, kind: str, sandbox_id: str) -> str:
        return hmac.new(self._key(), f"{kind}:{sandbox_id}".encode(), hashlib.sha256).hexdigest()

    def envd(self, sandbox_id: str) -> str:
        # Kept: a signed file URL is matched against every running sandbox's token (e2b/signed.py).
        token = self._envd_tokens.get(sandbox_id)
        if token is None:
            if len(self._envd_tokens) >= MAX_KEPT_TOKENS:
                self._envd_tokens.clear()
            token = self._envd_tokens[sandbox_id] = self._token("envd", sandbox_id)
        return token

    def traffic(self, sandbox_id: str) -> str:
        return self._token("traffic", sandbox_id)

    def volume(self, name: str, created_at_unix: int) -> str:
        return self._token("volume", f"{name}:{created_at_unix}")

    def accepts_volume(self, name: str, created_at_unix: int, presented: str) -> bool:
        """Whether ``presented`` is the token of volume ``name`` made at ``created_at_unix``."""
        return hmac.compare_digest(presented.encode(), self.volume(name, created_at_unix).encode())

    def file_signature(self, sandbox_id: str, path: str, operation: str, user: str,
                       expiration: int | None) -> str:
        """E2B's v1 signature of a file URL (``e2b.sandbox.signature.get_signature``'s scheme)."""
        raw = f"{path}:{operation}:{user}:{self.envd(sandbox_id)}"
        if expiration is not None:
            raw += f":{expiration}"
        digest = hashlib.sha256(raw.encode()).digest()
        return "v1_" + base64.b64encode(digest).rstrip(b"=").decode("ascii")

    def accepts_signature(self, sandbox_id: str, signature: str, path: str, operation: str, user: str,
                          expiration: int | None) -> bool:
        wanted = self.file_signature(sandbox_id, path, operation, user, expiration)
        return hmac.compare_digest(signature.encode(), wanted.encode())

    def accepts(self, sandbox_id: str, presented: str | None, *, traffic_too: bool = False) -> bool:
        """Whether ``presented`` is this sandbox's envd token (or, with ``traffic_too``, its
        traffic token); compared in constant time."""
        if not presented:
            return False
        wanted = [self.envd(sandbox_id)] + ([self.traffic(sandbox_id)] if traffic_too else [])
        return any(hmac.compare_digest(presented.encode(), w.encode()) for w in wanted)
