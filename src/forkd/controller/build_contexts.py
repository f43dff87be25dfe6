"""Build contexts: the files a Dockerfile's COPY may name, kept on the host by digest.

A context arrives as one tar (``PUT /v1/templates/contexts``) and is stored
under ``<data dir>/build-contexts/<sha256>.tar``: content-addressed, so the same
files uploaded twice are stored once, and a build names its context by digest.
Nothing is extracted on the host: a COPY step gets a small tar of just its
sources (``select``), which the guest unpacks. Every member is checked on the
way in (a relative path that stays inside the context; a file, directory or
symbolic link; bounded in number and total size).
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import tarfile
import tempfile
from collections.abc import AsyncIterable
from pathlib import Path

from forkd import bounds
from forkd.errors import InvalidRequest, NotFound, TooLarge

DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
_KINDS = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE)


def check_digest(digest: str) -> str:
    if not isinstance(digest, str) or not DIGEST_RE.match(digest):
        raise InvalidRequest("a build context is named by the sha256 of its tar (64 hex digits)")
    return digest


def _member_name(member: tarfile.TarInfo) -> str:
    name = posixpath.normpath(member.name)
    if name.startswith(("/", "../")) or name == ".." or "\0" in name:
        raise InvalidRequest(f"build context member {member.name[:200]!r} leaves the context")
    if member.type not in _KINDS:
        raise InvalidRequest(f"build context member {member.name[:200]!r}: only files, directories and "
                             "symbolic links")
    return name


class BuildContexts:
    def __init__(self, root: Path) -> None:
        self._root = root

    def path(self, digest: str) -> Path:
        path = self._root / f"{check_digest(digest)}.tar"
        if not path.is_file():
            raise NotFound(f"no build context {digest[:12]}…; upload it first (PUT /v1/templates/contexts)")
        return path

    async def put(self, chunks: AsyncIterable[bytes]) -> str:
        """Store a tar streamed in ``chunks``; its sha256. 413 past the size bound."""
        self._root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self._root, suffix=".part")
        sha = hashlib.sha256()
        size = 0
        try:
            with os.fdopen(fd, "wb") as out:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > bounds.MAX_BUILD_CONTEXT_BYTES:
                        raise TooLarge(f"a build context is at most {bounds.MAX_BUILD_CONTEXT_BYTES} bytes")
                    sha.update(chunk)
                    out.write(chunk)
            if size:  # an empty body is an empty context: a build that copies nothing
                self._check(Path(tmp))
            digest = sha.hexdigest()
            os.replace(tmp, self._root / f"{digest}.tar")
            self._prune(keep=digest)
            return digest
        finally:
            Path(tmp).unlink(missing_ok=True)

    @staticmethod
    def _check(path: Path) -> None:
        try:
            with tarfile.open(path, "r:") as tar:
                for count, member in enumerate(tar, 1):
                    if count > bounds.MAX_BUILD_CONTEXT_MEMBERS:
                        raise InvalidRequest(f"a build context holds at most "
                                             f"{bounds.MAX_BUILD_CONTEXT_MEMBERS} entries")
                    _member_name(member)
        except tarfile.TarError as exc:
            raise InvalidRequest(f"the build context is not a tar archive: {exc}") from None

    def _prune(self, keep: str) -> None:
        stored = sorted(self._root.glob("*.tar"), key=lambda p: p.stat().st_mtime)
        for old in stored[:max(0, len(stored) - bounds.MAX_BUILD_CONTEXTS)]:
            if old.stem != keep:
                old.unlink(missing_ok=True)

    def select(self, digest: str, sources: tuple[str, ...], out: Path) -> str:
        """Write to ``out`` a tar of the members at or under ``sources``; the digest of what it holds
        (names, kinds, modes, link targets and contents), which is the COPY step's part of its cache key."""
        wanted = [s.rstrip("/") for s in sources]
        found = dict.fromkeys(wanted, False)
        entries: list[tuple[str, str]] = []
        if self.path(digest).stat().st_size == 0:
            raise InvalidRequest(f"COPY source {wanted[0]!r} is not in the build context (it is empty)")
        with tarfile.open(self.path(digest), "r:") as src, tarfile.open(out, "w:") as dst:
            for member in src:
                name = _member_name(member)
                hits = [w for w in wanted if w == "." or name == w or name.startswith(w + "/")]
                if not hits:
                    continue
                for w in hits:
                    found[w] = True
                content = hashlib.sha256()
                data = src.extractfile(member) if member.isreg() else None
                if data is not None:
                    member.name = name
                    dst.addfile(member, _Hashing(data, content))
                else:
                    member.name = name
                    dst.addfile(member)
                what = f"{member.type!r}:{member.mode:o}:{member.linkname}:{content.hexdigest()}"
                entries.append((name, what))
        missing = [w for w, hit in found.items() if not hit]
        if missing:
            raise InvalidRequest(f"COPY source {missing[0]!r} is not in the build context")
        total = hashlib.sha256()
        for name, what in sorted(entries):
            total.update(f"{name}\0{what}\n".encode())
        return total.hexdigest()


class _Hashing:
    """A file object that hashes what is read through it (tarfile.addfile reads it once)."""

    def __init__(self, inner: object, sha: hashlib._Hash) -> None:
        self._inner = inner
        self._sha = sha

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._inner.read(size)  # type: ignore[attr-defined]
        self._sha.update(data)
        return data
