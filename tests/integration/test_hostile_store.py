"""A hostile object store and hostile archives: manifests whose every field is fuzzed, within its
schema and beyond it.

The store is a real S3-compatible server (moto's, tests/integration/services.py) whose objects the
test writes itself, as a malicious store would serve them. A small snapshot (its files, and the base
image it sits on) is uploaded once; then, case by case, its manifest is rewritten with one field set
to a hostile or a boundary value and pulled into a fresh data dir through the real importer
(``SnapshotTravel``, the code ``forkd pull`` and spawn-of-an-absent-tag run).

What must hold for every case:
* a value beyond its field's bounds is refused with a 4xx naming it, and nothing is registered
  or left on disk;
* a value within bounds is imported, and then no command line or script the host would run for the
  snapshot (QEMU's argv, the kernel command line, the ``ip -batch`` lines, the nftables ruleset)
  holds anything the store wrote that is not a plain, checked value: the sentinel strings planted in
  the hostile cases never appear, and a travelling snapshot's host paths (its kernel, its rootfs)
  are replaced by this host's own.

No VM boots here: everything checked happens before one would (tests/integration/test_travel.py
pulls a tampered manifest of a real VM chain).
"""

from __future__ import annotations

import asyncio
import copy
import io
import json
import os
import socket
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from forkd.config import DataDir
from forkd.controller.host_accel import HostAccelerator
from forkd.controller.snapshots import SnapshotStore
from forkd.controller.tags import TagReservations
from forkd.controller.travel import SnapshotTravel
from forkd.errors import ForkdError
from forkd.host import netplan
from forkd.host.accel import LEGACY_MACHINE, NO_PIT, Accel, VMConfig
from forkd.host.egress import EgressPolicy
from forkd.host.shm import ShmMemory
from forkd.store import archive, chunked
from forkd.store.manifest import Backing, BaseEntry, FileEntry, Manifest, SnapshotEntry
from forkd.store.objectstore import ObjectStore, StoreError
from forkd.store.registry import Registry
from forkd.vmm import cmdline, probe
from forkd.vmm import disk as disk_mod

from .services import S3Server, environ, s3_server

MIB = 1 << 20
PREFIX = "hostile"
SENTINEL = "PWNED"  # planted in every hostile string: it must reach no command line or script
MARKER = "/tmp/forkd-hostile-store-marker"


@dataclass
class Origin:
    """The store, and the good manifest (as JSON) every case starts from."""

    s3: S3Server
    store: ObjectStore
    good: dict[str, Any]
    work: Path
    archive: Path  # a pack archive of the same snapshot (its blobs, the base included)


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Origin]:
    work = tmp_path_factory.mktemp("hostile-store")
    files = work / "src"
    files.mkdir()
    with open(files / "base.raw", "wb") as f:
        f.truncate(8 * MIB)
        f.write(os.urandom(MIB))
    with open(files / "mem", "wb") as f:
        f.truncate(8 * MIB)
        f.seek(MIB)
        f.write(os.urandom(MIB))
    (files / "state").write_bytes(os.urandom(10_000))
    disk_mod.create_overlay(files / "base.raw", files / "disk.qcow2", "raw")
    shas = {p.name: chunked.digest(p)[0] for p in files.iterdir()}
    meta = {
        "tag": "good", "created_at_unix": 1_700_000_000,
        "config": {"mem_mib": 512, "vcpus": 1, "accel": "tcg", "cpu": "max",
                   "machine": LEGACY_MACHINE + NO_PIT},
        "image": {"name": "default", "key": "abc123", "kernel_version": "6.1.0-28-amd64"},
        "kernel": "/var/lib/forkd/kernels/vmlinux-6.1", "rootfs": "/var/lib/forkd/rootfs/default.ext4",
        "warm_imports": ["numpy"], "setup": [["pip", "install", "x"]], "setup_eval": [],
        "jupyter_kernel": False,
        "numpy_version": "1.26.4", "python_version": "3.11.2", "qemu_version": "7.2.19",
        "boot_secs": 3.2, "save_state_ms": 120.5, "parent_tag": None, "branched_from": None,
        "tap": "forkd-tap0", "dns": ["9.9.9.9"],
    }
    snap = SnapshotEntry("good", None, 1, (
        FileEntry("mem", shas["mem"], 8 * MIB), FileEntry("state", shas["state"], 10_000),
        FileEntry("disk.qcow2", shas["disk.qcow2"], (files / "disk.qcow2").stat().st_size,
                  Backing(None, "", "raw"))), meta, {"mode": None})
    manifest = Manifest("good", 1, "0.1.0", probe.qemu_version(), Accel.tcg(),
                        BaseEntry(shas["base.raw"], 8 * MIB, "raw",
                                  {"name": "default", "key": "abc123", "kernel_version": "6.1.0-28-amd64",
                                   "recipe": {"suite": "bookworm", "packages": ["python3"]}}), (snap,))
    # FORKD_ACCEL: the importer checks that this host can run the snapshot; say it can.
    with s3_server() as s3, environ({**s3.env, "FORKD_ACCEL": "tcg"}):
        store = ObjectStore(s3.url(PREFIX))
        for p in files.iterdir():
            store.put_blob(shas[p.name], p)
        packed = work / "good.forkd"
        archive.write(packed, manifest, {shas[p.name]: p for p in files.iterdir()})
        yield Origin(s3, store, manifest.to_json(), work, packed)


def serve(origin: Origin, tag: str, doc: dict[str, Any] | bytes) -> None:
    """Put ``doc`` in the store as the manifest of ``tag``, as a malicious store would."""
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    boto3.client("s3").put_object(Bucket=origin.s3.bucket, Key=f"{PREFIX}/snapshots/{tag}.json", Body=body)


def renamed(doc: dict[str, Any], tag: str) -> dict[str, Any]:
    """The good manifest, as snapshot ``tag`` (a manifest must describe the key it is stored under)."""
    out = copy.deepcopy(doc)
    out["tag"] = tag
    out["lineage"] = [tag]
    out["snapshots"][0]["tag"] = tag
    out["snapshots"][0]["meta"]["tag"] = tag
    return out


@dataclass
class Pulled:
    data: DataDir
    error: ForkdError | None
    registered: list[str]
    meta: dict[str, Any] | None


def packed(origin: Origin, doc: dict[str, Any] | bytes, out: Path) -> Path:
    """The good archive with ``doc`` as its manifest, as a hostile archive's maker would write it."""
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    with tarfile.open(origin.archive, "r:") as src, tarfile.open(out, "w:", format=tarfile.PAX_FORMAT) as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read()  # type: ignore[union-attr]
            if member.name == archive.MANIFEST:
                data = body
                member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    return out


def pull(origin: Origin, tag: str, name: str, via_archive: Path | None = None) -> Pulled:
    """Pull ``tag`` from the store (or unpack ``via_archive``) into a fresh data dir through the
    real importer."""
    data = DataDir(origin.work / name / "data", origin.work / name / "images").ensure()
    registry = Registry(data.registry)
    tags = TagReservations(registry.snapshots.has)
    snapshots = SnapshotStore(registry.snapshots, registry.snapshot_names, data.snapshots, tags,
                              ShmMemory(data.root))
    travel = SnapshotTravel(data, snapshots, tags, HostAccelerator(data), ObjectStore(origin.s3.url(PREFIX)))
    error: ForkdError | None = None
    try:
        asyncio.run(travel.unpack(via_archive) if via_archive is not None else travel.pull(tag))
    except ForkdError as exc:
        error = exc
    try:
        registered = [s.tag for s in snapshots.all()]
        meta = snapshots.dir(tag).read_meta() if registered else None
    finally:
        registry.close()
    return Pulled(data, error, registered, meta)


def host_commands(p: Pulled, tag: str) -> str:
    """Every command line and script this host would run for a child of the pulled snapshot."""
    sdir_meta = p.meta
    assert sdir_meta is not None
    config = VMConfig.from_json(sdir_meta["config"])
    tap = sdir_meta.get("tap")
    spec = cmdline.LaunchSpec(config=config, mem_path=p.data.snapshots / tag / "mem", share_ram=False,
                              disk=p.data.sandboxes / "x" / "disk.qcow2", qmp_fd=3, agent_fd=4,
                              console_log=p.data.sandboxes / "x" / "console.log", tap=tap, incoming=True)
    argv = cmdline.build_argv("qemu-system-x86_64", spec)
    kernel = cmdline.kernel_cmdline(sdir_meta.get("warm_imports") or [], accel=config.accel,
                                    extra=(netplan.guest_cmdline(sdir_meta.get("dns") or ()),))
    net = netplan.ChildNet(owner="t", netns="forkd-child-0", owns_netns=True, tap=tap, owns_tap=True,
                           index=5, ip="10.201.0.6", gateway="10.201.0.1", egress=EgressPolicy(),
                           dns=tuple(sdir_meta.get("dns") or ()))
    scripts = [netplan.host_batch(net), netplan.netns_batch(net)]
    if tap is not None:  # a snapshot without a NIC gets no rules
        scripts.append(netplan.netns_ruleset(net, ()))
    return "\n".join([*argv, kernel, *scripts])


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation of the manifest: the field at ``path`` (dots; ``S`` is the snapshot entry) set."""
    def mutate(doc: dict[str, Any]) -> None:
        parts = path.split(".")
        node: Any = doc
        for part in parts[:-1]:
            node = node["snapshots"][0] if part == "S" else node[part]
        node[parts[-1]] = value
    return mutate


def pull_with(origin: Origin, tag: str, path: str, value: Any, via: str) -> Pulled:
    """The good manifest as ``tag``, with the field at ``path`` set to ``value``, served by the
    store and pulled, or packed into an archive and unpacked (``via``)."""
    doc = renamed(origin.good, tag)
    _set(path, value)(doc)
    if via == "archive":
        return pull(origin, tag, f"{tag}-a", packed(origin, doc, origin.work / f"{tag}.forkd"))
    serve(origin, tag, doc)
    return pull(origin, tag, tag)


VIAS = ("store", "archive")


INJECT = f'forkd-tap0\nnetns exec forkd-child-0 /bin/sh -c "touch {MARKER}-{SENTINEL}"'
# Beyond the bounds: each is refused, naming the field.
HOSTILE: list[tuple[str, Any, str]] = [
    ("S.meta.tap", INJECT, "tap"),
    ("S.meta.tap", f"a{SENTINEL}" * 4, "tap"),
    ("S.meta.tap", "uplink0", "tap"),
    ("S.meta.tap", f"x y{SENTINEL}", "tap"),
    ("S.meta.tap", 7, "tap"),
    ("S.meta.config.machine", LEGACY_MACHINE + f",firmware=/etc/{SENTINEL}", "machine"),
    ("S.meta.config.machine", "pc", "machine"),
    ("S.meta.config.cpu", f"max,+{SENTINEL}", "cpu"),
    ("S.meta.config.accel", "xen", "accel"),
    ("S.meta.config.mem_mib", 1 << 30, "mem_mib"),
    ("S.meta.config.mem_mib", "512", "mem_mib"),
    ("S.meta.config.mem_mib", True, "mem_mib"),
    ("S.meta.config.vcpus", 0, "vcpus"),
    ("S.meta.config", [], "config"),
    ("S.meta.dns", [f"1.1.1.1 accept; {SENTINEL}"], "dns"),
    ("S.meta.dns", ["1.1.1.1", "1.0.0.1", "8.8.8.8", "8.8.4.4"], "dns"),
    ("S.meta.dns", ["::1"], "dns"),
    ("S.meta.dns", "1.1.1.1", "dns"),
    ("S.meta.warm_imports", [f"numpy init=/bin/sh {SENTINEL}"], "warm_imports"),
    ("S.meta.warm_imports", ["x"] * 300, "warm_imports"),
    ("S.meta.image", {"name": f"../../{SENTINEL}"}, "image"),
    ("S.meta.image", {"name": "default", "key": f"k\n{SENTINEL}"}, "image"),
    ("S.meta.kernel", f"relative/{SENTINEL}", "kernel"),
    ("S.meta.rootfs", f"/x\n{SENTINEL}", "rootfs"),
    ("S.meta.parent_tag", f"../{SENTINEL}", "parent_tag"),
    ("S.meta.branched_from", f"a/{SENTINEL}", "branched_from"),
    ("S.meta.mode", SENTINEL, "mode"),
    ("S.meta.numpy_version", f"1.0\n{SENTINEL}", "numpy_version"),
    ("S.meta.setup", [["x" * 70_000]], "setup"),
    ("S.meta.setup", ["pip install x"], "setup"),
    ("S.meta.boot_secs", float("nan"), "boot_secs"),
    ("S.meta.boot_secs", -1, "boot_secs"),
    ("S.meta.imported", {"from": 5}, "imported"),
    ("S.meta", [], "meta"),
    ("S.record.mode", SENTINEL, "mode"),
    ("S.record.pause_ms", -3, "pause_ms"),
    ("S.record.branched_from", f"../{SENTINEL}", "branched_from"),
    ("accel", {"name": "tcg", "cpu": f"max,{SENTINEL}"}, "accel"),
    ("accel", {"name": "kvm", "cpu": "max"}, "accel"),
    ("base.image", {"name": {"deep": [SENTINEL]}}, "image"),
]
# Within the bounds: each is imported, and its host paths are this host's.
BENIGN: list[tuple[str, Any]] = [
    ("S.meta.tap", "mytap.1"),
    ("S.meta.tap", None),
    ("S.meta.dns", ["1.1.1.1", "8.8.8.8", "9.9.9.9"]),
    ("S.meta.dns", []),
    ("S.meta.config.machine", LEGACY_MACHINE),
    ("S.meta.warm_imports", ["numpy", "json.decoder", "_private"]),
    ("S.meta.kernel", "/etc/shadow"),
    ("S.meta.rootfs", "/etc/shadow"),
    ("S.meta.mode", "live"),
    ("S.meta.unknown_field", f"{SENTINEL} is dropped"),
    ("S.record.mode", "diff"),
]


def test_the_good_manifest_imports(origin: Origin) -> None:
    """The control: the untouched manifest, served under another name, is imported."""
    serve(origin, "control", renamed(origin.good, "control"))
    p = pull(origin, "control", "control")
    assert p.error is None and p.registered == ["control"]
    assert p.meta is not None and p.meta["tap"] == "forkd-tap0" and p.meta["dns"] == ["9.9.9.9"]
    assert "kernel" not in p.meta, "the origin host's kernel path was kept"
    assert p.meta["rootfs"].startswith(str(p.data.root)), "the origin's rootfs path was kept"
    assert SENTINEL not in host_commands(p, "control")


@pytest.mark.parametrize("via", VIAS)
@pytest.mark.parametrize(("path", "value", "field"), HOSTILE,
                         ids=[f"{i}-{p}" for i, (p, _, _) in enumerate(HOSTILE)])
def test_a_field_beyond_its_bounds_is_refused_and_nothing_is_kept(origin: Origin, path: str, value: Any,
                                                                   field: str, via: str) -> None:
    tag = f"hostile-{HOSTILE.index((path, value, field))}"
    p = pull_with(origin, tag, path, value, via)
    assert p.error is not None, f"{path}={value!r} was imported"
    if via == "store":  # 502: the store (a dependency) answered with what no forkd writes
        assert p.error.status == 502 and "not valid" in str(p.error), (p.error.status, str(p.error))
    else:  # 400: the archive the client handed over is corrupt
        assert p.error.status == 400 and "corrupt archive" in str(p.error), (p.error.status, str(p.error))
    assert field in str(p.error), f"the error does not name {field!r}: {p.error}"
    assert p.registered == [] and not list(p.data.snapshots.iterdir()), "a refused pull left something"
    assert not Path(f"{MARKER}-{SENTINEL}").exists(), "the store ran a command on the host"


@pytest.mark.parametrize("via", VIAS)
@pytest.mark.parametrize(("path", "value"), BENIGN, ids=[f"{i}-{p}" for i, (p, _) in enumerate(BENIGN)])
def test_a_field_within_its_bounds_is_imported_and_reaches_no_command_unchecked(origin: Origin, path: str,
                                                                                value: Any, via: str) -> None:
    tag = f"benign-{BENIGN.index((path, value))}"
    p = pull_with(origin, tag, path, value, via)
    assert p.error is None, f"{path}={value!r} was refused: {p.error}"
    assert p.registered == [tag] and p.meta is not None
    assert "kernel" not in p.meta and "unknown_field" not in p.meta
    assert p.meta.get("tap") in (None, netplan.DEFAULT_TAP), "a tap name the store chose was kept"
    assert p.meta["rootfs"].startswith(str(p.data.root)), p.meta["rootfs"]
    commands = host_commands(p, tag)
    assert SENTINEL not in commands and "/etc/shadow" not in commands


def test_a_deeply_nested_or_oversized_manifest_is_a_clean_refusal(origin: Origin) -> None:
    """50,000 levels of nesting once raised RecursionError (a 500); a store's text is scanned first."""
    deep = renamed(origin.good, "deep")
    text = json.dumps(deep).replace('"setup": [["pip", "install", "x"]]',
                                    '"setup": ' + "[" * 50_000 + "]" * 50_000)
    assert "[" * 50_000 in text
    serve(origin, "deep", text.encode())
    p = pull(origin, "deep", "deep")
    assert p.error is not None and "nested deeper" in str(p.error) and p.error.status == 502, p.error
    serve(origin, "big", b"[" + b" " * (17 * MIB) + b"]")
    p = pull(origin, "big", "big")
    assert p.error is not None and "larger than" in str(p.error) and p.error.status == 502, p.error
    assert p.registered == []


def test_a_store_that_drips_its_answer_is_given_up_on(origin: Origin,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A store answering one byte at a time never trips a per-read timeout; the call's deadline ends it."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drip(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n"
                         b"Content-Type: application/json\r\n\r\n")
            while not stop.wait(0.2):
                try:
                    conn.sendall(b" ")
                except OSError:
                    return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=drip, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{listener.getsockname()[1]}")
        store = ObjectStore(origin.s3.url(PREFIX))
        store.deadline_secs = 1.5
        started = time.monotonic()
        with pytest.raises(StoreError, match="did not arrive within"):
            store.get_manifest("anything")
        with pytest.raises(StoreError, match="did not arrive within"):
            store.open_blob("0" * 64, 10)
        print(f"\ntwo dripping answers given up on in {time.monotonic() - started:.1f} s")
    finally:
        stop.set()
        listener.close()
