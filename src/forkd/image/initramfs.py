"""The initramfs: static busybox, the virtio modules and forkd's /init.

The Debian cloud kernel builds virtio as modules, and this kernel lacks
``VIRTIO_MMIO_CMDLINE_DEVICES``, so nothing can be found before ``virtio_mmio``
is loaded. The archive is written here in cpio "newc" format so that the host
needs no cpio binary.
"""

from __future__ import annotations

import gzip
import io
import os
from importlib import resources
from pathlib import Path

from forkd.errors import ImageError
from forkd.host import prereqs

# What the guest needs: the virtio-mmio transport, a disk, the agent's
# virtio-serial port, an entropy source, a NIC for later networking, and FUSE for shared volumes
# (forkd.guest.agent.volfs).
WANTED_MODULES = ("virtio_mmio", "virtio_blk", "virtio_console", "virtio-rng", "virtio_net", "fuse")


def module_index(modules_dir: Path) -> dict[str, Path]:
    """Module name (as in ``depends=``, dashes and underscores equal) → .ko path."""
    index: dict[str, Path] = {}
    for ko in modules_dir.rglob("*.ko"):
        index[_norm(ko.stem)] = ko
    return index


def _norm(name: str) -> str:
    return name.replace("-", "_")


def module_depends(ko: Path) -> list[str]:
    """The ``depends=`` entry of a module's .modinfo section."""
    data = ko.read_bytes()
    at = data.find(b"\0depends=")
    if at < 0:
        return []
    end = data.find(b"\0", at + 1)
    value = data[at + len(b"\0depends=") : end].decode()
    return [_norm(d) for d in value.split(",") if d]


def load_order(modules_dir: Path, wanted: tuple[str, ...] = WANTED_MODULES) -> list[Path]:
    """Modules in an order where every dependency comes first."""
    index = module_index(modules_dir)
    order: list[Path] = []
    seen: set[str] = set()

    def visit(name: str, chain: tuple[str, ...]) -> None:
        name = _norm(name)
        if name in seen:
            return
        if name in chain:
            raise ImageError(f"module dependency cycle: {' -> '.join((*chain, name))}")
        ko = index.get(name)
        if ko is None:
            raise ImageError(f"kernel module {name} not found in {modules_dir}")
        for dep in module_depends(ko):
            visit(dep, (*chain, name))
        seen.add(name)
        order.append(ko)

    for name in wanted:
        visit(name, ())
    return order


class CpioWriter:
    """Minimal cpio "newc" writer (what the kernel's initramfs unpacker reads)."""

    def __init__(self) -> None:
        self.buf = io.BytesIO()
        self.ino = 1

    def _entry(self, name: str, mode: int, data: bytes = b"", nlink: int = 1) -> None:
        encoded = name.encode() + b"\0"
        header = "070701" + "".join(
            f"{v:08x}"
            for v in (self.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        )
        self.ino += 1
        self.buf.write(header.encode() + encoded)
        self._pad()
        self.buf.write(data)
        self._pad()

    def _pad(self) -> None:
        self.buf.write(b"\0" * (-self.buf.tell() % 4))

    def directory(self, name: str) -> None:
        self._entry(name, 0o040755, nlink=2)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._entry(name, 0o100000 | mode, data)

    def symlink(self, name: str, target: str) -> None:
        self._entry(name, 0o120777, target.encode())

    def finish(self) -> bytes:
        self._entry("TRAILER!!!", 0)
        return self.buf.getvalue()


def init_script() -> bytes:
    return resources.files("forkd.image").joinpath("files/init.sh").read_bytes()


def build_initramfs(modules_dir: Path, out: Path) -> list[str]:
    """Write ``out`` (gzip'd cpio); return the module load order it uses."""
    busybox = Path(prereqs.static_busybox()).read_bytes()
    order = load_order(modules_dir)
    cpio = CpioWriter()
    for d in ("bin", "dev", "proc", "sys", "newroot", "modules"):
        cpio.directory(d)
    cpio.file("bin/busybox", busybox, 0o755)
    cpio.symlink("bin/sh", "busybox")
    cpio.file("init", init_script(), 0o755)
    for ko in order:
        cpio.file(f"modules/{ko.stem}.ko", ko.read_bytes())
    cpio.file("modules.order", "".join(f"{ko.stem}\n" for ko in order).encode())
    tmp = out.with_suffix(".tmp")
    # Level 1: the kernel decompresses it once per template boot; size barely matters.
    tmp.write_bytes(gzip.compress(cpio.finish(), compresslevel=1))
    os.replace(tmp, out)
    return [ko.stem for ko in order]
