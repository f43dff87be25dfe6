"""Test material for OCI images: a real registry on loopback and images made here from local files.

The registry is Debian's ``docker-registry`` (the CNCF distribution server) on a
free port with its storage in a temporary folder, optionally behind htpasswd
auth. Images are OCI layouts made with ``umoci`` (``init``, ``new``, ``raw
add-layer`` of a tar written here) and pushed with ``skopeo``: nothing is
downloaded.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from forkd.image.builder import ImageRecipe

from .daemon_fixture import free_port

# What the test Debian image leaves out of the debootstrap tree: docs, locales, caches, numpy (the
# image stays small; the conversion is host CPU) and /dev's nodes (an image carries no devices).
_DEBIAN_EXCLUDES = ("./dev/*", "./usr/share/locale", "./usr/share/doc", "./usr/share/man", "./usr/share/info",
                    "./usr/share/zoneinfo", "./var/lib/apt/lists", "./var/cache", "./opt/forkd",
                    "./usr/lib/python3/dist-packages/numpy", "./usr/lib/python3/dist-packages/numpy.libs")


@dataclass
class Registry:
    host: str  # 127.0.0.1:PORT
    user: str | None = None
    password: str | None = None

    def push(self, layout: Path, tag: str, name: str) -> str:
        """Push ``layout:tag`` as ``name`` (repo:tag); its reference on this registry."""
        ref = f"{self.host}/{name}"
        args = ["skopeo", "copy", "-q", "--dest-tls-verify=false", f"oci:{layout}:{tag}", f"docker://{ref}"]
        if self.user:
            args.insert(3, f"--dest-creds={self.user}:{self.password}")
        subprocess.run(args, check=True, capture_output=True)
        return ref


@contextlib.contextmanager
def registry(root: Path, *, user: str | None = None, password: str | None = None) -> Iterator[Registry]:
    """A docker-registry on a free loopback port, stopped and its storage removed afterwards."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    auth = ""
    if user:
        # bcrypt, the only scheme the registry's htpasswd reader takes (apache2-utils' htpasswd -B).
        assert password is not None
        hashed = subprocess.run(["htpasswd", "-Bbn", user, password], check=True, capture_output=True,
                                text=True).stdout.strip()
        (root / "htpasswd").write_text(f"{hashed}\n")
        auth = f"auth:\n  htpasswd:\n    realm: forkd-test\n    path: {root / 'htpasswd'}\n"
    (root / "config.yml").write_text(
        f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {root / 'storage'}\n"
        f"  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n{auth}")
    with open(root / "registry.log", "wb") as log:
        proc = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")], stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=2)
                break
            except httpx.HTTPError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log_text = (root / "registry.log").read_text()
                    raise RuntimeError(f"docker-registry did not start: {log_text}") from None
                time.sleep(0.1)
        yield Registry(f"127.0.0.1:{port}", user, password)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def new_layout(path: Path, tag: str = "t") -> Path:
    subprocess.run(["umoci", "init", "--layout", str(path)], check=True, capture_output=True)
    subprocess.run(["umoci", "new", "--image", f"{path}:{tag}"], check=True, capture_output=True)
    return path


def add_layer(layout: Path, tar: Path, tag: str = "t") -> None:
    subprocess.run(["umoci", "raw", "add-layer", "--image", f"{layout}:{tag}", str(tar)], check=True,
                   capture_output=True)


def set_config(layout: Path, *args: str, tag: str = "t") -> None:
    subprocess.run(["umoci", "config", "--image", f"{layout}:{tag}", *args], check=True, capture_output=True)


def debian_tree(images: Path) -> Path:
    """The debootstrap tree the default image was built from (``forkd image build`` caches it)."""
    tree = images / ".cache" / f"rootfs-{ImageRecipe().base_key()}"
    assert tree.is_dir(), "the default image's debootstrap tree is cached by `forkd image build`"
    return tree


def debian_layout(images: Path, work: Path, extra: dict[str, bytes]) -> Path:
    """A one-layer Debian image from the debootstrap tree plus a second layer of ``extra`` files."""
    layout = new_layout(work / "debian")
    base = work / "debian-base.tar"
    args = ["tar", "-C", str(debian_tree(images)), "-cf", str(base)]
    args += [f"--exclude={pattern}" for pattern in _DEBIAN_EXCLUDES]
    subprocess.run([*args, "."], check=True)
    add_layer(layout, base)
    base.unlink()
    add_layer(layout, write_tar(work / "extra.tar", [file(name, data) for name, data in extra.items()]))
    return layout


# The applets a busybox image links (Docker Hub's busybox links them all; these are what the tests run).
BUSYBOX_APPLETS = ("sh", "ls", "cat", "echo", "id", "stty", "mount", "mkdir", "rm", "sleep", "uname", "grep")


def busybox_layout(work: Path) -> Path:
    """Debian's static busybox and its applets, as busybox's own image is: no Python, no libc, no
    /etc but what the layer makes; then a second layer that whites out a file of the first, makes
    a directory opaque, and adds a setuid file and a hard link to it."""
    layout = new_layout(work / "busybox")
    members = [entry("bin", tarfile.DIRTYPE), entry("etc", tarfile.DIRTYPE),
               entry("tmp", tarfile.DIRTYPE, mode=0o1777),
               file("bin/busybox", Path("/bin/busybox").read_bytes(), mode=0o755),
               file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"), file("etc/group", b"root:x:0:\n"),
               file("etc/gone", b"old"), entry("srv", tarfile.DIRTYPE), file("srv/old", b"1")]
    members += [entry(f"bin/{applet}", tarfile.SYMTYPE, link="busybox") for applet in BUSYBOX_APPLETS]
    add_layer(layout, write_tar(work / "busybox.tar", members))
    add_layer(layout, write_tar(work / "second.tar", [
        file("etc/.wh.gone"), entry("srv", tarfile.DIRTYPE), file("srv/.wh..wh..opq"), file("srv/new", b"n"),
        file("srv/tool", b"#!/bin/sh\necho tool\n", mode=0o4755),
        entry("srv/tool-link", tarfile.LNKTYPE, link="srv/tool"),
    ]))
    return layout


def file(name: str, data: bytes = b"", mode: int = 0o644, uid: int = 0) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.uid, info.gid, info.mtime = len(data), mode, uid, uid, 1_700_000_000
    return info, data


def entry(name: str, kind: bytes, *, link: str = "", mode: int = 0o755,
          pax: dict[str, str] | None = None) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.mtime = kind, link, mode, 1_700_000_000
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3
    if pax:
        info.pax_headers = pax
    return info, b""


def write_tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def outside_untouched(root: Path) -> list[str]:
    """Everything under ``root`` (the folder a hostile layer aims at): empty when nothing escaped."""
    return sorted(os.path.relpath(os.path.join(d, f), root)
                  for d, dirs, files in os.walk(root) for f in [*files, *dirs])


__all__ = ["Registry", "add_layer", "debian_layout", "entry", "file", "new_layout", "outside_untouched",
           "registry", "set_config", "write_tar"]
