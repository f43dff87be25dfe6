"""The Connect services' bounds (api/e2b/connect_bounds, connect_framing), through the daemon's whole app.

Issue 38 (HIGH 3): ``Content-Type: json`` (bare), or gRPC-web with ``Connect-Content-Encoding:
identity`` beside ``grpc-encoding: gzip``, carried a 20,000-deep gzip'd JSON past the bounds into
protobuf's C parser (a segfault). Here the JSON codec's ``decode`` is a spy that records what it is
handed and refuses deep JSON itself, so a bypass fails the test instead of killing pytest.
"""

from __future__ import annotations

import gzip
import itertools
import json
import struct
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from connectrpc._codec import ProtoJSONCodec
from connectrpc._protocol_grpc import _connect_status_to_grpc  # type: ignore[attr-defined]
from connectrpc.code import Code
from fastapi.testclient import TestClient
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from forkd import bounds, jsondepth
from forkd.api.e2b.connect_framing import GRPC_STATUS
from forkd.api.e2b.tokens import AccessTokens
from tests.fakes.app import TOKEN, daemon_app

# envd's headers for the test's sandbox (set by ``_client`` once it is spawned).
ENVD: dict[str, str] = {}
DEEP = b'{"path": "/tmp", "x": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"
WATCH, START = "/filesystem.Filesystem/WatchDir", "/process.Process/Start"
STAT = "/filesystem.Filesystem/Stat"


def frame(payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


class ParserSpy:
    """What protobuf's JSON parser was handed; deep JSON never reaches the real one."""

    def __init__(self) -> None:
        self.deep = 0
        self.calls = 0


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> ParserSpy:
    seen = ParserSpy()
    real = ProtoJSONCodec.decode

    def decode(self: ProtoJSONCodec[Any, Any], data: bytes | bytearray, cls: type[Any]) -> Any:
        seen.calls += 1
        if jsondepth.too_deep(bytes(data), bounds.MAX_JSON_DEPTH):
            seen.deep += 1
            raise ValueError("deep JSON reached the parser")
        return real(self, data, cls)

    monkeypatch.setattr(ProtoJSONCodec, "decode", decode)
    return seen


class Served:
    """The app as a server runs it: uvicorn's HTTP/1.1 servers have no ASGI trailers extension
    (``trailers=False``); with it, the last response's trailers are kept (TestClient drops them)."""

    def __init__(self, app: ASGIApp, trailers: bool) -> None:
        self.app = app
        self.trailers = trailers
        self.last_trailers: dict[str, str] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extensions = dict(scope.get("extensions", {}))
        if not self.trailers:
            extensions.pop("http.response.trailers", None)
        self.last_trailers = {}

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.trailers":
                self.last_trailers = {k.decode(): v.decode() for k, v in message["headers"]}
            await send(message)

        await self.app({**scope, "extensions": extensions}, receive, sending)


@contextmanager
def _client(tmp_path: Path, trailers: bool) -> Iterator[TestClient]:
    with daemon_app(tmp_path, snapshots=("base",), wrap=lambda app: Served(app, trailers)) as daemon:
        sb = daemon.sandbox("base").id
        ENVD.clear()
        ENVD.update({"E2b-Sandbox-Id": sb, "E2b-Sandbox-Port": "49983",
                     "X-Access-Token": AccessTokens(TOKEN.encode()).envd(sb)})
        yield daemon.client


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    """As the daemon serves (uvicorn, HTTP/1.1: no trailers)."""
    with _client(tmp_path, trailers=False) as c:
        yield c


@pytest.fixture
def h2_client(tmp_path: Path) -> Iterator[TestClient]:
    """As a server that sends trailers (HTTP/2) would: gRPC is served there."""
    with _client(tmp_path, trailers=True) as c:
        yield c


def refusal(resp: httpx.Response, client: TestClient | None = None) -> tuple[str, str]:
    """The (code, message) of a clean refusal in the call's protocol; fails on anything else."""
    # 501 is Connect's status for unimplemented (an unknown compression); never a 500.
    assert resp.status_code in (200, 400, 404, 405, 415, 429, 501), (resp.status_code, resp.text)
    content_type = resp.headers.get("content-type", "")
    if resp.status_code >= 400:  # Connect's error shape
        body = resp.json()
        return str(body["code"]), str(body["message"])
    if "grpc-status" in resp.headers:  # gRPC's trailers-only answer
        status = resp.headers["grpc-status"]
        assert status != "0", resp.headers
        return status, urllib.parse.unquote(resp.headers.get("grpc-message", ""))
    if content_type.startswith("application/grpc+") or content_type == "application/grpc":
        assert client is not None and isinstance(client.app, Served)
        trailers = client.app.last_trailers  # gRPC's status comes in the HTTP trailers
        assert trailers.get("grpc-status", "0") != "0", (resp.content, trailers)
        return trailers["grpc-status"], urllib.parse.unquote(trailers.get("grpc-message", ""))
    # An answer the app began: its last frame ends the stream with an error.
    data, last = resp.content, b""
    while data:
        size = struct.unpack(">I", data[1:5])[0]
        last, flags, data = data[5:5 + size], data[0], data[5 + size:]
    if content_type.startswith("application/grpc-web"):
        assert flags & 0x80, resp.content
        trailers = dict(line.split(": ", 1) for line in last.decode().split("\r\n") if line)
        assert trailers["grpc-status"] != "0", trailers
        return trailers["grpc-status"], urllib.parse.unquote(trailers.get("grpc-message", ""))
    assert content_type.startswith("application/connect+"), (resp.status_code, content_type, resp.content)
    assert flags & 0x02, resp.content
    error = json.loads(last)["error"]
    return str(error["code"]), str(error["message"])


NESTED = f"nested deeper than {bounds.MAX_JSON_DEPTH} levels"
SUPPORTED = "application/json and application/proto (unary), application/connect+json"


@pytest.mark.parametrize("path", [WATCH, START])
def test_bare_json_on_a_stream_is_refused_before_the_parser(client: TestClient, spy: ParserSpy,
                                                            path: str) -> None:
    body = frame(gzip.compress(DEEP), 1)
    resp = client.post(path, content=body, headers={**ENVD, "Content-Type": "json",
                                                    "Connect-Content-Encoding": "gzip"})
    assert resp.status_code == 415
    code, message = refusal(resp)
    assert code == "unimplemented" and "'json' is not served" in message and SUPPORTED in message
    assert spy.calls == 0


@pytest.mark.parametrize("path", [WATCH, START])
def test_grpc_web_obeys_grpc_encoding_alone(client: TestClient, spy: ParserSpy, path: str) -> None:
    body = frame(gzip.compress(DEEP), 1)
    resp = client.post(path, content=body, headers={
        **ENVD, "Content-Type": "application/grpc-web+json", "Connect-Content-Encoding": "identity",
        "grpc-encoding": "gzip"})
    code, message = refusal(resp)
    assert code == GRPC_STATUS[Code.INVALID_ARGUMENT] == "3" and NESTED in message
    assert spy.deep == 0
    # A compression header of another protocol that says anything but identity is refused.
    resp = client.post(path, content=body, headers={
        **ENVD, "Content-Type": "application/grpc-web+json", "Connect-Content-Encoding": "gzip"})
    code, message = refusal(resp)
    assert code == "3" and "connect-content-encoding: 'gzip' does not apply" in message
    assert spy.deep == 0


def test_grpc_over_http1_is_refused_naming_what_is_served(client: TestClient, spy: ParserSpy) -> None:
    # It was a 500: "ASGI server does not support ASGI trailers" (issue 38, LOW 11).
    resp = client.post(WATCH, content=frame(b'{"path": "/tmp"}'),
                       headers={**ENVD, "Content-Type": "application/grpc+json"})
    assert resp.status_code == 415
    code, message = refusal(resp)
    assert code == "unimplemented" and "needs HTTP trailers" in message and SUPPORTED in message
    assert spy.calls == 0


def test_grpc_with_trailers_is_served_and_bounded(h2_client: TestClient, spy: ParserSpy) -> None:
    resp = h2_client.post(WATCH, content=frame(gzip.compress(DEEP), 1),
                          headers={**ENVD, "Content-Type": "application/grpc+json", "grpc-encoding": "gzip"})
    code, message = refusal(resp, h2_client)
    assert code == "3" and NESTED in message
    assert spy.deep == 0


def test_a_streams_framing_follows_its_method(client: TestClient, spy: ParserSpy) -> None:
    resp = client.post(START, content=DEEP, headers={**ENVD, "Content-Type": "application/json"})
    assert resp.status_code == 415 and "streams" in refusal(resp)[1]
    resp = client.post(STAT, content=frame(DEEP),
                       headers={**ENVD, "Content-Type": "application/connect+json"})
    assert resp.status_code == 415 and "is unary" in refusal(resp)[1]
    resp = client.post("/process.Process/Nope", content=b"{}",
                       headers={**ENVD, "Content-Type": "application/json"})
    assert resp.status_code == 404 and refusal(resp)[0] == "not_found"
    resp = client.put(STAT, content=b"{}", headers={**ENVD, "Content-Type": "application/json"})
    assert resp.status_code == 405 and "are POST" in refusal(resp)[1]
    assert spy.calls == 0


def test_the_grpc_status_numbers_are_grpcs() -> None:
    assert {code: str(number) for code, number in _connect_status_to_grpc.items()} == GRPC_STATUS


def test_well_formed_calls_still_work(client: TestClient, spy: ParserSpy) -> None:
    ok = b'{"path": "/tmp"}'
    for headers, body in (({"Content-Type": "application/json"}, ok),
                          ({"Content-Type": "application/json; charset=utf-8", "Content-Encoding": "GZIP"},
                           gzip.compress(ok))):
        resp = client.post(STAT, content=body, headers={**ENVD, **headers})
        assert resp.status_code == 200, resp.text
        assert resp.json()["entry"]["path"] == "/tmp"
    for content_type, flags in (("application/grpc-web+json", 1), ("Application/GRPC-Web+JSON", 1)):
        resp = client.post(STAT, content=frame(gzip.compress(ok), flags),
                           headers={**ENVD, "Content-Type": content_type, "grpc-encoding": "gzip"})
        assert resp.status_code == 200 and resp.headers.get("grpc-status") is None
        assert b'"path":"/tmp"' in resp.content.replace(b" ", b""), resp.content
    assert spy.calls == 4


# ------------------------------------------------------------------ every header combination

CONTENT_TYPES = [
    "application/json", "application/proto", "application/connect+json", "application/connect+proto",
    "application/grpc-web", "application/grpc-web+json", "application/grpc-web+proto",
    "application/grpc+json",
    "application/grpc", "json", "proto", "connect+json", "grpc-web+json", "", "text/plain",
    "APPLICATION/CONNECT+JSON; charset=utf-8", "application/grpc-web+json; charset=utf-8",
    "application/grpc-web+json+x", "application/connect+json+proto", "application/grpc-webx+json",
]
ENCODINGS = [None, "identity", "GZIP ", "br"]
PLAIN_ENCODINGS = [None, "gzip"]
BODIES = {
    "raw": DEEP, "gzip": gzip.compress(DEEP), "frame": frame(DEEP),
    "gzip frame": frame(gzip.compress(DEEP), 1),
    "unflagged gzip frame": frame(gzip.compress(DEEP)),
    "gzip of a gzip frame": gzip.compress(frame(gzip.compress(DEEP), 1)),
}


@pytest.mark.parametrize("path", [WATCH, STAT])
@pytest.mark.parametrize(("content_type", "trailers"), [
    *((content_type, False) for content_type in CONTENT_TYPES),
    ("application/grpc+json", True), ("application/grpc", True), ("application/grpc+proto", True)])
def test_every_header_combination_is_refused_or_bounded(tmp_path: Path, spy: ParserSpy, content_type: str,
                                                        trailers: bool, path: str) -> None:
    """Content-Type x Connect-Content-Encoding x grpc-encoding x Content-Encoding, with a deep JSON
    message in every framing and compression: each call ends in a clean refusal, and protobuf's
    parser is never handed the deep message."""
    with _client(tmp_path, trailers) as client:
        for connect, grpc, plain in itertools.product(ENCODINGS, ENCODINGS, PLAIN_ENCODINGS):
            headers = {**ENVD, "Content-Type": content_type}
            for name, value in (("Connect-Content-Encoding", connect), ("grpc-encoding", grpc),
                                ("Content-Encoding", plain)):
                if value is not None:
                    headers[name] = value
            for form, body in BODIES.items():
                resp = client.post(path, content=body, headers=headers)
                context = (content_type, connect, grpc, plain, form, resp.status_code, resp.content[:200])
                refusal(resp, client)
                assert spy.deep == 0, context
