"""A hostile API client: a holder of one sandbox's E2B token, against the daemon's real app.

The daemon's real ASGI app (every middleware, the E2B dispatcher, the Connect
apps of the pinned ``e2b`` package, protobuf's parser) runs on the real runtime
over the QEMU double (tests/fakes/vmm.py) in a uvicorn process of its own on a
loopback port, so a request that crashes the process (protobuf's C parser
overflowing its stack is a segfault) shows here as a dead server rather than a
dead test run. No VM is booted.

Issue 24, high findings:
1. JSON nested 20,000 deep crashed the daemon through ``/filesystem.Filesystem/Stat``
   and was a 500 ``RecursionError`` on ``/v2/sandboxes`` and ``/execute``: every
   body is now refused with 400 past ``bounds.MAX_JSON_DEPTH``, on every route,
   before any parser sees it.
2. Two ``E2b-Sandbox-Id`` headers, B's then A's, with A's token, acted in B: a
   repeated routing or credential header is now refused with 400.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import resource
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from forkd import bounds
from forkd.api.e2b.tokens import AccessTokens
from forkd.sdk import Controller
from tests.fakes import vmm
from tests.fakes.app import TOKEN

from .daemon_fixture import Daemon as ForkdDaemon
from .daemon_fixture import new_daemon, shutdown_and_check, start_or_clean_up

ROOT = Path(__file__).resolve().parents[2]
A = "sb-aaaaaa-0000"  # an id no daemon of ``plain_daemon`` runs
HEAD_SECS = 3  # plain_daemon's --header-timeout
DEEP = b'{"path": ' + b"[" * 20000 + b"]" * 20000 + b"}"
NESTED = f"nested deeper than {bounds.MAX_JSON_DEPTH} levels"

SERVER = """
import sys
from pathlib import Path

import uvicorn

from forkd.api.app import create_app
from forkd.api.connections import http_protocol
from forkd.api.settings import Settings
from tests.fakes.app import guest_image

tmp, port, token, data = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
guest_image(data / "images")
(tmp / "token").write_text(token)
settings = Settings(token_file=tmp / "token", data_dir=data, audit_log=tmp / "audit.log")
uvicorn.run(create_app(settings), host="127.0.0.1", port=port, log_level="warning",
            http=http_protocol())  # as the daemon serves
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Daemon:
    def __init__(self, proc: subprocess.Popen[bytes], url: str) -> None:
        self.proc = proc
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=20)
        self.a = self.b = ""  # its two sandboxes: the hostile client holds a's token

    def alive(self) -> bool:
        """The process still runs and still answers."""
        if self.proc.poll() is not None:
            return False
        return self.http.get("/healthz").status_code == 200


@pytest.fixture
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("hostile-client")  # one daemon per test: a crash stays in its test
    script = tmp / "serve.py"
    script.write_text(SERVER)
    port = _free_port()
    # The QEMU double first on PATH; a short data dir (a VM's sockets live under it).
    qemu_dir = vmm.install(tmp / "bin").parent
    data = Path(tempfile.mkdtemp(prefix="fkt-", dir="/tmp"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
           "PATH": f"{qemu_dir}{os.pathsep}{os.environ.get('PATH', '')}", "FORKD_ACCEL": "tcg"}
    log = (tmp / "daemon.log").open("wb")
    proc = subprocess.Popen([sys.executable, str(script), str(tmp), str(port), TOKEN, str(data)],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    d = Daemon(proc, f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 60
    while True:
        try:
            if d.alive():
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the daemon did not start: {(tmp / 'daemon.log').read_text()}")
        time.sleep(0.2)
    try:
        with Controller(url=d.url, token=TOKEN) as controller:
            controller.create_snapshot("base")
            d.a, d.b = (sb["id"] for sb in controller.spawn_sandboxes("base", n=2))
        yield d
    finally:
        d.http.close()
        proc.terminate()  # the daemon stops its sandboxes as it exits
        proc.wait(timeout=15)
        log.close()
        shutil.rmtree(data, ignore_errors=True)


def envd(sandbox: str, token_of: str | None = None, port: str = "49983") -> list[tuple[str, str]]:
    return [("E2b-Sandbox-Id", sandbox), ("E2b-Sandbox-Port", port),
            ("X-Access-Token", AccessTokens(TOKEN.encode()).envd(token_of or sandbox))]


def frame(payload: bytes, flags: int = 0) -> bytes:
    """One Connect (and gRPC) envelope: flags, big-endian length, the message."""
    return bytes([flags]) + len(payload).to_bytes(4, "big") + payload


CONNECT_STREAM = [("Content-Type", "application/connect+json"), ("Connect-Protocol-Version", "1")]
CONNECT_UNARY = [("Content-Type", "application/json"), ("Connect-Protocol-Version", "1")]


def _post(daemon: Daemon, path: str, body: bytes, headers: list[tuple[str, str]]) -> httpx.Response:
    try:
        return daemon.http.post(path, content=body, headers=headers)
    except httpx.TransportError as exc:  # the daemon died under the request
        pytest.fail(f"{path}: the connection broke ({exc!r}); daemon alive: {daemon.proc.poll() is None}")


def _connect_refusal(resp: httpx.Response, status: int, code: str, words: str) -> None:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["code"] == code and words in body["message"], body


# ------------------------------------------------------------------ 1. deep JSON


def test_deep_json_to_a_connect_service_is_refused_and_the_daemon_lives(daemon: Daemon) -> None:
    # The request of issue 24 that segfaulted the daemon inside protobuf's JSON parser.
    resp = _post(daemon, "/filesystem.Filesystem/Stat", DEEP, [*envd(daemon.a), *CONNECT_UNARY])
    _connect_refusal(resp, 400, "invalid_argument", NESTED)
    assert daemon.alive()
    # The same, gzip'd (the parser would see it inflated): 40 KB of brackets in under 200 bytes.
    zipped = gzip.compress(DEEP)
    resp = _post(daemon, "/filesystem.Filesystem/Stat", zipped,
                 [*envd(daemon.a), *CONNECT_UNARY, ("Content-Encoding", "gzip")])
    _connect_refusal(resp, 400, "invalid_argument", NESTED)
    # As a GET (the message in the query string, base64 of gzip).
    message = base64.urlsafe_b64encode(zipped).decode().rstrip("=")
    resp = daemon.http.get("/filesystem.Filesystem/Stat", headers=envd(daemon.a), params={
        "encoding": "json", "base64": "1", "compression": "gzip", "message": message, "connect": "v1"})
    _connect_refusal(resp, 400, "invalid_argument", NESTED)
    assert daemon.alive()


def test_deep_json_in_a_streaming_connect_frame_is_refused(daemon: Daemon) -> None:
    # process.Start is server-streaming: its request is one enveloped message.
    for flags, payload in ((0, DEEP), (1, gzip.compress(DEEP))):
        compressed = [("Connect-Content-Encoding", "gzip")] if flags else []
        headers = [*envd(daemon.a), *CONNECT_STREAM, *compressed]
        resp = _post(daemon, "/process.Process/Start", frame(payload, flags), headers)
        _connect_refusal(resp, 400, "invalid_argument", NESTED)
    assert daemon.alive()


def test_framings_the_bound_misread_are_refused_and_the_daemon_lives(daemon: Daemon) -> None:
    """Issue 38 (HIGH 3, LOW 11): a bare ``json`` content type, or gRPC-web with a foreign
    Connect-Content-Encoding, carried a gzip'd deep frame past the bound (a segfault), and
    ``application/grpc+json`` was a 500 (uvicorn's HTTP/1.1 sends no trailers)."""
    body = frame(gzip.compress(DEEP), 1)
    for path in ("/filesystem.Filesystem/WatchDir", "/process.Process/Start"):
        resp = _post(daemon, path, body, [*envd(daemon.a), ("Content-Type", "json"),
                                          ("Connect-Content-Encoding", "gzip")])
        _connect_refusal(resp, 415, "unimplemented", "application/connect+json")
        resp = _post(daemon, path, body, [
            *envd(daemon.a), ("Content-Type", "application/grpc-web+json"),
            ("Connect-Content-Encoding", "identity"), ("grpc-encoding", "gzip")])
        assert resp.status_code == 200 and resp.headers["grpc-status"] == "3", (resp.headers, resp.content)
        assert NESTED in urllib.parse.unquote(resp.headers["grpc-message"])
        resp = _post(daemon, path, frame(b'{"path": "/tmp"}'),
                     [*envd(daemon.a), ("Content-Type", "application/grpc+json")])
        _connect_refusal(resp, 415, "unimplemented", "needs HTTP trailers")
    assert daemon.alive()


def test_deep_json_is_refused_on_rest_routes_in_each_apis_shape(daemon: Daemon) -> None:
    # E2B's control plane and the code interpreter: {"code", "message"}, not a 500 RecursionError.
    for path, headers in (("/v2/sandboxes", [("X-API-KEY", TOKEN)]),
                          ("/execute", envd(daemon.a, port="49999"))):
        resp = _post(daemon, path, DEEP, [*headers, ("Content-Type", "application/json")])
        assert resp.status_code == 400, (path, resp.status_code, resp.text)
        assert resp.json()["code"] == 400 and NESTED in resp.json()["message"], resp.text
    # forkd's own API: {"error"}; whatever the Content-Type says (some routes parse JSON anyway).
    for content_type in ("application/json", "text/plain"):
        resp = _post(daemon, "/v1/snapshots", DEEP,
                     [("Authorization", f"Bearer {TOKEN}"), ("Content-Type", content_type)])
        assert resp.status_code == 400 and NESTED in resp.json()["error"], resp.text
    assert daemon.alive()


def test_json_of_ordinary_depth_still_passes(daemon: Daemon) -> None:
    nested_ok = b'{"path": "/tmp", "x": ' + b"[" * 40 + b"]" * 40 + b"}"
    resp = _post(daemon, "/filesystem.Filesystem/Stat", nested_ok, [*envd(daemon.a), *CONNECT_UNARY])
    assert resp.status_code == 200 and resp.json()["entry"]["path"] == "/tmp", resp.text
    # Brackets inside strings are data, not nesting.
    in_string = b'{"path": "/tmp/' + b"[" * 1000 + b'"}'
    resp = _post(daemon, "/filesystem.Filesystem/Stat", in_string, [*envd(daemon.a), *CONNECT_UNARY])
    _connect_refusal(resp, 404, "not_found", "")


# ------------------------------------------------------------------ 2. repeated routing headers


def test_a_second_sandbox_id_header_is_refused_and_nothing_runs_in_the_other_sandbox(
        daemon: Daemon) -> None:
    # B's id first, A's last, A's token: the check used to read the last, the handler the first.
    smuggled = [("E2b-Sandbox-Id", daemon.b), *envd(daemon.a)]
    made = _post(daemon, "/filesystem.Filesystem/MakeDir", b'{"path": "/tmp/from-a"}',
                 [*smuggled, *CONNECT_UNARY])
    _connect_refusal(made, 400, "invalid_argument", "e2b-sandbox-id header is given more than once")
    started = _post(daemon, "/process.Process/Start",
                    frame(b'{"process": {"cmd": "/bin/touch", "args": ["/tmp/from-a"]}}'),
                    [*smuggled, *CONNECT_STREAM])
    _connect_refusal(started, 400, "invalid_argument", "more than once")
    # Nothing happened in B: no directory, no process.
    stat = _post(daemon, "/filesystem.Filesystem/Stat", b'{"path": "/tmp/from-a"}',
                 [*envd(daemon.b), *CONNECT_UNARY])
    _connect_refusal(stat, 404, "not_found", "")
    listed = _post(daemon, "/process.Process/List", b"{}", [*envd(daemon.b), *CONNECT_UNARY])
    assert listed.status_code == 200 and listed.json().get("processes", []) == [], listed.text


def test_every_routing_and_credential_header_must_come_once(daemon: Daemon) -> None:
    token_a = AccessTokens(TOKEN.encode()).envd(daemon.a)
    cases = [
        ("/health", [*envd(daemon.a), ("X-Access-Token", token_a)], "x-access-token"),
        ("/health", [*envd(daemon.a), ("E2b-Sandbox-Port", "49999")], "e2b-sandbox-port"),
        ("/v2/sandboxes", [("X-API-KEY", TOKEN), ("X-API-KEY", TOKEN)], "x-api-key"),
    ]
    for path, headers, name in cases:
        resp = daemon.http.get(path, headers=headers)
        assert resp.status_code == 400, (path, name, resp.text)
        assert resp.json()["code"] == 400 and name in resp.json()["message"], resp.text
    auth = ("Authorization", f"Bearer {TOKEN}")
    resp = daemon.http.get("/v1/sandboxes", headers=[auth, auth])
    assert resp.status_code == 400 and "authorization" in resp.json()["error"], resp.text
    assert daemon.http.get("/v1/sandboxes", headers=[auth]).status_code == 200


# ------------------------------------------------ finding 6: connections, against a real daemon process

@pytest.fixture(scope="module")
def plain_daemon() -> Iterator[ForkdDaemon]:
    """A daemon with no snapshot: these tests need its HTTP side only, no VM. Its head timeout (a
    new connection's first request, a begun request head) is short, so that the silent connections
    of the fd test are closed by it within seconds rather than the default's ten."""
    daemon = start_or_clean_up(new_daemon("fkd-hc-", extra_args=["--header-timeout", str(HEAD_SECS)]))
    try:
        yield daemon
    finally:
        shutdown_and_check(daemon)


def log_since(daemon: ForkdDaemon, offset: int) -> bytes:
    """What the daemon's log gained after ``offset``."""
    with daemon.log_path.open("rb") as log:
        log.seek(offset)
        return log.read()


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_idle_connections_cannot_exhaust_the_daemons_fds(plain_daemon: ForkdDaemon) -> None:
    """Finding 6: 20,200 idle TCP connections used all 20,000 fds; /healthz and
    authenticated calls then timed out and the log filled with "Too many open files".
    Here the daemon's limit is lowered to 2,048 and 3,000 silent connections are opened."""
    assert plain_daemon.proc is not None
    pid = plain_daemon.proc.pid
    before = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (2048, before[1]))  # the soft limit only
    log_before = plain_daemon.log_path.stat().st_size
    silent: list[socket.socket] = []
    try:
        for _ in range(3000):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.settimeout(5)
            s.connect(("127.0.0.1", plain_daemon.port))
            silent.append(s)
        time.sleep(1)  # let the daemon accept what the kernel queued
        with plain_daemon.client(timeout=10) as c:
            assert c.get("/healthz").json() == {"ok": True}
            assert c.get("/v1/sandboxes").status_code == 200  # authenticated, too
        assert open_fds(pid) < 2048
        # The silent ones are closed by the daemon: evicted for newer ones, or timed out.
        deadline = time.monotonic() + HEAD_SECS + 10
        pending = selectors.DefaultSelector()  # epoll: these fds are past select()'s 1024
        for s in silent:
            pending.register(s, selectors.EVENT_READ)
        while pending.get_map() and time.monotonic() < deadline:
            for key, _ in pending.select(timeout=1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(1)
                except OSError:
                    data = b""
                assert data == b"", "the daemon answered a connection that sent nothing"
                pending.unregister(sock)
        left = len(pending.get_map())
        pending.close()
        assert left == 0, f"{left} silent connections were never closed by the daemon"
    finally:
        for s in silent:
            s.close()
        resource.prlimit(pid, resource.RLIMIT_NOFILE, before)
    written = log_since(plain_daemon, log_before)
    assert b"Too many open files" not in written
    assert len(written) < 64 * 1024, "the daemon's log grew by more than 64 KiB during the flood"


def test_a_flood_on_a_starved_daemon_stays_under_the_fd_limit(plain_daemon: ForkdDaemon) -> None:
    """CI16: one "Too many open files" on accept during the flood above, on a loaded host.

    A starved daemon accepts a full batch on each wake-up before any of it passes the
    cap, and evicted sockets close a loop turn later; with 512 per batch, four batches
    beyond the cap's 512 reached the limit of 2,048. Here the daemon runs 5 ms in every
    55 (SIGSTOP/SIGCONT) while 5,000 connections arrive."""
    assert plain_daemon.proc is not None
    pid = plain_daemon.proc.pid
    before = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (2048, before[1]))
    log_before = plain_daemon.log_path.stat().st_size
    flooding = threading.Event()
    flooding.set()

    def starve() -> None:
        while flooding.is_set():
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.05)
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.005)

    starver = threading.Thread(target=starve)
    flood: list[socket.socket] = []
    starver.start()
    try:
        for _ in range(5000):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", plain_daemon.port))
            flood.append(s)
    finally:
        flooding.clear()
        starver.join()
        os.kill(pid, signal.SIGCONT)
    try:
        time.sleep(2)  # the daemon works through what it was given
        with plain_daemon.client(timeout=10) as c:
            assert c.get("/healthz").json() == {"ok": True}
        assert open_fds(pid) < 2048
    finally:
        for s in flood:
            s.close()
        resource.prlimit(pid, resource.RLIMIT_NOFILE, before)
    written = log_since(plain_daemon, log_before)
    assert b"Too many open files" not in written


def test_a_slow_client_gets_its_answer(plain_daemon: ForkdDaemon) -> None:
    """The head timeout is for silence and stalls only: a request split over several writes
    within it is served as usual."""
    with socket.create_connection(("127.0.0.1", plain_daemon.port), timeout=10) as s:
        for part in (b"GET /healthz HTTP/1.1\r\n", b"Host: localhost\r\n", b"\r\n"):
            s.sendall(part)
            time.sleep(0.3)
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]


# ------------------------------------------------ issue 38: the port proxy's request-target, raw


def _raw(daemon: ForkdDaemon, request: bytes) -> tuple[int, dict[str, object]]:
    """One request as sent, byte for byte (no client library tidies its target); the answer's
    status and JSON body."""
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=20) as s:
        s.sendall(request)
        answer = b""
        while chunk := s.recv(65536):  # the proxy's own answers close the connection
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_the_port_proxy_relays_only_origin_form_targets(plain_daemon: ForkdDaemon) -> None:
    """Issue 38, HIGH 2 and 11: ``GET *@127.0.0.1:22/`` with a sandbox port's Host connected to the
    host's port 22 (the target pasted after the guest's address); ``OPTIONS *`` was a 500. Both are
    400s now, before the sandbox is even looked up, and nothing is connected to."""
    with socket.create_server(("127.0.0.1", 0)) as host_port:
        port = host_port.getsockname()[1]
        for line in (f"GET *@127.0.0.1:{port}/ HTTP/1.1", "OPTIONS * HTTP/1.1"):
            status, body = _raw(plain_daemon, f"{line}\r\nHost: 8000-{A}.localhost\r\n\r\n".encode())
            assert status == 400 and "origin-form" in str(body["error"]), (line, body)
        with selectors.DefaultSelector() as sel:
            sel.register(host_port, selectors.EVENT_READ)
            assert not sel.select(timeout=0), "the daemon connected to the host's port"
    with plain_daemon.client() as c:
        assert c.get("/healthz").status_code == 200


def test_the_port_proxys_missing_sandbox_is_e2bs_502(plain_daemon: ForkdDaemon) -> None:
    """Issue 38, LOW 20: E2B's SDK reads its proxy's ``{"message", "sandboxId", "code"}``."""
    status, body = _raw(plain_daemon, f"GET / HTTP/1.1\r\nHost: 8000-{A}.localhost\r\n\r\n".encode())
    assert status == 502 and body["code"] == 502 and body["sandboxId"] == A, body
    assert "was not found" in str(body["message"]) and body["error"] == body["message"]
