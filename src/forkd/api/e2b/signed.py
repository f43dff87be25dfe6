"""Signed file URLs: a ``secure`` sandbox's ``download_url``/``upload_url`` (envd 0.5.x).

Such a URL is ``/files?path=&username=&signature=v1_...[&signature_expiration=]``:
it carries neither the sandbox's access token nor, when the SDK addresses every
sandbox through one URL (``E2B_SANDBOX_URL``), its ``E2b-Sandbox-Id``. The
signature is the sandbox's name then: only one sandbox's token reproduces it
(``AccessTokens.file_signature``), and the envd app checks it again, with its
expiration, as it checks a token.

E2B's signature is a sha256 over the path, operation, user, token and expiry, so a
URL that names no sandbox can only be matched by trying each running sandbox's
token: 26.6 ms of daemon CPU per request at 10,000 sandboxes, for anyone, with no
credential (issue 38). ``SignerSearch`` bounds that: a signature matched once is
remembered (its next use costs one hash), and the scans of unknown signatures share
a budget of ``SCAN_TRIALS_PER_SEC`` hashes a second; past it one is answered 429.
A request that names its sandbox (``E2b-Sandbox-Id``) costs one hash and no scan.
"""

from __future__ import annotations

import re
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from starlette.types import Scope

from forkd.errors import ForkdError, InvalidRequest

# "v1_" and an unpadded base64 sha256 (43 characters); anything longer is not a signature.
MAX_SIGNATURE_CHARS = 64
MAX_QUERY_BYTES = 8192
# The SDK's URL has four fields at most; a few more (a cache-buster) are tolerated.
MAX_QUERY_FIELDS = 16
SIGNED_FIELDS = ("path", "username", "signature", "signature_expiration")
# Unix seconds in ASCII digits: str.isdigit() is true for "²" (int() raises) and for other
# scripts' digits (int() reads them), and lstrip("-") let "--5" through.
EXPIRATION_RE = re.compile(r"-?[0-9]{1,12}", re.ASCII)
EXPIRED = "signature is already expired"
# Hashes a second that scans for the signer of an unknown signature may spend (about 0.1 s of
# CPU), and how many matched signatures are remembered.
SCAN_TRIALS_PER_SEC = 50_000
MAX_REMEMBERED = 4096


class Expired(ForkdError):
    status = 401


class ScanBudgetSpent(ForkdError):
    status = 429


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
    try:
        pairs = urllib.parse.parse_qsl(raw.decode("latin-1"), max_num_fields=MAX_QUERY_FIELDS)
    except ValueError:  # more fields than max_num_fields
        raise InvalidRequest(f"a signed file URL has at most {MAX_QUERY_FIELDS} query fields") from None
    query: dict[str, str] = {}
    for name, value in pairs:
        if name in SIGNED_FIELDS:
            if name in query:  # which copy was signed? Neither is guessed.
                raise InvalidRequest(f"{name} appears more than once in the query of a signed file URL")
            query[name] = value
    signature = query.get("signature", "")
    if not signature.startswith("v1_") or len(signature) > MAX_SIGNATURE_CHARS:
        raise InvalidRequest("signature is not a v1 file signature")
    expires = query.get("signature_expiration")
    if expires is not None and not EXPIRATION_RE.fullmatch(expires):
        raise InvalidRequest("signature_expiration must be a unix time in seconds")
    return SignedFileRequest(signature=signature, path=query.get("path", ""), operation=operation,
                             user=query.get("username", ""),
                             expiration=None if expires is None else int(expires))


class SignerSearch:
    """Which running sandbox signed a URL that names none, at a bounded cost.

    ``accepts(sandbox_id)`` checks the signature against one sandbox's token (one hash).
    """

    def __init__(self, trials_per_sec: int | None = None, clock: Callable[[], float] | None = None) -> None:
        self._rate = SCAN_TRIALS_PER_SEC if trials_per_sec is None else trials_per_sec
        # Looked up on each call, not bound here, so a test can stand in for the module's clock.
        self._clock: Callable[[], float] = clock if clock is not None else (lambda: time.monotonic())
        self._allowance = float(self._rate)
        self._stamp = self._clock()
        self._signers: dict[str, str] = {}  # signature -> the sandbox whose token made it

    def find(self, signature: str, candidates: Iterable[str], accepts: Callable[[str], bool]) -> str | None:
        known = self._signers.get(signature)
        if known is not None:
            if accepts(known):
                return known
            del self._signers[signature]  # a signature over other fields, or a key since changed
        ids = list(candidates)
        # A scan of more sandboxes than a second's budget may still run, once it has accrued.
        ceiling = max(self._rate, len(ids))
        now = self._clock()
        self._allowance = min(ceiling, self._allowance + (now - self._stamp) * self._rate)
        self._stamp = now
        if len(ids) > self._allowance:
            raise ScanBudgetSpent("too many signed file URLs that name no sandbox are being checked: "
                                  "retry shortly, or send E2b-Sandbox-Id with the request")
        self._allowance -= len(ids)
        for sandbox_id in ids:
            if accepts(sandbox_id):
                if len(self._signers) >= MAX_REMEMBERED:
                    self._signers.clear()
                self._signers[signature] = sandbox_id
                return sandbox_id
        return None


__all__ = ["EXPIRED", "Expired", "ScanBudgetSpent", "SignedFileRequest", "SignerSearch",
           "signed_file_request"]
