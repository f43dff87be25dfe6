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

An entry is an IPv4 address or CIDR, or a DNS name, optionally with a port or a
port range: ``"10.0.0.0/8"`` (every protocol and port), ``"192.0.2.7:443"``,
``"198.51.100.0/24:8000-8100"`` (TCP and UDP to those ports), ``"pypi.org"``,
``"*.pythonhosted.org:443"`` (every name under it, at any depth, not the name
itself); ``ENTRY_PATTERN`` says exactly that. A CIDR with host bits set means
its network (``10.0.0.1/8`` is ``10.0.0.0/8``), as in ``ip route`` and
nftables. IPv6 is refused with a message saying so: the guest has IPv4 only.

Names are enforced by the sandbox's resolver (host/dnsguard.py): it answers
only names the policy allows, and the addresses it answers become short-lived
elements of the sandbox's allow sets (host/netplan.py). ``allowed_name`` is
the one place that says which names a policy lets a guest resolve.
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

NETWORK_KEYS = ("allow_out", "deny_out", "allow_public_traffic", "mask_request_host", "rules")
# Header transforms (E2B's ``rules``): bounded before anything else reads them.
MAX_RULE_HOSTS = 32
MAX_RULES_PER_HOST = 8
MAX_RULE_HEADERS = 32
MAX_HEADER_VALUE_CHARS = 8192
# An HTTP header name (RFC 9110's token), as the API documents it.
HEADER_NAME_PATTERN = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$"
_HEADER_NAME = re.compile(HEADER_NAME_PATTERN)
PORT_PLACEHOLDER = "${PORT}"
# A Host header: a DNS name or IPv4 address, an optional port, and E2B's ${PORT} anywhere in it.
MASK_HOST_PATTERN = r"^[A-Za-z0-9.${}_-]{1,253}(:[0-9${}A-Z]{1,7})?$"

_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_PORT = r"([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
# Every string this matches is a valid entry (the API documents it; ``Destination.parse`` says
# what is wrong with one that does not match).
_ADDRESS = rf"{_OCTET}(\.{_OCTET}){{3}}(/(3[0-2]|[12]?[0-9]))?"
# A DNS name (letters, digits, '-', '_'; labels of 1-63), its last label starting with a letter
# (so "10.0.0.256" is a bad address, not a name), optionally under "*." (every name below it).
_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_NAME = rf"(\*\.)?({_LABEL}\.)*[A-Za-z]([A-Za-z0-9-]{{0,61}}[A-Za-z0-9])?"
MAX_NAME_CHARS = 253  # RFC 1035, without the wildcard's "*."
# An entry's shape, and the pattern the API documents: the shape, with a lookahead that bounds a
# name at 253 characters (after an optional "*.") as the check does; without it the schema would
# promise names longer than any the daemon takes.
ENTRY_SHAPE = rf"({_ADDRESS}|{_NAME})(:{_PORT}(-{_PORT})?)?"
ENTRY_PATTERN = rf"^(?=(?:\*\.)?[^:]{{1,{MAX_NAME_CHARS}}}(?::|$)){ENTRY_SHAPE}$"
# A rule's host: a DNS name or *.name, without a port (``_rules`` checks it with NameDestination).
RULE_HOST_PATTERN = rf"^(?=(?:\*\.)?[^:]{{1,{MAX_NAME_CHARS}}}$){_NAME}$"


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
            raise InvalidRequest(f"{where} {text!r} is not an IPv4 address or CIDR ({exc})") from None
        return cls(network, *_ports(ports, where, text))

    def __str__(self) -> str:
        net = str(self.network.network_address) if self.network.prefixlen == 32 else str(self.network)
        return net + _port_suffix(self.first_port, self.last_port)

    @property
    def ports(self) -> str | None:
        """nftables' spelling of the port range: ``443`` or ``8000-8100``; None: every port."""
        return _nft_ports(self.first_port, self.last_port)


@dataclass(frozen=True)
class NameDestination:
    """An allow_out / deny_out entry by DNS name: ``name`` exactly, or (``wildcard``) every name
    below it at any depth; optionally a port range. ``name`` is lower-case, without a final dot."""

    name: str
    wildcard: bool = False
    first_port: int | None = None
    last_port: int | None = None

    def sort_key(self) -> tuple[str, bool, int, int]:
        return (self.name, self.wildcard, -1 if self.first_port is None else self.first_port,
                -1 if self.last_port is None else self.last_port)

    @classmethod
    def parse(cls, text: str, where: str) -> NameDestination:
        """``[*.]NAME[:PORT[-PORT]]`` (``text`` already bounded in length by ``parse_entry``)."""
        name, _, ports = text.partition(":")
        wildcard = name.startswith("*.")
        bare = name[2:] if wildcard else name
        if len(bare) > MAX_NAME_CHARS or not re.fullmatch(_NAME, name):
            raise InvalidRequest(
                f"{where} {text!r} is neither an IPv4 address or CIDR nor a DNS name (labels of 1-63 "
                "letters, digits, '-' or '_', at most 253 characters, optionally under '*.'; e.g. "
                "'pypi.org', '*.pythonhosted.org:443')")
        return cls(bare.lower().rstrip("."), wildcard, *_ports(ports, where, text))

    def matches(self, qname: str) -> bool:
        """Whether ``qname`` (lower-case, no final dot) is this entry's name."""
        return qname.endswith("." + self.name) if self.wildcard else qname == self.name

    def covers(self, port: int) -> bool:
        """Whether ``port`` is within the entry's ports (every port when it names none)."""
        return self.first_port is None or self.first_port <= port <= (self.last_port or self.first_port)

    def __str__(self) -> str:
        return ("*." if self.wildcard else "") + self.name + _port_suffix(self.first_port, self.last_port)

    @property
    def ports(self) -> str | None:
        return _nft_ports(self.first_port, self.last_port)


Entry = Destination | NameDestination


@dataclass(frozen=True)
class HostRule:
    """The headers set on every HTTP request to ``host`` (a name, or ``*.`` a wildcard): E2B's
    ``rules`` entry, its rules' transforms merged in order (a later one wins). A value may hold
    ``${secrets.NAME}`` placeholders; they are resolved at egress (host/egress_tls.py)."""

    host: NameDestination
    headers: tuple[tuple[str, str], ...] = ()

    def info(self) -> list[dict[str, Any]]:
        return [{"transform": {"headers": dict(self.headers)}}]


def _header(name: object, value: object, where: str) -> tuple[str, str]:
    if not isinstance(name, str) or not _HEADER_NAME.match(name):
        raise InvalidRequest(f"{where}: {str(name)[:64]!r} is not an HTTP header name (letters, digits "
                             "and !#$%&'*+.^_`|~-, at most 128)")
    if (not isinstance(value, str) or len(value) > MAX_HEADER_VALUE_CHARS
            or any(c in value for c in "\r\n\0")):
        raise InvalidRequest(f"{where}.{name} must be a string of at most {MAX_HEADER_VALUE_CHARS} "
                             "characters without CR, LF or NUL")
    return name, value


def _rules(raw: object, allow_out: tuple[Entry, ...], deny_out: tuple[Entry, ...],
           internet: bool) -> tuple[HostRule, ...]:
    """``network.rules`` (``{host: [{"transform": {"headers": {...}}}]}``); each host must be one
    the policy lets the guest reach by name: an allow_out name, or with allow_internet_access any
    name no deny_out name matches (a rule opens nothing on its own, as in E2B)."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping) or len(raw) > MAX_RULE_HOSTS:
        raise InvalidRequest(f'network.rules must be an object of at most {MAX_RULE_HOSTS} hosts, like '
                             '{"api.example.com": [{"transform": {"headers": {"Authorization": '
                             '"Bearer ${secrets.API_TOKEN}"}}}]}')
    # The names allow_out opens, whatever their ports: a rule applies on each of them.
    names = {(e.name, e.wildcard) for e in allow_out if isinstance(e, NameDestination)}
    denied = [e for e in deny_out if isinstance(e, NameDestination)]
    out: list[HostRule] = []
    for host, rules in raw.items():
        where = f"network.rules[{str(host)[:64]!r}]"
        entry = parse_entry(host, where)
        if not isinstance(entry, NameDestination) or entry.first_port is not None:
            raise InvalidRequest(f"{where}: a rule's host is a DNS name (or *.name), without a port")
        allowed = (entry.name, entry.wildcard) in names or any(
            isinstance(e, NameDestination) and e.matches(entry.name) and not entry.wildcard
            for e in allow_out)
        if internet and not any(d.matches(entry.name) or (d.name, d.wildcard) == (entry.name, entry.wildcard)
                                for d in denied):
            allowed = True
        if not allowed:
            raise InvalidRequest(f"{where}: a rule opens nothing on its own; add {str(entry)!r} to "
                                 "network.allow_out too (or open the internet with allow_internet_access)")
        if not isinstance(rules, list) or len(rules) > MAX_RULES_PER_HOST:
            raise InvalidRequest(f"{where} must be a list of at most {MAX_RULES_PER_HOST} rules")
        headers: dict[str, str] = {}
        for i, rule in enumerate(rules):
            transform = rule.get("transform") if isinstance(rule, Mapping) else None
            bad_transform = transform is not None and (not isinstance(transform, Mapping)
                                                       or bool(set(transform) - {"headers"}))
            if not isinstance(rule, Mapping) or set(rule) - {"transform"} or bad_transform:
                raise InvalidRequest(f'{where}[{i}] must be like {{"transform": {{"headers": {{...}}}}}}')
            given = (transform or {}).get("headers") or {}
            if not isinstance(given, Mapping):
                raise InvalidRequest(f"{where}[{i}].transform.headers must be an object")
            for name, value in given.items():
                k, v = _header(name, value, f"{where}[{i}].transform.headers")
                headers[k] = v
        if len(headers) > MAX_RULE_HEADERS:
            raise InvalidRequest(f"{where}: at most {MAX_RULE_HEADERS} headers")
        out.append(HostRule(entry, tuple(sorted(headers.items()))))
    return tuple(sorted(out, key=lambda r: r.host.sort_key()))


def parse_entry(text: object, where: str) -> Entry:
    """One allow_out / deny_out entry, an address or a name; a 400 naming ``where``. Bounded in
    length and charset before any parser sees it."""
    if not isinstance(text, str):
        raise InvalidRequest(f"{where} must be a string like '10.0.0.0/8', '192.0.2.7:443' or "
                             f"'pypi.org', not {str(text)[:80]!r}")
    if not text or len(text) > bounds.MAX_EGRESS_ENTRY_CHARS:
        raise InvalidRequest(f"{where} must be 1 to {bounds.MAX_EGRESS_ENTRY_CHARS} characters")
    if not text.isascii() or not text.isprintable():
        raise InvalidRequest(f"{where} {ascii(text)[:80]}: only ASCII letters, digits and '.-_*:/' are "
                             "allowed (give an internationalized name in its xn-- form)")
    addr = text.partition(":")[0]
    if text.count(":") <= 1 and "[" not in text and (addr.startswith("*.") or any(
            c.isalpha() for c in addr.rpartition(".")[2])):
        return NameDestination.parse(text, where)
    return Destination.parse(text, where)


def _ports(ports: str, where: str, entry: str) -> tuple[int | None, int | None]:
    """An entry's port range after its ':' ("" when it has none): (None, None) means every port."""
    if not ports:
        if entry.endswith(":"):
            raise InvalidRequest(f"{where} {entry!r}: a port must follow the ':'")
        return None, None
    first_s, dash, last_s = ports.partition("-")
    first = _port(first_s, where, entry)
    last = _port(last_s, where, entry) if dash else first
    return min(first, last), max(first, last)


def _port_suffix(first: int | None, last: int | None) -> str:
    if first is None:
        return ""
    return f":{first}" if first == last else f":{first}-{last}"


def _nft_ports(first: int | None, last: int | None) -> str | None:
    if first is None:
        return None
    return str(first) if first == last else f"{first}-{last}"


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


def _entry_key(e: Entry) -> tuple[bool, tuple[object, ...]]:
    # Addresses first, then names: two kinds never compare their own keys with each other's.
    return (isinstance(e, NameDestination), e.sort_key())


def _destinations(entries: object, where: str) -> tuple[Entry, ...]:
    if entries is None:
        return ()
    if not isinstance(entries, list | tuple):
        raise InvalidRequest(f"{where} must be a list of IPv4 addresses, CIDRs or DNS names")
    if len(entries) > bounds.MAX_EGRESS_ENTRIES:
        raise InvalidRequest(f"{where} may have at most {bounds.MAX_EGRESS_ENTRIES} entries "
                             f"(got {len(entries)})")
    parsed = [parse_entry(e, f"{where}[{i}]") for i, e in enumerate(entries)]
    return tuple(sorted(set(parsed), key=_entry_key))  # canonical: the pool key compares policies


@dataclass(frozen=True)
class EgressPolicy:
    """Denied by default; see the module docstring. Hashable: a warm pool's key holds one."""

    allow_internet_access: bool = False
    allow_out: tuple[Entry, ...] = ()
    deny_out: tuple[Entry, ...] = ()
    allow_public_traffic: bool = False  # inbound, through the daemon's port proxy
    mask_request_host: str | None = None
    rules: tuple[HostRule, ...] = ()  # header transforms of HTTPS/HTTP to allow_out names

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
        allow_out = _destinations(network.get("allow_out"), "network.allow_out")
        deny_out = _destinations(network.get("deny_out"), "network.deny_out")
        internet = bool(allow_internet_access)
        return cls(internet, allow_out, deny_out, public, _mask_host(network.get("mask_request_host")),
                   _rules(network.get("rules"), allow_out, deny_out, internet))

    @property
    def is_default(self) -> bool:
        """Every outbound destination denied (what a spawn gets without asking). The inbound
        settings do not count: without a NIC there is no port to reach, so they cost nothing."""
        return (self.allow_internet_access, self.allow_out, self.deny_out) == (False, (), ())

    @property
    def allow_names(self) -> tuple[NameDestination, ...]:
        """The allow_out entries by name, in order: entry ``i`` fills the sandbox's set ``name_<i>``."""
        return tuple(e for e in self.allow_out if isinstance(e, NameDestination))

    @property
    def uses_names(self) -> bool:
        """Whether any entry is a name: then the sandbox's DNS goes to the daemon's resolver."""
        return any(isinstance(e, NameDestination) for e in (*self.allow_out, *self.deny_out))

    def allowed_name(self, qname: str) -> bool:
        """Whether the guest may resolve ``qname`` (lower-case, no final dot): an allow_out name
        matches it (allow wins over deny), or the internet is open and no deny_out name matches it."""
        if any(e.matches(qname) for e in self.allow_names):
            return True
        denied = any(e.matches(qname) for e in self.deny_out if isinstance(e, NameDestination))
        return self.allow_internet_access and not denied

    def allows_connection(self, name: str, port: int) -> bool:
        """Whether a TCP connection that names ``name`` (its TLS SNI or HTTP ``Host``, lower-case)
        may reach ``port`` of an address answered for an allow_out name: an allow_out name entry
        matches both. (Only such connections are inspected: host/egress_inspect.py.)"""
        return any(e.matches(name) and e.covers(port) for e in self.allow_names)

    @property
    def inspects_internet(self) -> bool:
        """Whether HTTPS to the open internet goes through the sandbox's inspector: it has header
        rules, whose hosts may be any name the internet reaches (E2B's rules without allow_out)."""
        return self.allow_internet_access and bool(self.rules)

    @property
    def served_by_the_daemon(self) -> bool:
        """Whether the sandbox needs the daemon's resolver and inspector (host/dnsguard.py)."""
        return self.uses_names or bool(self.rules)

    def rule_for(self, name: str) -> HostRule | None:
        """The header transform of requests to ``name`` (an exact host before a wildcard); None:
        its connections are passed through untouched."""
        exact = [r for r in self.rules if not r.host.wildcard and r.host.matches(name)]
        wild = sorted((r for r in self.rules if r.host.wildcard and r.host.matches(name)),
                      key=lambda r: -len(r.host.name))  # the most specific wildcard
        found = exact or wild
        return found[0] if found else None

    def name_sets(self, qname: str) -> list[int]:
        """The indices ``i`` of the sets ``name_<i>`` that the addresses of ``qname`` go into."""
        return [i for i, e in enumerate(self.allow_names) if e.matches(qname)]

    def info(self) -> dict[str, Any]:
        """As SandboxInfo and PoolInfo show it (and as the registry stores it)."""
        return {"allow_internet_access": self.allow_internet_access,
                "allow_out": [str(d) for d in self.allow_out], "deny_out": [str(d) for d in self.deny_out],
                "allow_public_traffic": self.allow_public_traffic,
                "mask_request_host": self.mask_request_host,
                "rules": {str(r.host): r.info() for r in self.rules}}

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
        addresses and the sandboxes' gateway) are delivered locally. Names are not
        counted: where they lead is known only when they are resolved
        (``Networks.prepare`` masquerades them when the host forwards).
        """
        if self.allow_internet_access:
            return True
        mine = {IPv4Network(a) for a in local}
        return any(isinstance(d, Destination) and d.network not in mine for d in self.allow_out)


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
