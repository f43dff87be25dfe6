"""How a Connect/gRPC request's body is framed and compressed, decided once from its headers.

The Connect services are ``connectrpc``'s ASGI applications. They pick a
protocol from the raw ``Content-Type`` (gRPC, gRPC-web, else Connect), a codec
from what follows its prefix (for Connect, *any* other text: ``json`` alone is
the JSON codec, framed as a stream on a streaming method), and the request's
compression from a header that depends on the protocol (``Content-Encoding``
for a Connect unary call, ``Connect-Content-Encoding`` for a Connect stream,
``grpc-encoding`` for gRPC and gRPC-web), ignoring the others. A bound that
guessed any of these differently was walked around (issue 38: ``json``, or
gRPC-web with ``Connect-Content-Encoding: identity`` beside ``grpc-encoding:
gzip``, carried deep JSON to protobuf's C parser).

So ``decide`` serves only the canonical content types below, refuses every
other one (``415``) and a compression header that does not belong to the
protocol (unless it says ``identity``), and ``canonical_headers`` rewrites the
request's headers to exactly what was decided: the app never reads a header
the bound did not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from connectrpc.code import Code
from protobuf import DescFile
from starlette.types import Scope

Protocol = Literal["connect", "grpc-web", "grpc"]

# The content types served, each with its protocol, codec and whether the body is enveloped
# (length-prefixed frames) rather than one unary message.
_SERVED: dict[str, tuple[Protocol, str, bool]] = {
    "application/json": ("connect", "json", False),
    "application/proto": ("connect", "proto", False),
    "application/connect+json": ("connect", "json", True),
    "application/connect+proto": ("connect", "proto", True),
    "application/grpc-web": ("grpc-web", "proto", True),
    "application/grpc-web+proto": ("grpc-web", "proto", True),
    "application/grpc-web+json": ("grpc-web", "json", True),
    "application/grpc": ("grpc", "proto", True),
    "application/grpc+proto": ("grpc", "proto", True),
    "application/grpc+json": ("grpc", "json", True),
}
SUPPORTED = ("application/json and application/proto (unary), application/connect+json and "
             "application/connect+proto (streams), application/grpc-web[+proto|+json]")
COMPRESSION_HEADERS = (b"content-encoding", b"connect-content-encoding", b"grpc-encoding")
# The apps are built with connectrpc's default compressions.
COMPRESSIONS = ("identity", "gzip")
TRAILERS = "http.response.trailers"  # the ASGI extension gRPC (not gRPC-web) needs


class Refused(Exception):
    """A request (or one of its messages) that is not handed to the app; ``status`` overrides
    the HTTP status Connect gives ``code``; ``grpc`` (a content type) asks for gRPC's answer."""

    def __init__(self, code: Code, message: str, status: int | None = None, grpc: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.grpc = grpc


@dataclass(frozen=True)
class Framing:
    content_type: str  # canonical: what the app is handed
    protocol: Protocol
    codec: str  # "json" or "proto"
    enveloped: bool
    compression_header: bytes  # the one compression header this protocol obeys
    compression: str  # "identity" or "gzip"


def header(scope: Scope, name: bytes) -> str:
    """A request header (each compression and content-type header comes once: the
    SingleHeadersMiddleware refused repeats), decoded as the app decodes it."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("utf-8"))
    return ""


def check_utf8_headers(scope: Scope) -> None:
    """connectrpc decodes every header value as strict UTF-8 (a 500 otherwise)."""
    for key, value in scope.get("headers", ()):
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            raise Refused(Code.INVALID_ARGUMENT,
                          f"the {key.decode('latin-1')[:64]} header is not UTF-8") from None


def streaming_methods(*files: DescFile) -> dict[str, bool]:
    """Each method's path (``/package.Service/Method``) and whether it streams (either way):
    a Connect unary call's body is one message, a stream's is enveloped."""
    return {f"/{service.type_name}/{method.name}": method.method_kind != "unary"
            for file in files for service in file.services for method in service.methods}


def decide(scope: Scope, methods: Mapping[str, bool]) -> Framing:
    """The framing of a request that has a body (any method but GET) to one of ``methods``;
    Refused if not served."""
    path = str(scope.get("path", ""))
    raw = header(scope, b"content-type")
    content_type = raw.partition(";")[0].strip().lower()
    served = _SERVED.get(content_type)
    if served is None:
        raise Refused(Code.UNIMPLEMENTED, f"content type {raw[:64]!r} is not served: use {SUPPORTED}", 415)
    protocol, codec, enveloped = served
    if protocol == "connect" and enveloped != methods[path]:
        # The app would look for a codec named "connect+json" (or "application/json") and find none.
        want = "application/connect+json or +proto" if methods[path] else "application/json or proto"
        raise Refused(Code.UNIMPLEMENTED, f"{path[:128]} {'streams' if methods[path] else 'is unary'}: "
                      f"its content type is {want}, not {content_type!r}", 415)
    if protocol == "grpc" and TRAILERS not in scope.get("extensions", {}):
        raise Refused(Code.UNIMPLEMENTED, f"content type {raw[:64]!r} (gRPC) needs HTTP trailers, which "
                      f"this server does not send: use {SUPPORTED}", 415)
    if protocol != "connect":
        own = b"grpc-encoding"
    else:
        own = b"connect-content-encoding" if enveloped else b"content-encoding"
    grpc = content_type if protocol != "connect" else None  # refused from here on in gRPC's way
    for name in COMPRESSION_HEADERS:
        value = header(scope, name).strip().lower()
        if name != own and value not in ("", "identity"):
            raise Refused(Code.INVALID_ARGUMENT,
                          f"{name.decode()}: {value[:32]!r} does not apply to this call ({content_type}): "
                          f"compress it with {own.decode()}", grpc=grpc)
    compression = header(scope, own).strip().lower() or "identity"
    if compression not in COMPRESSIONS:
        raise Refused(Code.UNIMPLEMENTED,
                      f"unsupported compression {compression[:32]!r}: use {' or '.join(COMPRESSIONS)}",
                      grpc=grpc)
    return Framing(content_type, protocol, codec, enveloped, own, compression)


def canonical_headers(scope: Scope, framing: Framing | None) -> list[tuple[bytes, bytes]]:
    """The request's headers with the content type and compression as decided (for a GET,
    ``None``: neither, so the app reads its query as a Connect GET)."""
    dropped = (b"content-type", *COMPRESSION_HEADERS)
    headers = [(k, v) for k, v in scope.get("headers", ()) if k not in dropped]
    if framing is not None:
        headers += [(b"content-type", framing.content_type.encode()),
                    (framing.compression_header, framing.compression.encode())]
    return headers


# gRPC's status numbers: Code lists them in that order, from CANCELED (1).
GRPC_STATUS = {code: str(number) for number, code in enumerate(Code, start=1)}

__all__ = ["GRPC_STATUS", "SUPPORTED", "Framing", "Refused", "canonical_headers", "check_utf8_headers",
           "decide", "header", "streaming_methods"]
