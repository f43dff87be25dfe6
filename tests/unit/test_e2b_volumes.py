"""E2B's volumes (api/e2b/volumes.py, volume_content.py) through the published SDK's ``Volume``:
its own requests, sent to the daemon's app (only the SDK's transport is swapped for one that hands
each request to the test client), and its own parsing and exceptions on the answers.

The runtime is the real one over the QEMU double (tests/fakes/app.py): its ``Volumes`` makes the
hostdir volumes and their ``HostDir`` serves the files, on real directories. A volume in use by
sandboxes (409) is the VM test's (tests/integration/test_compat_clients.py, e2b/volumes.py).
"""

from __future__ import annotations

import dataclasses
import io
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import Volume
from e2b.api.client.models import SandboxVolumeMount
from e2b.exceptions import AuthenticationException, NotFoundException, VolumeException
from e2b.volume import volume_sync
from e2b.volume.client.client import AuthenticatedClient as VolumeApiClient
from fastapi.testclient import TestClient

from forkd.api.e2b import volume_content
from forkd.api.e2b.tokens import AccessTokens
from forkd.controller.options import SpawnOptions
from forkd.guest.volume_messages import MAX_SLOTS
from tests.fakes.app import TOKEN, Daemon, daemon_app

KEY = {"X-API-KEY": TOKEN}
MAX_FILE = 1 << 16
URL = "http://testserver"

# ------------------------------------------------------------------ the SDK, on the test client


def relay(client: TestClient) -> httpx.MockTransport:
    """A transport that hands each of the SDK's requests, as it made it, to the app."""

    def handle(request: httpx.Request) -> httpx.Response:
        headers = {k: v for k, v in request.headers.items() if k not in ("host", "content-length",
                                                                        "transfer-encoding")}
        answer = client.request(request.method, request.url.raw_path.decode("ascii"), headers=headers,
                                content=request.read())
        kept = [(k, v) for k, v in answer.headers.multi_items()
                if k not in ("content-length", "transfer-encoding", "content-encoding")]
        return httpx.Response(answer.status_code, headers=kept, content=answer.content)

    return httpx.MockTransport(handle)


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    with daemon_app(tmp_path, snapshots=("base",), max_file_bytes=MAX_FILE) as d:
        transport = relay(d.client)
        from e2b.api import ApiClient

        def content_client(config: Any, **_: Any) -> VolumeApiClient:
            return VolumeApiClient(base_url=config.api_url, token=config.access_token, prefix="Bearer",
                                   auth_header_name="Authorization", httpx_args={"transport": transport})

        monkeypatch.setattr(volume_sync, "get_core_api_client",
                            lambda config, **_: ApiClient(config, transport=transport))
        monkeypatch.setattr(volume_sync, "get_volume_api_client", content_client)
        monkeypatch.setattr(volume_sync, "get_streaming_volume_api_client", content_client)
        monkeypatch.setenv("E2B_API_KEY", TOKEN)
        monkeypatch.setenv("E2B_API_URL", URL)
        monkeypatch.setenv("E2B_VOLUME_API_URL", URL)
        yield d


def volumes(daemon: Daemon) -> Any:
    return daemon.runtime.volumes


def content_error(resp: httpx.Response, status: int) -> str:
    """The content API's error shape: its spec's ``Error``, the code a string."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"code", "message"} and body["code"] == str(status), body
    return str(body["message"])


# ------------------------------------------------------------------ the control plane


def test_volumes_are_created_listed_got_and_destroyed_through_the_sdk(daemon: Daemon) -> None:
    vol = Volume.create("data")
    record = volumes(daemon).get("data")
    assert (vol.volume_id, vol.name, record.fs) == ("data", "data", "hostdir")
    assert record.size_bytes >> 20 == 1024  # E2B gives no size: forkd's default is its quota
    assert vol.token == AccessTokens(TOKEN.encode()).volume("data", record.created_at_unix)
    daemon.run(volumes(daemon).create, "disk", size_mib=16, fs="ext4")  # forkd's own kind
    assert [v.name for v in Volume.list()] == ["data"]
    info = Volume.get_info("data")
    assert (info.volume_id, info.name, info.token) == ("data", "data", vol.token)
    assert Volume.connect("data").token == vol.token
    with pytest.raises(NotFoundException):
        Volume.get_info("disk")  # an ext4 volume is not E2B's
    with pytest.raises(VolumeException, match=r"409.*already exists"):
        Volume.create("data")
    with pytest.raises(VolumeException, match=r"400.*volume name"):
        Volume.create("no/slashes")
    assert Volume.destroy("data") is True
    assert Volume.destroy("data") is False
    assert Volume.destroy("disk") is False  # not E2B's to delete
    assert volumes(daemon).get("disk").fs == "ext4"
    assert daemon.client.get("/volumes").status_code == 401  # the API key, as for every E2B call
    bad = daemon.client.post("/volumes", headers=KEY, json={"name": "x", "size": 5})
    assert bad.status_code == 400 and "unknown field 'size'" in bad.json()["message"]


# ------------------------------------------------------------------ the content API


def test_volume_files_round_trip_through_the_sdk(daemon: Daemon) -> None:
    vol = Volume.create("work")
    root = volumes(daemon).files_dir("work")
    made = vol.write_file("/a.txt", "hello")
    assert (made.name, made.path, made.type.value, made.size) == ("a.txt", "/a.txt", "file", 5)
    assert (made.mode, made.uid, made.gid) == (0o644, 1000, 1000)  # the sandboxes' user
    assert (root / "a.txt").read_bytes() == b"hello"
    assert vol.read_file("/a.txt") == "hello"
    data = bytes(range(256)) * 100
    vol.write_file("/bin.dat", io.BytesIO(data), mode=0o600, uid=0, gid=0)
    assert vol.read_file("/bin.dat", format="bytes") == data
    assert b"".join(vol.read_file("/bin.dat", format="stream")) == data
    info = vol.get_info("/bin.dat")
    assert (info.mode, info.uid, info.gid, info.size) == (0o600, 0, 0, len(data))
    with pytest.raises(VolumeException, match=r"409.*already exists"):
        vol.write_file("/a.txt", "again")  # E2B's rule: an overwrite is asked for
    vol.write_file("/a.txt", "again", force=True)
    assert vol.read_file("/a.txt") == "again"
    with pytest.raises(NotFoundException):
        vol.write_file("/no/such/dir/f.txt", "x")

    deep = vol.make_dir("/d/e/f", force=True)
    assert (deep.type.value, deep.path, deep.mode) == ("directory", "/d/e/f", 0o755)
    assert vol.make_dir("/d/e/f", force=True).path == "/d/e/f"  # force: an existing one is fine
    with pytest.raises(VolumeException, match="409"):
        vol.make_dir("/d")
    with pytest.raises(NotFoundException):
        vol.make_dir("/x/y")  # no parents without force
    vol.write_file("/d/e/f/g.txt", "g")
    assert sorted(e.path for e in vol.list("/")) == ["/a.txt", "/bin.dat", "/d"]
    assert [e.path for e in vol.list("/d", depth=3)] == ["/d/e", "/d/e/f", "/d/e/f/g.txt"]
    assert vol.exists("/d/e/f/g.txt") and not vol.exists("/nope")
    with pytest.raises(NotFoundException):
        vol.list("/nope")

    changed = vol.update_metadata("/a.txt", mode=0o640, uid=1001, gid=1002)
    assert (changed.mode, changed.uid, changed.gid) == (0o640, 1001, 1002)
    assert stat.S_IMODE((root / "a.txt").stat().st_mode) == 0o640
    with pytest.raises(NotFoundException):
        vol.update_metadata("/nope", mode=0o644)

    vol.remove("/d")  # a directory goes with everything in it
    assert not (root / "d").exists()
    with pytest.raises(NotFoundException):
        vol.remove("/d")
    assert Volume.destroy("work") and not root.exists()


def test_volume_content_wants_that_volumes_own_token(daemon: Daemon) -> None:
    mine, other = Volume.create("mine"), Volume.create("other")
    with pytest.raises(AuthenticationException):
        Volume("mine", "mine", token=other.token).get_info("/")
    with pytest.raises(AuthenticationException):
        Volume("mine", "mine", token=TOKEN).get_info("/")  # the API key opens no volume's files
    assert mine.get_info("/").type.value == "directory"
    c = daemon.client
    assert "missing volume token" in content_error(c.get("/volumecontent/mine/path?path=/"), 401)
    for_none = c.get("/volumecontent/gone/path?path=/", headers={"Authorization": f"Bearer {mine.token}"})
    assert "invalid volume token" in content_error(for_none, 401)
    # A volume made again under the name (in a later second: the token is bound to the name and the
    # second it was made) has a new token: the old one opens nothing.
    Volume.destroy("mine")
    time.sleep(1.05 - time.time() % 1)
    Volume.create("mine")
    with pytest.raises(AuthenticationException):
        mine.get_info("/")


@pytest.mark.parametrize(("query", "why"), [
    ("path=/a/../b", "'.' or '..'"),
    ("path=" + "a" * (3 * 4096 + 300), "longer than"),
    ("path=/a&path=/b", "given twice"),
    ("path=/a&colour=red", "unknown query parameter 'colour'"),
    ("", "path"),
    ("path=/" + "n" * 256, "longer than 255"),
    ("path=%ff", "UTF-8"),
])
def test_volume_content_bounds_its_queries(daemon: Daemon, query: str, why: str) -> None:
    vol = Volume.create("q")
    auth = {"Authorization": f"Bearer {vol.token}"}
    resp = daemon.client.get(f"/volumecontent/q/path?{query}", headers=auth)
    assert why in content_error(resp, 400)


def test_volume_content_bounds_its_writes(daemon: Daemon) -> None:
    vol = Volume.create("w")
    auth = {"Authorization": f"Bearer {vol.token}"}
    c = daemon.client
    root = volumes(daemon).files_dir("w")
    for query, why in (("path=/f&uid=4294967295", "uid must be"), ("path=/f&mode=99999", "mode must be"),
                       ("path=/f&force=maybe", "force must be"), ("path=/f&gid=-1", "gid must be")):
        assert why in content_error(c.put(f"/volumecontent/w/file?{query}", headers=auth, content=b"x"), 400)
    declared = c.put("/volumecontent/w/file?path=/big", headers=auth, content=b"x" * (MAX_FILE + 1))
    assert f"{MAX_FILE}-byte limit" in content_error(declared, 413)

    def chunks() -> Iterator[bytes]:
        yield b"y" * MAX_FILE
        yield b"y"

    streamed = c.put("/volumecontent/w/file?path=/big", headers=auth, content=chunks())  # no Content-Length
    assert f"{MAX_FILE}-byte limit" in content_error(streamed, 413)
    assert list(root.iterdir()) == []  # nothing of either is left
    assert "depth must be" in content_error(c.get("/volumecontent/w/dir?path=/&depth=0", headers=auth), 400)
    assert "depth must be" in content_error(c.get("/volumecontent/w/dir?path=/&depth=17", headers=auth), 400)
    root_removed = c.delete("/volumecontent/w/path?path=/", headers=auth)
    assert "root cannot be removed" in content_error(root_removed, 400)
    patch = c.patch("/volumecontent/w/path?path=/", headers=auth, json={"owner": 1})
    assert "unknown field 'owner'" in content_error(patch, 400)
    vol.write_file("/f", "f")
    assert "is a directory" in content_error(c.put("/volumecontent/w/file?path=/&force=true", headers=auth,
                                                   content=b"x"), 409)
    assert "not a file" in content_error(c.get("/volumecontent/w/file?path=/", headers=auth), 400)
    assert "not a directory" in content_error(c.get("/volumecontent/w/dir?path=/f", headers=auth), 400)
    assert "not a call of E2B's volume content API" in content_error(
        c.get("/volumecontent/w/tree?path=/", headers=auth), 501)


# ------------------------------------------------------------------ volume_mounts on create


def _create(daemon: Daemon, mounts: list[Any]) -> httpx.Response:
    body = {"templateID": "base", "volumeMounts": mounts}
    return daemon.client.post("/v2/sandboxes", headers=KEY, json=body)


def test_volume_mounts_are_checked_in_the_sdk_shape(daemon: Daemon) -> None:
    Volume.create("shared")
    daemon.run(volumes(daemon).create, "disk", size_mib=16, fs="ext4")

    def refused(mounts: list[Any]) -> str:
        resp = _create(daemon, mounts)
        assert resp.status_code == 400, resp.text
        return str(resp.json()["message"])

    ok = SandboxVolumeMount(name="shared", path="/mnt/a").to_dict()
    assert f"at most {MAX_SLOTS}" in refused([ok] * (MAX_SLOTS + 1))
    assert "volumeMounts[1].path" in refused([ok, {"name": "shared", "path": "relative"}])
    assert "would cover the guest's own" in refused([{"name": "shared", "path": "/etc"}])
    assert "given twice" in refused([ok, ok])
    assert "volumeMounts[0]: volume nope not found" in refused([{"name": "nope", "path": "/mnt/a"}])
    assert "forkd ext4 volume" in refused([{"name": "disk", "path": "/mnt/a"}])
    assert "unknown field 'readOnly'" in refused([{**ok, "readOnly": True}])
    assert "name and path strings" in refused([{"name": "shared"}])
    assert daemon.runtime.list_sandboxes() == []  # nothing started


def test_volume_mounts_reach_the_spawn_as_shared_volumes(daemon: Daemon,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    Volume.create("shared")
    asked: list[Any] = []
    spawn = daemon.runtime.spawn

    async def recorded(template: str, count: int, options: SpawnOptions) -> Any:
        asked.append(options.volumes)
        default = SpawnOptions().volumes
        return await spawn(template, count, dataclasses.replace(options, volumes=default))

    monkeypatch.setattr(daemon.runtime, "spawn", recorded)
    resp = _create(daemon, [SandboxVolumeMount(name="shared", path="/mnt/shared").to_dict()])
    assert resp.status_code == 201, resp.text
    [volumes] = asked
    assert [(v.name, v.mount, v.fork, v.read_only) for v in volumes] == [("shared", "/mnt/shared", "shared",
                                                                          False)]


def test_the_volume_content_app_answers_503_before_the_runtime(tmp_path: Path) -> None:
    app = volume_content.create_volume_content_app(lambda: None, AccessTokens(TOKEN.encode()), MAX_FILE)
    with TestClient(app, raise_server_exceptions=False) as early:
        resp = early.get("/volumecontent/v/path?path=/", headers={"Authorization": "Bearer x"})
        assert "still starting" in content_error(resp, 503)
