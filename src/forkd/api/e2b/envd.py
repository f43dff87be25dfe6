"""In-sandbox traffic: what the SDK sends to a sandbox, on the daemon's port, by header.

Every such request names its sandbox (``E2b-Sandbox-Id``) and port
(``E2b-Sandbox-Port``): 49983 is envd (``/health``, ``/files``, the Connect
filesystem and process services), 49999 the code interpreter
(``interpreter``). Before anything else the request must carry the sandbox's
own access token (``X-Access-Token``; on the interpreter port, also
``E2B-Traffic-Access-Token``, which is all the SDK sends to ``/contexts``), and
the sandbox must be running: otherwise ``502 ... was not found``, as E2B's
proxy answers, which the SDK reads as "not running". Other ports are not
served through the daemon: ``502 ... port is not open``.

``/files``: ``GET ?path=`` streams the file; ``POST ?path=`` takes an
octet-stream body (gzip if ``Content-Encoding`` says so) or multipart parts
(``uploads``), makes missing parent directories, and answers
``[{name, type: "file", path}]``. Both stream, under ``max_file_bytes``, and act
as the guest user the SDK names in ``?username=`` (else in its Basic
``Authorization`` header, else ``user``), as every envd call does
(``filesystem.call_user``).
"""

from __future__ import annotations

import posixpath
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from connectrpc.code import Code
from e2b.envd.filesystem import filesystem_pb
from e2b.envd.process import process_pb
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from forkd.api.e2b import uploads
from forkd.api.e2b.connect_bounds import ConnectBounds, streaming_methods
from forkd.api.e2b.errors import CONNECT_CODE, HTTP_STATUS, connect_body, not_running, rest_body, send_json
from forkd.api.e2b.filesystem import call_user, filesystem_app, guest_path, serving
from forkd.api.e2b.interpreter import Interpreter
from forkd.api.e2b.process import process_app
from forkd.api.e2b.signed import signed_file_request
from forkd.api.e2b.tokens import AccessTokens
from forkd.api.file_routes import metadata_headers, streamed_body
from forkd.bounds import SANDBOX_ID_RE, check_guest_user
from forkd.errors import Busy, ForkdError, InvalidRequest, TooLarge

if TYPE_CHECKING:
    from forkd.controller.runtime import Runtime

ENVD_PORT = "49983"
INTERPRETER_PORT = "49999"
CONNECT_SERVICES = ("/filesystem.Filesystem/", "/process.Process/")


class SandboxTraffic:
    """The ASGI app for every request that carries ``E2b-Sandbox-Id``."""

    def __init__(self, runtime: Callable[[], Runtime | None], tokens: AccessTokens, *,
                 max_body_bytes: int, max_file_bytes: int) -> None:
        self._runtime_source = runtime
        self._tokens = tokens
        self._max_file_bytes = max_file_bytes
        # Connect messages reach protobuf's parser only bounded in size and JSON nesting.
        self._filesystem = ConnectBounds(filesystem_app(self._runtime, max_body_bytes),
                                         streaming_methods(filesystem_pb.desc()), max_body_bytes)
        self._process = ConnectBounds(process_app(self._runtime, max_body_bytes),
                                      streaming_methods(process_pb.desc()), max_body_bytes)
        self._interpreter = Interpreter(self._runtime)

    def _runtime(self) -> Runtime:
        runtime = self._runtime_source()
        if runtime is None:
            raise Busy("the daemon is still starting; retry shortly")
        return runtime

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Each of these headers comes once (limits.SingleHeadersMiddleware refused repeats), and
        # the sandbox id checked here is the one handed on: no handler reads the header again.
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        path: str = scope["path"]
        connect = path.startswith(CONNECT_SERVICES)
        sandbox_id = headers.get("e2b-sandbox-id", "")
        port = headers.get("e2b-sandbox-port", ENVD_PORT)

        async def fail(status: int, message: str) -> None:
            if connect:
                code = CONNECT_CODE.get(status, Code.INTERNAL)
                await send_json(send, HTTP_STATUS.get(code, status), connect_body(code, message))
            else:
                await send_json(send, status, rest_body(status, message))

        if not SANDBOX_ID_RE.match(sandbox_id):
            await fail(400, f"E2b-Sandbox-Id {sandbox_id[:64]!r} is not a sandbox id")
            return
        presented = headers.get("x-access-token") or (
            headers.get("e2b-traffic-access-token") if port == INTERPRETER_PORT else None)
        try:
            signed = None if presented or port != ENVD_PORT else signed_file_request(scope)
            # A signed file URL stands for the token (e2b/signed.py), until it expires.
            if signed is not None and self._tokens.accepts_signature(
                    sandbox_id, signed.signature, signed.path, signed.operation, signed.user,
                    signed.expiration):
                signed.check_not_expired()
                presented = self._tokens.envd(sandbox_id)
        except ForkdError as exc:
            await fail(exc.status, str(exc))
            return
        if not self._tokens.accepts(sandbox_id, presented, traffic_too=port == INTERPRETER_PORT):
            await fail(401, f"missing or wrong access token for sandbox {sandbox_id}: use the "
                       "envdAccessToken its create, connect or fork answered with")
            return
        if port not in (ENVD_PORT, INTERPRETER_PORT):
            await fail(502, f"The sandbox {sandbox_id} is running but the port is not open ({port[:8]}): "
                       "the daemon serves only envd (49983) and the code interpreter (49999) of a "
                       "sandbox; reach other ports over the sandbox's own network, if it has one")
            return
        try:
            record = self._runtime().get_sandbox(sandbox_id)
        except ForkdError as exc:
            if exc.status == 404:
                await fail(502, not_running(sandbox_id))
            else:
                await fail(exc.status, str(exc))
            return
        if record.hibernation is not None and not (record.auto_resume and record.hibernation.memory):
            # autoResume off, or paused filesystem-only (E2B's auto-resume refuses to cold-boot one):
            # its traffic does not wake it (E2B's SDK reads 502 as "not running").
            why = "its autoResume is off" if record.hibernation.memory else "it was paused filesystem-only"
            await fail(502, f"{not_running(sandbox_id)}; {why}: connect resumes it")
            return
        try:
            user = call_user(headers.get("authorization"))
        except ForkdError as exc:
            await fail(exc.status, str(exc))
            return
        if connect and port == ENVD_PORT:
            app = self._filesystem if path.startswith("/filesystem.") else self._process
            with serving(sandbox_id, user):
                await app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            if port == INTERPRETER_PORT:
                response = await self._interpreter.handle(request, sandbox_id)
            else:
                response = await self._envd(request, sandbox_id, user)
        except ForkdError as exc:
            status = exc.status if 400 <= exc.status <= 599 else 500
            response = JSONResponse({"code": status, "message": str(exc) or type(exc).__name__},
                                    status_code=status)
        await response(scope, receive, send)

    # ------------------------------------------------------------------ envd's plain HTTP API

    async def _envd(self, request: Request, sandbox_id: str, user: str) -> Response:
        path, method = request.url.path, request.method
        if path == "/health" and method == "GET":
            return Response(status_code=204)
        if path == "/files":
            # The SDK names the user of a file transfer in the query (an old envd's way).
            user = check_guest_user(request.query_params.get("username") or None) or user
            if method == "GET":
                return await self._download(request, sandbox_id, user)
            if method == "POST":
                return JSONResponse(await self._upload(request, sandbox_id, user))
        return JSONResponse({"code": 404, "message": f"{method} {path} is not served by forkd's envd "
                             "(see docs/E2B.md)"}, status_code=404)

    async def _download(self, request: Request, sandbox_id: str, user: str) -> Response:
        path = guest_path(request.query_params.get("path", ""), user)
        info, pieces = await self._runtime().files.open_read(sandbox_id, path, user=user)
        return StreamingResponse(pieces, media_type="application/octet-stream",
                                 headers={"X-Forkd-File-Size": str(info["size"])})

    async def _upload(self, request: Request, sandbox_id: str, user: str) -> list[dict[str, Any]]:
        limit = self._max_file_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit + (64 << 10):
            raise TooLarge(f"file exceeds the daemon's {limit}-byte limit")
        content_type = request.headers.get("content-type", "")
        default_path = request.query_params.get("path") or None
        # Every file of the upload gets the same metadata (envd's rule); checked before any write.
        metadata = metadata_headers(request.headers.items())

        async def write(target: str, pieces: AsyncIterator[bytes]) -> dict[str, Any]:
            full = guest_path(target, user)
            parent = posixpath.dirname(full)
            if parent != "/":
                await self._runtime().files.mkdir(sandbox_id, parent, parents=True, user=user)
            info = await self._runtime().files.write(sandbox_id, full, pieces, max_bytes=limit, user=user,
                                                     metadata=metadata)
            answer: dict[str, Any] = {"name": info["name"], "type": "file", "path": info["path"]}
            if info.get("metadata"):
                answer["metadata"] = info["metadata"]
            return answer

        if content_type.startswith("multipart/form-data"):
            return await uploads.multipart(streamed_body(request), content_type, default_path, write)
        if not default_path:
            raise InvalidRequest("an octet-stream upload needs the path query parameter")
        stream = streamed_body(request)
        if request.headers.get("content-encoding", "").lower() == "gzip":
            stream = uploads.inflate(stream, limit)
        return [await write(default_path, stream)]
