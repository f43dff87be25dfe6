"""Volumes (controller/volumes.py, store/volume_spec.py, vmm/volume_image.py): the /v1/volumes
resource on a real runtime over the QEMU double, the attach request's checks, and the device
config a volume adds. Real VMs: tests/integration/test_volumes.py."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from forkd.errors import InvalidRequest
from forkd.host.accel import Accel, VMConfig
from forkd.store import snapshot_meta
from forkd.store.records import SnapshotRecord
from forkd.store.volume_spec import VolumeMount
from forkd.vmm import disk as disk_mod
from forkd.vmm.cmdline import LaunchSpec, VolumeDrive, build_argv
from tests.fakes.app import AUTH, Daemon, daemon_app


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with daemon_app(tmp_path, headers=AUTH) as d:
        yield d


@pytest.fixture
def client(daemon: Daemon) -> TestClient:
    return daemon.client


def error(resp: Any, status: int) -> str:
    assert resp.status_code == status, resp.text
    assert set(resp.json()) == {"error"}
    return str(resp.json()["error"])


def volume_files(daemon: Daemon) -> list[str]:
    root = daemon.data / "volumes"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def test_a_volume_is_created_listed_and_deleted(client: TestClient, daemon: Daemon) -> None:
    made = client.post("/v1/volumes", json={"name": "data", "size_mib": 64})
    assert made.status_code == 201, made.text
    assert made.json()["size_mib"] == 64 and made.json()["fs"] == "ext4"
    assert made.json()["snapshots"] == []
    # Its quota is the disk's size: what the guest sees, and the most the host file holds.
    assert disk_mod.qcow2_virtual_size(daemon.data / "volumes" / "data" / "disk.qcow2") == 64 << 20
    assert [v["name"] for v in client.get("/v1/volumes").json()] == ["data"]
    assert client.get("/v1/volumes/data").json()["name"] == "data"
    assert "already exists" in error(client.post("/v1/volumes", json={"name": "data"}), 409)
    assert client.delete("/v1/volumes/data").status_code == 204
    error(client.get("/v1/volumes/data"), 404)
    assert volume_files(daemon) == []


def test_a_volume_in_use_is_not_deleted_and_its_users_are_named(client: TestClient, daemon: Daemon) -> None:
    assert client.post("/v1/volumes", json={"name": "data", "size_mib": 16}).status_code == 201
    daemon.runtime.registry.snapshots.insert(SnapshotRecord(
        tag="uses-data", dir="/nonexistent", created_at_unix=1,
        volumes=[{"name": "data", "mount": "/mnt/data", "read_only": False, "fork": "copy",
                  "size_bytes": 16 << 20}]))
    assert client.get("/v1/volumes/data").json()["snapshots"] == ["uses-data"]
    assert "uses-data" in error(client.delete("/v1/volumes/data"), 409)
    assert volume_files(daemon) == ["data"]


def test_a_volume_is_filled_from_a_host_directory(client: TestClient, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "f.txt").write_text("hello")
    made = client.post("/v1/volumes", json={"name": "d", "size_mib": 16, "source": str(src)})
    assert made.status_code == 201, made.text
    (src / "big").write_bytes(b"\0" * (20 << 20))
    assert "more than fits" in error(client.post("/v1/volumes", json={"name": "e", "size_mib": 16,
                                                                      "source": str(src)}), 400)


def _tarball(path: Path, members: dict[str, bytes], *, symlink: tuple[str, str] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if symlink:
            info = tarfile.TarInfo(symlink[0])
            info.type, info.linkname = tarfile.SYMTYPE, symlink[1]
            tar.addfile(info)
    return path


def test_a_tarball_fills_a_volume_and_hostile_archives_are_refused(client: TestClient, daemon: Daemon,
                                                                    tmp_path: Path) -> None:
    good = _tarball(tmp_path / "good.tar.gz", {"a/b.txt": b"x" * 100})
    made = client.post("/v1/volumes", json={"name": "t", "size_mib": 16, "source": str(good)})
    assert made.status_code == 201, made.text
    out = tmp_path / "outside"
    for name, archive in [
        ("dotdot", _tarball(tmp_path / "dd.tar.gz", {"../outside": b"x"})),
        ("abs", _tarball(tmp_path / "abs.tar.gz", {str(out): b"x"})),
        ("link", _tarball(tmp_path / "ln.tar.gz", {}, symlink=("escape", "/etc/passwd"))),
    ]:
        assert "leave the volume" in error(
            client.post("/v1/volumes", json={"name": name, "size_mib": 16, "source": str(archive)}), 400)
    assert not out.exists()
    # Larger than the volume: refused from the headers, before a byte is written.
    huge = tmp_path / "huge.tar"
    with tarfile.open(huge, "w") as tar:
        info = tarfile.TarInfo("big")
        info.size = 32 << 20
        tar.addfile(info, io.BytesIO(b"\0" * info.size))
    assert "more than fits" in error(
        client.post("/v1/volumes", json={"name": "huge", "size_mib": 16, "source": str(huge)}), 400)
    assert volume_files(daemon) == ["t"]  # nothing half-made is left


def test_volume_bounds_are_checked(client: TestClient) -> None:
    assert "size_mib" in error(client.post("/v1/volumes", json={"name": "x", "size_mib": 1}), 400)
    error(client.post("/v1/volumes", json={"name": "../x"}), 400)
    error(client.post("/v1/volumes", json={"name": "x", "source": "relative/path"}), 400)


@pytest.mark.parametrize("kwargs, message", [
    ({"mount": "/mnt/data"}, "exactly one"),
    ({"mount": "/mnt/data", "name": "a", "host_path": "/srv"}, "exactly one"),
    ({"mount": "/", "name": "a"}, "absolute guest path"),
    ({"mount": "/usr", "name": "a"}, "guest's own files"),
    ({"mount": "/mnt/../etc", "name": "a"}, "without '.' or '..'"),
    ({"mount": "/mnt/data", "host_path": "/srv", "fork": "shared"}, "takes a named hostdir volume"),
    ({"mount": "/mnt/data", "name": "a", "fork": "other"}, "fork must be"),
    ({"mount": "/mnt/data", "host_path": "rel"}, "absolute host path"),
    ({"mount": "/mnt/data", "name": "a", "size_mib": 64}, "size_mib is for a host_path"),
])
def test_an_attach_request_is_checked(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        VolumeMount(**kwargs).check()


def test_snapshot_json_volumes_are_checked() -> None:
    entry = {"name": "a", "mount": "/mnt/data", "read_only": True, "fork": "copy", "size_bytes": 16 << 20}
    assert snapshot_meta.check({"volumes": [entry]})["volumes"] == [entry]
    for bad in ({**entry, "mount": "/proc/x"}, {**entry, "size_bytes": -1}, "x"):
        with pytest.raises(snapshot_meta.BadMeta):
            snapshot_meta.check({"volumes": [bad]})
    with pytest.raises(snapshot_meta.BadMeta):
        snapshot_meta.check({"volumes": [entry] * 5})


def test_a_volume_is_a_virtio_disk_after_the_root_disk(tmp_path: Path) -> None:
    spec = LaunchSpec(config=VMConfig(256, 1, Accel.tcg()), mem_path=tmp_path / "mem",
                      share_ram=False, disk=tmp_path / "disk.qcow2", qmp_fd=3, agent_fd=4,
                      console_log=tmp_path / "c.log",
                      volumes=[VolumeDrive(tmp_path / "disk.vol0.qcow2", "disk0v0", "forkd-vol0"),
                               VolumeDrive(tmp_path / "disk.vol1.qcow2", "disk0v1", "forkd-vol1", True)])
    argv = build_argv("qemu", spec)
    devices = [argv[i + 1] for i, word in enumerate(argv) if word == "-device"]
    assert devices[:3] == ["virtio-blk-device,drive=disk0",
                           "virtio-blk-device,drive=disk0v0,serial=forkd-vol0",
                           "virtio-blk-device,drive=disk0v1,serial=forkd-vol1"]
    drives = [argv[i + 1] for i, word in enumerate(argv) if word == "-blockdev"]
    assert "read-only=on" not in drives[1] and drives[2].endswith("read-only=on")


def test_a_snapshot_refuses_bad_volumes_before_it_boots(client: TestClient, daemon: Daemon) -> None:
    def snapshot(*volumes: dict[str, Any]) -> Any:
        return client.post("/v1/snapshots", json={"tag": "v", "volumes": list(volumes)})

    assert "guest's own files" in error(snapshot({"name": "x", "mount": "/usr"}), 400)
    assert "exactly one" in error(snapshot({"mount": "/m"}), 400)
    assert "does not exist" in error(snapshot({"name": "nope", "mount": "/m"}), 404)
    assert "not a directory" in error(snapshot({"host_path": "/no/such/dir", "mount": "/m"}), 400)
    assert client.post("/v1/volumes", json={"name": "x", "size_mib": 16}).status_code == 201
    assert "same path" in error(snapshot({"name": "x", "mount": "/m"}, {"name": "x", "mount": "/m"}), 400)
    assert "ext4 disk" in error(snapshot({"name": "x", "mount": "/m", "fork": "shared"}), 400)
    assert client.post("/v1/volumes", json={"name": "h", "size_mib": 16, "fs": "hostdir"}).status_code == 201
    assert "hostdir volume" in error(snapshot({"name": "h", "mount": "/m", "fork": "copy"}), 400)
    assert client.get("/v1/snapshots/v").status_code == 404  # nothing was registered


def test_a_volume_is_exported_into_a_new_host_directory(client: TestClient, daemon: Daemon,
                                                        tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "f.txt").write_text("hello")
    (src / "link").symlink_to("/etc/passwd")
    made = client.post("/v1/volumes", json={"name": "d", "size_mib": 16, "source": str(src)})
    assert made.status_code == 201, made.text
    out = tmp_path / "out"
    done = client.post("/v1/volumes/d/export", json={"to": str(out)})
    assert done.status_code == 200, done.text
    assert done.json() == {"name": "d", "to": str(out)}
    assert (out / "sub" / "f.txt").read_text() == "hello"
    assert (out / "link").is_symlink() and str((out / "link").readlink()) == "/etc/passwd"
    assert "already exists" in error(client.post("/v1/volumes/d/export", json={"to": str(out)}), 409)
    assert "does not attach" in error(client.post("/v1/volumes/d/export", json={
        "to": str(tmp_path / "o2"), "snapshot": "py"}), 404)
    error(client.post("/v1/volumes/nope/export", json={"to": str(tmp_path / "o3")}), 404)
    assert not (tmp_path / "o2").exists()


def test_a_spawn_attaches_only_hostdir_volumes(client: TestClient, daemon: Daemon) -> None:
    # A disk (an ext4 volume, a host_path) is part of a snapshot's device configuration: a spawn
    # naming one is a 400 that says where it goes, never a spawn that silently drops it.
    assert client.post("/v1/volumes", json={"name": "x", "size_mib": 16}).status_code == 201

    def spawn(*volumes: dict[str, Any]) -> Any:
        return client.post("/v1/sandboxes", json={"snapshot_tag": "py", "volumes": list(volumes)})

    assert "attached when a snapshot is made" in error(spawn({"name": "x", "mount": "/m"}), 400)
    assert "named hostdir volume" in error(spawn({"host_path": "/srv", "mount": "/m", "fork": "shared"}), 400)
    assert "a volume attached at spawn" in error(spawn({"host_path": "/srv", "mount": "/m"}), 400)
    assert "does not exist" in error(spawn({"name": "nope", "mount": "/m"}), 404)
    assert client.post("/v1/volumes", json={"name": "h", "size_mib": 16, "fs": "hostdir"}).status_code == 201
    assert "same path" in error(spawn({"name": "h", "mount": "/m"}, {"name": "h", "mount": "/m"}), 400)
    assert daemon.runtime.list_sandboxes() == []  # nothing started


