"""Host tools the image builder and the VMM need, and how to get each one."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from forkd.errors import PrerequisiteMissing


@dataclass(frozen=True)
class Tool:
    command: str
    package: str  # the Debian package that provides it
    purpose: str

    def path(self) -> str | None:
        found = shutil.which(self.command)
        if found:
            return found
        for prefix in ("/usr/sbin", "/sbin", "/usr/bin", "/bin"):
            candidate = os.path.join(prefix, self.command)
            if os.access(candidate, os.X_OK):
                return candidate
        return None


QEMU = Tool("qemu-system-x86_64", "qemu-system-x86", "runs the microVMs")
QEMU_IMG = Tool("qemu-img", "qemu-utils", "creates copy-on-write qcow2 disks")
DEBOOTSTRAP = Tool("debootstrap", "debootstrap", "builds the guest root filesystem")
MKFS_EXT4 = Tool("mkfs.ext4", "e2fsprogs", "packs the root filesystem into an ext4 image")
LZ4 = Tool("lz4", "lz4", "decompresses the guest kernel")
APT_GET = Tool("apt-get", "apt", "downloads the guest kernel package")
DPKG_DEB = Tool("dpkg-deb", "dpkg", "unpacks the guest kernel package")
BUSYBOX = Tool("busybox", "busybox-static", "the initramfs shell")
TAR = Tool("tar", "tar", "unpacks a user-supplied root filesystem tarball")

VMM_TOOLS = (QEMU, QEMU_IMG)
IMAGE_TOOLS = (DEBOOTSTRAP, MKFS_EXT4, LZ4, APT_GET, DPKG_DEB, BUSYBOX)


def require(*tools: Tool) -> dict[str, str]:
    """Paths of ``tools``, or one error that names every missing package."""
    found: dict[str, str] = {}
    missing: list[Tool] = []
    for tool in tools:
        path = tool.path()
        if path:
            found[tool.command] = path
        else:
            missing.append(tool)
    if missing:
        names = ", ".join(f"{t.command} ({t.purpose})" for t in missing)
        packages = " ".join(sorted({t.package for t in missing}))
        raise PrerequisiteMissing(
            f"missing host tools: {names}. Install them with: "
            f"apt-get install -y --no-install-recommends {packages}"
        )
    return found


def static_busybox() -> str:
    """The initramfs runs before any library exists, so busybox must be static."""
    path = require(BUSYBOX)["busybox"]
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if b"/lib64/ld-linux" in head or b"/lib/ld-linux" in head:
        raise PrerequisiteMissing(
            f"{path} is dynamically linked; the initramfs needs a static one: "
            "apt-get install -y busybox-static"
        )
    return path


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise PrerequisiteMissing(f"{what} needs root (debootstrap, chroot); run it as root or with sudo")
