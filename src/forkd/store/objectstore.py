"""An S3-compatible object store for snapshots, content-addressed.

Configured by URL, ``s3://bucket/prefix`` (``--store`` / ``FORKD_STORE``), with
the usual variables: ``AWS_ENDPOINT_URL`` (MinIO, R2, a local test server; unset
for AWS S3 itself), ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_REGION``. Layout under the prefix::

    blobs/<sha256>            one file's sparse stream (store/sparse.py), zstd-compressed
    snapshots/<tag>.json      the snapshot's manifest (store/manifest.py)

Blobs are named by the sha256 of the file they hold, so a base image or a
parent's disk shared by many snapshots is stored once, and a push uploads only
what the store lacks. A manifest is written after every blob it names, so a
reader never finds one whose blobs are missing.

Every call is blocking (boto3); the controller runs them in worker threads.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import boto3
import botocore.config
import botocore.exceptions
import zstandard

from forkd import bounds
from forkd.errors import ForkdError, InvalidRequest, NotFound
from forkd.store import sparse
from forkd.store.manifest import Manifest

ZSTD_LEVEL = 3
MAX_MANIFEST_BYTES = 16 << 20
# Path-style addressing and checksums only where the API requires them: what
# MinIO, R2, Ceph and local test servers all accept (AWS S3 accepts it too).
_CLIENT_CONFIG = botocore.config.Config(
    s3={"addressing_style": "path"},
    request_checksum_calculation="when_required",
    response_checksum_validation="when_required",
    retries={"max_attempts": 5, "mode": "standard"},
    connect_timeout=10,
    read_timeout=120,
)


class StoreError(ForkdError):
    """The object store could not be reached or refused a request (502: a dependency failed)."""

    status = 502


@dataclass(frozen=True)
class StoreURL:
    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str) -> StoreURL:
        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise InvalidRequest(f"store URL {url!r} must look like s3://bucket/prefix "
                                 "(the endpoint comes from AWS_ENDPOINT_URL)")
        prefix = parsed.path.strip("/")
        if ".." in prefix.split("/"):
            raise InvalidRequest(f"store URL {url!r}: the prefix must not contain '..'")
        return cls(parsed.netloc, f"{prefix}/" if prefix else "")

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")


@dataclass
class TransferStats:
    """What went over the wire, for metrics and for tests that count downloads."""

    blobs_uploaded: int = 0
    bytes_uploaded: int = 0
    blobs_downloaded: int = 0
    bytes_downloaded: int = 0
    manifests_downloaded: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {k: v for k, v in vars(self).items() if not k.startswith("_")}


class _Counting:
    """Wraps a readable and counts the bytes read through it."""

    def __init__(self, src: Any) -> None:
        self._src = src
        self.count = 0

    def read(self, n: int = -1) -> bytes:
        data: bytes = self._src.read(n)
        self.count += len(data)
        return data


class ObjectStore:
    def __init__(self, url: str) -> None:
        self.url = StoreURL.parse(url)
        self.stats = TransferStats()
        try:
            self._s3 = boto3.session.Session().client("s3", config=_CLIENT_CONFIG)
        except botocore.exceptions.BotoCoreError as exc:
            raise StoreError(f"cannot set up the S3 client for {self.url}: {exc}") from None

    def _key(self, *parts: str) -> str:
        return self.url.prefix + "/".join(parts)

    def _fail(self, what: str, exc: Exception) -> ForkdError:
        if isinstance(exc, botocore.exceptions.ClientError):
            code = exc.response.get("Error", {}).get("Code", "")
            if code == "NoSuchBucket":
                return StoreError(f"store {self.url}: bucket {self.url.bucket!r} does not exist; create it "
                                  "or fix --store/FORKD_STORE")
            if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                return StoreError(f"store {self.url} refused {what} ({code}): check AWS_ACCESS_KEY_ID and "
                                  "AWS_SECRET_ACCESS_KEY")
        return StoreError(f"store {self.url}: {what} failed: {exc}")

    # ------------------------------------------------------------ blobs

    def has_blob(self, sha: str) -> bool:
        try:
            self._s3.head_object(Bucket=self.url.bucket, Key=self._key("blobs", sha))
            return True
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise self._fail(f"looking up blob {sha[:12]}", exc) from None
        except botocore.exceptions.BotoCoreError as exc:
            raise self._fail(f"looking up blob {sha[:12]}", exc) from None

    def put_blob(self, sha: str, path: Path) -> int:
        """Upload ``path`` (whose content has digest ``sha``) as a compressed sparse stream."""
        cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True)
        with sparse.StreamReader(path) as reader:
            body = _Counting(cctx.stream_reader(reader))  # type: ignore[arg-type]  # any read() will do
            try:
                self._s3.upload_fileobj(body, self.url.bucket, self._key("blobs", sha),
                                        ExtraArgs={"Metadata": {"size": str(reader.info.size)}})
            except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
                raise self._fail(f"uploading blob {sha[:12]}", exc) from None
        self.stats.add(blobs_uploaded=1, bytes_uploaded=body.count)
        return body.count

    def get_blob(self, sha: str, dest: Path, size: int) -> int:
        """Download blob ``sha`` into the new file ``dest`` (sparse), verifying its digest."""
        try:
            obj = self._s3.get_object(Bucket=self.url.bucket, Key=self._key("blobs", sha))
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                raise NotFound(f"store {self.url} lacks blob {sha[:12]}… (a manifest names it: "
                               "push the snapshot again)") from None
            raise self._fail(f"downloading blob {sha[:12]}", exc) from None
        except botocore.exceptions.BotoCoreError as exc:
            raise self._fail(f"downloading blob {sha[:12]}", exc) from None
        body = _Counting(obj["Body"])
        try:
            with zstandard.ZstdDecompressor().stream_reader(body) as z:  # type: ignore[arg-type]
                sparse.write(z, dest, expect_sha256=sha, max_size=size)
        except (zstandard.ZstdError, sparse.CorruptStream) as exc:
            raise StoreError(f"store {self.url}: blob {sha[:12]}… is corrupt: {exc}") from None
        except (botocore.exceptions.BotoCoreError, OSError) as exc:
            dest.unlink(missing_ok=True)
            raise self._fail(f"downloading blob {sha[:12]}", exc) from None
        finally:
            obj["Body"].close()
        self.stats.add(blobs_downloaded=1, bytes_downloaded=body.count)
        return body.count

    # ------------------------------------------------------------ manifests

    def get_manifest(self, tag: str) -> Manifest | None:
        if not bounds.TAG_RE.match(tag):
            raise InvalidRequest(f"invalid tag {tag!r}")
        try:
            obj = self._s3.get_object(Bucket=self.url.bucket, Key=self._key("snapshots", f"{tag}.json"))
            raw = obj["Body"].read(MAX_MANIFEST_BYTES + 1)
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                return None
            raise self._fail(f"reading the manifest of {tag!r}", exc) from None
        except botocore.exceptions.BotoCoreError as exc:
            raise self._fail(f"reading the manifest of {tag!r}", exc) from None
        if len(raw) > MAX_MANIFEST_BYTES:
            raise StoreError(f"store {self.url}: the manifest of {tag!r} is larger than {MAX_MANIFEST_BYTES}")
        self.stats.add(manifests_downloaded=1)
        try:
            manifest = Manifest.from_json(json.loads(raw))
        except ValueError as exc:
            raise StoreError(f"store {self.url}: the manifest of {tag!r} is not valid: {exc}") from None
        if manifest.tag != tag:
            raise StoreError(f"store {self.url}: snapshots/{tag}.json describes {manifest.tag!r}")
        return manifest

    def put_manifest(self, manifest: Manifest) -> None:
        body = json.dumps(manifest.to_json(), indent=1).encode()
        try:
            self._s3.put_object(Bucket=self.url.bucket, Key=self._key("snapshots", f"{manifest.tag}.json"),
                                Body=body, ContentType="application/json")
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            raise self._fail(f"writing the manifest of {manifest.tag!r}", exc) from None

    def list_tags(self) -> list[str]:
        """Tags with a manifest in the store."""
        tags: list[str] = []
        prefix = self._key("snapshots", "")
        try:
            pages = self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.url.bucket, Prefix=prefix)
            for page in pages:
                for obj in page.get("Contents", []):
                    name = str(obj["Key"])[len(prefix):]
                    if name.endswith(".json") and bounds.TAG_RE.match(name[:-5]):
                        tags.append(name[:-5])
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            raise self._fail("listing snapshots", exc) from None
        return sorted(tags)


__all__ = ["ObjectStore", "StoreError", "StoreURL", "TransferStats"]
