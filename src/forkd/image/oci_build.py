"""A guest image from an OCI/Docker image: its layers applied (``oci_layers.unpack``), checked for what
forkd writes into it, the agent and account added as to any tree, packed as ext4.

The pulling and the layer checks are ``image/oci.py``'s; the kernel, initramfs and publishing
are the builder's (``image/builder.py``), shared with forkd's own images.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from pathlib import Path

from forkd.bounds import TAG_RE
from forkd.config import DataDir
from forkd.errors import InvalidRequest, NotFound
from forkd.guest.agent import MIN_GUEST_PYTHON
from forkd.host import prereqs
from forkd.image import initramfs, kernel, oci, oci_layers, rootfs
from forkd.image.builder import (
    BUILDER_VERSION,
    NAME_RE_HELP,
    Image,
    ImageRecipe,
    Progress,
    cached_kernel,
    digest_of,
    load_image,
    no_progress,
    publish_image,
)


def oci_image_name(ref: str) -> str:
    """The image name a pulled ``ref`` gets unless one is given: its last path part and tag."""
    last = ref.rsplit("/", 1)[-1]
    name, _, digest = last.partition("@")
    if digest and ":" not in name:
        name = f"{name}-{digest.removeprefix('sha256:')[:12]}"
    name = re.sub(r"[^A-Za-z0-9._-]", "-", name.replace(":", "-")).lstrip(".-")[:64]
    return name or "image"


# Where the image's own agent is written (rootfs.install_agent, add_user): none of these may be a
# symlink in an image's tree, or writing there would follow it out of the tree, on the host.
_WRITTEN = ("etc", "etc/hostname", "etc/passwd", "etc/group", "etc/shadow", "etc/gshadow", "etc/sudoers.d",
            "etc/sudoers.d/forkd-user", "etc/skel", "opt", "opt/forkd", "home", "usr", "usr/bin")


def _refuse_symlinks(tree: Path, ref: str) -> None:
    # Read through /etc/passwd only when neither it nor /etc leads out of the tree.
    readable = not (tree / "etc").is_symlink() and not (tree / "etc" / "passwd").is_symlink()
    home = rootfs.user_home(tree) if readable else None
    homes = [home] if home else []
    for rel in (*_WRITTEN, *homes, rootfs.GUEST_HOME):
        parts = Path(rel).parts
        for i in range(1, len(parts) + 1):
            if (tree / Path(*parts[:i])).is_symlink():
                raise InvalidRequest(f"image {ref}: /{Path(*parts[:i])} is a symlink; forkd writes its agent "
                                     "and account there, so it must be a real file or directory")


def _oci_python(tree: Path, ref: str) -> None:
    """The agent starts as /usr/bin/python3 (init.sh); an image whose Python is /usr/local's (the
    python:3.x images) gets that path as a symlink to it."""
    usr_bin = tree / "usr" / "bin"
    if (usr_bin / "python3").exists() or (usr_bin / "python3").is_symlink():
        return
    if (tree / "usr/local/bin/python3").exists():
        usr_bin.mkdir(parents=True, exist_ok=True)
        (usr_bin / "python3").symlink_to("/usr/local/bin/python3")
        return
    raise InvalidRequest(f"image {ref} has no python3 (/usr/bin/python3 or /usr/local/bin/python3): the "
                         "forkd agent runs on the image's own Python "
                         f"{'.'.join(map(str, MIN_GUEST_PYTHON))} or newer, so images without one are not "
                         "supported yet")


def build_oci_image(data: DataDir, pulled: oci.PulledImage, name: str | None = None, *, force: bool = False,
                    progress: Progress = no_progress) -> Image:
    """A guest image from an OCI image in the cache (oci.pull / oci.import_archive).

    Its layers are applied onto a tree (oci_layers.unpack), the agent and account are added
    as to any tree, and the tree packed as ext4. The image's ENV, WORKDIR, USER,
    ENTRYPOINT and CMD are kept in ``image.json`` (``oci.defaults``): a template
    built from it starts its sandboxes with them.
    """
    name = name or oci_image_name(pulled.ref)
    if not TAG_RE.match(name):
        raise InvalidRequest(f"invalid image name {name!r}: use {NAME_RE_HELP}")
    prereqs.require(prereqs.MKFS_EXT4, prereqs.LZ4, prereqs.APT_GET, prereqs.DPKG_DEB, prereqs.BUSYBOX,
                    *oci.OCI_TOOLS)
    data.images.mkdir(parents=True, exist_ok=True)
    key = digest_of({"builder": BUILDER_VERSION, "oci": pulled.digest, "agent": rootfs.agent_digest(),
                   "init": hashlib.sha256(initramfs.init_script()).hexdigest(),
                   "kernel": kernel.KERNEL_PACKAGE})[:16]
    if not force:
        try:
            cached = load_image(data, name)
            if cached.key == key:
                progress("cached", 1.0)
                return cached
        except NotFound:
            pass
    started = time.monotonic()
    staging = data.images / f".{name}.build-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        progress("kernel", 0.02)
        kfiles = cached_kernel(data.images / ".cache", kernel.KERNEL_PACKAGE)
        modules = initramfs.build_initramfs(kfiles.modules, staging / "initramfs.img")
        os.link(kfiles.vmlinux, staging / "vmlinux")
        tree = staging / "tree"
        oci_layers.unpack(pulled, tree, progress)
        _refuse_symlinks(tree, pulled.ref)
        _oci_python(tree, pulled.ref)
        progress("installing the agent", 0.75)
        rootfs.install_agent(tree)
        progress("ext4 image", 0.85)
        size_mib = max(ImageRecipe.size_mib, rootfs.tree_size_mib(tree) * 2 + 512)
        rootfs.make_ext4(tree, staging / "rootfs.ext4", size_mib)
        shutil.rmtree(tree)
        meta = {
            "name": name,
            "key": key,
            "oci": {"ref": pulled.ref, "digest": pulled.digest, "defaults": pulled.defaults.info()},
            "size_mib": size_mib,
            "kernel_version": kfiles.version,
            "modules": modules,
            "built_at_unix": int(time.time()),
            "build_secs": round(time.monotonic() - started, 1),
        }
        image = publish_image(data, name, staging, meta)
        progress("done", 1.0)
        return image
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


__all__ = ["build_oci_image", "oci_image_name"]
