"""Secrets: values a sandbox's requests may carry without the sandbox ever holding them.

A secret is written once (``POST /v1/secrets``) and never read back through any API: listing
and getting it give its name, version and metadata only. Its value is sealed at rest
(store/secret_box.py) and opened only by ``resolve``, which the egress interceptor of a
sandbox calls (host/egress_tls.py) to put it in place of a ``${secrets.NAME}`` placeholder in a
request to a host with a rule: the value goes from the daemon to that server and nowhere else,
never to a guest, a log, a snapshot or a pack.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from forkd import bounds
from forkd.errors import Conflict, InvalidRequest, NotFound
from forkd.store.rows.secrets import SecretRow, SecretRows
from forkd.store.secret_box import SecretBox

_NAME = re.compile(bounds.SECRET_NAME_PATTERN)
MAX_VALUE_BYTES = bounds.MAX_SECRET_VALUE_BYTES
MAX_METADATA = bounds.MAX_SECRET_METADATA
MAX_SECRETS = 1024


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise InvalidRequest(f"secret name {name[:64]!r} must be letters, digits and '_', not starting "
                             "with a digit, at most 128 (it goes into ${secrets.NAME})")
    return name


@dataclass(frozen=True)
class SecretInfo:
    name: str
    version: int
    metadata: dict[str, str]
    created_at_unix: float
    updated_at_unix: float

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "metadata": self.metadata,
                "created_at_unix": self.created_at_unix, "updated_at_unix": self.updated_at_unix}


def _info(row: SecretRow) -> SecretInfo:
    return SecretInfo(row.name, row.version, row.metadata, row.created_at_unix, row.updated_at_unix)


class Secrets:
    """The owner of the ``secrets`` table."""

    def __init__(self, rows: SecretRows, box: SecretBox) -> None:
        self._rows = rows
        self._box = box

    def _check(self, value: str, metadata: dict[str, str] | None) -> dict[str, str]:
        if len(value.encode()) > MAX_VALUE_BYTES:
            raise InvalidRequest(f"a secret's value is at most {MAX_VALUE_BYTES} bytes")
        if "\0" in value:
            raise InvalidRequest("a secret's value may not hold NUL")
        metadata = dict(metadata or {})
        if len(metadata) > MAX_METADATA:
            raise InvalidRequest(f"a secret has at most {MAX_METADATA} metadata entries")
        return metadata

    def create(self, name: str, value: str, metadata: dict[str, str] | None = None) -> SecretInfo:
        check_name(name)
        metadata = self._check(value, metadata)
        if self._rows.get(name) is not None:
            raise Conflict(f"a secret named {name!r} exists; update it (PUT /v1/secrets/{name}) or delete it")
        if len(self._rows.all()) >= MAX_SECRETS:
            raise Conflict(f"this daemon holds {MAX_SECRETS} secrets, the most it keeps; delete one first")
        now = time.time()
        nonce, sealed = self._box.seal(name, value)
        row = SecretRow(name, nonce, sealed, 1, metadata, now, now)
        self._rows.put(row)
        return _info(row)

    def update(self, name: str, value: str | None = None,
               metadata: dict[str, str] | None = None) -> SecretInfo:
        old = self._row(name)
        nonce, sealed, version = old.nonce, old.sealed, old.version
        if value is not None:
            self._check(value, None)
            nonce, sealed = self._box.seal(name, value)
            version += 1
        row = SecretRow(name, nonce, sealed, version,
                        self._check("", metadata) if metadata is not None else old.metadata,
                        old.created_at_unix, time.time())
        self._rows.put(row)
        return _info(row)

    def get(self, name: str) -> SecretInfo:
        return _info(self._row(name))

    def all(self) -> list[SecretInfo]:
        return [_info(r) for r in self._rows.all()]

    def delete(self, name: str) -> None:
        if not self._rows.delete(check_name(name)):
            raise NotFound(f"no secret named {name!r}")

    def resolve(self, name: str) -> str | None:
        """The value of ``name`` (None: no such secret): for the egress interceptor only."""
        if not _NAME.match(name):
            return None
        row = self._rows.get(name)
        return None if row is None else self._box.open(row.name, row.nonce, row.sealed)

    def _row(self, name: str) -> SecretRow:
        row = self._rows.get(check_name(name))
        if row is None:
            raise NotFound(f"no secret named {name!r}; POST /v1/secrets makes one")
        return row
