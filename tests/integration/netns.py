"""Separate "machines" on one host: network namespaces joined only by a network the test makes.

:func:`private_network` makes one namespace per named machine, each with its own
address on a private /24, and a bridge in a namespace of its own that joins
them through veth pairs, as a switch joins machines. The root namespace (where
the test process, its clients and the gateway run) is one more machine on that
network, through one more veth: the "client machine". Nothing else routes
between them.

Several forkd runs share this host, so every name carries a random suffix and
the /24 is picked from 10.160.0.0/11 (clear of forkd's sandbox range,
FORKD_NET_CIDR's default 10.201.0.0/16) among those no route or address of the
root namespace touches. Only what this module created is removed, even when a
step fails half-way.
"""

from __future__ import annotations

import contextlib
import ipaddress
import secrets
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

# 10.160.0.0 - 10.191.255.255: private, and far from forkd's 10.201.0.0/16 default.
POOL = ipaddress.ip_network("10.160.0.0/11")


def ip(*args: str) -> str:
    """``ip ARGS`` (iproute2), which must succeed; its output."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"ip {' '.join(args)}: {done.stderr.strip()}"
    return done.stdout


def used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the root namespace routes to or holds an address in."""
    nets = []
    for line in (ip("-4", "route", "show", "table", "all") + ip("-4", "-o", "addr", "show")).splitlines():
        for word in line.split():
            with contextlib.suppress(ValueError):
                if "." in word and word[0].isdigit():
                    nets.append(ipaddress.ip_network(word, strict=False))
    return nets


def free_subnet() -> ipaddress.IPv4Network:
    """A random /24 of :data:`POOL` that nothing on this host uses (routes are the proof of use)."""
    used = used_networks()
    for _ in range(100):
        candidate = ipaddress.ip_network(
            f"{POOL.network_address + (secrets.randbelow(POOL.num_addresses // 256) << 8)}/24")
        if not any(candidate.overlaps(net) for net in used if net.prefixlen > 0):
            return candidate
    raise AssertionError(f"no unused /24 in {POOL}")


@dataclass
class Machine:
    """One namespace with one address on the private network."""

    netns: str
    address: str

    @property
    def launcher(self) -> list[str]:
        """What runs a command inside it. nsenter execs it (the pid is the command's) and, unlike
        ``ip netns exec``, changes only the network namespace: the daemon's FUSE mounts stay in
        the test's mount namespace, where the clean-up and the orphan checks look for them."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--"]

    def nft(self, script: str) -> None:
        """Load an nft script into this machine's own ruleset (no other namespace sees it)."""
        done = subprocess.run([*self.launcher, "nft", "-f", "-"], input=script, capture_output=True,
                              text=True, timeout=30)
        assert done.returncode == 0, f"nft in {self.netns}: {done.stderr.strip()}"


@dataclass
class Network:
    subnet: ipaddress.IPv4Network
    machines: dict[str, Machine]
    client_address: str  # the root namespace's own address on it
    namespaces: list[str] = field(default_factory=list)

    def __getitem__(self, name: str) -> Machine:
        return self.machines[name]


def namespaces_alive() -> set[str]:
    return set(line.split()[0] for line in ip("netns", "list").splitlines() if line.strip())


@contextlib.contextmanager
def private_network(names: Sequence[str]) -> Iterator[Network]:
    """Namespaces named ``names`` (plus the bridge's), joined on a fresh private /24; removed after."""
    suffix = secrets.token_hex(3)
    subnet = free_subnet()
    hosts = list(subnet.hosts())
    bridge = f"fkbr-{suffix}"
    client_link = f"fkc{suffix}"  # the only name in the root namespace (15 characters at most)
    made: list[str] = []
    client_made = False
    try:
        ip("netns", "add", bridge)
        made.append(bridge)
        ip("-n", bridge, "link", "set", "lo", "up")
        ip("-n", bridge, "link", "add", "br0", "type", "bridge")
        ip("-n", bridge, "link", "set", "br0", "up")
        network = Network(subnet, {}, str(hosts[0]), made)
        for i, name in enumerate(names):
            netns = f"fk{name}-{suffix}"
            ip("netns", "add", netns)
            made.append(netns)
            ip("-n", netns, "link", "set", "lo", "up")
            # Made in the bridge's namespace, its peer moved into the machine's: no root-namespace name.
            ip("-n", bridge, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns", netns)
            ip("-n", bridge, "link", "set", f"p{i}", "master", "br0", "up")
            address = str(hosts[10 + i])
            ip("-n", netns, "addr", "add", f"{address}/{subnet.prefixlen}", "dev", "eth0")
            ip("-n", netns, "link", "set", "eth0", "up")
            network.machines[name] = Machine(netns, address)
        ip("link", "add", client_link, "type", "veth", "peer", "name", "pc", "netns", bridge)
        client_made = True
        ip("-n", bridge, "link", "set", "pc", "master", "br0", "up")
        ip("addr", "add", f"{network.client_address}/{subnet.prefixlen}", "dev", client_link)
        ip("link", "set", client_link, "up")
        yield network
    finally:
        errors = []
        if client_made:  # deleting one end of a veth deletes both
            with contextlib.suppress(AssertionError):
                ip("link", "del", client_link)
        for netns in reversed(made):
            try:
                ip("netns", "del", netns)
            except AssertionError as exc:
                errors.append(str(exc))
        left = namespaces_alive() & set(made)
        assert not errors and not left, f"namespaces left behind: {left} {errors}"
        assert client_link not in ip("-o", "link", "show"), f"{client_link} left behind"


__all__ = ["POOL", "Machine", "Network", "free_subnet", "namespaces_alive", "private_network"]
