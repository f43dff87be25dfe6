"""E2B's volume content API (``/volumecontent/{volumeID}/...``) on a ``hostdir`` volume's files:
the calls ``Volume.get_info/list/make_dir/update_metadata/remove/read_file/write_file`` make.

Its own app, beside the control plane's (``dispatch.py`` hands it every ``/volumecontent/`` path):
its credential is not the API key but the volume's token (``Authorization: Bearer``, from
``VolumeAndToken``), which opens that one volume; its errors are the content API's
``{"code": "<status>", "message"}`` (a string code, as its spec has it).

* ``GET  .../path?path=``: the entry (``VolumeEntryStat``); ``404`` for none.
* ``PATCH .../path?path= {uid?, gid?, mode?}``: chown/chmod, the entry after.
* ``DELETE .../path?path=``: the file, or the directory with everything in it; ``204``.
* ``GET  .../dir?path=&depth=``: the entries under a directory, ``depth`` levels down (1 to 16).
* ``POST .../dir?path=&uid&gid&mode&force``: ``201`` the new directory; ``force`` makes its
  parents, and takes one that exists; without it an existing path is ``409``.
* ``GET  .../file?path=``: the bytes, streamed as read.
* ``PUT  .../file?path=&uid&gid&mode&force``: the body, streamed to the file (at most the daemon's
  ``--max-file-bytes``); ``201`` the entry. An existing file is ``409`` unless ``force``.

Paths are the SDK's: absolute in the volume (``/dir/a.txt``; ``/`` is its root), no ``.`` or
``..``. Owners default to ``user`` (uid and gid 1000, the sandboxes' user), as the files a
sandbox writes are; the SDK's ``uid``/``gid`` set others. Every query is bounded (its length,
its fields) before it is parsed; bodies are bounded by ``dispatch``'s limit, uploads here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import stat
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Annotated, Any, Protocol

from e2b.volume.client.models import VolumeEntryStat, VolumeEntryStatType
from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from forkd.api.e2b import handlers, inputs
from forkd.api.e2b.deps import LiveRuntime, RuntimeDep, TokensDep
from forkd.api.e2b.errors import E2BError
from forkd.api.e2b.tokens import AccessTokens
from forkd.api.e2b.volumes import served
from forkd.api.file_routes import streamed_body
from forkd.errors import Conflict, InvalidRequest, NotFound, TooLarge
from forkd.guest.volume_messages import MAX_PATH, VolAttr, VolDirEntry, check_path

if TYPE_CHECKING:
    from forkd.controller.runtime import Runtime

RuntimeSource = Callable[[], "Runtime | None"]

USER_ID = 1000  # the sandboxes' user (and group): who owns what the SDK writes unless it says
MAX_ID = (1 << 32) - 2  # uid_t's largest; -1 means "unchanged" to chown
MAX_QUERY_BYTES = 3 * MAX_PATH + 256  # a path of MAX_PATH bytes, every one %-escaped, and four numbers
MAX_QUERY_FIELDS = 8
MAX_DEPTH = 16
MAX_LISTED = 10_000  # entries one listing answers (each is stat'ed); a bigger one is refused
UPLOAD_IDLE_SECS = 300.0  # an upload whose next bytes take longer is given up


class VolumeFiles(Protocol):
    """What ``rt.volumes.files(name)`` gives (``forkd.vmm.volume_files.HostFiles``): a volume's files,
    confined to its directory and its quota; paths volume-relative ('' the root). Each call blocks
    (host file I/O): the routes make them in a worker thread."""

    def stat(self, path: str) -> VolAttr: ...

    def listdir(self, path: str) -> list[VolDirEntry]: ...

    def mkdir(self, path: str, *, parents: bool = ..., uid: int = ..., gid: int = ...,
              mode: int = ...) -> object: ...

    def remove(self, path: str, *, recursive: bool = ...) -> object: ...

    def write_file(self, path: str, chunks: Iterable[bytes], *, uid: int = ..., gid: int = ...,
                   mode: int = ...) -> VolAttr: ...

    def read_file(self, path: str) -> Iterator[bytes]: ...

    def chmod_chown(self, path: str, mode: int | None = ..., uid: int | None = ...,
                    gid: int | None = ...) -> object: ...


def content_error(status: int, message: str) -> dict[str, object]:
    """The content API's error body (its spec's ``Error``: the code a string)."""
    return {"code": str(status), "message": message}


def _answer(status: int, message: str) -> JSONResponse:
    return JSONResponse(content_error(status, message), status_code=status)


# ------------------------------------------------------------------ credentials


async def opened(volume_id: str, request: Request, rt: RuntimeDep, tokens: TokensDep) -> VolumeFiles:
    """The files of ``volume_id``, for a bearer of its token; 401 otherwise, alike for a wrong
    token and for no such volume (the token is what proves a caller may know it exists)."""
    scheme, _, presented = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        raise E2BError(401, "missing volume token: send Authorization: Bearer <the token of "
                       "Volume.create or Volume.connect>")
    refused = E2BError(401, f"invalid volume token for volume {str(volume_id)[:80]} (or no such volume)")
    try:
        record = served(rt, volume_id)
    except E2BError as exc:
        if exc.status == 404:  # the token proves one may know it exists: no 404 without it
            raise refused from None
        raise
    if not tokens.accepts_volume(record.name, record.created_at_unix, presented.strip()):
        raise refused
    files: VolumeFiles = rt.volumes.files(record.name)
    return files


FilesDep = Annotated[VolumeFiles, Depends(opened)]

# ------------------------------------------------------------------ the query


def _query(request: Request, allowed: tuple[str, ...]) -> dict[str, str]:
    """The query's fields, each at most once and among ``allowed``; its size bounded first."""
    raw: bytes = request.scope.get("query_string", b"")
    if len(raw) > MAX_QUERY_BYTES:
        raise E2BError(400, f"the query is longer than {MAX_QUERY_BYTES} bytes")
    try:
        pairs = urllib.parse.parse_qsl(raw.decode("ascii"), keep_blank_values=True, errors="strict",
                                       max_num_fields=MAX_QUERY_FIELDS)
    except (UnicodeError, ValueError):
        raise E2BError(400, f"the query must be URL-encoded UTF-8, at most {MAX_QUERY_FIELDS} "
                       "fields") from None
    fields: dict[str, str] = {}
    for name, value in pairs:
        if name not in allowed:
            raise E2BError(400, f"unknown query parameter {name[:64]!r} (this call takes "
                           f"{', '.join(allowed)})")
        if name in fields:
            raise E2BError(400, f"query parameter {name!r} is given twice")
        fields[name] = value
    return fields


def _path(fields: dict[str, str]) -> str:
    """The SDK's path (``/a/b``; ``/`` the root) as the volume-relative one ('' the root)."""
    given = fields.get("path")
    if not given:
        raise E2BError(400, "path (a path in the volume, e.g. /data/a.txt) is required")
    parts = [p for p in given.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise E2BError(400, f"path {given[:200]!r} must not have '.' or '..' segments")
    try:
        return check_path("/".join(parts))
    except ValueError as exc:
        raise E2BError(400, str(exc)) from None


def _number(fields: dict[str, str], name: str, high: int, default: int) -> int:
    raw = fields.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 10 or int(raw) > high:
        raise E2BError(400, f"{name} must be an integer between 0 and {high}")
    return int(raw)


def _flag(fields: dict[str, str], name: str) -> bool:
    raw = fields.get(name, "false").lower()
    if raw not in ("true", "false"):
        raise E2BError(400, f"{name} must be true or false")
    return raw == "true"


# ------------------------------------------------------------------ answers

_KINDS = {stat.S_IFDIR: VolumeEntryStatType.DIRECTORY, stat.S_IFREG: VolumeEntryStatType.FILE,
          stat.S_IFLNK: VolumeEntryStatType.SYMLINK}


def _shown(path: str) -> str:
    """A volume-relative path as the SDK shows it: absolute in the volume (any name a guest
    made that is not UTF-8 shows its bytes replaced)."""
    return "/" + path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _when(ns: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ns / 1e9, dt.UTC)


def entry(path: str, attr: VolAttr) -> dict[str, Any]:
    """``VolumeEntryStat`` of ``path``: its mode without the type bits, as the SDK reads it."""
    shown = _shown(path)
    body: dict[str, Any] = VolumeEntryStat(
        name=shown.rsplit("/", 1)[1] or "/", type_=_KINDS.get(stat.S_IFMT(attr["mode"]),
                                                              VolumeEntryStatType.UNKNOWN),
        path=shown, size=attr["size"], mode=stat.S_IMODE(attr["mode"]), uid=attr["uid"], gid=attr["gid"],
        atime=_when(attr["atime_ns"]), mtime=_when(attr["mtime_ns"]), ctime=_when(attr["ctime_ns"]),
    ).to_dict()
    return body


def _exists(files: VolumeFiles, path: str) -> VolAttr | None:
    try:
        return files.stat(path)
    except NotFound:
        return None


# ------------------------------------------------------------------ the routes


BASE = "/volumecontent/{volume_id}"
router = APIRouter()



@router.get(BASE + "/path")
async def get_path(request: Request, files: FilesDep) -> dict[str, Any]:
    path = _path(_query(request, ("path",)))
    return entry(path, await asyncio.to_thread(files.stat, path))

@router.patch(BASE + "/path")
async def patch_path(request: Request, files: FilesDep) -> dict[str, Any]:
    path = _path(_query(request, ("path",)))
    body = await inputs.body(request)
    unknown = sorted(set(body) - {"uid", "gid", "mode"})
    if unknown:
        raise E2BError(400, f"unknown field {unknown[0][:64]!r} (uid, gid and mode are)")
    ids = {k: inputs.integer(body[k], k, 0, MAX_ID) if body.get(k) is not None else None
           for k in ("uid", "gid")}
    mode = inputs.integer(body["mode"], "mode", 0, 0o7777) if body.get("mode") is not None else None

    def change() -> VolAttr:
        files.chmod_chown(path, mode=mode, uid=ids["uid"], gid=ids["gid"])
        return files.stat(path)

    return entry(path, await asyncio.to_thread(change))

@router.delete(BASE + "/path", status_code=204)
async def delete_path(request: Request, files: FilesDep) -> Response:
    path = _path(_query(request, ("path",)))
    if not path:
        raise E2BError(400, "the volume's root cannot be removed: remove what is in it, or "
                       "destroy the volume")

    def remove() -> None:
        files.stat(path)  # 404 for none (a remove of nothing is not a success here)
        files.remove(path, recursive=True)

    await asyncio.to_thread(remove)
    return Response(status_code=204)

@router.get(BASE + "/dir")
async def list_dir(request: Request, files: FilesDep) -> list[dict[str, Any]]:
    fields = _query(request, ("path", "depth"))
    path = _path(fields)
    depth = _number(fields, "depth", MAX_DEPTH, 1)
    if depth < 1:
        raise E2BError(400, f"depth must be an integer between 1 and {MAX_DEPTH}")
    return await asyncio.to_thread(_listing, files, path, depth)

def _making(request: Request, mode: int) -> tuple[str, int, int, int, bool]:
    """What a new directory or file is asked to be: its path, owner, mode (default ``mode``), and
    whether one already there is fine (``force``)."""
    fields = _query(request, ("path", "uid", "gid", "mode", "force"))
    return (_path(fields), _number(fields, "uid", MAX_ID, USER_ID), _number(fields, "gid", MAX_ID, USER_ID),
            _number(fields, "mode", 0o7777, mode), _flag(fields, "force"))


@router.post(BASE + "/dir", status_code=201)
async def make_dir(request: Request, files: FilesDep) -> dict[str, Any]:
    path, uid, gid, mode, force = _making(request, 0o755)

    def make() -> VolAttr:
        there = _exists(files, path)
        if there is not None:
            if force and stat.S_ISDIR(there["mode"]):
                return there  # force: mkdir -p's "already there" is a success
            raise Conflict(f"{_shown(path)} already exists")
        files.mkdir(path, parents=force, uid=uid, gid=gid, mode=mode)
        return files.stat(path)

    return entry(path, await asyncio.to_thread(make))

@router.get(BASE + "/file")
async def read_file(request: Request, files: FilesDep) -> StreamingResponse:
    path = _path(_query(request, ("path",)))
    pieces = await asyncio.to_thread(_opened_file, files, path)
    # No Content-Length: the file may change while it streams (a sandbox writes it).
    return StreamingResponse(pieces, media_type="application/octet-stream")

@router.put(BASE + "/file", status_code=201)
async def write_file(request: Request, files: FilesDep) -> dict[str, Any]:
    path, uid, gid, mode, force = _making(request, 0o644)
    limit: int = request.app.state.e2b_max_file_bytes
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isascii() or not declared.isdigit()):
        raise E2BError(400, "invalid Content-Length header")
    if declared is not None and int(declared) > limit:
        raise TooLarge(f"file exceeds the daemon's {limit}-byte limit")
    # E2B's rule, checked first so a refusal reads no body; not a lock: a file a sandbox makes
    # meanwhile is replaced, as a later write of its own would be.
    there = await asyncio.to_thread(_exists, files, path)
    if there is not None and stat.S_ISDIR(there["mode"]):
        raise Conflict(f"{_shown(path)} is a directory")
    if there is not None and not force:
        raise Conflict(f"{_shown(path)} already exists: write it with force=True to replace it")
    chunks = _pulled(streamed_body(request), asyncio.get_running_loop(), limit)
    attr = await asyncio.to_thread(files.write_file, path, chunks, uid=uid, gid=gid, mode=mode)
    return entry(path, attr)


def _listing(files: VolumeFiles, path: str, depth: int) -> list[dict[str, Any]]:
    """Each entry under ``path``, ``depth`` levels down, directories before what is in them."""
    if not stat.S_ISDIR(files.stat(path)["mode"]):
        raise InvalidRequest(f"{_shown(path)} is not a directory")
    out: list[dict[str, Any]] = []
    todo = [(path, 1)]
    while todo:
        folder, level = todo.pop(0)
        for item in sorted(files.listdir(folder), key=lambda e: e["name"]):
            child = f"{folder}/{item['name']}" if folder else item["name"]
            attr = _exists(files, child)
            if attr is None:
                continue  # removed (by a sandbox) since the directory was read
            if len(out) >= MAX_LISTED:
                raise InvalidRequest(f"{_shown(path)} holds more than {MAX_LISTED} entries at this "
                                     "depth: list a directory further down")
            out.append(entry(child, attr))
            if level < depth and stat.S_ISDIR(attr["mode"]):
                todo.append((child, level + 1))
    return out


def _opened_file(files: VolumeFiles, path: str) -> Iterator[bytes]:
    """The file's pieces, its first already read: a file that is missing, not a file or not
    readable is answered as such before the response starts."""
    if not stat.S_ISREG(files.stat(path)["mode"]):
        raise InvalidRequest(f"{_shown(path)} is not a file")
    pieces = iter(files.read_file(path))
    first = next(pieces, b"")

    def rest() -> Iterator[bytes]:
        try:
            if first:
                yield first
            yield from pieces
        finally:
            close = getattr(pieces, "close", None)
            if close is not None:
                close()  # a client gone midway: the file is closed now, not when collected

    return rest()


def _pulled(body: AsyncIterator[bytes], loop: asyncio.AbstractEventLoop, limit: int) -> Iterator[bytes]:
    """The request's body as the blocking iterator ``write_file`` takes, for its worker thread:
    each piece fetched from the event loop as it is wanted (so the upload streams, with
    backpressure), at most ``limit`` bytes in all."""

    async def next_piece() -> bytes | None:
        try:
            return await body.__anext__()
        except StopAsyncIteration:
            return None

    size = 0
    while True:
        try:
            piece = asyncio.run_coroutine_threadsafe(next_piece(), loop).result(UPLOAD_IDLE_SECS)
        except concurrent.futures.TimeoutError:
            raise InvalidRequest(f"the upload sent nothing for {UPLOAD_IDLE_SECS:.0f} s") from None
        if piece is None:
            return
        size += len(piece)
        if size > limit:
            raise TooLarge(f"file exceeds the daemon's {limit}-byte limit")
        if piece:
            yield piece


# ------------------------------------------------------------------ the app


def create_volume_content_app(runtime: RuntimeSource, tokens: AccessTokens, max_file_bytes: int) -> FastAPI:
    """``max_file_bytes``: the most one upload writes (the daemon's ``--max-file-bytes``)."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None,
                  telemetry={"tracing": False, "metrics": False, "logs": False})  # as the daemon's app
    app.state.e2b_runtime = LiveRuntime(runtime)
    app.state.e2b_tokens = tokens
    app.state.e2b_max_file_bytes = max_file_bytes
    handlers.install(app, _answer, "a call of E2B's volume content API that forkd serves")
    app.include_router(router)
    return app


__all__ = ["VolumeFiles", "content_error", "create_volume_content_app", "entry", "router"]
