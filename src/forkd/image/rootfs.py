"""The guest root filesystem: a Debian tree (ours or the user's) plus the agent, as ext4."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

from forkd.errors import ImageError, InvalidRequest
from forkd.guest.agent import MIN_GUEST_PYTHON
from forkd.host import prereqs

# The agent package and its protocol modules live under this directory in the guest, as
# forkd/guest/agent/, forkd/guest/protocol.py and forkd/guest/messages.py; init.sh runs AGENT_ENTRY
# by path.
AGENT_GUEST_ROOT = "opt/forkd"
AGENT_ENTRY = f"{AGENT_GUEST_ROOT}/forkd/guest/agent/__main__.py"
# The guest's forkd and forkd.guest packages hold nothing but the agent and its
# protocol: the host's forkd/__init__.py imports modules the guest does not have.
# The account every image has (E2B's sandboxes run as it by default): uid/gid 1000, a home, bash,
# and passwordless sudo where the tree has sudo.
GUEST_USER = "user"
GUEST_UID = 1000
GUEST_HOME = "home/user"
# The modules of forkd.guest that the agent imports beside its own package (the host has the rest:
# client.py, transport.py). A new one goes here, or the agent cannot start.
GUEST_SHARED_MODULES = ("capabilities.py", "code_messages.py", "messages.py", "process_messages.py",
                        "protocol.py", "schema.py", "volume_messages.py")
GUEST_PACKAGE_STUB = b'"""forkd\'s guest side: the agent and its protocol only (see forkd.image.rootfs)."""\n'


def _walk(folder: Traversable, prefix: str) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for entry in folder.iterdir():
        if entry.name == "__pycache__" or entry.name.endswith((".pyc", ".pyo")):
            continue
        if entry.is_dir():
            files.update(_walk(entry, f"{prefix}{entry.name}/"))
        else:
            files[f"{prefix}{entry.name}"] = entry.read_bytes()
    return files


def agent_files() -> dict[str, bytes]:
    """What the guest gets, by path under ``AGENT_GUEST_ROOT``, sorted by path.

    Every file of the ``forkd.guest.agent`` package, the modules of ``forkd.guest`` both ends
    share (``GUEST_SHARED_MODULES``: the wire protocol and its schema), and the two stub
    ``__init__.py`` files that make them importable.
    """
    guest = resources.files("forkd.guest")
    files = {
        "forkd/__init__.py": GUEST_PACKAGE_STUB,
        "forkd/guest/__init__.py": GUEST_PACKAGE_STUB,
        **{f"forkd/guest/{name}": guest.joinpath(name).read_bytes() for name in GUEST_SHARED_MODULES},
        **_walk(guest.joinpath("agent"), "forkd/guest/agent/"),
    }
    return dict(sorted(files.items()))


def agent_digest(files: dict[str, bytes] | None = None) -> str:
    """sha256 over every agent file's path and content, in path order: the image key's part."""
    h = hashlib.sha256()
    for path, data in sorted((agent_files() if files is None else files).items()):
        h.update(b"%s\0%d\0" % (path.encode(), len(data)))
        h.update(data)
    return h.hexdigest()


def guest_python_version(root: Path) -> tuple[int, int] | None:
    """The version of a tree's python3, from the name it links to or its stdlib folder.

    None when neither tells (then the agent itself refuses an old one at boot).
    """
    for start in ("usr/bin/python3", "bin/python3"):
        rel = start
        for _hop in range(16):  # follow symlinks inside the tree, not on the host
            path = root / rel
            if not path.is_symlink():
                break
            target = os.readlink(path)
            rel = target.lstrip("/") if target.startswith("/") else os.path.normpath(
                os.path.join(os.path.dirname(rel), target))
        match = re.fullmatch(r"python(\d+)\.(\d+)", os.path.basename(rel))
        if match and (root / rel).exists():
            return int(match[1]), int(match[2])
    versions = []
    for lib in (root / "usr" / "lib").glob("python3.*/os.py"):
        match = re.fullmatch(r"python(\d+)\.(\d+)", lib.parent.name)
        if match:
            versions.append((int(match[1]), int(match[2])))
    return max(versions) if versions else None


def check_guest_python(root: Path) -> None:
    version = guest_python_version(root)
    if version is not None and version < MIN_GUEST_PYTHON:
        have, need = ".".join(map(str, version)), ".".join(map(str, MIN_GUEST_PYTHON))
        raise InvalidRequest(
            f"the root filesystem's python3 is {have}; the forkd agent needs Python {need} or newer"
        )


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


def _guest_platform(root: Path, log: Path) -> tuple[str, tuple[int, int]]:
    """The tree's machine and glibc version, as its own python3 reports them (in a chroot)."""
    proc = subprocess.run(
        ["chroot", str(root), "python3", "-c",
         "import platform; print(platform.machine(), platform.libc_ver()[1])"],
        capture_output=True, text=True,
    )
    with open(log, "a") as f:
        f.write(f"$ chroot {root} python3 -c platform...\n{proc.stdout}\n{proc.stderr}\n")
    words = proc.stdout.split()
    match = re.fullmatch(r"(\d+)\.(\d+)", words[1]) if proc.returncode == 0 and len(words) == 2 else None
    if match is None:
        raise ImageError(f"cannot tell the rootfs's machine and glibc for pip packages: {proc.stderr[-400:]}")
    return words[0], (int(match[1]), int(match[2]))


def install_pip_packages(root: Path, pins: list[str], log: Path) -> None:
    """pip-install exact pins into the tree's ``/usr/local/lib/python3.X/dist-packages``.

    Debian's python3 puts that folder ahead of its own packages, so these shadow
    Debian's of the same name for every program in the guest. The host's pip
    fetches wheels built for the tree's python, machine and glibc (never a source
    build), without dependencies: the list is the whole set. The console
    scripts pip writes name the host's interpreter, so they are dropped; the
    guest's own python3 compiles the bytecode.
    """
    if not pins:
        return
    prereqs.require_root("installing pip packages into a root filesystem")
    version = guest_python_version(root)
    if version is None:
        raise InvalidRequest("pip packages need the rootfs's python3 (its version could not be told)")
    machine, (glibc_major, glibc_minor) = _guest_platform(root, log)
    platforms = [f"--platform=manylinux_{glibc_major}_{minor}_{machine}"
                 for minor in range(17, glibc_minor + 1)]
    platforms.append(f"--platform=manylinux2014_{machine}")
    guest_dir = f"/usr/local/lib/python{version[0]}.{version[1]}/dist-packages"
    target = root / guest_dir.lstrip("/")
    staging = root / "tmp" / f"forkd-pip-{os.getpid()}"  # pip --target replaces what it installs
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary=:all:",
              "--no-compile", "--disable-pip-version-check", "--target", str(staging),
              f"--python-version={version[0]}.{version[1]}", "--implementation=cp", *platforms, *pins],
             f"pip install {' '.join(pins)} (the host's pip, for the rootfs's python3)", log)
        shutil.rmtree(staging / "bin", ignore_errors=True)
        target.mkdir(parents=True, exist_ok=True)
        for entry in staging.iterdir():
            shutil.rmtree(target / entry.name, ignore_errors=True)
            os.rename(entry, target / entry.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _run(["chroot", str(root), "python3", "-m", "compileall", "-q", "-j0", guest_dir],
         "compiling the pip packages' bytecode in rootfs", log)


def install_agent(root: Path, *, check_python: bool = True) -> None:
    """Put the agent into a root filesystem tree, replacing any agent already there. ``check_python``
    False: the tree carries forkd's runtime for it (image/guest_runtime.py), whatever its own."""
    if check_python:
        check_guest_python(root)
    base = root / AGENT_GUEST_ROOT
    # The debootstrap tree is cached and reused: no module of an older agent may linger.
    shutil.rmtree(base, ignore_errors=True)
    for rel, data in agent_files().items():
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o644)
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc" / "hostname").write_text("forkd\n")
    add_user(root)


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def user_home(root: Path) -> str | None:
    """The home directory the tree's /etc/passwd gives ``user``, relative to the root; None if none."""
    for line in _lines(root / "etc" / "passwd"):
        fields = line.split(":")
        if len(fields) >= 7 and fields[0] == GUEST_USER:
            return fields[5].lstrip("/")
    return None


def _ensure_line(path: Path, name: str, line: str, mode: int = 0o644) -> None:
    """Add ``line`` to the colon-separated database ``path`` unless an entry ``name`` is there."""
    lines = _lines(path)
    if any(existing.split(":", 1)[0] == name for existing in lines):
        return
    path.write_text("\n".join([*lines, line]) + "\n")
    path.chmod(mode)


def add_user(root: Path) -> None:
    """Give the tree the account ``user`` (uid and gid 1000, home /home/user), idempotently.

    The files are edited directly rather than with ``useradd`` in a chroot: a user's
    tree (``rootfs_source``) need not have the shadow tools, and the debootstrap tree
    is cached, so this runs on every build of it. A tree that already has a ``user``
    keeps it as it is; uid 1000 held by another name is refused (E2B's programs expect
    ``user`` to be 1000).
    """
    etc = root / "etc"
    passwd = etc / "passwd"
    entries = {line.split(":")[0]: line.split(":") for line in _lines(passwd) if line.count(":") >= 6}
    if GUEST_USER not in entries:
        taken = [name for name, fields in entries.items() if fields[2] == str(GUEST_UID)]
        if taken:
            raise InvalidRequest(f"the root filesystem's uid {GUEST_UID} is {taken[0]!r}; forkd's "
                                 f"guests need uid {GUEST_UID} for the user {GUEST_USER!r}")
        has_bash = (root / "bin" / "bash").exists() or (root / "usr/bin/bash").exists()
        shell = "/bin/bash" if has_bash else "/bin/sh"
        _ensure_line(passwd, GUEST_USER, f"{GUEST_USER}:x:{GUEST_UID}:{GUEST_UID}::/{GUEST_HOME}:{shell}")
        _ensure_line(etc / "group", GUEST_USER, f"{GUEST_USER}:x:{GUEST_UID}:")
        # No password: a locked account, reached only through the agent (and sudo, below).
        if (etc / "shadow").exists():
            _ensure_line(etc / "shadow", GUEST_USER, f"{GUEST_USER}:!:19700:0:99999:7:::", 0o640)
        if (etc / "gshadow").exists():
            _ensure_line(etc / "gshadow", GUEST_USER, f"{GUEST_USER}:!::", 0o640)
    fields = _lines(passwd)
    uid, gid, home = next((int(f[2]), int(f[3]), f[5]) for f in (line.split(":") for line in fields)
                          if f[0] == GUEST_USER)
    home_dir = root / home.lstrip("/")
    if not home_dir.exists():
        home_dir.mkdir(parents=True)
        skel = root / "etc" / "skel"
        if skel.is_dir():
            _run(["cp", "-a", f"{skel}/.", str(home_dir)], f"copying {skel}")
        for dirpath, _dirs, files in os.walk(home_dir):
            for name in [dirpath, *(os.path.join(dirpath, f) for f in files)]:
                os.lchown(name, uid, gid)
        home_dir.chmod(0o750)
    sudoers = etc / "sudoers.d"
    if sudoers.is_dir():
        rule = sudoers / "forkd-user"
        rule.write_text(f"{GUEST_USER} ALL=(ALL:ALL) NOPASSWD: ALL\n")
        rule.chmod(0o440)


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
