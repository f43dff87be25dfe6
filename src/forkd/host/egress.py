"""Where a networked sandbox may send traffic: its egress policy (pure logic, no I/O).

Outbound traffic is denied by default. A spawn opens it with the names E2B
users know (``allow_internet_access``, ``network.allow_out`` / ``deny_out``):

* ``allow_internet_access: true`` opens the public internet: every destination
  except the non-public ranges (``NOT_INTERNET``: private, carrier-grade NAT,
  link-local with the cloud metadata address, loopback, multicast), the host's
  own addresses and the other sandboxes;
* ``allow_out`` entries are always open, whatever else is said (as in E2B,
  allow wins over deny); an entry can open one of the ranges above;
* ``deny_out`` entries close destinations ``allow_internet_access`` opened.

The same policy says who may reach the sandbox's ports through the daemon's
port proxy (api/port_proxy.py, E2B's ``get_host``), the other way in:
``allow_public_traffic`` (E2B's name; forkd's default is off, E2B's on) lets
anyone who reaches the daemon in; otherwise a request needs the sandbox's
traffic token or the daemon's bearer token. ``mask_request_host`` is the Host
header the guest sees instead of the proxy's (``${PORT}``: the port asked for).
E2B keeps these in its one ``network`` object too, so they flow with it.

An entry is an IPv4 address or CIDR, optionally with a port or a port range:
``"10.0.0.0/8"`` (every protocol and port), ``"192.0.2.7:443"``,
``"198.51.100.0/24:8000-8100"`` (TCP and UDP to those ports); ``ENTRY_PATTERN``
says exactly that. A CIDR with host bits set means its network
(``10.0.0.1/8`` is ``10.0.0.0/8``), as in ``ip route`` and nftables. Domain
names and IPv6 are refused with a message saying so: the guest has IPv4 only,
and the rules are address-based.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from forkd import bounds
from forkd.errors import InvalidRequest

ALL_TRAFFIC = "0.0.0.0/0"  # E2B's name for "everything"

# Not "the internet": opened only by an explicit allow_out entry.
NOT_INTERNET = tuple(IPv4Network(n) for n in (
    "0.0.0.0/8",        # "this network"
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",  # RFC 1918
    "100.64.0.0/10",    # carrier-grade NAT
    "127.0.0.0/8",      # loopback
    "169.254.0.0/16",   # link-local, with the clouds' metadata service at 169.254.169.254
    "224.0.0.0/4", "240.0.0.0/4",  # multicast, reserved and broadcast
))

NETWORK_KEYS = ("allow_out", "deny_out", "allow_public_traffic", "mask_request_host")
PORT_PLACEHOLDER = "${PORT}"
# A Host header: a DNS name or IPv4 address, an optional port, and E2B's ${PORT} anywhere in it.
MASK_HOST_PATTERN = r"^[A-Za-z0-9.${}_-]{1,253}(:[0-9${}A-Z]{1,7})?$"

_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_PORT = r"([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
# Every string this matches is a valid entry (the API documents it; ``Destination.parse`` says
# what is wrong with one that does not match).
ENTRY_PATTERN = rf"^{_OCTET}(\.{_OCTET}){{3}}(/(3[0-2]|[12]?[0-9]))?(:{_PORT}(-{_PORT})?)?$"


@dataclass(frozen=True)
class Destination:
    """An allow_out / deny_out entry: a network, and optionally a port range (TCP and UDP)."""

    network: IPv4Network
    first_port: int | None = None
    last_port: int | None = None

    def sort_key(self) -> tuple[IPv4Network, int, int]:
        """An order for every mix of entries: a whole address (no ports) sorts before its ports
        (the generated ``order`` compares None with an int, a TypeError and so a 500)."""
        return (self.network, -1 if self.first_port is None else self.first_port,
                -1 if self.last_port is None else self.last_port)

    @classmethod
    def parse(cls, text: object, where: str) -> Destination:
        """``ADDRESS[/PREFIX][:PORT[-PORT]]``; a 400 naming ``where`` (e.g. ``network.allow_out[2]``)."""
        if not isinstance(text, str):
            raise InvalidRequest(f"{where} must be a string like '10.0.0.0/8' or '192.0.2.7:443', "
                                 f"not {text!r}")
        if not text or len(text) > bounds.MAX_EGRESS_ENTRY_CHARS:
            raise InvalidRequest(f"{where} must be 1 to {bounds.MAX_EGRESS_ENTRY_CHARS} characters")
        if text.count(":") > 1 or "[" in text:
            raise InvalidRequest(f"{where} {text!r}: IPv6 is not supported (sandboxes have IPv4 only)")
        addr, _, ports = text.partition(":")
        try:
            network = IPv4Network(addr, strict=False)
        except ValueError as exc:
            if any(c.isalpha() for c in addr):
                raise InvalidRequest(
                    f"{where} {text!r}: domain names are not supported; give an IPv4 address or CIDR "
                    "(e.g. '192.0.2.7' or '198.51.100.0/24:443')") from None
            raise InvalidRequest(f"{where} {text!r} is not an IPv4 address or CIDR ({exc})") from None
        if not ports:
            if text.endswith(":"):
                raise InvalidRequest(f"{where} {text!r}: a port must follow the ':'")
            return cls(network)
        first_s, dash, last_s = ports.partition("-")
        first = _port(first_s, where, text)
        last = _port(last_s, where, text) if dash else first
        return cls(network, min(first, last), max(first, last))

    def __str__(self) -> str:
        net = str(self.network.network_address) if self.network.prefixlen == 32 else str(self.network)
        if self.first_port is None:
            return net
        if self.first_port == self.last_port:
            return f"{net}:{self.first_port}"
        return f"{net}:{self.first_port}-{self.last_port}"

    @property
    def ports(self) -> str | None:
        """nftables' spelling of the port range: ``443`` or ``8000-8100``; None: every port."""
        if self.first_port is None:
            return None
        if self.first_port == self.last_port:
            return str(self.first_port)
        return f"{self.first_port}-{self.last_port}"


def _port(text: str, where: str, entry: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise InvalidRequest(f"{where} {entry!r}: ports must be numbers from 1 to 65535 (got {text!r})")
    return int(text)


def _mask_host(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not re.fullmatch(MASK_HOST_PATTERN, value):
        raise InvalidRequest(f"network.mask_request_host must be a host name with an optional :port "
                             f"(${{PORT}} stands for the port asked for), not {str(value)[:80]!r}")
    return value


def _destinations(entries: object, where: str) -> tuple[Destination, ...]:
    if entries is None:
        return ()
    if not isinstance(entries, list | tuple):
        raise InvalidRequest(f"{where} must be a list of IPv4 addresses or CIDRs")
    if len(entries) > bounds.MAX_EGRESS_ENTRIES:
        raise InvalidRequest(f"{where} may have at most {bounds.MAX_EGRESS_ENTRIES} entries "
                             f"(got {len(entries)})")
    parsed = [Destination.parse(e, f"{where}[{i}]") for i, e in enumerate(entries)]
    return tuple(sorted(set(parsed), key=Destination.sort_key))  # canonical: the pool key compares policies


@dataclass(frozen=True)
class EgressPolicy:
    """Denied by default; see the module docstring. Hashable: a warm pool's key holds one."""

    allow_internet_access: bool = False
    allow_out: tuple[Destination, ...] = ()
    deny_out: tuple[Destination, ...] = ()
    allow_public_traffic: bool = False  # inbound, through the daemon's port proxy
    mask_request_host: str | None = None

    @classmethod
    def from_request(cls, allow_internet_access: bool | None = None,
                     network: Mapping[str, Any] | None = None) -> EgressPolicy:
        """The policy a spawn asked for (the API's fields; None: not given, i.e. denied)."""
        if allow_internet_access is not None and not isinstance(allow_internet_access, bool):
            raise InvalidRequest(
                f"allow_internet_access must be true or false, not {allow_internet_access!r}")
        network = network or {}
        if not isinstance(network, Mapping):
            raise InvalidRequest('network must be an object like {"allow_out": ["192.0.2.7:443"]}')
        unknown = sorted(set(network) - set(NETWORK_KEYS))
        if unknown:
            raise InvalidRequest(f"network has unknown keys {unknown}; it takes {list(NETWORK_KEYS)}")
        public = network.get("allow_public_traffic", False)
        if not isinstance(public, bool):
            raise InvalidRequest(f"network.allow_public_traffic must be true or false, not {public!r}")
        return cls(bool(allow_internet_access),
                   _destinations(network.get("allow_out"), "network.allow_out"),
                   _destinations(network.get("deny_out"), "network.deny_out"),
                   public, _mask_host(network.get("mask_request_host")))

    @property
    def is_default(self) -> bool:
        """Every outbound destination denied (what a spawn gets without asking). The inbound
        settings do not count: without a NIC there is no port to reach, so they cost nothing."""
        return (self.allow_internet_access, self.allow_out, self.deny_out) == (False, (), ())

    def info(self) -> dict[str, Any]:
        """As SandboxInfo and PoolInfo show it (and as the registry stores it)."""
        return {"allow_internet_access": self.allow_internet_access,
                "allow_out": [str(d) for d in self.allow_out], "deny_out": [str(d) for d in self.deny_out],
                "allow_public_traffic": self.allow_public_traffic,
                "mask_request_host": self.mask_request_host}

    def outbound(self) -> EgressPolicy:
        """Only what shapes a VM's network (its rules): a warm pool's members are matched by it, and
        a claimed one takes the inbound settings of the spawn that claims it."""
        return dataclasses.replace(self, allow_public_traffic=False, mask_request_host=None)

    def request_host(self, port: int) -> str | None:
        """The Host header the guest gets for traffic to ``port`` (None: the client's)."""
        if self.mask_request_host is None:
            return None
        return self.mask_request_host.replace(PORT_PLACEHOLDER, str(port))

    @classmethod
    def from_info(cls, d: Mapping[str, Any] | None) -> EgressPolicy:
        if not d:
            return cls()
        return cls.from_request(d.get("allow_internet_access"),
                                {k: d[k] for k in NETWORK_KEYS if k in d})

    def leaves_host(self, local: Iterable[IPv4Address]) -> bool:
        """Whether traffic it allows can go beyond this host (then the host must forward and NAT it).

        Destinations that are addresses of the host itself (``local``: its own
        addresses and the sandboxes' gateway) are delivered locally.
        """
        if self.allow_internet_access:
            return True
        mine = {IPv4Network(a) for a in local}
        return any(d.network not in mine for d in self.allow_out)


def parse_addresses(values: Iterable[str]) -> list[IPv4Address]:
    """The IPv4 addresses among ``values`` (resolv.conf lines, ``ip`` output); others are skipped."""
    out: list[IPv4Address] = []
    for v in values:
        try:
            addr = ipaddress.ip_address(v)
        except ValueError:
            continue
        if isinstance(addr, IPv4Address):
            out.append(addr)
    return out
