"""The network plan of sandboxes: addresses, device names, and the commands and rules that
make one sandbox's network (pure: text in, text out; ``host/childnet.py`` runs it).

Every child of a snapshot is a clone of one template, so every guest has the
*same* address (``GUEST_IP`` on eth0, gateway ``TAP_IP``, baked into the
snapshot). What makes them distinct is the network namespace each one's QEMU
runs in::

    guest eth0 172.16.0.2 ── tap (172.16.0.1, MAC TAP_MAC) ┐ the sandbox's namespace:
                                                           │ DNAT <ip> -> 172.16.0.2,
                           uplink0 <ip>/32 peer <gateway> ─┘ SNAT 172.16.0.2 -> <ip>, egress filter
                                 │ veth pair
    host:                  fkn<index> <gateway>/32 peer <ip>/32

* Each sandbox has its own address ``<ip>`` from the plan's CIDR (default
  ``10.201.0.0/16``, ``$FORKD_NET_CIDR``): the host reaches the guest's every
  port at ``<ip>``. The CIDR's first host address is the *gateway*, put on the
  host end of every veth (a point-to-point address, as PPP servers do): from
  any sandbox, ``<gateway>`` is the host. A /16 holds 65533 sandboxes.
* Every rule lives in the sandbox's own namespace (table ``inet forkd``) and so
  dies with it. The host-side rules are each daemon's own, in a table named
  after its data dir (``ip forkd-<hash>``, ``host_nat_table``), so one daemon
  never removes what another relies on: the masquerade for sandboxes whose
  policy reaches beyond the host (one set element per sandbox, removed with
  it) and the guard (``host_guard``): a new connection from the host to a
  sandbox's address is refused unless its socket is root's or the daemon's
  user's, so another local user cannot reach a sandbox's ports around the
  daemon's port proxy and its traffic token.
* A sandbox accepts new connections only from the host (source ``<gateway>``),
  so sandboxes never reach each other, whatever their egress policy says.
* A packet from the tap whose source is not ``GUEST_IP`` is dropped, never
  rejected (an ICMP error to a spoofed source would carry the guest's bytes
  out), and the tap and uplink filter reverse paths strictly.
* The tap has the same MAC in every namespace, so the neighbour entry the
  template's guest cached for its gateway stays right in every clone.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, collapse_addresses
from pathlib import Path
from typing import Any

from forkd.bounds import TAP_RE
from forkd.errors import InvalidRequest
from forkd.host.egress import NOT_INTERNET, Destination, EgressPolicy, NameDestination

GUEST_IP = IPv4Address("172.16.0.2")
TAP_IP = IPv4Address("172.16.0.1")
GUEST_PREFIX = 30
GUEST_NETWORK = IPv4Network(f"{GUEST_IP}/{GUEST_PREFIX}", strict=False)
# The guest's gateway MAC. The guest's own MAC is vmm/cmdline.GUEST_MAC (52:54:00:66:6b:01).
TAP_MAC = "52:54:00:66:6b:fe"
UPLINK = "uplink0"  # the namespace's end of the veth pair
DEFAULT_TAP = "forkd-tap0"
DEFAULT_CIDR = "10.201.0.0/16"
CIDR_ENV = "FORKD_NET_CIDR"
VETH_PREFIX = "fkn"  # host end: fkn<index> (at most 15 characters: fkn + 5 digits at a /16)
NFT_TABLE = "forkd"  # in each namespace: inet forkd; on the host: ip forkd-<hash> per daemon
HOST_NAT_SET = "egress"
# The host table of one daemon (a lease written before per-daemon tables names none: "forkd").
HOST_TABLE_RE = re.compile(r"^forkd(-[0-9a-f]{12})?$")
# Public resolvers for guests of a host whose own resolvers are all loopback ones
# (a local stub such as systemd-resolved's 127.0.0.53, unreachable from a namespace).
FALLBACK_DNS = ("1.1.1.1", "8.8.8.8")
# Sandbox namespaces this daemon names itself (forkd-child-<i> are the seeds').
NETNS_PREFIX = "forkd-"
# A namespace name (the seeds' forkd-child-<i>, ours, or one a user made with scripts/netns-setup.sh).
NETNS_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class AddressPlan:
    """Which address each sandbox gets: index ``i`` -> ``network[2 + i]``; ``network[1]`` is the host."""

    network: IPv4Network

    @classmethod
    def from_env(cls) -> AddressPlan:
        return cls.parse(os.environ.get(CIDR_ENV) or DEFAULT_CIDR, CIDR_ENV)

    @classmethod
    def parse(cls, text: str, where: str = "network CIDR") -> AddressPlan:
        try:
            network = IPv4Network(text, strict=True)
        except ValueError as exc:
            raise InvalidRequest(f"{where} {text!r} is not an IPv4 CIDR: {exc}") from None
        if network.prefixlen > 29:
            raise InvalidRequest(f"{where} {text!r} is too small: give a /29 or larger (a /16 holds 65533 "
                                 "sandboxes)")
        if network.overlaps(GUEST_NETWORK):
            raise InvalidRequest(
                f"{where} {text!r} overlaps the guests' own subnet {GUEST_IP}/{GUEST_PREFIX}")
        return cls(network)

    @property
    def gateway(self) -> IPv4Address:
        return self.network[1]

    @property
    def capacity(self) -> int:
        """Sandboxes it holds at once: all but the network, gateway and broadcast addresses."""
        return self.network.num_addresses - 3

    def address(self, index: int) -> IPv4Address:
        if not 0 <= index < self.capacity:
            raise ValueError(f"index {index} outside the plan {self.network}")
        return self.network[2 + index]

    @staticmethod
    def veth(index: int) -> str:
        return f"{VETH_PREFIX}{index}"

    @staticmethod
    def index_of_veth(name: str) -> int | None:
        rest = name[len(VETH_PREFIX):]
        return int(rest) if name.startswith(VETH_PREFIX) and rest.isdigit() else None


@dataclass(frozen=True)
class ChildNet:
    """One sandbox's (or template's) network as forkd made it; kept in a lease file and its row.

    ``tap`` None: a namespace only (``per_child_netns`` for a snapshot without
    a NIC). ``owns_netns`` / ``owns_tap``: forkd created them and removes them;
    a namespace ``scripts/netns-setup.sh`` provisioned is only given back.
    """

    owner: str
    netns: str
    owns_netns: bool
    tap: str | None = None
    owns_tap: bool = False
    index: int | None = None
    ip: str | None = None
    gateway: str | None = None
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    dns: tuple[str, ...] = ()
    nat: bool = False  # an element of the host's masquerade set
    nat_table: str = NFT_TABLE  # the host table holding that element: its daemon's (host_nat_table)

    def __post_init__(self) -> None:
        # Its names and addresses are written into ``ip -batch`` and nftables scripts: only plain
        # device names and addresses, wherever the record came from (a row, a snapshot's meta).
        if not NETNS_NAME_RE.match(self.netns) or (self.tap is not None and not TAP_RE.match(self.tap)):
            raise ValueError(f"network names {self.netns[:80]!r} / {str(self.tap)[:80]!r} are not plain "
                             "names")
        for address in (self.ip, self.gateway, *self.dns):
            if address is not None:
                IPv4Address(address)  # ValueError unless a plain dotted quad

    @property
    def veth(self) -> str | None:
        return AddressPlan.veth(self.index) if self.index is not None else None

    def to_json(self) -> dict[str, Any]:
        return {"owner": self.owner, "netns": self.netns, "owns_netns": self.owns_netns, "tap": self.tap,
                "owns_tap": self.owns_tap, "index": self.index, "ip": self.ip, "gateway": self.gateway,
                "egress": self.egress.info(), "dns": list(self.dns), "nat": self.nat,
                "nat_table": self.nat_table}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ChildNet:
        table = d.get("nat_table") or NFT_TABLE
        if not isinstance(table, str) or not HOST_TABLE_RE.match(table):
            # It is written into an nft script: only a name this module makes.
            raise InvalidRequest(f"a network's nat_table must be a forkd host table name, not {table!r:.80}")
        return cls(owner=str(d["owner"]), netns=str(d["netns"]), owns_netns=bool(d["owns_netns"]),
                   tap=d.get("tap"), owns_tap=bool(d.get("owns_tap")), index=d.get("index"),
                   ip=d.get("ip"), gateway=d.get("gateway"), egress=EgressPolicy.from_info(d.get("egress")),
                   dns=tuple(d.get("dns") or ()), nat=bool(d.get("nat")), nat_table=table)

    def info(self) -> dict[str, Any]:
        """SandboxInfo's ``network``: how the guest sees its network, and what it may reach."""
        out: dict[str, Any] = {"guest_ip": str(GUEST_IP), "host_gateway": self.gateway, "dns": list(self.dns)}
        out.update(self.egress.info())
        return out


# ------------------------------------------------------------------ commands


def host_batch(net: ChildNet) -> str:
    """``ip -batch`` lines run in the host's namespace: the veth pair, the host end's address.

    (The namespace itself is made by a call of its own, so that a failure tells
    whether it was ours to remove.)
    """
    lines: list[str] = []
    if net.tap is not None:
        lines += [
            f"link add {net.veth} type veth peer name {UPLINK} netns {net.netns}",
            f"addr add {net.gateway}/32 peer {net.ip}/32 dev {net.veth}",
            f"link set dev {net.veth} up",
        ]
    return "".join(f"{line}\n" for line in lines)


def netns_batch(net: ChildNet) -> str:
    """``ip -n <netns> -batch`` lines: loopback, the tap with its address and MAC, the uplink, the route."""
    lines = ["link set dev lo up"]
    if net.tap is not None:
        if net.owns_tap:
            lines.append(f"tuntap add dev {net.tap} mode tap")
        lines += [
            f"link set dev {net.tap} down",  # a MAC changes only while the link is down
            f"link set dev {net.tap} address {TAP_MAC}",
            f"addr add {TAP_IP}/{GUEST_PREFIX} dev {net.tap}",
            f"link set dev {net.tap} up",
            f"addr add {net.ip}/32 peer {net.gateway}/32 dev {UPLINK}",
            f"link set dev {UPLINK} up",
            f"route add default via {net.gateway} dev {UPLINK}",
        ]
    return "".join(f"{line}\n" for line in lines)


def netns_sysctls(net: ChildNet) -> dict[str, str]:
    """The sysctls set in the sandbox's namespace before its rules: forwarding, and strict
    reverse-path filtering on the tap and the uplink (a packet whose source would not be routed
    back out of the link it came in on is dropped before any rule sees it)."""
    assert net.tap is not None
    out = {"/proc/sys/net/ipv4/ip_forward": "1"}
    for dev in (net.tap, UPLINK):
        out[f"/proc/sys/net/ipv4/conf/{dev}/rp_filter"] = "1"
    return out


# The sandbox's resolver (host/dnsguard.py) listens here, inside its namespace, when its policy
# has names: the guest's DNS to its resolvers (or to its gateway) is redirected to it.
RESOLVER_PORT = 53
# Ports of DNS to anyone else (plain, and DNS over TLS), refused when names are enforced; and
# QUIC (UDP 443), whose names a later check of TLS names would not see.
DNS_PORTS = (53, 853)
QUIC_PORT = 443
# The sandbox's egress inspector (host/egress_inspect.py) listens here, inside its namespace: the
# guest's TCP to an address answered for an allow_out name is redirected to it, and reaches that
# address only if its TLS SNI or HTTP Host names an allowed name.
INSPECT_PORT = 15001
# With header rules and the internet open, the guest's other HTTPS (TCP 443) comes to the
# inspector here: a rule's host is intercepted, anything else spliced as it is, with or without
# a name (the internet lets it through anyway).
PASS_PORT = 15002
HTTPS_PORT = 443


def name_set(index: int) -> str:
    """The set of the addresses answered for the policy's ``index``-th allow_out name."""
    return f"name_{index}"


def _ports(d: Destination | NameDestination) -> str:
    return f" meta l4proto {{ tcp, udp }} th dport {d.ports}" if d.ports else ""


def _match(d: Destination) -> str:
    return f"ip daddr {d.network}{_ports(d)}"


def _tcp_ports(d: NameDestination) -> str:
    return f"tcp dport {d.ports}" if d.ports else "meta l4proto tcp"


def _udp_ports(d: NameDestination) -> str:
    return f"udp dport {d.ports}" if d.ports else "meta l4proto udp"


def _name_parts(net: ChildNet, closed: str) -> tuple[list[str], list[str], list[str], list[str]]:
    """What a policy the daemon serves (names, header rules) adds: the sets; the redirects (the
    guest's DNS to its resolver, its TCP to answered addresses to its inspector, unless the address
    is allowed by number; with rules and the internet open, its other HTTPS to the inspector's
    pass-through port); the input rules that let them in; and the egress rules (DNS elsewhere and
    QUIC refused, then UDP to the sets: TCP to them never gets that far, it was redirected).
    ``closed``: what the internet does not open (its HTTPS is never redirected: the daemon would
    dial it for the guest)."""
    policy = net.egress
    if not policy.served_by_the_daemon or net.tap is None:
        return [], [], [], []
    tap = net.tap
    names = policy.allow_names
    sets = [f"set {name_set(i)} {{ type ipv4_addr; flags timeout; }}" for i in range(len(names))]
    redirect: list[str] = []
    inbound: list[str] = []
    egress: list[str] = []
    if policy.uses_names:
        resolvers = ", ".join([*net.dns, str(TAP_IP)])
        redirect += [f'iifname "{tap}" ip daddr {{ {resolvers} }} udp dport 53 '
                     f"dnat ip to {TAP_IP}:{RESOLVER_PORT}"]
        inbound += [f'iifname "{tap}" ip daddr {TAP_IP} udp dport {RESOLVER_PORT} accept']
        dns = ", ".join(str(p) for p in DNS_PORTS)
        egress += [f"meta l4proto {{ tcp, udp }} th dport {{ {dns} }} jump refuse"]
    # An address allowed by number is reached without a name, as it would be without names.
    redirect += [f'iifname "{tap}" {_match(d)} return'
                 for d in policy.allow_out if isinstance(d, Destination)]
    redirect += [f'iifname "{tap}" ip daddr @{name_set(i)} {_tcp_ports(d)} dnat ip to {TAP_IP}:{INSPECT_PORT}'
                 for i, d in enumerate(names)]
    if policy.inspects_internet:
        # A denied address stays refused (the forward chain); the rest of the internet's HTTPS
        # goes through the pass-through port, where a rule's host is intercepted.
        redirect += [f'iifname "{tap}" {_match(d)} return'
                     for d in policy.deny_out if isinstance(d, Destination)]
        redirect += [f'iifname "{tap}" tcp dport {HTTPS_PORT} ip daddr != {{ {closed} }} '
                     f"dnat ip to {TAP_IP}:{PASS_PORT}"]
    # Only what was redirected: a guest dialling the inspector itself has no destination.
    inbound += [f'iifname "{tap}" ip daddr {TAP_IP} tcp dport {{ {INSPECT_PORT}, {PASS_PORT} }} '
                "ct status dnat accept"]
    egress += [f"udp dport {QUIC_PORT} jump refuse"]
    egress += [f"ip daddr @{name_set(i)} {_udp_ports(d)} accept" for i, d in enumerate(names)]
    return sets, redirect, inbound, egress


def name_elements(indices: Iterable[int], addresses: Iterable[IPv4Address], timeout_secs: int) -> str:
    """``nft -f`` lines that put ``addresses`` into the sets ``name_<i>`` for ``timeout_secs``. An
    element already there gets the new timeout: added (so that it exists), deleted, added again,
    in one transaction (nftables' ``add`` leaves an existing element's timeout as it was)."""
    lines: list[str] = []
    for i in indices:
        elems = ", ".join(str(a) for a in addresses)
        if not elems:
            continue
        where = f"inet {NFT_TABLE} {name_set(i)}"
        timed = ", ".join(f"{a} timeout {timeout_secs}s" for a in addresses)
        lines += [f"add element {where} {{ {timed} }}", f"delete element {where} {{ {elems} }}",
                  f"add element {where} {{ {timed} }}"]
    return "".join(f"{line}\n" for line in lines)


def netns_ruleset(net: ChildNet, blocked: Iterable[IPv4Network]) -> str:
    """The sandbox namespace's nftables table: NAT both ways, inbound from the host only, egress.

    Whatever comes in from the tap with a source other than the guest's address
    (or any IPv6) is *dropped* in ``guard``, before conntrack and before any
    ``reject``: a rejection would answer the spoofed source, so a guest could
    make the namespace carry its data out to any address in an ICMP error.

    ``blocked``: what ``allow_internet_access`` still keeps closed besides
    ``NOT_INTERNET`` (the plan's CIDR, the host's own addresses).
    """
    assert net.tap is not None and net.ip and net.gateway
    tap, policy = net.tap, net.egress
    # Collapsed: an anonymous interval set refuses overlapping elements.
    closed = ", ".join(str(n) for n in collapse_addresses([*NOT_INTERNET, *blocked]))
    sets, redirect, inbound, egress = _name_parts(net, closed)
    egress += [f"{_match(d)} accept" for d in policy.allow_out if isinstance(d, Destination)]
    egress += [f"{_match(d)} jump refuse" for d in policy.deny_out if isinstance(d, Destination)]
    if policy.allow_internet_access:
        # The guest's resolvers may sit in a private range (a LAN resolver): DNS to them stays open.
        egress += [f"ip daddr {ns} meta l4proto {{ tcp, udp }} th dport 53 accept" for ns in net.dns]
        egress += [f"ip daddr {{ {closed} }} jump refuse", "accept"]
    body = "\n".join(f"    {rule}" for rule in egress)
    set_lines = "".join(f"  {line}\n" for line in sets)
    redirect_lines = "".join(f"\n    {line}" for line in redirect)
    inbound_lines = "".join(f"\n    {line}" for line in inbound)
    return f"""table inet {NFT_TABLE} {{
{set_lines}  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname "{UPLINK}" ip daddr {net.ip} dnat ip to {GUEST_IP}{redirect_lines}
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname "{UPLINK}" ip saddr {GUEST_IP} snat ip to {net.ip}
  }}
  chain input {{
    type filter hook input priority filter; policy drop;
    iif "lo" accept
    ct state established,related accept{inbound_lines}
  }}
  chain guard {{
    type filter hook prerouting priority raw; policy accept;
    iifname "{tap}" ip saddr != {GUEST_IP} drop
    iifname "{tap}" meta nfproto ipv6 drop
  }}
  chain forward {{
    type filter hook forward priority filter; policy drop;
    ct state established,related accept
    ct state invalid drop
    iifname "{UPLINK}" oifname "{tap}" ip saddr {net.gateway} ct status dnat accept
    iifname "{tap}" oifname "{UPLINK}" ip saddr {GUEST_IP} jump egress
    iifname "{tap}" jump refuse
  }}
  chain egress {{
{body}
  }}
  chain refuse {{
    meta l4proto tcp reject with tcp reset
    reject with icmpx admin-prohibited
  }}
}}
"""


def netns_ruleset_replace(net: ChildNet, blocked: Iterable[IPv4Network]) -> str:
    """``netns_ruleset`` over the one already there, as one transaction (``nft -f``): the table is
    flushed and filled again, so there is no moment without rules, and a failure leaves the old ones."""
    # ``flush table`` leaves set elements: the addresses answered under the old policy go too
    # (set ``name_<i>`` may be another name's now).
    sets = "".join(f"flush set inet {NFT_TABLE} {name_set(i)}\n" for i in range(len(net.egress.allow_names)))
    return f"table inet {NFT_TABLE}\nflush table inet {NFT_TABLE}\n" + netns_ruleset(net, blocked) + sets


def host_nat_table(data_root: Path) -> str:
    """The host table of the daemon on ``data_root``: its masquerade and its guard. Named after the
    data dir, so a restarted daemon finds its own, and two daemons never share one (the first to
    stop would take the other's rules along)."""
    digest = hashlib.sha256(str(data_root.resolve()).encode()).hexdigest()[:12]
    return f"{NFT_TABLE}-{digest}"


def host_guard(table: str, plan: AddressPlan, uids: Iterable[int]) -> str:
    """The daemon's table with its ``output`` chain (idempotent): a new connection from this host to
    a sandbox address is refused unless its socket belongs to one of ``uids`` (root, the daemon's
    user). Only a flow's first packet is looked at (``ct state new``): replies of a host service of
    any user to a sandbox that reached it stay allowed. The gateway is the host's own address."""
    t = f"ip {table}"
    owners = ", ".join(str(u) for u in sorted(set(uids)))
    match = (f"ip daddr {plan.network} ip daddr != {plan.gateway} ct state new "
             f"meta skuid != {{ {owners} }}")
    return (f"add table {t}\n"
            f"add chain {t} output {{ type filter hook output priority filter; policy accept; }}\n"
            f"flush chain {t} output\n"
            f"add rule {t} output {match} meta l4proto tcp reject with tcp reset\n"
            f"add rule {t} output {match} reject\n")


def host_nat_add(ip: str, table: str = NFT_TABLE) -> str:
    """The host's masquerade for sandboxes that reach beyond it, and ``ip`` in its set (idempotent)."""
    t = f"ip {table}"
    return (f"add table {t}\n"
            f"add set {t} {HOST_NAT_SET} {{ type ipv4_addr; }}\n"
            f"add chain {t} postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}\n"
            f"flush chain {t} postrouting\n"
            f'add rule {t} postrouting ip saddr @{HOST_NAT_SET} oifname != "{VETH_PREFIX}*" masquerade\n'
            f"add element {t} {HOST_NAT_SET} {{ {ip} }}\n")


def host_nat_remove(ip: str, table: str = NFT_TABLE) -> str:
    return f"delete element ip {table} {HOST_NAT_SET} {{ {ip} }}\n"


def guest_cmdline(dns: Iterable[str]) -> str:
    """The kernel command-line word from which the guest agent configures eth0 at boot."""
    return f"forkd.net={GUEST_IP}/{GUEST_PREFIX},{TAP_IP},{'+'.join(dns)}"
