#!/usr/bin/env python3
"""How long a registry's image takes to become a guest image: pull and convert, cold and cached.

The image is made here from the default image's debootstrap tree (about 130 MiB
uncompressed, one layer, plus a small second layer) and pushed by skopeo to
Debian's docker-registry on loopback, so the figures are this host's CPU, disk
and loopback HTTP, not a network. Recorded, side by side:

* **cold**: an empty image cache: skopeo copies the layers, umoci applies them,
  the agent is added and the ext4 packed (forkd.image.oci.pull, then
  forkd.image.builder.build_oci_image);
* **cached layers**: the same image again with ``force`` (the layers are in the
  cache by digest, nothing is fetched; the tree is unpacked and packed again);
* **cached image**: the same image again: the digest matches, nothing is done.

Run as root (umoci applies owners). Writes bench/results/oci_pull.json. A busy,
shared machine is noisy: run it a few times.

Usage: .venv/bin/python bench/oci_pull.py [--out PATH]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' registry and image makers

from tests.integration.oci_material import debian_layout, registry

from common import host_facts, write_result
from forkd.config import DataDir
from forkd.image import oci
from forkd.image.builder import build_oci_image


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out")
    args = parser.parse_args()
    shared = DataDir.from_env().images  # the built default image's cache (FORKD_IMAGES_DIR too)
    with tempfile.TemporaryDirectory(prefix="forkd-bench-oci-") as tmp:
        work = Path(tmp)
        layout = debian_layout(shared, work, {"srv/hello.txt": b"hello\n"})
        layout_mib = sum(p.stat().st_size for p in layout.rglob("*") if p.is_file()) / (1 << 20)
        data = DataDir(work / "data", work / "images")
        (data.images / ".cache").mkdir(parents=True)
        for kernel in (shared / ".cache").glob("kernel-*"):  # the kernel is not what is measured
            (data.images / ".cache" / kernel.name).symlink_to(kernel)
        figures: dict[str, dict[str, float]] = {}
        with registry(work / "registry") as reg:
            reg.push(layout, "t", "bench/debian:1")
            registries = oci.Registries(mirrors={"docker.io": f"http://{reg.host}"})
            for label, force in (("cold", False), ("cached_layers", True), ("cached_image", False)):
                started = time.monotonic()
                pulled = oci.pull(data.images, "bench/debian:1", registries)
                pull_s = time.monotonic() - started
                image = build_oci_image(data, pulled, "bench-debian", force=force)
                total_s = time.monotonic() - started
                figures[label] = {"pull_s": round(pull_s, 2), "convert_s": round(total_s - pull_s, 2),
                                  "total_s": round(total_s, 2)}
                print(f"{label:14} pull {pull_s:6.2f} s  convert {total_s - pull_s:6.2f} s", flush=True)
            rootfs_mib = image.rootfs.stat().st_blocks * 512 / (1 << 20)
        shutil.rmtree(data.images, ignore_errors=True)
    write_result("oci_pull", {"host": host_facts(), "image": {
        "compressed_mib": round(layout_mib, 1), "rootfs_allocated_mib": round(rootfs_mib, 1),
        "source": "the default image's debootstrap tree, docs and numpy left out"},
        "figures": figures}, args.out)


if __name__ == "__main__":
    main()
