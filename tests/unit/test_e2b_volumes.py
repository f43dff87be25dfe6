"""E2B's volumes (api/e2b/volumes.py, volume_content.py) through the published SDK's ``Volume``:
its own requests, sent to the daemon's app (only the SDK's transport is swapped for one that hands
each request to the test client), and its own parsing and exceptions on the answers.

The runtime's volumes are a stand-in here (``DirVolumes``): the ``hostdir`` volumes and their
``HostDir`` (``rt.volumes.files``) are the controller's and host's part, not yet on this branch.
``DirFiles`` implements HostDir's methods over a real directory, with its errors (forkd's
NotFound/InvalidRequest/Conflict); ownership is recorded beside the files, so the tests need no
root. Swap in the real ``Volumes`` (fs="hostdir") and ``HostDir`` once they land.
"""

from __future__ import annotations

import dataclasses
import io
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
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
from forkd.errors import Conflict, InvalidRequest, NotFound
from forkd.guest.volume_messages import MAX_SLOTS, VolAttr, VolDirEntry, check_path
from forkd.store.records import VolumeRecord
from tests.fakes.app import TOKEN, Daemon, daemon_app

KEY = {"X-API-KEY": TOKEN}
MAX_FILE = 1 << 16
URL = "http://testserver"

# ------------------------------------------------------------------ the stand-ins


class DirFiles:
    """HostDir's methods (forkd.host.volume_dir) over a real directory: a stand-in for the IO."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.owners: dict[str, tuple[int, int]] = {}

    def _at(self, path: str) -> Path:
        return self.root / check_path(path) if path else self.root

    def stat(self, path: str) -> VolAttr:
        try:
            st = os.lstat(self._at(path))
        except FileNotFoundError:
            raise NotFound(f"no such file or directory: {path!r}") from None
        uid, gid = self.owners.get(path, (1000, 1000))
        return VolAttr(mode=st.st_mode, nlink=st.st_nlink, uid=uid, gid=gid, size=st.st_size,
                       blocks=st.st_blocks, atime_ns=st.st_atime_ns, mtime_ns=st.st_mtime_ns,
                       ctime_ns=st.st_ctime_ns)

    def listdir(self, path: str) -> list[VolDirEntry]:
        try:
            return [VolDirEntry(name=e.name, mode=stat.S_IFMT(e.stat(follow_symlinks=False).st_mode))
                    for e in os.scandir(self._at(path))]
        except FileNotFoundError:
            raise NotFound(f"no such directory: {path!r}") from None

    def mkdir(self, path: str, *, parents: bool = False, uid: int = 1000, gid: int = 1000,
              mode: int = 0o755) -> None:
        try:
            (os.makedirs if parents else os.mkdir)(self._at(path), mode)
        except FileExistsError:
            raise Conflict(f"{path!r} exists") from None
        except FileNotFoundError:
            raise NotFound(f"the parent of {path!r} does not exist") from None
        os.chmod(self._at(path), mode)
        self.owners[path] = (uid, gid)

    def remove(self, path: str, *, recursive: bool = False) -> None:
        at = self._at(path)
        if at.is_dir() and not at.is_symlink():
            if not recursive:
                raise Conflict(f"{path!r} is a directory")
            shutil.rmtree(at)
        else:
            at.unlink()

    def write_file(self, path: str, chunks: Iterable[bytes], *, uid: int = 1000, gid: int = 1000,
                   mode: int = 0o644) -> VolAttr:
        at = self._at(path)
        if not at.parent.is_dir():
            raise NotFound(f"the parent of {path!r} does not exist")
        part = at.with_name(f".{at.name}.part")
        try:
            with part.open("wb") as out:
                for chunk in chunks:
                    out.write(chunk)
            os.chmod(part, mode)
            os.replace(part, at)
        finally:
            part.unlink(missing_ok=True)
        self.owners[path] = (uid, gid)
        return self.stat(path)

    def read_file(self, path: str) -> Iterator[bytes]:
        with self._at(path).open("rb") as f:
            while piece := f.read(1 << 14):
                yield piece

    def chmod_chown(self, path: str, mode: int | None = None, uid: int | None = None,
                    gid: int | None = None) -> None:
        was = self.stat(path)
        if mode is not None:
            os.chmod(self._at(path), mode)
        self.owners[path] = (was["uid"] if uid is None else uid, was["gid"] if gid is None else gid)


class DirVolumes:
    """``rt.volumes`` as the E2B layer calls it (create, get, all, delete, files): a stand-in."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.records: dict[str, VolumeRecord] = {}
        self.users: dict[str, list[str]] = {}
        self._files: dict[str, DirFiles] = {}  # one per volume: its owners map lives there
        self._clock = 1_800_000_000

    async def create(self, name: str, *, size_mib: int, fs: str = "ext4") -> VolumeRecord:
        if name in self.records:
            raise Conflict(f"volume {name!r} already exists; delete it first")
        self._clock += 1  # each volume made at its own second: its token is its own
        self.records[name] = VolumeRecord(name=name, size_bytes=size_mib << 20, fs=fs,
                                          created_at_unix=self._clock)
        (self.root / name / "files").mkdir(parents=True)
        return self.records[name]

    def get(self, name: str) -> VolumeRecord:
        if name not in self.records:
            raise NotFound(f"no volume named {name!r}")
        return self.records[name]

    def all(self) -> list[VolumeRecord]:
        return list(self.records.values())

    def delete(self, name: str) -> None:
        if self.users.get(name):
            raise Conflict(f"volume {name!r} is in use by {', '.join(self.users[name])}")
        del self.records[self.get(name).name]
        self._files.pop(name, None)
        shutil.rmtree(self.root / name)

    def files(self, name: str) -> DirFiles:
        if self.get(name).fs != "hostdir":
            raise InvalidRequest(f"volume {name!r} is not a hostdir volume")
        return self._files.setdefault(name, DirFiles(self.root / name / "files"))


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
        monkeypatch.setattr(d.runtime, "volumes", DirVolumes(tmp_path / "volumes"))
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


def stand_in(daemon: Daemon) -> DirVolumes:
    volumes = daemon.runtime.volumes
    assert isinstance(volumes, DirVolumes)
    return volumes


def content_error(resp: httpx.Response, status: int) -> str:
    """The content API's error shape: its spec's ``Error``, the code a string."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"code", "message"} and body["code"] == str(status), body
    return str(body["message"])


# ------------------------------------------------------------------ the control plane


def test_volumes_are_created_listed_got_and_destroyed_through_the_sdk(daemon: Daemon) -> None:
    vol = Volume.create("data")
    record = stand_in(daemon).get("data")
    assert (vol.volume_id, vol.name, record.fs) == ("data", "data", "hostdir")
    assert record.size_bytes >> 20 == 1024  # E2B gives no size: forkd's default is its quota
    assert vol.token == AccessTokens(TOKEN.encode()).volume("data", record.created_at_unix)
    daemon.run(stand_in(daemon).create, "disk", size_mib=16, fs="ext4")  # forkd's own kind
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
    stand_in(daemon).users["data"] = ["sb-1"]
    with pytest.raises(VolumeException, match=r"409.*in use by sb-1"):
        Volume.destroy("data")
    stand_in(daemon).users.clear()
    assert Volume.destroy("data") is True
    assert Volume.destroy("data") is False
    assert Volume.destroy("disk") is False  # not E2B's to delete
    assert "disk" in stand_in(daemon).records
    assert daemon.client.get("/volumes").status_code == 401  # the API key, as for every E2B call
    bad = daemon.client.post("/volumes", headers=KEY, json={"name": "x", "size": 5})
    assert bad.status_code == 400 and "unknown field 'size'" in bad.json()["message"]


# ------------------------------------------------------------------ the content API


def test_volume_files_round_trip_through_the_sdk(daemon: Daemon) -> None:
    vol = Volume.create("work")
    root = stand_in(daemon).root / "work" / "files"
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
    # A volume made again under the name has a new token: the old one opens nothing.
    Volume.destroy("mine")
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
    root = stand_in(daemon).root / "w" / "files"
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
    daemon.run(stand_in(daemon).create, "disk", size_mib=16, fs="ext4")

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


@pytest.mark.skipif("volumes" not in {f.name for f in dataclasses.fields(SpawnOptions)},
                    reason="SpawnOptions.volumes (spawn-time shared volumes) is the controller's part, "
                           "not yet on this branch")
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
