"""Images from a user's root filesystem, and snapshots that do not fit this host."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from forkd.config import DataDir
from forkd.controller.runtime import Runtime, SnapshotSpec
from forkd.errors import IncompatibleSnapshot, InvalidRequest
from forkd.host.accel import KNOWN_CPUS
from forkd.image.builder import ImageRecipe, build_image, load_image
from forkd.store import snapshot_meta

from .conftest import Loop

pytestmark = pytest.mark.vm


def test_custom_image_from_a_tarball_with_extra_packages(
    loop: Loop, runtime: Runtime, tmp_path: Path
) -> None:
    """A `docker export`-style tarball plus an extra package boots and forks like ours."""
    base = load_image(runtime.data)
    tree = Path(base.dir).parent / ".cache" / f"rootfs-{ImageRecipe().base_key()}"
    assert tree.is_dir(), "the default image's debootstrap tree is cached by `forkd image build`"
    tarball = tmp_path / "rootfs.tar"
    subprocess.run(["tar", "-cf", str(tarball), "-C", str(tree), "."], check=True)
    images = DataDir(tmp_path / "data", tmp_path / "images")
    recipe = ImageRecipe(name="custom", rootfs_source=str(tarball), extra_packages=("jq",))
    image = build_image(images, recipe)
    assert image.meta["recipe"]["extra_packages"] == ["jq"]
    # Built once, then served from the cache.
    assert build_image(images, recipe).meta["built_at_unix"] == image.meta["built_at_unix"]

    spec = SnapshotSpec(tag="custom-img", kernel=str(image.kernel), rootfs=str(image.rootfs))
    loop.run(runtime.create_snapshot(spec))
    try:
        sb = loop.run(runtime.spawn("custom-img", 1))[0]
        res = loop.run(runtime.exec(sb.id, ["jq", "-n", "1+1"]))
        assert res["stdout"].strip() == "2", res
        loop.run(runtime.kill(sb.id))
    finally:
        loop.run(runtime.delete_snapshot("custom-img"))


def test_a_rebuilt_image_keeps_the_disk_of_snapshots_made_before(
    loop: Loop, runtime: Runtime, tmp_path: Path
) -> None:
    """A forced rebuild of an image (a new filesystem, under the same recipe) publishes a new disk;
    the snapshot made from the build before still stands on that build's, and its child boots it.
    (Before, the rebuild replaced the file under the snapshot's layers: children kernel-panicked.)"""
    base = load_image(runtime.data)
    tree = Path(base.dir).parent / ".cache" / f"rootfs-{ImageRecipe().base_key()}"
    tarball = tmp_path / "rootfs.tar"
    subprocess.run(["tar", "-cf", str(tarball), "-C", str(tree), "."], check=True)
    images = DataDir(tmp_path / "data", tmp_path / "images")
    recipe = ImageRecipe(name="rebuilt", rootfs_source=str(tarball))
    first = build_image(images, recipe)
    spec = SnapshotSpec(tag="rebuilt-img", kernel=str(first.kernel), rootfs=str(first.base), warm_imports=[])
    loop.run(runtime.create_snapshot(spec))
    try:
        stood_on = first.base.stat().st_ino
        second = build_image(images, recipe, force=True)
        assert second.base != first.base and second.rootfs.stat().st_ino != stood_on
        assert first.base.stat().st_ino == stood_on  # kept, under the name the snapshot's disk names
        [sb] = loop.run(runtime.spawn("rebuilt-img", 1))
        res = loop.run(runtime.exec(sb.id, ["sh", "-c", "cat /etc/debian_version && ls /usr/bin | wc -l"]))
        assert res["exit_code"] == 0, res
        loop.run(runtime.kill(sb.id))
    finally:
        loop.run(runtime.delete_snapshot("rebuilt-img"))


def test_rootfs_without_python_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tree" / "etc").mkdir(parents=True)
    images = DataDir(tmp_path / "data", tmp_path / "images")
    with pytest.raises(InvalidRequest, match="no python3"):
        build_image(images, ImageRecipe(name="nopy", rootfs_source=str(tmp_path / "tree")))


def test_snapshot_from_another_accelerator_is_refused(loop: Loop, runtime: Runtime, snapshot: str) -> None:
    before = {sb.id for sb in runtime.list_sandboxes()}
    meta_path = Path(runtime.get_snapshot(snapshot).dir) / "snapshot.json"
    original = meta_path.read_text()
    meta = json.loads(original)
    other = "kvm" if meta["config"]["accel"] == "tcg" else "tcg"
    meta["config"]["accel"] = other  # with the CPU model that goes with it, as a real one has
    meta["config"]["cpu"] = KNOWN_CPUS[other]
    meta_path.write_text(json.dumps(meta))
    try:
        with pytest.raises(IncompatibleSnapshot, match=f"taken under {other}"):
            loop.run(runtime.spawn(snapshot, 1))
    finally:
        meta_path.write_text(original)
    assert {sb.id for sb in runtime.list_sandboxes()} == before  # nothing half-spawned


def test_the_snapshot_json_forkd_writes_fits_its_schema_whole(loop: Loop, runtime: Runtime,
                                                               snapshot: str) -> None:
    """store/snapshot_meta.py checks every snapshot.json that is read or imported: what a template
    boot, a BRANCH and a compaction write must pass it unchanged, with no field dropped."""
    [sb] = loop.run(runtime.spawn(snapshot, 1))
    try:
        loop.run(runtime.branch(sb.id, "img-meta-branch", mode="diff"))
    finally:
        loop.run(runtime.kill(sb.id))
    loop.run(runtime.compact_snapshot("img-meta-branch", "img-meta-compact"))
    try:
        for tag in (snapshot, "img-meta-branch", "img-meta-compact"):
            raw = json.loads((Path(runtime.get_snapshot(tag).dir) / "snapshot.json").read_text())
            assert snapshot_meta.check(raw) == raw, tag
            assert set(raw) <= set(snapshot_meta.FIELDS), set(raw) - set(snapshot_meta.FIELDS)
    finally:
        for tag in ("img-meta-compact", "img-meta-branch"):
            loop.run(runtime.delete_snapshot(tag))
