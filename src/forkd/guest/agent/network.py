"""eth0's address, default route and DNS, set once at boot from the kernel command line.

A template with a NIC boots with ``forkd.net=<addr>/<prefix>,<gateway>,<dns>+<dns>``
(host/netplan.py ``guest_cmdline``). Every child is restored from that template's
memory and disk, so it starts with the same configuration and never needs it
again: the host gives each child its own namespace in which that same address
is unique (see host/netplan.py).

The image has no iproute2 (debootstrap minbase), so this uses the ioctls that
``ifconfig`` and ``route`` use: stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import ipaddress
import os
import socket
import struct
import sys
import time

from forkd.guest.agent.setup import IFF_UP, IFREQ_FLAGS, SIOCGIFFLAGS, SIOCSIFFLAGS

# <linux/sockios.h>, <linux/route.h>
SIOCSIFADDR = 0x8916
SIOCSIFNETMASK = 0x891C
SIOCADDRT = 0x890B
RTF_UP, RTF_GATEWAY = 0x1, 0x2
IFREQ_ADDR = "16sHH4s16x"  # struct ifreq: the name, then a sockaddr_in in its 24-byte union
# struct rtentry (native alignment; "0L" pads the end to its 120 bytes on x86-64)
RTENTRY = "@L16s16s16sHhLPhPLLH0L"

IFACE = "eth0"
RESOLV_CONF = "/etc/resolv.conf"
# virtio_net is loaded by the initramfs before the agent starts; allow a moment regardless.
IFACE_WAIT_SECS = 2.0


class NetSpec:
    """``forkd.net=`` parsed: the interface's address and network, the gateway, the resolvers."""

    def __init__(self, spec: str) -> None:
        parts = spec.split(",")
        if len(parts) != 3:
            raise ValueError(f"forkd.net={spec!r}: expected ADDR/PREFIX,GATEWAY,DNS+DNS")
        self.interface = ipaddress.IPv4Interface(parts[0])
        self.gateway = ipaddress.IPv4Address(parts[1])
        self.dns = [str(ipaddress.IPv4Address(d)) for d in parts[2].split("+") if d]


def _sockaddr(addr: ipaddress.IPv4Address) -> bytes:
    return struct.pack("HH4s8x", socket.AF_INET, 0, addr.packed)


def _set_addr(s: socket.socket, iface: bytes, request: int, addr: ipaddress.IPv4Address) -> None:
    fcntl.ioctl(s, request, struct.pack(IFREQ_ADDR, iface, socket.AF_INET, 0, addr.packed))


def _link_up(s: socket.socket, iface: bytes) -> None:
    flags = struct.unpack(IFREQ_FLAGS, fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack(IFREQ_FLAGS, iface, 0)))[1]
    fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack(IFREQ_FLAGS, iface, flags | IFF_UP))


def _default_route(s: socket.socket, gateway: ipaddress.IPv4Address) -> None:
    any_addr = ipaddress.IPv4Address(0)
    rt = struct.pack(RTENTRY, 0, _sockaddr(any_addr), _sockaddr(gateway), _sockaddr(any_addr),
                     RTF_UP | RTF_GATEWAY, 0, 0, 0, 0, 0, 0, 0, 0)
    try:
        fcntl.ioctl(s, SIOCADDRT, rt)
    except OSError as exc:
        if exc.errno != errno.EEXIST:
            raise


def write_resolv_conf(dns: list[str], path: str = RESOLV_CONF) -> None:
    """Replace (not follow: it may be a dangling symlink in the image) the resolver list."""
    tmp = f"{path}.forkd-tmp"
    with open(tmp, "w") as f:
        f.write("".join(f"nameserver {d}\n" for d in dns))
    os.replace(tmp, path)


def configure(spec: str | None, iface: str = IFACE, resolv_conf: str = RESOLV_CONF) -> str | None:
    """Bring ``iface`` up as ``spec`` says; None on success (or without a spec), else why not."""
    if not spec:
        return None
    try:
        net = NetSpec(spec)
    except ValueError as exc:
        return str(exc)
    deadline = time.monotonic() + IFACE_WAIT_SECS
    while not os.path.exists(f"/sys/class/net/{iface}") and time.monotonic() < deadline:
        time.sleep(0.02)
    name = iface.encode()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            _set_addr(s, name, SIOCSIFADDR, net.interface.ip)
            _set_addr(s, name, SIOCSIFNETMASK, net.interface.netmask)
            _link_up(s, name)
            _default_route(s, net.gateway)
        if net.dns:
            write_resolv_conf(net.dns, resolv_conf)
    except OSError as exc:
        return f"configuring {iface} ({spec}): {exc}"
    return None


def configure_at_boot(spec: str | None) -> None:
    """PID 1's call: configure, and say on the console if it failed (the agent serves anyway)."""
    error = configure(spec)
    if error:
        with contextlib.suppress(OSError):
            print(f"forkd-agent: network not configured: {error}", flush=True, file=sys.stderr)
