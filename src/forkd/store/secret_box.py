"""Secrets sealed at rest: AES-256-GCM under the daemon's key, each bound to its name.

The key is 32 random bytes in ``<data>/secrets.key`` (0600, made once, atomically); a value is
sealed with a fresh 96-bit nonce and its secret's name as associated data, so a sealed value
copied onto another name does not open. Only the key file and the registry together give the
values back, and only ``controller.secrets`` asks.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from forkd.errors import CorruptState

KEY_BYTES = 32
NONCE_BYTES = 12


class SecretBox:
    def __init__(self, key_path: Path) -> None:
        self._path = key_path
        self._key: bytes | None = None

    def _load(self) -> bytes:
        if self._key is None:
            if not self._path.exists():
                self._path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self._path.with_name(f".{self._path.name}.{os.getpid()}")
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.write(fd, os.urandom(KEY_BYTES))
                    os.fsync(fd)
                finally:
                    os.close(fd)
                try:
                    os.link(tmp, self._path)  # never replaces a key another start made meanwhile
                except FileExistsError:
                    pass
                finally:
                    tmp.unlink()
            key = self._path.read_bytes()
            if len(key) != KEY_BYTES:
                raise CorruptState(f"{self._path} is not a {KEY_BYTES}-byte key; the secrets sealed "
                                   "under it cannot be opened (restore the file, or delete the secrets)")
            self._key = key
        return self._key

    def seal(self, name: str, value: str) -> tuple[bytes, bytes]:
        nonce = os.urandom(NONCE_BYTES)
        return nonce, AESGCM(self._load()).encrypt(nonce, value.encode(), name.encode())

    def open(self, name: str, nonce: bytes, sealed: bytes) -> str:
        try:
            return AESGCM(self._load()).decrypt(nonce, sealed, name.encode()).decode()
        except (InvalidTag, ValueError, UnicodeDecodeError):
            raise CorruptState(f"the secret {name!r} does not open under {self._path}") from None
