"""Where `forkd image build` links the image for the seeds' example paths."""

from __future__ import annotations

from pathlib import Path

from forkd.config import DataDir
from forkd.image.builder import KEPT_BUILDS, Image, load_image, publish_image, publish_seed_paths, seed_paths


def test_seed_paths_point_at_the_image(tmp_path: Path) -> None:
    img_dir = tmp_path / "images" / "default"
    img_dir.mkdir(parents=True)
    for name in ("vmlinux", "rootfs.ext4"):
        (img_dir / name).write_bytes(b"x")
    data = DataDir(tmp_path)
    image = Image(name="default", dir=img_dir, meta={"kernel_version": "6.1.0-56-cloud-amd64"})
    kernel, rootfs = seed_paths(data, image)
    assert kernel == tmp_path / "kernels" / "vmlinux-6.1"
    assert rootfs == tmp_path / "rootfs" / "python.ext4"
    publish_seed_paths(data, image)
    publish_seed_paths(data, image)  # idempotent
    assert kernel.resolve() == (img_dir / "vmlinux").resolve()
    assert rootfs.resolve() == (img_dir / "rootfs.ext4").resolve()
    custom = Image(name="mine", dir=img_dir, meta={"kernel_version": "6.1.0-56-cloud-amd64"})
    assert seed_paths(data, custom)[1].name == "mine.ext4"


def _publish(data: DataDir, key: str, content: str) -> Image:
    staging = data.images / f".build-{key}"
    staging.mkdir(parents=True)
    for name in ("vmlinux", "initramfs.img"):
        (staging / name).write_text(name)
    (staging / "rootfs.ext4").write_text(content)
    return publish_image(data, "default", staging, {"key": key})


def test_a_rebuild_keeps_the_disk_earlier_snapshots_stand_on(tmp_path: Path) -> None:
    """A snapshot's disk stands on its build's root filesystem by that build's own name: a rebuild
    publishes another file there and keeps the earlier builds' (the newest KEPT_BUILDS of them), so
    an earlier snapshot never finds another build's disk under its layers."""
    data = DataDir(tmp_path)
    first = _publish(data, "k1", "first build")
    assert first.base.name.startswith("rootfs-k1-") and first.base.read_text() == "first build"
    assert first.base.stat().st_ino == first.rootfs.stat().st_ino  # a link: no second copy
    base_of_a_snapshot = first.base
    second = _publish(data, "k2", "second build")
    assert second.base.read_text() == "second build" and second.rootfs.read_text() == "second build"
    assert base_of_a_snapshot.read_text() == "first build"  # the same path, the same disk
    for i, key in enumerate(("k3", "k4"), 3):
        _publish(data, key, f"build {i}")
    kept = sorted(p.name for p in (data.images / "default").glob("rootfs-*.ext4"))
    assert len(kept) == 1 + KEPT_BUILDS and not any(name.startswith("rootfs-k1-") for name in kept)
    fourth = load_image(data).base
    assert fourth.read_text() == "build 4"
    again = _publish(data, "k4", "build 4, forced again")  # the same recipe, another disk
    assert again.base != fourth and again.base.read_text() == "build 4, forced again"
    assert fourth.read_text() == "build 4"  # what the fourth build's snapshots stand on
    assert not list(data.images.glob(".default.old-*"))  # the replaced folder is gone
