"""Files in a sandbox without a VM: the agent's file actions in-process, the
daemon's bounds on what the guest sends back, the routes against the real Runtime over the QEMU double
(path checks, 404/409/413, streaming), and the SDK over the ASGI app.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from forkd.api.app import create_app
from forkd.api.file_routes import streams_body
from forkd.api.settings import Settings
from forkd.controller import files as controller_files
from forkd.errors import GuestError, InvalidRequest
from forkd.guest import protocol
from forkd.guest.agent.files import Files
from forkd.guest.agent.uploads import Uploads
from forkd.guest.protocol import CONFLICT, INVALID, NOT_FOUND, RequestError
from forkd.sdk import AsyncController, AsyncSandbox
from forkd.sdk.errors import NotFoundError
from tests.fakes.app import Daemon, daemon_app, open_runtime

SB = "sb-67a1b3-0000"
MIB = 1 << 20


# ------------------------------------------------------------- path checks


@pytest.mark.parametrize(("path", "why"), [
    ("", "non-empty"), ("relative", "absolute"), ("/a\0b", "NUL"), ("/" + "a" * 5000, "longer"),
    (None, "non-empty"), ("/\ud800", "UTF-8"),
])
def test_bad_paths_are_refused_as_invalid(path: Any, why: str) -> None:
    with pytest.raises(RequestError, match=why) as info:
        protocol.check_path(path)
    assert info.value.kind == INVALID
    with pytest.raises(InvalidRequest):
        controller_files.check_path(path)


def test_good_paths_pass() -> None:
    assert protocol.check_path("/tmp/x y/ü.txt") == "/tmp/x y/ü.txt"


# ------------------------------------------------------------- agent, in-process


def test_agent_upload_is_atomic_and_pieces_may_come_in_any_order(tmp_path: Path) -> None:
    up = Uploads()
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    target.chmod(0o600)
    handle = up.write_open({"path": str(target)})["handle"]
    data = os.urandom(2500)
    for offset in (2000, 0, 1000):  # out of order
        up.write({"handle": handle, "offset": offset,
                  "data": base64.b64encode(data[offset:offset + 1000]).decode()})
    assert target.read_bytes() == b"old"  # nothing replaced before the close
    info = up.write_close({"handle": handle, "commit": True})
    assert target.read_bytes() == data and info["size"] == 2500
    assert info["mode"] == 0o600  # an overwrite keeps the permissions
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_agent_aborted_upload_leaves_nothing(tmp_path: Path) -> None:
    up = Uploads()
    handle = up.write_open({"path": str(tmp_path / "x")})["handle"]
    up.write({"handle": handle, "offset": 0, "data": base64.b64encode(b"half").decode()})
    assert up.write_close({"handle": handle, "commit": False}) == {"aborted": True}
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RequestError) as info:
        up.write({"handle": handle, "offset": 0, "data": ""})
    assert info.value.kind == NOT_FOUND


@pytest.mark.parametrize(("req", "kind"), [
    ({"path": "/nonexistent-dir/f"}, NOT_FOUND),
    ({"path": "/tmp"}, CONFLICT),
    ({"path": "/tmp/"}, INVALID),
    ({"path": "tmp/x"}, INVALID),
])
def test_agent_refuses_bad_upload_targets(req: dict[str, Any], kind: str) -> None:
    with pytest.raises(RequestError) as info:
        Uploads().write_open(req)
    assert info.value.kind == kind


def test_agent_refuses_oversized_or_bad_pieces(tmp_path: Path) -> None:
    up = Uploads()
    handle = up.write_open({"path": str(tmp_path / "x")})["handle"]
    too_long = base64.b64encode(b"\0" * (protocol.FILE_CHUNK + 3)).decode()
    for data in (too_long, "not base64!", 7):
        with pytest.raises(RequestError) as info:
            up.write({"handle": handle, "offset": 0, "data": data})
        assert info.value.kind == INVALID
    up.write_close({"handle": handle, "commit": False})


def test_agent_reads_stat_list_mkdir_remove(tmp_path: Path) -> None:
    fs = Files()
    (tmp_path / "f").write_bytes(b"x" * 10)
    piece = fs.read({"path": str(tmp_path / "f"), "offset": 4, "length": 100})
    assert base64.b64decode(piece["data"]) == b"x" * 6 and piece["eof"] is True
    assert fs.stat({"path": str(tmp_path / "f")})["type"] == "file"
    assert fs.mkdir({"path": str(tmp_path / "d" / "e"), "parents": True}) == {"created": True}
    assert fs.mkdir({"path": str(tmp_path / "d" / "e"), "parents": True}) == {"created": False}
    listing = fs.list({"path": str(tmp_path)})
    assert [(e["name"], e["type"]) for e in listing["entries"]] == [("d", "dir"), ("f", "file")]
    for req, kind in (
        (lambda: fs.read({"path": str(tmp_path / "d"), "offset": 0, "length": 1}), CONFLICT),
        (lambda: fs.read({"path": str(tmp_path / "f"), "offset": 0, "length": protocol.FILE_CHUNK + 1}),
         INVALID),
        (lambda: fs.stat({"path": str(tmp_path / "missing")}), NOT_FOUND),
        (lambda: fs.list({"path": str(tmp_path / "f")}), CONFLICT),
        (lambda: fs.mkdir({"path": str(tmp_path / "d")}), CONFLICT),
        (lambda: fs.remove({"path": str(tmp_path / "d")}), CONFLICT),
        (lambda: fs.remove({"path": "/"}), CONFLICT),
        (lambda: fs.read({"path": "/dev/zero", "offset": 0, "length": 1}), CONFLICT),
    ):
        with pytest.raises(RequestError) as info:
            req()
        assert info.value.kind == kind
    fs.remove({"path": str(tmp_path / "d"), "recursive": True})
    fs.remove({"path": str(tmp_path / "f")})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("root", ["//", "///", "/.", "/./", "//tmp/..", "/proc/self/root/"])
def test_the_agent_refuses_to_remove_or_move_root_by_any_name(
        root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24: ``DELETE …/files?path=//&recursive=true`` wiped /opt, /sbin and /var in the guest
    (``normpath("//")`` is ``"//"``). Every destructive call is stubbed out here, so a regression
    records the call instead of deleting this host's files."""
    from forkd.guest.agent import files as agent_files

    calls: list[tuple[str, str]] = []

    def record(name: str) -> Any:
        def call(path: Any, *args: Any, **kw: Any) -> None:
            calls.append((name, str(path)))
        return call

    for module, name in ((agent_files.shutil, "rmtree"), (agent_files.shutil, "move"),
                         (agent_files.os, "rmdir"), (agent_files.os, "unlink"), (agent_files.os, "rename")):
        monkeypatch.setattr(module, name, record(name))
    fs = Files()
    for req in (lambda: fs.remove({"path": root, "recursive": True}),
                lambda: fs.remove({"path": root}),
                lambda: fs.move({"source": root, "destination": str(tmp_path / "x")})):
        with pytest.raises(RequestError) as info:
            req()
        assert info.value.kind == CONFLICT
    assert calls == []


def test_a_link_to_root_is_only_a_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    link = tmp_path / "lnk"
    link.symlink_to("/")
    Files().remove({"path": str(link), "recursive": True})  # removes the link, nothing below it
    assert not link.is_symlink() and Path("/proc").is_dir()


def test_agent_entries_name_owner_group_and_link_target(tmp_path: Path) -> None:
    """Owner and group by name (E2B's EntryInfo has them); a symbolic link's resolved, absolute
    target: stat follows the link for its type, a listing shows the link itself (issue 20)."""
    import grp
    import pwd

    fs = Files()
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f.txt").write_text("abc")
    os.symlink("d/f.txt", tmp_path / "ln")
    os.symlink("missing", tmp_path / "dead")
    me, mine = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
    plain = fs.stat({"path": str(tmp_path / "d" / "f.txt")})
    assert (plain["owner"], plain["group"]) == (me, mine) and "target" not in plain
    link = fs.stat({"path": str(tmp_path / "ln")})
    assert link["type"] == "file" and link["size"] == 3
    assert link["target"] == str((tmp_path / "d" / "f.txt").resolve())
    dead = fs.stat({"path": str(tmp_path / "dead")})
    assert dead["type"] == "symlink" and dead["target"] == str(tmp_path.resolve() / "missing")
    listed = {e["name"]: e for e in fs.list({"path": str(tmp_path)})["entries"]}
    assert listed["ln"]["type"] == "symlink" and listed["ln"]["target"] == link["target"]
    assert "target" not in listed["d"] and listed["d"]["owner"] == me
    # The host keeps these (checked) and refuses a malformed one.
    assert controller_files.checked_info(link)["target"] == link["target"]
    with pytest.raises(GuestError):
        controller_files.checked_info({**link, "owner": 0})
    with pytest.raises(GuestError):
        controller_files.checked_info({**link, "target": "/" * (protocol.FILE_PATH_MAX + 1)})


def test_the_agent_serves_file_actions_with_error_kinds(tmp_path: Path) -> None:
    """Through the real dispatch: a refusal's kind goes back in the reply."""
    from forkd.guest.agent.server import Agent

    agent = Agent(warm=[])
    with pytest.raises(RequestError) as info:
        agent.handle({"action": protocol.FILE_STAT, "path": str(tmp_path / "nope")})
    reply = protocol.error_reply(1, str(info.value), info.value.kind)
    assert reply["kind"] == NOT_FOUND
    assert agent.handle({"action": protocol.FILE_STAT, "path": str(tmp_path)})["type"] == "dir"


# ------------------------------------------------------ host bounds on the guest


def test_host_refuses_a_read_piece_longer_than_asked() -> None:
    long = base64.b64encode(b"x" * 20).decode()
    with pytest.raises(GuestError):
        controller_files._piece({"data": long, "eof": True}, 10)
    with pytest.raises(GuestError):
        controller_files._piece({"data": "!!", "eof": True}, 10)
    assert controller_files._piece({"data": base64.b64encode(b"ok").decode(), "eof": False}, 10) == (
        b"ok", False)


def test_rechunk_cuts_a_stream_into_fixed_pieces() -> None:
    async def source() -> AsyncIterator[bytes]:
        for size in (3, 10, 1, 0, 7):
            yield b"a" * size

    async def collect() -> list[int]:
        return [len(p) async for p in controller_files.rechunk(source(), 4)]

    assert asyncio.run(collect()) == [4, 4, 4, 4, 4, 1]


# ---------------------------------------------------------------- the routes


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with daemon_app(tmp_path, token=False, max_body_bytes=8192, max_file_bytes=3 * MIB) as d:
        yield d


@pytest.fixture
def sb_id(daemon: Daemon) -> str:
    return daemon.sandbox("py").id


@pytest.fixture
def client(daemon: Daemon) -> TestClient:
    return daemon.client


@pytest.fixture
def files_url(sb_id: str) -> Callable[..., str]:
    def url(what: str = "") -> str:
        return f"/v1/sandboxes/{sb_id}/files{what}"
    return url


def test_upload_passes_the_body_limit_and_streams(client: TestClient, daemon: Daemon, sb_id: str,
                                                   files_url: Callable[..., str]) -> None:
    data = os.urandom(2 * MIB)  # far above max_body_bytes (8192), under max_file_bytes

    def body() -> Iterator[bytes]:
        for i in range(0, len(data), 256 * 1024):
            yield data[i:i + 256 * 1024]

    r = client.put(files_url(), params={"path": "/f.bin"}, content=body())
    assert r.status_code == 200, r.text
    assert r.json()["size"] == len(data)
    # The route forwarded pieces, not one buffered body.
    assert len(daemon.guest_requests(sb_id, "file_write")) > 1
    r = client.get(files_url(), params={"path": "/f.bin"})
    assert r.status_code == 200 and r.content == data
    assert r.headers["content-type"] == "application/octet-stream"
    assert r.headers["x-forkd-file-size"] == str(len(data))
    # Other routes keep the small JSON limit.
    r = client.post(f"/v1/sandboxes/{sb_id}/exec", json={"args": ["x" * 10000]})
    assert r.status_code == 413


def test_too_large_is_413_by_header_and_by_stream(client: TestClient, files_url: Callable[..., str]) -> None:
    r = client.put(files_url(), params={"path": "/big"}, content=b"x" * (3 * MIB + 1))
    assert r.status_code == 413 and "3145728-byte limit" in r.json()["error"]

    def body() -> Iterator[bytes]:  # chunked: no Content-Length to refuse up front
        for _ in range(4):
            yield b"x" * MIB

    r = client.put(files_url(), params={"path": "/big"}, content=body())
    assert r.status_code == 413 and "error" in r.json()
    assert client.get(files_url("/stat"), params={"path": "/big"}).status_code == 404


@pytest.mark.parametrize("path", ["relative", "/a\0b", "/" + "a" * 5000, ""])
def test_bad_paths_are_400(client: TestClient, files_url: Callable[..., str], path: str) -> None:
    for r in (client.get(files_url(), params={"path": path}),
              client.put(files_url(), params={"path": path}, content=b"x"),
              client.get(files_url("/stat"), params={"path": path}),
              client.get(files_url("/list"), params={"path": path}),
              client.delete(files_url(), params={"path": path}),
              client.post(files_url("/mkdir"), json={"path": path})):
        assert r.status_code == 400, (r.request.method, r.request.url, r.text)
        assert r.json()["error"]


def test_missing_is_404_and_directories_are_409(client: TestClient, files_url: Callable[..., str]) -> None:
    assert client.get(files_url(), params={"path": "/nope"}).status_code == 404
    assert client.get(files_url(), params={"path": "/nope"}).json()["error"]
    assert client.get("/v1/sandboxes/sb-000000-0000/files", params={"path": "/x"}).status_code == 404
    assert client.post(files_url("/mkdir"), json={"path": "/d"}).json() == {"path": "/d", "created": True}
    assert client.get(files_url(), params={"path": "/d"}).status_code == 409
    assert client.put(files_url(), params={"path": "/d"}, content=b"x").status_code == 409
    assert client.put(files_url(), params={"path": "/d/f"}, content=b"x").status_code == 200
    assert client.delete(files_url(), params={"path": "/d"}).status_code == 409
    listing = client.get(files_url("/list"), params={"path": "/d"}).json()
    assert [e["name"] for e in listing["entries"]] == ["f"] and listing["truncated"] is False
    assert client.delete(files_url(), params={"path": "/d", "recursive": "true"}).status_code == 204
    assert client.get(files_url("/stat"), params={"path": "/d"}).status_code == 404


def test_only_file_uploads_skip_the_body_limit() -> None:
    assert streams_body({"method": "PUT", "path": f"/v1/sandboxes/{SB}/files"})
    assert not streams_body({"method": "POST", "path": f"/v1/sandboxes/{SB}/files/mkdir"})
    assert not streams_body({"method": "PUT", "path": "/v1/snapshots/py/pool"})


# ------------------------------------------------------------------- the SDK


def test_sdk_files_round_trip(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", audit_log=tmp_path / "audit.log")

    async def scenario() -> None:
        async with open_runtime(tmp_path) as rt:
            [record] = await rt.spawn("py")
            await against(create_app(settings, runtime=rt), record.id)

    async def against(app: Any, sb_id: str) -> None:
        transport = httpx.ASGITransport(app=app)
        async with AsyncController("http://forkd", transport=transport) as c:
            sb = AsyncSandbox(sandbox_id=sb_id, controller=c)
            assert await sb.files.mkdir("/w") is True
            info = await sb.files.write("/w/a.txt", "hello")
            assert info["size"] == 5
            seen: list[int] = []
            data = os.urandom(3 * MIB + 5)
            await c.write_file(sb_id, "/w/b.bin", io.BytesIO(data), progress=seen.append)
            assert seen[-1] == len(data) and len(seen) == 4  # read a piece at a time
            assert await sb.files.read("/w/a.txt") == b"hello"
            assert await sb.files.read("/w/b.bin") == data
            local = tmp_path / "b.bin"
            assert await sb.files.download("/w/b.bin", local) == len(data)
            assert local.read_bytes() == data
            assert [e["name"] for e in await sb.files.list("/w")] == ["a.txt", "b.bin"]
            assert (await sb.files.stat("/w"))["type"] == "dir"
            await sb.files.remove("/w/a.txt")
            assert await sb.files.exists("/w/a.txt") is False
            with pytest.raises(NotFoundError):
                await sb.files.read("/w/a.txt")

    asyncio.run(scenario())
