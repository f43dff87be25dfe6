"""File metadata (E2B's, envd 0.6.2): user.e2b.* extended attributes; and watch events that
carry their entry (envd 0.6.3), metadata included.

The agent's handling runs in-process on real xattrs in a tmp dir; the bounds are
``protocol.check_metadata``'s, applied by the E2B layer to the headers, by the
daemon before the guest is asked and again to what the guest answers; the E2B
layer's mapping (``X-Metadata-*`` headers in, ``metadata`` out) runs on the real Runtime.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import os
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from forkd.api import file_routes
from forkd.api.e2b.tokens import AccessTokens
from forkd.controller import files as controller_files
from forkd.controller.watches import _batch
from forkd.errors import Conflict, GuestError, InvalidRequest
from forkd.guest import capabilities, protocol
from forkd.guest.agent import fileinfo as agent_fileinfo
from forkd.guest.agent.files import Files
from forkd.guest.agent.uploads import Uploads
from forkd.guest.agent.watches import Watches
from forkd.guest.client import require
from forkd.guest.protocol import INVALID, RequestError
from tests.fakes.app import AUTH, TOKEN, Daemon, daemon_app

SB = "sb-67a1b3-0000"
PREFIX = protocol.METADATA_XATTR_PREFIX


def xattrs_work(where: Path) -> bool:
    probe = where / ".probe"
    probe.write_bytes(b"")
    try:
        os.setxattr(probe, "user.forkd-probe", b"1")
        return True
    except OSError:
        return False
    finally:
        probe.unlink()


@pytest.fixture
def xdir(tmp_path: Path) -> Path:
    if not xattrs_work(tmp_path):
        pytest.skip("this filesystem has no user extended attributes")
    return tmp_path


def upload(path: Path, data: bytes, metadata: dict[str, str] | None = None) -> dict[str, Any]:
    up = Uploads()
    req: dict[str, Any] = {"path": str(path)}
    if metadata is not None:
        req["metadata"] = metadata
    handle = up.write_open(req)["handle"]
    up.write({"handle": handle, "offset": 0, "data": base64.b64encode(data).decode()})
    return up.write_close({"handle": handle, "commit": True})


# ------------------------------------------------------------------- bounds


@pytest.mark.parametrize(("metadata", "why"), [
    ([("a", "b")], "object"),
    ({"": "v"}, "keys"),
    ({"bad\nkey": "v"}, "keys"),
    ({"k" * (protocol.METADATA_KEY_MAX + 1): "v"}, "keys"),
    ({"ü": "v"}, "keys"),
    ({"k": "bad\nvalue"}, "printable"),
    ({"k": "é"}, "printable"),
    ({"k": 1}, "printable"),
    ({f"k{i}": "" for i in range(protocol.METADATA_MAX_KEYS + 1)}, "at most"),
    ({"a": "v" * protocol.METADATA_TOTAL_MAX}, "bytes"),
])
def test_bad_metadata_is_refused_everywhere(metadata: Any, why: str) -> None:
    with pytest.raises(RequestError, match=why) as info:
        protocol.check_metadata(metadata)
    assert info.value.kind == INVALID
    with pytest.raises(InvalidRequest):
        controller_files.check_metadata(metadata)


def test_good_metadata_passes_up_to_its_bounds() -> None:
    assert protocol.check_metadata(None) == {}
    key = "k" * protocol.METADATA_KEY_MAX
    value = "v" * (protocol.METADATA_TOTAL_MAX - len(PREFIX) - len(key))
    assert protocol.check_metadata({key: value}) == {key: value}
    assert protocol.check_metadata({"Mixed Case!~": " spaced "}) == {"Mixed Case!~": " spaced "}


def test_the_daemon_refuses_malformed_metadata_from_the_guest() -> None:
    entry = {"path": "/f", "name": "f", "type": "file", "size": 1, "mode": 0o644, "mtime": 1.0}
    assert controller_files.checked_info({**entry, "metadata": {"a": "b"}})["metadata"] == {"a": "b"}
    assert "metadata" not in controller_files.checked_info(entry)
    for bad in ({"a": 1}, {"a": "x" * 5000}, "a=b", {"": "b"}, {"a": "\x00"}):
        with pytest.raises(GuestError, match="metadata"):
            controller_files.checked_info({**entry, "metadata": bad})


# ------------------------------------------------------------- the agent, on real xattrs


def test_an_upload_lands_with_its_metadata_and_an_overwrite_clears_it(xdir: Path) -> None:
    target = xdir / "f.txt"
    info = upload(target, b"one", {"author": "mish", "purpose": "upload"})
    assert info["metadata"] == {"author": "mish", "purpose": "upload"}
    assert os.getxattr(target, PREFIX + "author") == b"mish"
    assert Files.stat({"path": str(target)})["metadata"] == {"author": "mish", "purpose": "upload"}
    listed = Files.list({"path": str(xdir)})["entries"]
    assert [e.get("metadata") for e in listed] == [{"author": "mish", "purpose": "upload"}]
    moved = Files.move({"source": str(target), "destination": str(xdir / "g.txt")})
    assert moved["metadata"] == {"author": "mish", "purpose": "upload"}
    # Without metadata, the new file has none: the old file's went with it.
    info = upload(xdir / "g.txt", b"two")
    assert "metadata" not in info and "metadata" not in Files.stat({"path": str(xdir / "g.txt")})
    assert sorted(p.name for p in xdir.iterdir()) == ["g.txt"]  # no temp file left


def test_metadata_is_set_before_the_rename(xdir: Path) -> None:
    """The target keeps its old content and metadata until the upload commits."""
    target = xdir / "f"
    upload(target, b"old", {"v": "1"})
    up = Uploads()
    handle = up.write_open({"path": str(target), "metadata": {"v": "2"}})["handle"]
    temp = next(p for p in xdir.iterdir() if p.name != "f")
    assert os.getxattr(temp, PREFIX + "v") == b"2"
    assert Files.stat({"path": str(target)})["metadata"] == {"v": "1"}
    assert up.write_close({"handle": handle, "commit": False}) == {"aborted": True}
    assert Files.stat({"path": str(target)})["metadata"] == {"v": "1"}


def test_the_agent_shows_only_e2b_pairs_within_bounds(xdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = xdir / "f"
    target.write_bytes(b"x")
    os.setxattr(target, PREFIX + "author", b"mish")  # set out of band: shown
    os.setxattr(target, "user.other", b"x")  # not E2B's: not shown
    os.setxattr(target, PREFIX + "binary", b"\xff\x00")  # not printable ASCII: left out
    os.setxattr(target, PREFIX + "zbig", b"v" * 100)  # past the total (ext4 holds no 4 KiB more)
    monkeypatch.setattr(agent_fileinfo, "METADATA_TOTAL_MAX", 60)
    assert Files.stat({"path": str(target)})["metadata"] == {"author": "mish"}


def test_a_link_shows_its_targets_metadata_on_stat_not_in_a_listing(xdir: Path) -> None:
    upload(xdir / "f", b"x", {"k": "v"})
    (xdir / "d").mkdir()
    (xdir / "d" / "link").symlink_to(xdir / "f")
    assert Files.stat({"path": str(xdir / "d" / "link")})["metadata"] == {"k": "v"}
    assert "metadata" not in Files.list({"path": str(xdir / "d")})["entries"][0]


def test_the_agent_refuses_bad_metadata_before_making_a_temp_file(xdir: Path) -> None:
    with pytest.raises(RequestError) as info:
        Uploads().write_open({"path": str(xdir / "f"), "metadata": {"bad key\n": "v"}})
    assert info.value.kind == INVALID
    assert list(xdir.iterdir()) == []


def test_a_filesystem_without_xattrs_refuses_the_upload_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def unsupported(*_args: Any, **_kwargs: Any) -> None:
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr(os, "setxattr", unsupported)
    with pytest.raises(RequestError, match="not supported") as info:
        Uploads().write_open({"path": str(tmp_path / "f"), "metadata": {"k": "v"}})
    assert info.value.kind == INVALID
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------- the daemon's owner


class _Sandboxes:
    """An AgentGateway stand-in: records calls, answers as an agent of ``version`` would."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def require_user_support(self, sandbox_id: str, user: str | None) -> None:
        pass

    async def require_agent(self, sandbox_id: str, *features: str) -> None:
        require(capabilities.Capabilities.of({"agent_version": str(self.version)}), *features)

    async def call(self, sandbox_id: str, ask: Callable[[Any], Awaitable[Any]]) -> Any:
        """The gateway's typed call, on an agent that answers the upload's three actions."""
        actions = (protocol.FILE_WRITE_OPEN, protocol.FILE_WRITE, protocol.FILE_WRITE_CLOSE)
        return await ask(SimpleNamespace(**{a: functools.partial(self._answer, a) for a in actions}))

    async def _answer(self, action: str, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.calls.append((action, dict(req)))
        if action == protocol.FILE_WRITE_OPEN:
            return {"handle": "h"}
        return {"path": "/f", "name": "f", "type": "file", "size": 1, "mode": 0o644, "mtime": 1.0,
                **({"metadata": {"k": "v"}} if action == protocol.FILE_WRITE_CLOSE else {})}


async def _one_piece() -> Any:
    yield b"x"


def test_the_owner_passes_metadata_on_and_asks_for_an_agent_that_keeps_it() -> None:
    table = _Sandboxes(protocol.METADATA_AGENT_VERSION)
    files = controller_files.SandboxFiles(table)  # type: ignore[arg-type]
    info = asyncio.run(files.write(SB, "/f", _one_piece(), max_bytes=10, metadata={"k": "v"}))
    assert info["metadata"] == {"k": "v"}
    assert table.calls[0] == (protocol.FILE_WRITE_OPEN, {"path": "/f", "metadata": {"k": "v"}})
    # No metadata: none is sent, and any agent will do.
    old = _Sandboxes(protocol.METADATA_AGENT_VERSION - 1)
    asyncio.run(controller_files.SandboxFiles(old).write(  # type: ignore[arg-type]
        SB, "/f", _one_piece(), max_bytes=10))
    assert old.calls[0] == (protocol.FILE_WRITE_OPEN, {"path": "/f"})
    with pytest.raises(Conflict, match="file metadata"):
        asyncio.run(controller_files.SandboxFiles(old).write(  # type: ignore[arg-type]
            SB, "/f", _one_piece(), max_bytes=10, metadata={"k": "v"}))
    with pytest.raises(InvalidRequest):
        asyncio.run(files.write(SB, "/f", _one_piece(), max_bytes=10, metadata={"": "v"}))


# ------------------------------------------------------------- the E2B layer, on the real Runtime


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with daemon_app(tmp_path, snapshots=("base",), max_file_bytes=1 << 20) as d:
        yield d


@pytest.fixture
def sb_id(daemon: Daemon) -> str:
    return daemon.sandbox("base").id


@pytest.fixture
def client(daemon: Daemon) -> TestClient:
    return daemon.client


@pytest.fixture
def envd(sb_id: str) -> Callable[..., dict[str, str]]:
    def headers(**extra: str) -> dict[str, str]:
        return {"E2b-Sandbox-Id": sb_id, "E2b-Sandbox-Port": "49983",
                "X-Access-Token": AccessTokens(TOKEN.encode()).envd(sb_id), **extra}
    return headers


def test_metadata_headers_are_read_as_envd_reads_them() -> None:
    got = file_routes.metadata_headers([("x-metadata-Author", "mish"), ("content-type", "x"),
                                    ("X-METADATA-author", "second"), ("x-metadata-tag", "")])
    assert got == {"author": "mish", "tag": ""}
    for bad in ([("x-metadata-", "v")], [("x-metadata-k", "bad\x7f")],
                [(f"x-metadata-k{i}", "v") for i in range(protocol.METADATA_MAX_KEYS + 5)]):
        with pytest.raises(InvalidRequest):
            file_routes.metadata_headers(bad)


def test_uploads_stat_list_and_move_carry_metadata(client: TestClient,
                                                   envd: Callable[..., dict[str, str]]) -> None:
    up = client.post("/files", params={"path": "a.txt"}, content=b"one",
                     headers=envd(**{"Content-Type": "application/octet-stream",
                                     "X-Metadata-Author": "mish"}))
    assert up.status_code == 200, up.text
    assert up.json() == [{"name": "a.txt", "type": "file", "path": "/home/user/a.txt",
                          "metadata": {"author": "mish"}}]
    multi = client.post("/files", headers=envd(**{"X-Metadata-Source": "suite"}),
                        files=[("file", ("/tmp/m1", b"1")), ("file", ("/tmp/m2", b"2"))])
    assert [f["metadata"] for f in multi.json()] == [{"source": "suite"}, {"source": "suite"}]
    stat = client.post("/filesystem.Filesystem/Stat", json={"path": "a.txt"}, headers=envd())
    assert stat.json()["entry"]["metadata"] == {"author": "mish"}
    listed = client.post("/filesystem.Filesystem/ListDir", json={"path": "/tmp"}, headers=envd())
    assert [e.get("metadata") for e in listed.json()["entries"]] == [{"source": "suite"}] * 2
    moved = client.post("/filesystem.Filesystem/Move", json={"source": "a.txt", "destination": "b.txt"},
                        headers=envd())
    assert moved.json()["entry"]["metadata"] == {"author": "mish"}
    # An upload without metadata headers replaces the file and its metadata.
    again = client.post("/files", params={"path": "b.txt"}, content=b"two",
                        headers=envd(**{"Content-Type": "application/octet-stream"}))
    assert "metadata" not in again.json()[0]
    stat = client.post("/filesystem.Filesystem/Stat", json={"path": "b.txt"}, headers=envd())
    assert "metadata" not in stat.json()["entry"]


def test_bad_metadata_headers_are_400_and_write_nothing(client: TestClient, daemon: Daemon, sb_id: str,
                                                        envd: Callable[..., dict[str, str]]) -> None:
    resp = client.post("/files", params={"path": "/tmp/x"}, content=b"x",
                       headers=envd(**{"Content-Type": "application/octet-stream",
                                       "X-Metadata-K": "v" * (protocol.METADATA_TOTAL_MAX + 1)}))
    assert resp.status_code == 400 and "at most 4096" in resp.json()["message"]
    assert daemon.guest_requests(sb_id, "file_write_open") == []


# ------------------------------------------------------------- watch events with their entry (0.6.3)


def test_a_watcher_with_entries_answers_each_event_with_what_it_names(xdir: Path) -> None:
    watches = Watches()
    plain = watches.handle({"op": "create", "path": str(xdir)})["watcher"]
    watcher = watches.handle({"op": "create", "path": str(xdir), "entries": True})["watcher"]
    upload(xdir / "f.txt", b"data", {"k": "v"})
    os.rename(xdir / "f.txt", xdir / "g.txt")
    (xdir / "gone").write_bytes(b"")
    (xdir / "gone").unlink()
    got = watches.handle({"op": "events", "watcher": watcher, "wait_ms": 500})["events"]
    by_type = {(e["name"], e["type"]): e.get("entry") for e in got}
    # f.txt was renamed before the poll: its create/write name what is no longer there.
    assert by_type[("f.txt", "write")] is None and by_type[("f.txt", "rename")] is None
    entry = by_type[("g.txt", "create")]
    assert entry is not None and entry["path"] == str(xdir / "g.txt") and entry["type"] == "file"
    assert entry["metadata"] == {"k": "v"} and by_type[("gone", "remove")] is None
    checked = _batch({"events": got})  # what the daemon accepts of it
    assert [ev.entry for ev in checked.events if ev.name == "g.txt"] == [controller_files.checked_info(entry)]
    assert all("entry" not in e for e in watches.handle(
        {"op": "events", "watcher": plain, "wait_ms": 0})["events"])
    for w in (plain, watcher):
        watches.handle({"op": "remove", "watcher": w})


def test_the_daemon_refuses_a_malformed_entry() -> None:
    with pytest.raises(GuestError, match="entry"):
        _batch({"events": [{"name": "a", "type": "write", "entry": "x"}]})
    with pytest.raises(GuestError, match=r"'events'\[0\]\.entry\.path must be a string"):  # the field named
        _batch({"events": [{"name": "a", "type": "write", "entry": {"path": 1}}]})


def test_envd_watch_options_map_to_forkds(client: TestClient, daemon: Daemon, sb_id: str,
                                          envd: Callable[..., dict[str, str]]) -> None:
    options = {"path": "/tmp", "includeEntry": True, "allowNetworkMounts": True}
    made = client.post("/filesystem.Filesystem/CreateWatcher", json=options, headers=envd())
    watcher = made.json()["watcherId"]
    assert daemon.guest_requests(sb_id, "watch")[-1]["entries"] is True
    url = f"/v1/sandboxes/{sb_id}/files"
    assert client.put(url, params={"path": "/tmp/f"}, content=b"abc", headers=AUTH).status_code == 200

    def poll() -> list[dict[str, Any]]:
        return list(client.post("/filesystem.Filesystem/GetWatcherEvents", json={"watcherId": watcher},
                                headers=envd()).json()["events"])

    got = poll()
    assert got[0]["entry"]["path"] == "/tmp/f" and got[0]["entry"]["type"] == "FILE_TYPE_FILE"
    assert client.delete(url, params={"path": "/tmp/f"}, headers=AUTH).status_code == 204
    [removed] = poll()
    assert "entry" not in removed  # it names nothing any more
    plain = client.post("/filesystem.Filesystem/CreateWatcher", json={"path": "/tmp"}, headers=envd())
    assert "entries" not in daemon.guest_requests(sb_id, "watch")[-1] and plain.status_code == 200


# ------------------------------------------------------------- forkd's own /v1 files API


def test_v1_uploads_take_metadata_headers_and_file_infos_show_it(client: TestClient, sb_id: str) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    url = f"/v1/sandboxes/{sb_id}/files"
    up = client.put(url, params={"path": "/tmp/v1"}, content=b"x", headers={**auth, "X-Metadata-Tag": "t"})
    assert up.status_code == 200 and up.json()["metadata"] == {"tag": "t"}, up.text
    stat = client.get(f"{url}/stat", params={"path": "/tmp/v1"}, headers=auth).json()
    assert stat["metadata"] == {"tag": "t"}
    listed = client.get(f"{url}/list", params={"path": "/tmp"}, headers=auth).json()["entries"]
    assert [e["metadata"] for e in listed] == [{"tag": "t"}]
    again = client.put(url, params={"path": "/tmp/v1"}, content=b"y", headers=auth)
    assert again.json()["metadata"] is None
    bad = client.put(url, params={"path": "/tmp/v1"}, content=b"z", headers={**auth, "X-Metadata-K": "\x7f"})
    assert bad.status_code == 400
