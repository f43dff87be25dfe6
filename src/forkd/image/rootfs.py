"""The guest root filesystem: a Debian tree (ours or the user's) plus the agent, as ext4."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tarfile
from importlib import resources
from pathlib import Path

from forkd.errors import ImageError, InvalidRequest
from forkd.host import prereqs

AGENT_GUEST_PATH = "opt/forkd/agent.py"


def agent_source() -> bytes:
    return resources.files("forkd.guest").joinpath("agent.py").read_bytes()


def _run(args: list[str], what: str, log: Path | None = None) -> None:
    proc = subprocess.run(args, capture_output=True, text=True)
    if log is not None:
        with open(log, "a") as f:
            f.write(f"$ {' '.join(args)}\n{proc.stdout}\n{proc.stderr}\n")
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-1200:]
        raise ImageError(f"{what} failed (exit {proc.returncode}): {tail}")


def debootstrap(target: Path, suite: str, mirror: str, packages: list[str], log: Path) -> None:
    prereqs.require_root("building the guest root filesystem")
    tool = prereqs.require(prereqs.DEBOOTSTRAP)["debootstrap"]
    args = [tool, "--variant=minbase"]
    if packages:
        args.append("--include=" + ",".join(packages))
    args += [suite, str(target), mirror]
    _run(args, f"debootstrap of {suite} (see {log})", log)


def unpack_user_rootfs(source: Path, target: Path) -> None:
    """Copy a root filesystem directory, or unpack a tarball such as ``docker export`` gives."""
    if source.is_dir():
        _run(["cp", "-a", f"{source}/.", str(target)], f"copying {source}")
    elif source.is_file() and tarfile.is_tarfile(source):
        tar = prereqs.require(prereqs.TAR)["tar"]
        _run([tar, "-xf", str(source), "-C", str(target), "--numeric-owner"], f"unpacking {source}")
    else:
        raise InvalidRequest(f"rootfs {source} is neither a directory nor a tar archive")
    if not (target / "usr" / "bin" / "python3").exists() and not (target / "bin" / "python3").exists():
        raise InvalidRequest(
            f"rootfs {source} has no python3: the forkd agent needs /usr/bin/python3 in the guest"
        )


def install_packages(root: Path, packages: list[str], log: Path) -> None:
    """apt-get install inside a (Debian-based) root filesystem."""
    if not packages:
        return
    prereqs.require_root("installing packages into a root filesystem")
    if not (root / "usr" / "bin" / "apt-get").exists():
        raise InvalidRequest("extra packages need apt-get inside the rootfs (a Debian/Ubuntu tree)")
    resolv = root / "etc" / "resolv.conf"
    if resolv.is_symlink() or not resolv.exists():
        resolv.unlink(missing_ok=True)
        shutil.copyfile("/etc/resolv.conf", resolv)
    env = "DEBIAN_FRONTEND=noninteractive"
    _run(["chroot", str(root), "env", env, "apt-get", "update", "-q"], "apt-get update in rootfs", log)
    _run(
        ["chroot", str(root), "env", env, "apt-get", "install", "-y", "-q",
         "--no-install-recommends", *packages],
        f"apt-get install {' '.join(packages)} in rootfs",
        log,
    )
    _run(["chroot", str(root), "apt-get", "clean"], "apt-get clean in rootfs", log)


def install_agent(root: Path) -> None:
    agent = root / AGENT_GUEST_PATH
    agent.parent.mkdir(parents=True, exist_ok=True)
    agent.write_bytes(agent_source())
    agent.chmod(0o755)
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc" / "hostname").write_text("forkd\n")


def tree_size_mib(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total >> 20


def make_ext4(root: Path, out: Path, size_mib: int) -> None:
    """Pack ``root`` into a sparse ext4 image without mounting anything (mkfs.ext4 -d)."""
    mkfs = prereqs.require(prereqs.MKFS_EXT4)["mkfs.ext4"]
    needed = tree_size_mib(root) * 5 // 4 + 64
    if size_mib < needed:
        raise InvalidRequest(f"image size {size_mib} MiB is too small; the tree needs ~{needed} MiB")
    out.unlink(missing_ok=True)
    with open(out, "wb") as f:
        f.truncate(size_mib << 20)
    _run(
        [mkfs, "-q", "-F", "-L", "forkd-root", "-E", "lazy_itable_init=1", "-d", str(root), str(out)],
        f"mkfs.ext4 -d {root}",
    )
