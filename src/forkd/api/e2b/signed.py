"""Signed file URLs: a ``secure`` sandbox's ``download_url``/``upload_url`` (envd 0.5.x).

Such a URL is ``/files?path=&username=&signature=v1_...[&signature_expiration=]``:
it carries neither the sandbox's access token nor, when the SDK addresses every
sandbox through one URL (``E2B_SANDBOX_URL``), its ``E2b-Sandbox-Id``. The
signature is the sandbox's name then: only one sandbox's token reproduces it
(``AccessTokens.file_signature``), so the dispatcher finds that sandbox by
trying each one's (a sha256 and an HMAC per sandbox, and only for such URLs),
and the envd app checks it again, with its expiration, as it checks a token.
"""

from __future__ import annotations

import time
import urllib.parse
from dataclasses import dataclass

from starlette.types import Scope

from forkd.errors import ForkdError, InvalidRequest

# "v1_" and an unpadded base64 sha256 (43 characters); anything longer is not a signature.
MAX_SIGNATURE_CHARS = 64
MAX_QUERY_BYTES = 8192
EXPIRED = "signature is already expired"


class Expired(ForkdError):
    status = 401


@dataclass(frozen=True)
class SignedFileRequest:
    """What a signed ``/files`` request was signed over."""

    signature: str
    path: str
    operation: str  # "read" (GET) or "write" (POST)
    user: str  # as signed: the ``username`` of the URL, "" for the default user
    expiration: int | None  # unix seconds

    def check_not_expired(self, now: float | None = None) -> None:
        if self.expiration is not None and self.expiration < (time.time() if now is None else now):
            raise Expired(EXPIRED)


def signed_file_request(scope: Scope) -> SignedFileRequest | None:
    """The signature of a ``GET``/``POST /files`` request, or None if it carries none."""
    if scope.get("type") != "http" or scope.get("path") != "/files":
        return None
    operation = {"GET": "read", "POST": "write"}.get(str(scope.get("method")))
    raw: bytes = scope.get("query_string", b"")
    if operation is None or b"signature=" not in raw:
        return None
    if len(raw) > MAX_QUERY_BYTES:
        raise InvalidRequest(f"the query of a signed file URL is over {MAX_QUERY_BYTES} bytes")
    query = urllib.parse.parse_qs(raw.decode("latin-1"), max_num_fields=16)
    signature = query.get("signature", [""])[0]
    if not signature.startswith("v1_") or len(signature) > MAX_SIGNATURE_CHARS:
        raise InvalidRequest("signature is not a v1 file signature")
    expires = query.get("signature_expiration", [None])[0]
    if expires is not None and not (expires.lstrip("-").isdigit() and len(expires) <= 12):
        raise InvalidRequest("signature_expiration must be a unix time in seconds")
    return SignedFileRequest(signature=signature, path=query.get("path", [""])[0], operation=operation,
                             user=query.get("username", [""])[0],
                             expiration=None if expires is None else int(expires))


__all__ = ["EXPIRED", "Expired", "SignedFileRequest", "signed_file_request"]
