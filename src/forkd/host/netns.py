"""Network namespaces and tap devices for sandboxes: names, checks, and running QEMU inside one.

A sandbox of a snapshot with a NIC runs in a namespace of its own, which
controller/network.py makes (``forkd-<sandbox id>``, or the seeds'
``forkd-child-<i>`` with ``per_child_netns``). A snapshot taken with a NIC can
only be restored by a QEMU with the same device configuration, so every child
has a tap of the *same name*: one per namespace is exactly that.

QEMU is started through ``nsenter --net=/run/netns/<name>``, which joins the
namespace and execs QEMU in the same process, so the pid forkd records is QEMU's
own. (Unlike ``ip netns exec`` it does not remount ``/sys``, which QEMU does not
need and which would hide ``/sys/fs/cgroup`` from the launcher.)
"""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import threading
from collections.abc import Callable
from pathlib import Path

from forkd.bounds import TAP_RE
from forkd.errors import InvalidRequest

NETNS_DIR = Path("/run/netns")
CHILD_PREFIX = "forkd-child-"


def child_netns(index: int) -> str:
    return f"{CHILD_PREFIX}{index}"


def netns_index(name: str | None) -> int | None:
    """``i`` for ``forkd-child-<i>``, else None."""
    if name and name.startswith(CHILD_PREFIX) and name[len(CHILD_PREFIX):].isdigit():
        return int(name[len(CHILD_PREFIX):])
    return None


def netns_path(name: str, netns_dir: Path = NETNS_DIR) -> Path:
    return netns_dir / name


def netns_exists(name: str, netns_dir: Path = NETNS_DIR) -> bool:
    return netns_path(name, netns_dir).exists()


def lowest_free(used: set[int], n: int) -> list[int]:
    """The ``n`` lowest indices not in ``used``."""
    out: list[int] = []
    i = 0
    while len(out) < n:
        if i not in used:
            out.append(i)
        i += 1
    return out


# Interface names a sandbox's namespace already uses (host/netplan.py's UPLINK).
RESERVED_TAPS = ("lo", "uplink0")


def check_tap_name(name: object) -> str:
    if not isinstance(name, str) or not TAP_RE.match(name):
        raise InvalidRequest(
            f"tap {name!r} is not a valid interface name (1-15 characters: letters, digits, "
            "'_', '.', '-')"
        )
    if name in RESERVED_TAPS:
        raise InvalidRequest(f"tap {name!r} is taken inside every sandbox's namespace; pick another name")
    return name


def _ip() -> str:
    return shutil.which("ip") or "/usr/sbin/ip"


def launcher(netns: str, netns_dir: Path = NETNS_DIR) -> list[str]:
    """An argv prefix that runs the rest of the argv inside ``netns`` (same pid)."""
    nsenter = shutil.which("nsenter") or "/usr/bin/nsenter"
    return [nsenter, f"--net={netns_path(netns, netns_dir)}", "--"]


CLONE_NEWNET = 0x40000000  # <sched.h>


def socket_in(netns: str, make: Callable[[], socket.socket], netns_dir: Path = NETNS_DIR) -> socket.socket:
    """The socket ``make()`` returns, made inside ``netns`` (blocking: run it off the event loop).

    A socket belongs to the namespace it was made in, whichever namespace its user runs in
    later: a thread of its own joins ``netns`` (setns(2) moves only the calling thread), calls
    ``make`` (which makes, binds or listens), and ends; so no thread of the daemon's pools is ever
    left elsewhere. The socket holds the namespace alive: its owner closes it when the namespace goes.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            target = os.open(netns_path(netns, netns_dir), os.O_RDONLY | os.O_CLOEXEC)
            try:
                if libc.setns(target, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"joining network namespace {netns}: {os.strerror(err)}")
            finally:
                os.close(target)
            made.append(make())
        except BaseException as exc:  # handed to the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=run, name=f"netns-{netns}", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return made[0]


def _nonblocking(kind: int, address: tuple[str, int] | None, backlog: int | None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, kind)
    try:
        if backlog is not None:
            # A listener made again (a PUT network) while its last one's connections linger.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if address is not None:
            sock.bind(address)
        if backlog is not None:
            sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def udp_socket_in(netns: str, address: tuple[str, int], netns_dir: Path = NETNS_DIR) -> socket.socket:
    """A non-blocking UDP socket bound to ``address`` inside ``netns`` (see ``socket_in``)."""
    return socket_in(netns, lambda: _nonblocking(socket.SOCK_DGRAM, address, None), netns_dir)


def tcp_listener_in(netns: str, address: tuple[str, int], backlog: int,
                    netns_dir: Path = NETNS_DIR) -> socket.socket:
    """A non-blocking TCP socket listening on ``address`` inside ``netns`` (see ``socket_in``)."""
    return socket_in(netns, lambda: _nonblocking(socket.SOCK_STREAM, address, backlog), netns_dir)


def tcp_socket_in(netns: str, netns_dir: Path = NETNS_DIR) -> socket.socket:
    """A non-blocking, unconnected TCP socket of ``netns``: its connections leave by that namespace's
    routes and address, as the sandbox's own would (see ``socket_in``)."""
    return socket_in(netns, lambda: _nonblocking(socket.SOCK_STREAM, None, None), netns_dir)
