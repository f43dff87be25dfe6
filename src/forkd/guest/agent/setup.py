"""PID 1's environment: the kernel command line, mounts, /dev's links, hostname, loopback, the port.

The agent is the guest's init (there is no systemd in the image), so before it
can serve it does what an init would: mount the pseudo filesystems, link
/dev/fd and /dev/std*, set the hostname, bring up ``lo``, and find its
virtio-serial port by name.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import struct
import subprocess
import time
from typing import Any

from forkd.guest.protocol import RequestError, check_env, check_path

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# source, target, fstype, options
PID1_MOUNTS = (
    ("proc", "/proc", "proc", ""),
    ("sysfs", "/sys", "sysfs", ""),
    ("devtmpfs", "/dev", "devtmpfs", ""),
    ("devpts", "/dev/pts", "devpts", "gid=5,mode=620"),
    ("tmpfs", "/dev/shm", "tmpfs", "mode=1777"),
    ("tmpfs", "/run", "tmpfs", "mode=755"),
    ("tmpfs", "/tmp", "tmpfs", "mode=1777"),
)

# The links an init's /dev has (udev and systemd-tmpfiles make them; devtmpfs has none): bash's
# process substitution, `. /dev/fd/N` and programs that open /dev/stdin need them.
DEV_LINKS = (("/proc/self/fd", "fd"), ("/proc/self/fd/0", "stdin"), ("/proc/self/fd/1", "stdout"),
             ("/proc/self/fd/2", "stderr"))

# <linux/sockios.h>, <net/if.h>
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
IFREQ_FLAGS = "16sH14x"  # struct ifreq: the name, then ifr_flags

PORTS_DIR = "/sys/class/virtio-ports"


def cmdline_options(path: str = "/proc/cmdline") -> dict[str, str]:
    """``forkd.key=value`` words from the kernel command line."""
    opts: dict[str, str] = {}
    try:
        with open(path) as f:
            words = f.read().split()
    except OSError:
        return opts
    for word in words:
        if word.startswith("forkd.") and "=" in word:
            key, value = word[len("forkd.") :].split("=", 1)
            opts[key] = value
    return opts


def _mount_call(source: str, target: str, fstype: str, options: str) -> bool:
    """mount(2) through libc: an image need not have a ``mount`` (distroless has none)."""
    try:
        import ctypes  # here: an image's own Python may be built without it

        libc = ctypes.CDLL(None, use_errno=True)
        data = options.encode() if options else None
        return int(libc.mount(source.encode(), target.encode(), fstype.encode(), 0, data)) == 0
    except (ImportError, OSError, AttributeError):
        return False


def _mount(source: str, target: str, fstype: str, options: str = "") -> None:
    os.makedirs(target, exist_ok=True)
    if _mount_call(source, target, fstype, options):
        return
    args = ["mount", "-t", fstype]
    if options:
        args += ["-o", options]
    with contextlib.suppress(OSError):
        subprocess.run([*args, source, target], stderr=subprocess.DEVNULL, check=False)


def dev_links(dev: str = "/dev") -> None:
    """``DEV_LINKS`` in ``dev``, where missing."""
    for target, name in DEV_LINKS:
        with contextlib.suppress(OSError):
            os.symlink(target, os.path.join(dev, name))


def loopback_up() -> None:
    """``ip link set lo up`` without iproute2 (minbase images have none)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack(IFREQ_FLAGS, b"lo", 0)
        flags = struct.unpack(IFREQ_FLAGS, fcntl.ioctl(s, SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack(IFREQ_FLAGS, b"lo", flags | IFF_UP))


def setup_pid1_environment() -> None:
    """What an init would do: mounts, hostname, loopback. Only as PID 1."""
    os.environ.setdefault("PATH", DEFAULT_PATH)
    os.environ.setdefault("HOME", "/root")
    os.environ.setdefault("LANG", "C.UTF-8")
    mounted: set[str] = set()
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        mounted = {line.split()[1] for line in f}
    for src, target, fstype, options in PID1_MOUNTS:
        if target not in mounted:
            _mount(src, target, fstype, options)
    dev_links()
    with contextlib.suppress(OSError):
        with open("/etc/hostname") as f:
            name = f.read().strip() or "forkd"
        with open("/proc/sys/kernel/hostname", "w") as f:
            f.write(name)
    loopback_up()


def find_port(name: str, base: str = PORTS_DIR) -> str | None:
    """The /dev/vportNpM whose virtio-serial name is ``name``."""
    with contextlib.suppress(OSError):
        for port in os.listdir(base):
            with contextlib.suppress(OSError), open(f"{base}/{port}/name") as f:
                if f.read().strip() == name:
                    return f"/dev/{port}"
    return None


def wait_for_port(name: str, tries: int = 500, interval: float = 0.02) -> str | None:
    """``find_port``, retried while udev-less /sys catches up (about 10 s in all)."""
    for _ in range(tries):
        path = find_port(name)
        if path:
            return path
        time.sleep(interval)
    return None


def pid1_defaults(req: dict[str, Any]) -> dict[str, bool]:
    """A template build's ENV and WORKDIR in PID 1 itself: every later exec and eval inherits them
    (an action of its own, as an image without Python has no eval to do it with)."""
    env = check_env(req.get("env"))
    cwd = req.get("cwd")
    if cwd is not None:
        try:
            cwd = check_path(cwd)  # the file actions' check of a guest path
        except RequestError as exc:
            raise RequestError(f"cwd must be an absolute path: {exc}") from None
    os.environ.update(env)
    if cwd is not None:
        os.makedirs(cwd, exist_ok=True)
        os.chdir(cwd)
    return {"applied": True}
