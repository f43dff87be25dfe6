"""E2B's template build API on forkd's Dockerfile builds (``rt.builds``, docs/TEMPLATES.md).

The SDK's ``Template.build`` makes four kinds of call; each maps onto forkd:

* ``POST /v3/templates {name, cpuCount, memoryMB}``: a build is registered (``waiting``). The
  template's id is its name, which is the forkd snapshot tag the build makes, so
  ``Sandbox.create(name)`` forks from it.
* ``GET /templates/{id}/files/{hash}`` and ``PUT`` there: each ``copy`` step's files, a tar
  (gzipped or not) the SDK made of them, stored once per hash as a forkd build context
  (``present`` when it is already here). The upload URL is this daemon's, signed as E2B's
  storage URLs are: SDKs before 2.46 send the upload with no API key, so the ``PUT`` is let
  through on the URL's signature (an HMAC of the hash and the expiry, under a key this daemon
  made at start, good for ``UPLOAD_URL_SECS``). Newer SDKs also send the answer's ``headers``,
  the caller's own API key.
* ``POST /v2/templates/{id}/builds/{buildID} {fromImage|fromTemplate, steps, force, startCmd,
  readyCmd}``: the steps become a Dockerfile (exec-form ``RUN ["/bin/bash", "-c", cmd]``,
  ``COPY``, ``ENV``, ``WORKDIR``, ``USER``) on a context made of the steps' uploads, built in
  the background with forkd's layer cache (``force``: none of it, the base layer apart). The
  build starts as E2B's templates do: ``USER user`` and ``WORKDIR /home/user``.
* ``GET /templates/{id}/builds/{buildID}/status?logsOffset``: the build's state and its log
  entries from that offset (at most 100 a call), ``reason`` (message, failed step) on an error.

The base is forkd's ``default`` image for E2B's base image (``e2bdev/base``), any forkd image
by name, (``fromTemplate``) a snapshot, or any other image reference (``from_image``,
``from_dockerfile``'s ``FROM``, ``from_registry`` with ``fromImageRegistry`` credentials),
pulled and converted by the build (controller/images.py, the daemon's registry mirrors).
``GET /templates/aliases/{alias}`` (``Template.exists``) says whether a snapshot of that tag
exists. Builds are kept in memory (the last 64), so a daemon restart forgets their status.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import io
import json
import re
import secrets
import shutil
import tarfile
import time
import urllib.parse
import uuid
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request, Response
from starlette.types import Scope

from forkd import bounds
from forkd.api.e2b import template_names, template_steps
from forkd.api.e2b.deps import RuntimeDep, TemplatesDep
from forkd.api.e2b.template_steps import TemplateError
from forkd.errors import ForkdError, InvalidRequest, NotFound, TooLarge

if TYPE_CHECKING:
    from forkd.controller.runtime import Runtime

MAX_BUILDS = 64
MAX_LOG_ENTRIES = 10_000
MAX_MESSAGE = 4096
STATUS_PAGE = 100
HASH_RE = re.compile(r"^[0-9a-f]{64}$")
_UPLOAD_PATH = re.compile(r"^/templates/[^/]+/files/[0-9a-f]{64}/?$")
_EXPIRES_RE = re.compile(r"[0-9]{1,12}", re.ASCII)  # unix seconds, ASCII digits only
UPLOAD_URL_SECS = 3600  # how long a files link's signed upload URL is good for


def streams_body(scope: Scope) -> bool:
    """A file upload (a tar of a copy step's files), which the JSON body limit must not buffer."""
    return scope.get("method") == "PUT" and bool(_UPLOAD_PATH.match(str(scope.get("path", ""))))


@dataclass
class _Build:
    template_id: str
    build_id: str
    vcpus: int | None
    mem_mib: int | None
    status: str = "waiting"  # waiting | building | ready | error
    entries: list[dict[str, Any]] = field(default_factory=list)
    reason: dict[str, Any] | None = None
    task: asyncio.Task[None] | None = None
    names: list[str] = field(default_factory=list)  # more names its snapshot gets once built (tags)

    def log(self, message: str, level: str = "info", step: str | None = None) -> None:
        if len(self.entries) >= MAX_LOG_ENTRIES:
            return
        entry: dict[str, Any] = {"timestamp": datetime.now(UTC).isoformat(), "level": level,
                                 "message": message[:MAX_MESSAGE]}
        if step is not None:
            entry["step"] = step
        self.entries.append(entry)


class E2BTemplates:
    """The builds E2B's SDK asked for and the copy steps' uploads, by hash (in memory)."""

    def __init__(self, rt: Callable[[], Runtime], uploads: Path) -> None:
        self._rt = rt
        self._uploads = uploads
        self._builds: OrderedDict[str, _Build] = OrderedDict()  # build id -> build
        self._files: dict[str, Path] = {}  # E2B's files hash -> the upload, a plain tar
        # In the data dir, not /tmp: a daemon killed mid-life leaves its uploads where the next
        # daemon on that dir clears them (at its first upload); made only when one comes.
        self._dir: Path | None = None
        # Signs upload URLs; a restart makes a new one, as it forgets the uploads too.
        self._url_key = secrets.token_bytes(32)

    # --------------------------------------------------------------- requests

    def request(self, body: dict[str, Any]) -> dict[str, Any]:
        name = body.get("name") or body.get("alias")
        if not isinstance(name, str):
            raise TemplateError(400, "name is required")
        extra = body.get("tags") or []
        if not isinstance(extra, list) or len(extra) > template_names.MAX_TAGS \
                or not all(isinstance(t, str) for t in extra):
            raise TemplateError(400, f"tags must be a list of at most {template_names.MAX_TAGS} strings")
        try:
            tag = template_names.snapshot_tag(name)
            # More tags of this build: more names of its snapshot, given once it is built.
            names = [template_names.tag_name(name.partition(":")[0], t) for t in extra]
        except InvalidRequest as exc:
            raise TemplateError(400, str(exc)) from None
        vcpus, mem = body.get("cpuCount"), body.get("memoryMB")
        for value, rule in ((vcpus, bounds.VCPUS), (mem, bounds.MEM_MIB)):
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise TemplateError(400, f"{rule.name} must be an integer")
                rule.check(value)
        build = _Build(tag, str(uuid.uuid4()), vcpus, mem, names=[n for n, _ in names if n != tag])
        self._builds[build.build_id] = build
        while len(self._builds) > MAX_BUILDS:
            oldest = next(iter(self._builds))
            if self._builds[oldest].status in ("waiting", "building"):
                break  # never forget a build that runs
            del self._builds[oldest]
        # The template's id is its snapshot tag, which the SDK puts in the build's paths.
        return {"templateID": tag, "buildID": build.build_id, "public": False, "names": [name],
                "tags": [template_names.tag_of(name), *(t for _, t in names)],
                "aliases": [name.partition(":")[0]]}

    def file_link(self, request: Request, template_id: str, files_hash: str) -> dict[str, Any]:
        if not HASH_RE.match(files_hash):
            raise TemplateError(400, "a files hash is a lowercase hex SHA-256")
        expires = int(time.time()) + UPLOAD_URL_SECS
        signature = self._signature(files_hash, expires)
        query = urllib.parse.urlencode({"expires": expires, "signature": signature})
        url = f"{str(request.base_url).rstrip('/')}/templates/{template_id}/files/{files_hash}?{query}"
        key = request.headers.get("x-api-key") or request.headers.get("authorization", "").partition(" ")[2]
        return {"present": files_hash in self._files, "url": url, "headers": {"X-API-KEY": key}}

    def _signature(self, files_hash: str, expires: int) -> str:
        return hmac.new(self._url_key, f"{files_hash}:{expires}".encode(), hashlib.sha256).hexdigest()

    def signed_upload(self, scope: Scope) -> bool:
        """Whether ``scope`` is an upload whose URL this daemon signed and that has not expired."""
        path = str(scope.get("path", ""))
        if scope.get("method") != "PUT" or not _UPLOAD_PATH.match(path):
            return False
        raw: bytes = scope.get("query_string", b"")
        if len(raw) > 256:  # an expiry and a hex HMAC are far shorter
            return False
        try:
            query = urllib.parse.parse_qs(raw.decode("latin-1"), max_num_fields=4)
        except ValueError:  # more fields than this daemon's URL has: not one of its URLs
            return False
        expires, signature = query.get("expires", [""]), query.get("signature", [""])
        if len(expires) != 1 or len(signature) != 1 or not _EXPIRES_RE.fullmatch(expires[0]):
            return False  # str.isdigit() is true for "²", on which int() raises
        if int(expires[0]) < time.time():
            return False
        files_hash = path.rstrip("/").rsplit("/", 1)[1]
        # As bytes: compare_digest raises on a str with non-ASCII characters.
        wanted = self._signature(files_hash, int(expires[0]))
        return hmac.compare_digest(signature[0].encode(), wanted.encode())

    async def upload(self, files_hash: str, chunks: AsyncIterator[bytes]) -> None:
        """Store an upload as a plain tar (gunzipped as it arrives, bounded after decompression)."""
        if not HASH_RE.match(files_hash):
            raise TemplateError(400, "a files hash is a lowercase hex SHA-256")
        if self._dir is None:
            shutil.rmtree(self._uploads, ignore_errors=True)  # an earlier daemon's: its builds are gone
            self._uploads.mkdir(mode=0o700, parents=True)
            self._dir = self._uploads
        path = self._dir / f"{files_hash}.tar"
        part = path.with_suffix(".part")
        inflate: Any = None
        size = 0
        try:
            with part.open("wb") as out:
                async for chunk in chunks:
                    if inflate is None:
                        inflate = zlib.decompressobj(47) if chunk[:2] == b"\x1f\x8b" else False
                    data = inflate.decompress(chunk, bounds.MAX_BUILD_CONTEXT_BYTES + 1) if inflate else chunk
                    size += len(data)
                    if size > bounds.MAX_BUILD_CONTEXT_BYTES or (inflate and inflate.unconsumed_tail):
                        raise TooLarge(f"an upload is at most {bounds.MAX_BUILD_CONTEXT_BYTES} bytes "
                                       "unpacked")
                    out.write(data)
            part.replace(path)
            self._files[files_hash] = path
        finally:
            part.unlink(missing_ok=True)

    # ----------------------------------------------------------------- builds

    def _build(self, template_id: str, build_id: str) -> _Build:
        build = self._builds.get(build_id)
        if build is None or build.template_id != template_id:
            raise TemplateError(404, f"build {build_id[:64]} of template {template_id[:64]} was not found")
        return build

    async def start(self, template_id: str, build_id: str, body: dict[str, Any]) -> None:
        build = self._build(template_id, build_id)
        if build.status != "waiting":
            raise TemplateError(409, f"build {build_id} was already started")
        plan = template_steps.plan(body, self._files, self._has_snapshot)
        context = await self._context(plan.uploads) if plan.uploads else None
        req = self._request(build, body, plan.dockerfile, context)
        build.status = "building"
        build.task = asyncio.create_task(self._run(build, req, plan.step_names))

    def _has_snapshot(self, tag: str) -> bool:
        try:
            self._rt().get_snapshot(tag)
        except NotFound:
            return False
        return True

    def _request(self, build: _Build, body: dict[str, Any], dockerfile: str, context: str | None) -> Any:
        from forkd.controller.runtime import BuildRequest  # the controller pulls in the VMM stack

        start, ready = body.get("startCmd"), body.get("readyCmd")
        for value, name in ((start, "startCmd"), (ready, "readyCmd")):
            if value is not None and not isinstance(value, str):
                raise TemplateError(400, f"{name} must be a string")
        return BuildRequest(tag=build.template_id, dockerfile=dockerfile, context=context,
                            mem_mib=build.mem_mib, vcpus=build.vcpus, replace=True,
                            cache_from=0 if body.get("force") is True else None,
                            start_cmd=start or None, ready_cmd=ready or None,
                            registry_credentials=template_steps.registry_credentials(body))

    async def _context(self, uploads: list[str]) -> str:
        """One build context holding every upload (they are all relative to the same directory)."""
        def merged() -> bytes:
            seen: set[str] = set()
            out = io.BytesIO()
            with tarfile.open(fileobj=out, mode="w:") as dst:
                for files_hash in dict.fromkeys(uploads):
                    with tarfile.open(self._files[files_hash]) as src:
                        for member in src:
                            if member.name in seen:
                                continue
                            seen.add(member.name)
                            dst.addfile(member, src.extractfile(member) if member.isreg() else None)
            return out.getvalue()

        try:
            data = await asyncio.to_thread(merged)
        except tarfile.TarError as exc:
            raise TemplateError(400, f"an upload is not a tar archive: {exc}") from None

        async def one() -> AsyncIterator[bytes]:
            yield data

        info = await self._rt().builds.put_context(one())
        return str(info["context"])

    async def _run(self, build: _Build, req: Any, step_names: dict[int, str]) -> None:
        current = {"step": "base"}

        def emit(event: dict[str, Any]) -> None:
            kind = event.get("type")
            index = int(event.get("index", 0))
            # The SDK's step names: "base", an instruction's number, "finalize" (the start command).
            if kind in ("step", "log"):
                current["step"] = "base" if index == 0 else step_names.get(index, "finalize")
            if kind == "step":
                cached = " (cached)" if event.get("cached") else ""
                build.log(f"[{index}/{event.get('of')}] {event.get('text')}{cached}", step=current["step"])
            elif kind == "log":
                for line in str(event.get("data", "")).splitlines():
                    build.log(line, step=current["step"])
            elif kind == "done":
                build.log(f"Built {build.template_id}: {event.get('steps_run')} step(s) run, "
                          f"{event.get('cache_hits')} from the cache", step="finalize")

        started = time.monotonic()
        try:
            await self._rt().builds.build(req, emit)
        except ForkdError as exc:
            self._failed(build, str(exc), current["step"])
        except Exception as exc:  # a build's failure must reach its status, whatever it is
            self._failed(build, f"{type(exc).__name__}: {exc}", current["step"])
        else:
            try:
                for name in build.names:
                    self._rt().name_snapshot(name, build.template_id)
            except ForkdError as exc:
                self._failed(build, f"built, but its tags were not given: {exc}", "finalize")
                return
            build.status = "ready"
            build.log(f"Template ready in {time.monotonic() - started:.1f} s", step="finalize")

    @staticmethod
    def _failed(build: _Build, message: str, step: str) -> None:
        build.log(message, level="error", step=step)
        build.status = "error"
        build.reason = {"message": message[:MAX_MESSAGE], "step": step}

    def status(self, template_id: str, build_id: str, offset: int, limit: int) -> dict[str, Any]:
        build = self._build(template_id, build_id)
        body: dict[str, Any] = {"templateID": template_id, "buildID": build_id, "status": build.status,
                                "logs": [], "logEntries": build.entries[offset:offset + limit]}
        if build.reason is not None:
            body["reason"] = build.reason
        return body


async def json_body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        raise TemplateError(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise TemplateError(400, "the body must be a JSON object")
    return body


router = APIRouter()


@router.post("/v3/templates", status_code=202)
async def request_build(request: Request, templates: TemplatesDep) -> dict[str, Any]:
    return templates.request(await json_body(request))


@router.get("/templates/{template_id}/files/{files_hash}", status_code=201)
async def file_link(template_id: str, files_hash: str, request: Request,
                    templates: TemplatesDep) -> dict[str, Any]:
    return templates.file_link(request, template_id, files_hash)


@router.put("/templates/{template_id}/files/{files_hash}")
async def upload(template_id: str, files_hash: str, request: Request, templates: TemplatesDep) -> Response:
    await templates.upload(files_hash, request.stream())
    return Response(status_code=200)


@router.post("/v2/templates/{template_id}/builds/{build_id}", status_code=202)
async def start(template_id: str, build_id: str, request: Request, templates: TemplatesDep) -> Response:
    try:
        await templates.start(template_id, build_id, await json_body(request))
    except InvalidRequest as exc:
        raise TemplateError(400, str(exc)) from None
    return Response(status_code=202)


@router.get("/templates/{template_id}/builds/{build_id}/status")
async def status(template_id: str, build_id: str, templates: TemplatesDep,
                 logsOffset: int = 0,  # E2B's parameter name
                 limit: int = STATUS_PAGE) -> dict[str, Any]:
    return templates.status(template_id, build_id, max(0, logsOffset), max(1, min(limit, STATUS_PAGE)))


@router.get("/templates/aliases/{alias}")
async def alias(alias: str, rt: RuntimeDep) -> dict[str, Any]:
    try:
        record = rt.get_snapshot(rt.resolve_snapshot(template_names.snapshot_tag(alias)))
    except (NotFound, InvalidRequest):
        raise TemplateError(404, f"template {alias[:80]!r} was not found") from None
    return {"templateID": record.info()["tag"], "public": False}
