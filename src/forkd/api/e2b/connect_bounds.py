"""Connect calls' JSON, bounded before the protobuf parser sees it.

The Connect services (``filesystem``, ``process``) decode requests with
protobuf's JSON parser, which recurses in C: a small body of nested arrays
overflows the stack and kills the daemon (issue 24). ``ConnectBounds`` wraps
their ASGI app and hands it no JSON message that nests deeper than
``bounds.MAX_JSON_DEPTH`` (``forkd.jsondepth``) or is larger than the read limit,
in every form the Connect app accepts:

* unary ``POST`` (``application/json``; ``Content-Encoding: gzip`` inflated
  first, as the app would): read whole, scanned, replayed;
* ``GET`` (``?encoding=json&message=...``, ``base64``, ``compression``): the
  message decoded as the app would, scanned;
* enveloped streams (``application/connect+json``, ``application/grpc+json``,
  ``application/grpc-web+json``): each length-prefixed frame is held until it is
  whole, inflated if flagged compressed, scanned, and only then passed on, so a
  client stream (stdin) still flows frame by frame.

The protobuf binary codec (``proto``) is left to the app: its parser bounds
nesting itself. A refused request is answered in Connect's error shape
(``invalid_argument``, or ``resource_exhausted`` past the size); a refused
frame after the app has started answering ends the call (the app sees a
disconnect) instead.
"""

from __future__ import annotations

import base64
import binascii
import urllib.parse

from connectrpc.code import Code
from connectrpc.compression.gzip import GzipCompression
from connectrpc.errors import ConnectError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from forkd import bounds, jsondepth
from forkd.api.e2b.errors import HTTP_STATUS, connect_body, send_json

FRAMED = ("application/connect+", "application/grpc")
_GZIP = GzipCompression()
_HEADER = 5  # an envelope's flags byte and big-endian length
_COMPRESSED = 0x01


class Refused(Exception):
    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return ""


class ConnectBounds:
    """ASGI middleware in front of a Connect app: see the module's docstring."""

    def __init__(self, app: ASGIApp, max_bytes: int, max_depth: int = bounds.MAX_JSON_DEPTH) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_depth = max_depth

    # ------------------------------------------------------------------ checks

    def inflate(self, data: bytes, encoding: str) -> bytes:
        if not data or encoding in ("", "identity"):
            return data
        if encoding != "gzip":
            raise Refused(Code.UNIMPLEMENTED,
                          f"unsupported compression {encoding[:32]!r}: use gzip or identity")
        try:
            return _GZIP.decompress(data, self.max_bytes)
        except ConnectError as exc:  # past the limit
            raise Refused(exc.code, self.too_large()) from None
        except Exception as exc:  # zlib.error, EOFError
            raise Refused(Code.INVALID_ARGUMENT, f"the message is not valid gzip ({exc})") from None

    def check(self, message: bytes) -> None:
        if jsondepth.too_deep(message, self.max_depth):
            raise Refused(Code.INVALID_ARGUMENT, jsondepth.refusal(self.max_depth))

    def too_large(self) -> str:
        return f"message exceeds the {self.max_bytes}-byte limit"

    def _check_get(self, scope: Scope) -> None:
        params = urllib.parse.parse_qs(bytes(scope.get("query_string", b"")).decode("utf-8", "replace"),
                                       keep_blank_values=True)
        if params.get("encoding", [""])[0] == "proto" or "message" not in params:
            return  # the app refuses a GET without a message before decoding anything
        message = params["message"][0]
        if params.get("base64", [""])[0] == "1":
            try:
                raw = base64.urlsafe_b64decode(message + "===")
            except (binascii.Error, ValueError):
                return  # the app refuses it too
        else:
            raw = message.encode("utf-8")
        self.check(self.inflate(raw, params.get("compression", ["identity"])[0]))

    # ------------------------------------------------------------------ the ASGI app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        content_type = _header(scope, b"content-type").partition(";")[0].strip().lower()
        try:
            if scope.get("method") == "GET":
                self._check_get(scope)
            elif content_type.startswith(FRAMED):
                _, plus, codec = content_type.partition("+")
                if plus and codec != "proto":
                    encoding = _header(scope, b"connect-content-encoding") or _header(scope, b"grpc-encoding")
                    await _Frames(self, scope, receive, send, encoding.lower()).run()
                    return
            elif content_type.removeprefix("application/") != "proto":
                replay = await self._unary(receive, _header(scope, b"content-encoding").lower())
                if replay is None:
                    return  # the client went away
                receive = replay
        except Refused as refused:
            await _refuse(send, refused)
            return
        await self.app(scope, receive, send)

    async def _unary(self, receive: Receive, encoding: str) -> Receive | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise Refused(Code.RESOURCE_EXHAUSTED, self.too_large())
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        self.check(self.inflate(body, encoding))
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay


async def _refuse(send: Send, refused: Refused) -> None:
    await send_json(send, HTTP_STATUS.get(refused.code, 400), connect_body(refused.code, str(refused)))


class _Frames:
    """One enveloped call: frames reach the app only once whole and checked."""

    def __init__(self, bounds_: ConnectBounds, scope: Scope, receive: Receive, send: Send,
                 encoding: str) -> None:
        self.bounds = bounds_
        self.scope = scope
        self.receive = receive
        self.send = send
        self.encoding = encoding
        self.pending = bytearray()  # bytes of a frame not yet whole
        self.started = False  # the app has begun its answer
        self.refused = False  # a frame was refused: the app gets a disconnect, its output is dropped

    def _take_frames(self) -> bytes:
        """The whole frames at the front of ``pending``, checked (Refused if one is not)."""
        out = bytearray()
        while len(self.pending) >= _HEADER:
            length = int.from_bytes(self.pending[1:_HEADER], "big")
            if length > self.bounds.max_bytes:
                raise Refused(Code.RESOURCE_EXHAUSTED, self.bounds.too_large())
            if len(self.pending) < _HEADER + length:
                break
            payload = bytes(self.pending[_HEADER:_HEADER + length])
            if self.pending[0] & _COMPRESSED:
                payload = self.bounds.inflate(payload, self.encoding or "identity")
            self.bounds.check(payload)
            out += self.pending[:_HEADER + length]
            del self.pending[:_HEADER + length]
        return bytes(out)

    async def _receive(self) -> Message:
        if self.refused:
            return {"type": "http.disconnect"}
        while True:
            message = await self.receive()
            if message["type"] != "http.request":
                return message
            self.pending += message.get("body", b"")
            more = bool(message.get("more_body", False))
            try:
                ready = self._take_frames()
            except Refused as refused:
                self.refused = True
                self.pending.clear()
                if not self.started:
                    self.started = True
                    await _refuse(self.send, refused)
                return {"type": "http.disconnect"}
            if not more:  # a torn last frame goes on as it is: the app refuses it without decoding
                ready += bytes(self.pending)
                self.pending.clear()
                return {"type": "http.request", "body": ready, "more_body": False}
            if ready:
                return {"type": "http.request", "body": ready, "more_body": True}

    async def _send(self, message: Message) -> None:
        if self.refused:
            return
        if message["type"] == "http.response.start":
            self.started = True
        await self.send(message)

    async def run(self) -> None:
        try:
            await self.bounds.app(self.scope, self._receive, self._send)
        except Exception:
            if not self.refused:
                raise  # after a refusal, the app's complaint about the disconnect is no news


__all__ = ["ConnectBounds", "Refused"]
