"""The guest kernel: Debian's cloud kernel, unpacked to a PVH-bootable ELF.

QEMU's microvm machine boots an uncompressed ELF ``vmlinux`` through its PVH
entry point, like Firecracker; the bzImage stalls in real-mode setup. Debian
ships only the bzImage, whose payload is an LZ4 "legacy" frame: we find its
magic and decompress it. No compiler is needed.
"""

from __future__ import annotations

import glob
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from forkd.errors import ImageError
from forkd.host import prereqs

KERNEL_PACKAGE = "linux-image-cloud-amd64"
LZ4_LEGACY_MAGIC = b"\x02\x21\x4c\x18"
ELF_MAGIC = b"\x7fELF"


@dataclass(frozen=True)
class KernelFiles:
    vmlinux: Path
    modules: Path  # .../lib/modules/<version>
    version: str


def _run(args: list[str], cwd: Path | None = None) -> str:
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ImageError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    return proc.stdout


def resolve_kernel_package(meta_package: str = KERNEL_PACKAGE) -> str:
    """The versioned package the meta-package depends on (e.g. linux-image-6.1.0-56-cloud-amd64)."""
    out = _run(["apt-cache", "depends", meta_package])
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Depends:") and "linux-image-" in line:
            return line.split()[-1]
    raise ImageError(
        f"apt-cache knows no kernel behind {meta_package}; run 'apt-get update' first"
    )


def is_elf(path: Path) -> bool:
    """Whether ``path`` is an ELF file (a bootable vmlinux), reading 4 bytes, not 50 MB."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == ELF_MAGIC
    except OSError:
        return False


def extract_vmlinux(bzimage: Path, out: Path) -> None:
    data = bzimage.read_bytes()
    if data[:4] == ELF_MAGIC:
        out.write_bytes(data)
        return
    at = data.find(LZ4_LEGACY_MAGIC)
    if at < 0:
        raise ImageError(
            f"{bzimage} has no LZ4 payload; only LZ4-compressed kernels (Debian's) can be unpacked"
        )
    lz4 = prereqs.require(prereqs.LZ4)["lz4"]
    payload = out.with_suffix(".lz4")
    payload.write_bytes(data[at:])
    try:
        # lz4 stops at the end of the frame; trailing bytes of the bzImage are ignored.
        proc = subprocess.run([lz4, "-d", "-f", "-q", str(payload), str(out)], capture_output=True)
    finally:
        payload.unlink(missing_ok=True)
    if not is_elf(out):
        raise ImageError(f"decompressing {bzimage} did not give an ELF kernel: {proc.stderr!r}")


def fetch_kernel(workdir: Path, meta_package: str = KERNEL_PACKAGE) -> KernelFiles:
    """Download the kernel .deb (not installed) and unpack vmlinux + modules into ``workdir``."""
    tools = prereqs.require(prereqs.APT_GET, prereqs.DPKG_DEB)
    package = resolve_kernel_package(meta_package)
    workdir.mkdir(parents=True, exist_ok=True)
    # apt drops privileges to _apt for downloads; a root-only temp dir would make it warn.
    os.chmod(workdir, 0o755)
    _run([tools["apt-get"], "download", "-q", package], cwd=workdir)
    debs = glob.glob(str(workdir / f"{package}_*.deb"))
    if not debs:
        raise ImageError(f"apt-get download {package} produced no .deb")
    unpacked = workdir / "pkg"
    _run([tools["dpkg-deb"], "-x", debs[0], str(unpacked)])
    os.unlink(debs[0])
    bzimages = glob.glob(str(unpacked / "boot" / "vmlinuz-*"))
    if not bzimages:
        raise ImageError(f"{package} contains no /boot/vmlinuz-*")
    version = Path(bzimages[0]).name.removeprefix("vmlinuz-")
    vmlinux = workdir / "vmlinux"
    extract_vmlinux(Path(bzimages[0]), vmlinux)
    modules = unpacked / "lib" / "modules" / version
    if not modules.is_dir():
        raise ImageError(f"{package} has no modules for {version}")
    return KernelFiles(vmlinux=vmlinux, modules=modules, version=version)
