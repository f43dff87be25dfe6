"""Where `forkd image build` links the image for the seeds' example paths."""

from __future__ import annotations

from pathlib import Path

from forkd.config import DataDir
from forkd.image.builder import Image, publish_seed_paths, seed_paths


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
