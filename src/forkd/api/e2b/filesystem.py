"""envd's Connect-RPC filesystem service, on forkd's files layer (``controller.files``).

The messages and the ASGI application are the pinned ``e2b`` package's own
(``e2b.envd.filesystem``); this module only implements the service: ``Stat``,
``ListDir`` (to a depth), ``MakeDir`` (parents made; ``already_exists`` when it
was there), ``Remove`` (recursive; a path that is not there is removed already,
as in envd) and ``Move``. Entries carry the owner's and group's names, and a
symbolic link its resolved ``symlinkTarget`` (``Stat`` follows the link for the
type, as envd does; a listing shows the link itself), and a file's ``metadata``
(its ``user.e2b.*`` extended attributes, envd 0.6.2). Watching a directory, as a
stream or polled, is ``watch.py``'s.

Users: as in envd, every call acts as a guest user: the one the SDK names in its
``Authorization: Basic base64("<user>:")`` header (``user="root"``), else E2B's
default, ``user`` (uid 1000, every forkd image has it). The dispatcher reads the
header once (``call_user``) and hands the name on with the sandbox (``serving``).
Relative paths resolve against that user's home, ``/home/<user>`` (``/root`` for
root), as envd resolves them against the user's home directory.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import posixpath
import stat as stat_mod
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.envd.filesystem import filesystem_connect, filesystem_pb
from protobuf.wkt.google.protobuf.timestamp_pb import Timestamp

from forkd.api.e2b import watch
from forkd.api.e2b.connect_bounds import checked_codecs
from forkd.api.e2b.errors import connect_errors, not_running
from forkd.bounds import check_guest_user
from forkd.controller.results import FileEntry
from forkd.errors import InvalidRequest, NotFound
from forkd.guest import protocol

if TYPE_CHECKING:
    from forkd.controller.runtime import Runtime

# E2B's user when the SDK names none (envd >= 0.4.0 sends no header then).
DEFAULT_USER = "user"
# The sandbox a Connect call is for, as the dispatcher validated it (its id and token), and the
# guest user it acts as: set by ``serving`` around the call, never read again from the request's
# headers, which a client could send twice with two ids (issue 24).
_SANDBOX: ContextVar[str | None] = ContextVar("forkd_e2b_sandbox", default=None)
_USER: ContextVar[str] = ContextVar("forkd_e2b_user", default=DEFAULT_USER)
# ListDir's depth and total entries: a deep walk is many agent calls, so it is bounded.
MAX_DEPTH = 8
MAX_ENTRIES = protocol.FILE_LIST_MAX

_TYPES = {"file": (filesystem_pb.FileType.FILE, stat_mod.S_IFREG),
          "dir": (filesystem_pb.FileType.DIRECTORY, stat_mod.S_IFDIR),
          "symlink": (filesystem_pb.FileType.SYMLINK, stat_mod.S_IFLNK)}


def call_user(authorization: str | None) -> str:
    """The guest user a call names in its ``Authorization: Basic`` header (the password part is
    empty and ignored), else ``DEFAULT_USER``; a malformed header or name is a 400."""
    if not authorization:
        return DEFAULT_USER
    scheme, _, encoded = authorization.partition(" ")
    if scheme.lower() != "basic":
        raise InvalidRequest("envd's Authorization header must be Basic base64('<user>:')")
    try:
        user = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")[0]
    except (binascii.Error, ValueError):
        raise InvalidRequest("envd's Authorization header is not base64 of '<user>:'") from None
    return check_guest_user(user) or DEFAULT_USER


def home_of(user: str) -> str:
    """Where a user's relative paths are (the guest's convention: root's /root, others' /home/<user>)."""
    return "/root" if user == "root" else f"/home/{user}"


def guest_path(path: str, user: str | None = None) -> str:
    """A request's path as an absolute guest path: relative ones are under the home of ``user``
    (default: the call's user)."""
    home = home_of(user or _USER.get())
    if not path:
        return home
    return path if path.startswith("/") else posixpath.join(home, path)


def entry(info: FileEntry) -> filesystem_pb.EntryInfo:
    """forkd's FileInfo as envd's EntryInfo."""
    kind, bits = _TYPES.get(info["type"], (filesystem_pb.FileType.UNSPECIFIED, 0))
    mtime = float(info["mtime"])
    target = info.get("target")
    return filesystem_pb.EntryInfo(
        name=info["name"], type=kind, path=info["path"], size=info["size"], mode=info["mode"],
        permissions=stat_mod.filemode(bits | info["mode"]),
        owner=info.get("owner", ""), group=info.get("group", ""),
        modified_time=Timestamp(seconds=int(mtime), nanos=int((mtime % 1) * 1e9)),
        symlink_target=target,
        is_symlink=info["type"] == "symlink" or target is not None,
        metadata=info.get("metadata") or None,
    )


@contextlib.contextmanager
def serving(sandbox_id: str, user: str = DEFAULT_USER) -> Iterator[None]:
    """Run a Connect call for ``sandbox_id``, whose id and access token have been checked, as the
    guest user ``user``."""
    token = _SANDBOX.set(sandbox_id)
    user_token = _USER.set(user)
    try:
        yield
    finally:
        _USER.reset(user_token)
        _SANDBOX.reset(token)


def user_of(_ctx: RequestContext[Any, Any]) -> str:
    """The guest user a Connect call acts as (``serving``)."""
    return _USER.get()


def sandbox_of(_ctx: RequestContext[Any, Any]) -> str:
    """The sandbox a Connect call is for: the one the dispatcher validated (``serving``)."""
    sandbox_id = _SANDBOX.get()
    if not sandbox_id:
        raise ConnectError(Code.INTERNAL, "no validated sandbox for this call")
    return sandbox_id


class FilesystemService(filesystem_connect.Filesystem):
    """Everything not defined here answers ``unimplemented`` (the generated base's default)."""

    def __init__(self, runtime: Callable[[], Runtime]) -> None:
        self._runtime = runtime

    async def stat(self, request: filesystem_pb.StatRequest,
                   ctx: RequestContext[filesystem_pb.StatRequest, filesystem_pb.StatResponse], /,
                   ) -> filesystem_pb.StatResponse:
        with connect_errors():
            info = await self._runtime().files.stat(sandbox_of(ctx), guest_path(request.path),
                                                   user=user_of(ctx))
        return filesystem_pb.StatResponse(entry=entry(info))

    async def list_dir(self, request: filesystem_pb.ListDirRequest,
                       ctx: RequestContext[filesystem_pb.ListDirRequest, filesystem_pb.ListDirResponse], /,
                       ) -> filesystem_pb.ListDirResponse:
        sandbox, user = sandbox_of(ctx), user_of(ctx)
        depth = min(max(request.depth, 1), MAX_DEPTH)
        out: list[filesystem_pb.EntryInfo] = []

        async def walk(path: str, level: int) -> None:
            # envd's order (a depth-first walk by name): a directory, then what it holds.
            listing = await self._runtime().files.list(sandbox, path, user=user)
            for info in sorted(listing["entries"], key=lambda i: str(i["name"])):
                if len(out) >= MAX_ENTRIES:
                    return
                out.append(entry(info))
                if info["type"] == "dir" and level < depth:
                    await walk(info["path"], level + 1)  # at most MAX_DEPTH deep

        with connect_errors():
            await walk(guest_path(request.path), 1)
        return filesystem_pb.ListDirResponse(entries=out)

    async def make_dir(self, request: filesystem_pb.MakeDirRequest,
                       ctx: RequestContext[filesystem_pb.MakeDirRequest, filesystem_pb.MakeDirResponse], /,
                       ) -> filesystem_pb.MakeDirResponse:
        sandbox, path, user = sandbox_of(ctx), guest_path(request.path), user_of(ctx)
        with connect_errors():
            made = await self._runtime().files.mkdir(sandbox, path, parents=True, user=user)
            if not made["created"]:
                raise ConnectError(Code.ALREADY_EXISTS, f"directory {path} already exists")
            info = await self._runtime().files.stat(sandbox, path, user=user)
        return filesystem_pb.MakeDirResponse(entry=entry(info))

    async def remove(self, request: filesystem_pb.RemoveRequest,
                     ctx: RequestContext[filesystem_pb.RemoveRequest, filesystem_pb.RemoveResponse], /,
                     ) -> filesystem_pb.RemoveResponse:
        sandbox = sandbox_of(ctx)
        with connect_errors():
            try:
                await self._runtime().files.remove(sandbox, guest_path(request.path), recursive=True,
                                                  user=user_of(ctx))
            except NotFound:
                # E2B's envd: removing what is not there is done. Unless the sandbox itself is gone.
                try:
                    self._runtime().get_sandbox(sandbox)
                except NotFound:
                    raise ConnectError(Code.UNAVAILABLE, not_running(sandbox)) from None
        return filesystem_pb.RemoveResponse()

    async def move(self, request: filesystem_pb.MoveRequest,
                   ctx: RequestContext[filesystem_pb.MoveRequest, filesystem_pb.MoveResponse], /,
                   ) -> filesystem_pb.MoveResponse:
        with connect_errors():
            info = await self._runtime().files.move(sandbox_of(ctx), guest_path(request.source),
                                                   guest_path(request.destination), user=user_of(ctx))
        return filesystem_pb.MoveResponse(entry=entry(info))


    def watch_dir(self, request: filesystem_pb.WatchDirRequest,
                  ctx: RequestContext[filesystem_pb.WatchDirRequest, filesystem_pb.WatchDirResponse], /,
                  ) -> AsyncIterator[filesystem_pb.WatchDirResponse]:
        return watch.watch_stream(self._runtime(), sandbox_of(ctx), guest_path(request.path),
                                  watch.WatchOptions.of(request), ctx.timeout_ms, entry)

    async def create_watcher(self, request: filesystem_pb.CreateWatcherRequest,
                             ctx: RequestContext[filesystem_pb.CreateWatcherRequest,
                                                 filesystem_pb.CreateWatcherResponse], /,
                             ) -> filesystem_pb.CreateWatcherResponse:
        watcher = await watch.create_watcher(self._runtime(), sandbox_of(ctx), guest_path(request.path),
                                             watch.WatchOptions.of(request))
        return filesystem_pb.CreateWatcherResponse(watcher_id=watcher)

    async def get_watcher_events(self, request: filesystem_pb.GetWatcherEventsRequest,
                                 ctx: RequestContext[filesystem_pb.GetWatcherEventsRequest,
                                                     filesystem_pb.GetWatcherEventsResponse], /,
                                 ) -> filesystem_pb.GetWatcherEventsResponse:
        found = await watch.watcher_events(self._runtime(), sandbox_of(ctx), request.watcher_id, entry)
        return filesystem_pb.GetWatcherEventsResponse(events=found)

    async def remove_watcher(self, request: filesystem_pb.RemoveWatcherRequest,
                             ctx: RequestContext[filesystem_pb.RemoveWatcherRequest,
                                                 filesystem_pb.RemoveWatcherResponse], /,
                             ) -> filesystem_pb.RemoveWatcherResponse:
        await watch.remove_watcher(self._runtime(), sandbox_of(ctx), request.watcher_id)
        return filesystem_pb.RemoveWatcherResponse()


def filesystem_app(runtime: Callable[[], Runtime], read_max_bytes: int) -> Any:
    """The SDK package's own Connect ASGI application, serving ``FilesystemService``."""
    return filesystem_connect.FilesystemASGIApplication(
        FilesystemService(runtime), read_max_bytes=read_max_bytes, codecs=checked_codecs())
