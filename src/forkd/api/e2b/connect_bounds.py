"""Connect calls' JSON, bounded before the protobuf parser sees it.

The Connect services (``filesystem``, ``process``) decode requests with
protobuf's JSON parser, which recurses in C: a small body of nested arrays
overflows the stack and kills the daemon (issues 24, 38). ``ConnectBounds``
wraps their ASGI app and hands it no JSON message that nests deeper than
``bounds.MAX_JSON_DEPTH`` (``forkd.jsondepth``) or is larger than the read limit
once inflated, in every form the Connect app accepts. How a body is framed and
compressed is decided once (``connect_framing.decide``: unsupported content
types are refused) and the app is handed headers that say exactly that, so it
cannot read the body any other way:

* unary ``POST`` (``application/json``; ``Content-Encoding: gzip`` inflated
  first, as the app would): read whole, scanned, replayed;
* ``GET`` (``?encoding=json&message=...``, ``base64``, ``compression``): the
  message decoded as the app would, scanned;
* enveloped streams (``application/connect+json``, ``application/grpc-web+json``,
  and ``application/grpc+json`` where the server sends trailers): each
  length-prefixed frame is held until it is whole, inflated if flagged
  compressed (with the one compression its protocol names), scanned, and only
  then passed on, so a client stream (stdin) still flows frame by frame.

The protobuf binary codec (``proto``) is bounded in size alone: its parser
bounds nesting itself. A refused request is answered in its protocol's error
shape (Connect's JSON, ``invalid_argument``, ``resource_exhausted`` past the
size, ``415`` for a content type not served; gRPC's ``grpc-status`` headers); a
refused frame after the app has started answering ends the call (the app sees a
disconnect) instead. The apps' codecs are ``checked_codecs``: a message their
parser cannot decode (not JSON, not UTF-8, not the message's shape) is the
client's ``invalid_argument``, not a 500.
"""

from __future__ import annotations

import base64
import binascii
import urllib.parse
from collections.abc import Mapping
from typing import Any

from connectrpc.code import Code
from connectrpc.codec import Codec, proto_binary_codec, proto_json_codec
from connectrpc.compression.gzip import GzipCompression
from connectrpc.errors import ConnectError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from forkd import bounds, jsondepth
from forkd.api.e2b.connect_framing import (
    GRPC_STATUS,
    Framing,
    Refused,
    canonical_headers,
    check_utf8_headers,
    decide,
    streaming_methods,
)
from forkd.api.e2b.errors import HTTP_STATUS, connect_body, send_json
from forkd.api.limits import replaying

_GZIP = GzipCompression()
_HEADER = 5  # an envelope's flags byte and big-endian length
_COMPRESSED = 0x01


class ConnectBounds:
    """ASGI middleware in front of a Connect app: see the module's docstring."""

    def __init__(self, app: ASGIApp, methods: Mapping[str, bool], max_bytes: int,
                 max_depth: int = bounds.MAX_JSON_DEPTH) -> None:
        self.app = app
        self.methods = methods  # each method's path: whether it streams (connect_framing.streaming_methods)
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

    def check(self, message: bytes, codec: str = "json") -> None:
        if codec == "json" and jsondepth.too_deep(message, self.max_depth):
            raise Refused(Code.INVALID_ARGUMENT, jsondepth.refusal(self.max_depth))

    def too_large(self) -> str:
        return f"message exceeds the {self.max_bytes}-byte limit"

    def _check_get(self, scope: Scope) -> None:
        try:  # the app decodes the query as strict UTF-8 (a 500 otherwise)
            query = bytes(scope.get("query_string", b"")).decode("utf-8")
        except UnicodeDecodeError:
            raise Refused(Code.INVALID_ARGUMENT, "the query string is not UTF-8") from None
        params = urllib.parse.parse_qs(query, keep_blank_values=True)
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
        framing: Framing | None = None
        try:
            check_utf8_headers(scope)
            if scope["path"] not in self.methods:
                raise Refused(Code.NOT_FOUND, f"{scope['path'][:128]!r} is not a method of this service")
            if scope.get("method") == "GET":
                self._check_get(scope)
            elif scope.get("method") != "POST":
                raise Refused(Code.UNIMPLEMENTED, f"method {str(scope.get('method'))[:16]} is not served: "
                              "Connect calls are POST (or GET, for a call without side effects)", 405)
            else:
                framing = decide(scope, self.methods)
            # The app reads the framing and compression decided here, and nothing else.
            scope = {**scope, "headers": canonical_headers(scope, framing)}
            if framing is not None and framing.enveloped:
                await _Frames(self, scope, receive, send, framing).run()
                return
            if framing is not None:
                replay = await self._unary(receive, framing)
                if replay is None:
                    return  # the client went away
                receive = replay
        except Refused as refused:
            await _refuse(send, refused, framing)
            return
        await self.app(scope, receive, send)

    async def _unary(self, receive: Receive, framing: Framing) -> Receive | None:
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
        self.check(self.inflate(body, framing.compression), framing.codec)
        return replaying(body, receive)


class CheckedCodec:
    """A codec of the app's whose decode failure is the client's (``invalid_argument``): connectrpc
    answers any other exception as a 500 ``unknown``."""

    def __init__(self, codec: Codec[Any, Any]) -> None:
        self.codec = codec

    def name(self) -> str:
        return self.codec.name()

    def encode(self, message: Any) -> bytes:
        return self.codec.encode(message)

    def decode(self, data: bytes | bytearray, message_class: type[Any]) -> Any:
        try:
            return self.codec.decode(data, message_class)
        except ConnectError:
            raise
        except Exception as exc:
            raise ConnectError(Code.INVALID_ARGUMENT, f"the {self.name()} message is not a valid "
                               f"{message_class.__name__}: {str(exc)[:200]}") from None


def checked_codecs() -> list[Codec[Any, Any]]:
    """The app's codecs (connectrpc's defaults: binary and JSON), decode failures as invalid_argument."""
    return [CheckedCodec(proto_binary_codec()), CheckedCodec(proto_json_codec())]


async def _refuse(send: Send, refused: Refused, framing: Framing | None) -> None:
    grpc = refused.grpc or (framing.content_type if framing and framing.protocol != "connect" else None)
    if grpc is not None:
        # gRPC's "trailers-only" answer: the status in the headers of an empty 200.
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", grpc.encode()),
            (b"grpc-status", GRPC_STATUS[refused.code].encode()),
            (b"grpc-message", urllib.parse.quote(str(refused), safe="").encode())]})
        await send({"type": "http.response.body", "body": b""})
        return
    status = refused.status or HTTP_STATUS.get(refused.code, 400)
    await send_json(send, status, connect_body(refused.code, str(refused)))


class _Frames:
    """One enveloped call: frames reach the app only once whole and checked."""

    def __init__(self, bounds_: ConnectBounds, scope: Scope, receive: Receive, send: Send,
                 framing: Framing) -> None:
        self.bounds = bounds_
        self.scope = scope
        self.receive = receive
        self.send = send
        self.framing = framing
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
                if self.framing.compression == "identity":  # as the app: not with identity
                    raise Refused(Code.INVALID_ARGUMENT, "a message is flagged compressed, but the call "
                                  f"names no compression ({self.framing.compression_header.decode()})")
                payload = self.bounds.inflate(payload, self.framing.compression)
            self.bounds.check(payload, self.framing.codec)
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
                    await _refuse(self.send, refused, self.framing)
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


__all__ = ["CheckedCodec", "ConnectBounds", "Refused", "checked_codecs", "streaming_methods"]
