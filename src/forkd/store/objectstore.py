"""An S3-compatible object store for snapshots, content-addressed.

Configured by URL, ``s3://bucket/prefix`` (``--store`` / ``FORKD_STORE``), with
the usual variables: ``AWS_ENDPOINT_URL`` (MinIO, R2, a local test server; unset
for AWS S3 itself), ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_REGION``. Layout under the prefix::

    chunked/<digest>          one file's chunk frames (store/chunked.py)
    chunked/<digest>.index    their index, written after them
    snapshots/<tag>.json      the snapshot's manifest (store/manifest.py)

Blobs are named by the digest of the file they hold, so a base image or a
parent's disk shared by many snapshots is stored once, and a push uploads only
what the store lacks. A blob's index is written after its frames, and a
manifest after every blob it names, so a reader never finds one whose blobs
are missing. (Format 1 kept ``blobs/<sha256>``, one zstd stream per file: the
two never share a key.)

Large blobs go up as multipart uploads, parts sent by a few threads while the
next chunks are compressed; they come down as parallel range GETs of about
8 MiB, each chunk decompressed, checked against its digest and written in
place as it arrives (store/chunked.py's ``decode``).

Every call is blocking (boto3); the controller runs them in worker threads.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import boto3
import botocore.config
import botocore.exceptions
import urllib3.exceptions

from forkd import bounds, jsondepth
from forkd.errors import ForkdError, InvalidRequest, NotFound
from forkd.store import chunked
from forkd.store.manifest import BadManifest, Manifest

MAX_MANIFEST_BYTES = 16 << 20
# A store that answers one byte at a time never trips a per-read timeout, so every body read has an
# overall deadline: this long for a manifest or an index, plus a second per MIN_RATE bytes for a range.
CALL_DEADLINE_SECS = 60.0
MIN_RATE = 256 << 10
PART_BYTES = 8 << 20  # multipart part size (S3's minimum is 5 MiB, but for the last part)
# A blob comes down as up to TRANSFER_THREADS concurrent range GETs of 8 to 64 MiB: enough
# connections to fill a link, few enough requests that per-request costs stay small (moto's
# server, which the tests and benchmarks use, reads the whole object for every range).
MIN_RANGE_BYTES, MAX_RANGE_BYTES = 8 << 20, 64 << 20
TRANSFER_THREADS = 4  # concurrent part uploads or range GETs of one blob
# Path-style addressing and checksums only where the API requires them: what
# MinIO, R2, Ceph and local test servers all accept (AWS S3 accepts it too).
_CLIENT_CONFIG = botocore.config.Config(
    s3={"addressing_style": "path"},
    request_checksum_calculation="when_required",
    response_checksum_validation="when_required",
    retries={"max_attempts": 5, "mode": "standard"},
    connect_timeout=10,
    read_timeout=30,  # per socket read; a whole answer has a deadline of its own (_read_body)
    max_pool_connections=4 * TRANSFER_THREADS,  # several blobs' transfers share the client
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
    parts_uploaded: int = 0
    blobs_downloaded: int = 0
    bytes_downloaded: int = 0
    ranges_downloaded: int = 0
    manifests_downloaded: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {k: v for k, v in vars(self).items() if not k.startswith("_")}


class ObjectStore:
    def __init__(self, url: str) -> None:
        self.url = StoreURL.parse(url)
        self.stats = TransferStats()
        self.deadline_secs = CALL_DEADLINE_SECS
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

    def _read_body(self, body: Any, limit: int, what: str, per_byte: bool = False) -> bytes:
        """At most ``limit + 1`` bytes of a response body (the caller refuses more), given up with a
        StoreError after ``deadline_secs`` (plus a second per MIN_RATE bytes of ``limit`` if
        ``per_byte``), however the store paces them."""
        allowed = self.deadline_secs + (limit / MIN_RATE if per_byte else 0)
        deadline = time.monotonic() + allowed
        # urllib3's read1 returns what one socket read brought; StreamingBody.read(n) would wait for
        # all n bytes, a byte every 20 s included.
        raw = getattr(body, "_raw_stream", body)
        read = getattr(raw, "read1", raw.read)
        buf = bytearray()
        ended = False
        try:
            while len(buf) <= limit:
                if time.monotonic() > deadline:
                    raise StoreError(f"store {self.url}: {what} did not arrive within {allowed:.0f} s "
                                     "(the store answers too slowly)")
                data = read(min(1 << 20, limit + 1 - len(buf)))
                if not data:
                    ended = True
                    break
                buf += data
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise StoreError(f"store {self.url}: reading {what} failed: {exc}") from None
        finally:
            if not ended:  # a whole body hands its connection back to the pool by itself
                body.close()
        return bytes(buf)

    def has_blob(self, sha: str) -> bool:
        """Whether the store holds the blob (its index, which goes up after its frames)."""
        try:
            self._s3.head_object(Bucket=self.url.bucket, Key=self._key("chunked", f"{sha}.index"))
            return True
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise self._fail(f"looking up blob {sha[:12]}", exc) from None
        except botocore.exceptions.BotoCoreError as exc:
            raise self._fail(f"looking up blob {sha[:12]}", exc) from None

    def put_blob(self, sha: str, path: Path) -> int:
        """Upload ``path`` (whose content has digest ``sha``) as chunk frames and their index;
        returns the bytes sent."""
        key = self._key("chunked", sha)
        upload = _Multipart(self._s3, self.url.bucket, key)
        try:
            index = chunked.encode(path, upload.write, expect=sha)
            upload.finish()
            body = index.encode_json()
            self._s3.put_object(Bucket=self.url.bucket, Key=f"{key}.index", Body=body,
                                ContentType="application/json")
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            upload.abort()
            raise self._fail(f"uploading blob {sha[:12]}", exc) from None
        except BaseException:
            upload.abort()
            raise
        sent = index.stored_bytes + len(body)
        self.stats.add(blobs_uploaded=1, bytes_uploaded=sent, parts_uploaded=upload.parts_sent)
        return sent

    def open_blob(self, sha: str, size: int) -> tuple[chunked.ChunkIndex, chunked.ReadRange]:
        """Blob ``sha``'s index (checked against the bounds, not yet against its digest: the
        caller does that) and a reader of its frames by range GET, each one counted."""
        key = self._key("chunked", sha)
        what = f"downloading blob {sha[:12]}"
        try:
            obj = self._s3.get_object(Bucket=self.url.bucket, Key=f"{key}.index")
            raw = self._read_body(obj["Body"], chunked.MAX_INDEX_BYTES, f"the index of blob {sha[:12]}")
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                raise NotFound(f"store {self.url} lacks blob {sha[:12]}… (a manifest names it: "
                               "push the snapshot again)") from None
            raise self._fail(what, exc) from None
        except botocore.exceptions.BotoCoreError as exc:
            raise self._fail(what, exc) from None
        self.stats.add(bytes_downloaded=len(raw))
        try:
            index = chunked.ChunkIndex.parse(raw, size)
        except chunked.CorruptBlob as exc:
            raise StoreError(f"store {self.url}: blob {sha[:12]}… is corrupt: {exc}") from None

        def read(offset: int, length: int) -> bytes:
            try:
                part = self._s3.get_object(Bucket=self.url.bucket, Key=key,
                                           Range=f"bytes={offset}-{offset + length - 1}")
                data = self._read_body(part["Body"], length, f"blob {sha[:12]} (bytes {offset}+{length})",
                                       per_byte=True)
            except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
                raise self._fail(what, exc) from None
            self.stats.add(ranges_downloaded=1, bytes_downloaded=len(data))
            return data

        return index, read

    def get_blob(self, sha: str, dest: Path, size: int) -> int:
        """Download blob ``sha`` into the new file ``dest`` (sparse), every chunk verified;
        returns the bytes fetched."""
        before = self.stats.snapshot()["bytes_downloaded"]
        index, read = self.open_blob(sha, size)
        try:
            span = min(MAX_RANGE_BYTES, max(MIN_RANGE_BYTES, -(-index.stored_bytes // TRANSFER_THREADS)))
            chunked.decode(index, sha, read, dest, read_bytes=span, threads=TRANSFER_THREADS)
        except chunked.CorruptBlob as exc:
            raise StoreError(f"store {self.url}: blob {sha[:12]}… is corrupt: {exc}") from None
        except OSError as exc:
            raise self._fail(f"downloading blob {sha[:12]}", exc) from None
        self.stats.add(blobs_downloaded=1)
        # (Shared with concurrent transfers: exact when this blob is the only one moving.)
        return self.stats.snapshot()["bytes_downloaded"] - before

    # ------------------------------------------------------------ manifests

    def get_manifest(self, tag: str) -> Manifest | None:
        if not bounds.TAG_RE.match(tag):
            raise InvalidRequest(f"invalid tag {tag!r}")
        try:
            obj = self._s3.get_object(Bucket=self.url.bucket, Key=self._key("snapshots", f"{tag}.json"))
            raw = self._read_body(obj["Body"], MAX_MANIFEST_BYTES, f"the manifest of {tag!r}")
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
            manifest = Manifest.from_json(jsondepth.loads(raw, bounds.MAX_JSON_DEPTH))
        except (ValueError, BadManifest) as exc:
            # The store answered with something no forkd wrote: a dependency failed (502), not the client.
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


class _Multipart:
    """A blob's frames going up as they are made: one PUT if they stay under a part, else a
    multipart upload whose parts are sent by ``TRANSFER_THREADS`` threads (at most twice that
    many parts held in memory) while the caller compresses the next chunks."""

    def __init__(self, s3: Any, bucket: str, key: str) -> None:
        self._s3, self._bucket, self._key = s3, bucket, key
        self._buf = bytearray()
        self._upload_id: str | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._parts: list[Future[dict[str, Any]]] = []
        self.parts_sent = 0

    def write(self, frame: bytes) -> None:
        self._buf += frame
        if len(self._buf) >= PART_BYTES:
            self._send(bytes(self._buf))
            self._buf.clear()

    def _send(self, body: bytes) -> None:
        if self._upload_id is None:
            made = self._s3.create_multipart_upload(Bucket=self._bucket, Key=self._key)
            self._upload_id = str(made["UploadId"])
            self._pool = ThreadPoolExecutor(TRANSFER_THREADS)
        assert self._pool is not None
        in_flight = [f for f in self._parts if not f.done()]
        if len(in_flight) >= 2 * TRANSFER_THREADS:  # back-pressure: hold few parts in memory
            in_flight[0].result()
        number = len(self._parts) + 1
        self._parts.append(self._pool.submit(self._part, number, body))

    def _part(self, number: int, body: bytes) -> dict[str, Any]:
        done = self._s3.upload_part(Bucket=self._bucket, Key=self._key, UploadId=self._upload_id,
                                    PartNumber=number, Body=body)
        return {"PartNumber": number, "ETag": done["ETag"]}

    def finish(self) -> None:
        if self._upload_id is None:  # small: one PUT
            self._s3.put_object(Bucket=self._bucket, Key=self._key, Body=bytes(self._buf))
            return
        if self._buf:
            self._send(bytes(self._buf))
            self._buf.clear()
        parts = [f.result() for f in self._parts]
        self._s3.complete_multipart_upload(Bucket=self._bucket, Key=self._key, UploadId=self._upload_id,
                                           MultipartUpload={"Parts": parts})
        self.parts_sent = len(parts)
        self._close()

    def abort(self) -> None:
        self._close()
        if self._upload_id is not None:
            # If even the abort fails, the bucket's lifecycle rules collect the parts; the
            # upload's own failure is what gets reported.
            with contextlib.suppress(botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError):
                self._s3.abort_multipart_upload(Bucket=self._bucket, Key=self._key, UploadId=self._upload_id)
            self._upload_id = None

    def _close(self) -> None:
        if self._pool is not None:
            for f in self._parts:
                f.cancel()
            self._pool.shutdown(wait=True)
            self._pool = None


__all__ = ["ObjectStore", "StoreError", "StoreURL", "TransferStats"]
