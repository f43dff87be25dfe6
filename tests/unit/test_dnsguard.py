"""Egress by name: which names a policy lets a guest resolve, the rules that enforce it, and the
sandbox's resolver (host/dnsguard.py) over real UDP sockets, with a real upstream resolver on
loopback. The nft rules and the socket in a namespace run for real where the tests are root."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any, cast

import dns.asyncquery
import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest

from forkd.errors import VMError
from forkd.host import dnsguard, netplan
from forkd.host import netns as netns_mod
from forkd.host.dnsguard import NameGuard, parse_hosts
from forkd.host.egress import EgressPolicy
from forkd.host.netplan import ChildNet

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="needs root (network namespaces, nftables)")


def policy(allow: list[str] | None = None, deny: list[str] | None = None,
           internet: bool = False) -> EgressPolicy:
    return EgressPolicy.from_request(internet, {"allow_out": allow or [], "deny_out": deny or []})


def child(egress: EgressPolicy, netns: str = "forkd-test") -> ChildNet:
    return ChildNet(owner="sb1", netns=netns, owns_netns=True, tap="forkd-tap0", owns_tap=True, index=0,
                    ip="10.201.0.2", gateway="10.201.0.1", egress=egress, dns=("192.0.2.53",))


# ------------------------------------------------------------------ which names


def test_names_match_exactly_or_below_a_wildcard() -> None:
    p = policy(["pypi.org", "*.pythonhosted.org:443", "10.0.0.0/8"])
    assert p.uses_names and [str(n) for n in p.allow_names] == ["pypi.org", "*.pythonhosted.org:443"]
    assert p.allowed_name("pypi.org") and not p.allowed_name("www.pypi.org")
    assert p.allowed_name("files.pythonhosted.org") and p.allowed_name("a.b.pythonhosted.org")
    assert not p.allowed_name("pythonhosted.org")  # a wildcard is the names below, not the name
    assert not p.allowed_name("evilpythonhosted.org")  # a label boundary, not a suffix of characters
    assert p.name_sets("files.pythonhosted.org") == [1] and p.name_sets("pypi.org") == [0]
    assert p.name_sets("example.com") == []
    assert not policy(["10.0.0.0/8"]).uses_names and policy(deny=["x.example"]).uses_names


def test_deny_names_close_what_the_internet_opened_and_allow_wins() -> None:
    p = policy(["ok.bad.example"], ["*.bad.example"], internet=True)
    assert p.allowed_name("anything.example") and not p.allowed_name("x.bad.example")
    assert p.allowed_name("ok.bad.example")  # allow wins over deny, as for addresses
    assert not policy(deny=["x.example"]).allowed_name("y.example")  # no internet: nothing else


def test_a_name_policy_round_trips_and_is_a_pool_key() -> None:
    p = policy(["B.example:443", "a.example", "10.0.0.1"], ["*.c.example"])
    assert p.info()["allow_out"] == ["10.0.0.1", "a.example", "b.example:443"]  # canonical
    assert EgressPolicy.from_info(p.info()) == p and hash(EgressPolicy.from_info(p.info())) == hash(p)
    with pytest.raises(Exception, match="at most 256 entries"):
        policy([f"n{i}.example" for i in range(257)])


def test_a_connection_is_allowed_by_the_name_it_carries_and_that_names_port() -> None:
    p = policy(["pypi.org:443", "*.pythonhosted.org", "10.0.0.0/8"], ["evil.example"], internet=True)
    assert p.allows_connection("pypi.org", 443) and not p.allows_connection("pypi.org", 80)
    assert p.allows_connection("files.pythonhosted.org", 8443)  # every port
    # Only allow_out names: what the internet opens is not inspected, so it opens no connection here.
    assert not p.allows_connection("example.com", 443) and not p.allows_connection("evil.example", 443)
    ranged = policy(["a.example:8000-8100"])
    assert ranged.allows_connection("a.example", 8000) and ranged.allows_connection("a.example", 8100)
    assert not ranged.allows_connection("a.example", 8101)


def test_names_alone_never_ask_for_forwarding() -> None:
    assert not policy(["pypi.org"]).leaves_host([])
    assert policy(["pypi.org", "192.0.2.1"]).leaves_host([])


# ------------------------------------------------------------------ the rules


def _chain(rules: str, name: str) -> list[str]:
    body = rules.split(f"chain {name} {{")[1].split("\n  }")[0].split("\n")
    return [line.strip() for line in body if line.strip() and not line.strip().startswith("type ")]


def test_a_name_policy_redirects_dns_and_tcp_refuses_other_dns_and_allows_its_sets() -> None:
    net = child(policy(["a.example", "*.w.example:443", "192.0.2.9:80"]))
    rules = netplan.netns_ruleset(net, [])
    assert "set name_0 { type ipv4_addr; flags timeout; }" in rules and "set name_1 {" in rules
    prerouting = _chain(rules, "prerouting")
    assert prerouting[1:] == [
        'iifname "forkd-tap0" ip daddr { 192.0.2.53, 172.16.0.1 } udp dport 53 dnat ip to 172.16.0.1:53',
        # by number: no name needed, so not inspected
        'iifname "forkd-tap0" ip daddr 192.0.2.9/32 meta l4proto { tcp, udp } th dport 80 return',
        # TCP to an answered address goes to the inspector, on the entry's ports only
        'iifname "forkd-tap0" ip daddr @name_0 meta l4proto tcp dnat ip to 172.16.0.1:15001',
        'iifname "forkd-tap0" ip daddr @name_1 tcp dport 443 dnat ip to 172.16.0.1:15001']
    assert _chain(rules, "input")[2:] == [
        'iifname "forkd-tap0" ip daddr 172.16.0.1 udp dport 53 accept',
        'iifname "forkd-tap0" ip daddr 172.16.0.1 tcp dport { 15001, 15002 } ct status dnat accept']
    assert _chain(rules, "egress") == [
        "meta l4proto { tcp, udp } th dport { 53, 853 } jump refuse",  # first of all
        "udp dport 443 jump refuse",  # QUIC
        "ip daddr @name_0 meta l4proto udp accept",  # TCP never gets here: it was redirected
        "ip daddr @name_1 udp dport 443 accept",
        "ip daddr 192.0.2.9/32 meta l4proto { tcp, udp } th dport 80 accept"]
    plain = netplan.netns_ruleset(child(policy(["192.0.2.9:80"])), [])
    assert "set name_" not in plain and "dport 53" not in plain  # no names: the rules of before


def test_rules_with_the_internet_open_send_its_https_through_the_pass_through_inspector() -> None:
    """E2B's rules without allow_out: the internet's HTTPS (not what stays closed, not a denied
    address, not one allowed by number) goes to the pass-through port; QUIC is refused; no DNS
    redirect without names."""
    rules = {"api.example.com": [{"transform": {"headers": {"X-A": "b"}}}]}
    net = child(EgressPolicy.from_request(True, {"allow_out": ["192.0.2.9:80"],
                                                 "deny_out": ["198.51.100.0/24"], "rules": rules}))
    assert net.egress.inspects_internet and net.egress.served_by_the_daemon and not net.egress.uses_names
    rules_text = netplan.netns_ruleset(net, [IPv4Network("10.201.0.0/16")])
    prerouting = _chain(rules_text, "prerouting")
    assert prerouting[1:3] == [
        'iifname "forkd-tap0" ip daddr 192.0.2.9/32 meta l4proto { tcp, udp } th dport 80 return',
        'iifname "forkd-tap0" ip daddr 198.51.100.0/24 return']
    assert prerouting[3].startswith('iifname "forkd-tap0" tcp dport 443 ip daddr != { 0.0.0.0/8, 10.0.0.0/8,')
    assert prerouting[3].endswith("} dnat ip to 172.16.0.1:15002") and "udp dport 53" not in rules_text
    assert "udp dport 443 jump refuse" in _chain(rules_text, "egress")
    assert _chain(rules_text, "input")[2:] == [
        'iifname "forkd-tap0" ip daddr 172.16.0.1 tcp dport { 15001, 15002 } ct status dnat accept']
    # Without the internet a rule's host must be an allow_out name; with it, any name not denied.
    with pytest.raises(Exception, match="a rule opens nothing on its own"):
        EgressPolicy.from_request(False, {"rules": rules})
    with pytest.raises(Exception, match="a rule opens nothing on its own"):
        EgressPolicy.from_request(True, {"deny_out": ["*.example.com"], "rules": rules})


def test_answered_addresses_refresh_their_timeout() -> None:
    script = netplan.name_elements([0, 2], [IPv4Address("192.0.2.1"), IPv4Address("192.0.2.2")], 90)
    lines = script.splitlines()
    assert lines[:3] == [
        "add element inet forkd name_0 { 192.0.2.1 timeout 90s, 192.0.2.2 timeout 90s }",
        "delete element inet forkd name_0 { 192.0.2.1, 192.0.2.2 }",
        "add element inet forkd name_0 { 192.0.2.1 timeout 90s, 192.0.2.2 timeout 90s }"]
    assert len(lines) == 6 and "name_2" in lines[3]
    assert netplan.name_elements([0], [], 90) == ""


@pytest.fixture
def scratch_netns() -> Iterator[str]:
    name = f"fdtest-dns-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "tuntap", "add", "dev", "forkd-tap0", "mode", "tap"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def _elements(ns: str, set_name: str) -> dict[str, int]:
    out = subprocess.run(["ip", "netns", "exec", ns, "nft", "-j", "list", "set", "inet", "forkd", set_name],
                         capture_output=True, text=True, check=True).stdout
    [s] = [o["set"] for o in json.loads(out)["nftables"] if "set" in o]
    return {e["elem"]["val"]: e["elem"]["timeout"] for e in s.get("elem", [])}


@needs_root
def test_the_rules_load_and_elements_get_the_latest_timeout(scratch_netns: str) -> None:
    """nft itself takes the ruleset and the element scripts (a second answer of the same address
    renews its timeout rather than failing on an element already there)."""
    net = child(policy(["a.example", "*.w.example:443"]), scratch_netns)
    subprocess.run(["ip", "netns", "exec", scratch_netns, "nft", "-f", "-"], check=True, text=True,
                   input=netplan.netns_ruleset(net, []))
    addr = [IPv4Address("192.0.2.1")]
    for secs in (60, 600):
        subprocess.run(["ip", "netns", "exec", scratch_netns, "nft", "-f", "-"], check=True, text=True,
                       input=netplan.name_elements([1], addr, secs))
    assert _elements(scratch_netns, "name_1") == {"192.0.2.1": 600}
    assert _elements(scratch_netns, "name_0") == {}
    # PUT network: the table flushed and filled again: the answered elements go with the old policy.
    subprocess.run(["ip", "netns", "exec", scratch_netns, "nft", "-f", "-"], check=True, text=True,
                   input=netplan.netns_ruleset_replace(net, []))
    assert _elements(scratch_netns, "name_1") == {}


@needs_root
def test_a_socket_made_in_a_namespace_lives_there(scratch_netns: str) -> None:
    host = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    host.bind(("127.0.0.1", 0))
    port = host.getsockname()[1]
    # The same address and port, free inside the namespace: the socket is not the host's.
    inner = netns_mod.udp_socket_in(scratch_netns, ("127.0.0.1", port))
    try:
        listed = subprocess.run(["ip", "netns", "exec", scratch_netns, "ss", "-Hunl"], capture_output=True,
                                text=True, check=True).stdout
        assert f"127.0.0.1:{port}" in listed
    finally:
        inner.close()
        host.close()
    with pytest.raises(OSError, match="No such file"):
        netns_mod.udp_socket_in("fdtest-no-such-netns", ("127.0.0.1", 0))


# ------------------------------------------------------------------ the resolver


class Upstream(asyncio.DatagramProtocol):
    """A real resolver on loopback: answers A for its names, records every question it gets."""

    def __init__(self, names: dict[str, list[str]]) -> None:
        self.names = names
        self.asked: list[str] = []
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)  # asyncio's is no subclass of it

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        q = dns.message.from_wire(data)
        name = q.question[0].name
        self.asked.append(name.to_text(omit_final_dot=True))
        resp = dns.message.make_response(q)
        found = self.names.get(name.to_text(omit_final_dot=True))
        if found is None:
            resp.set_rcode(dns.rcode.NXDOMAIN)
        elif q.question[0].rdtype == dns.rdatatype.A:
            resp.answer.append(dns.rrset.from_text_list(name, 5, "IN", "A", found))
        assert self.transport is not None
        self.transport.sendto(resp.to_wire(), addr)


class Installs:
    def __init__(self, fail: bool = False) -> None:
        self.scripts: list[str] = []
        self.fail = fail

    async def __call__(self, net: ChildNet, script: str) -> None:
        if self.fail:
            raise VMError("nft said no")
        self.scripts.append(script)


@asynccontextmanager
async def resolver(egress: EgressPolicy, install: Installs) -> AsyncIterator[tuple[NameGuard, int, Upstream]]:
    loop = asyncio.get_running_loop()
    upstream = Upstream({"pypi.org": ["192.0.2.10", "192.0.2.11"], "files.pythonhosted.org": ["192.0.2.20"],
                         "example.com": ["192.0.2.30"]})
    up_transport, _ = await loop.create_datagram_endpoint(lambda: upstream, local_addr=("127.0.0.1", 0))
    guard = NameGuard(upstreams=[("127.0.0.1", up_transport.get_extra_info("sockname")[1])], install=install)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    await guard.attach(child(egress), sock=sock)
    try:
        yield guard, port, upstream
    finally:
        await guard.close()
        up_transport.close()


async def ask(port: int, name: str, rdtype: str = "A") -> dns.message.Message:
    return await dns.asyncquery.udp(dns.message.make_query(name, rdtype), "127.0.0.1", timeout=10, port=port)


def addresses(resp: dns.message.Message) -> list[str]:
    return sorted(rd.address for r in resp.answer if r.rdtype == dns.rdatatype.A for rd in r)


def test_the_resolver_answers_allowed_names_and_installs_their_addresses_first() -> None:
    async def go() -> None:
        installs = Installs()
        async with resolver(policy(["pypi.org", "*.pythonhosted.org:443"]), installs) as (guard, port, up):
            got = await ask(port, "PyPI.org")
            assert got.rcode() == dns.rcode.NOERROR and addresses(got) == ["192.0.2.10", "192.0.2.11"]
            # name_0 is pypi.org's set (names sort); the TTL of 5 s is raised to the minimum.
            [script] = installs.scripts
            assert script.startswith("add element inet forkd name_0 { ") and "name_1" not in script
            assert f"192.0.2.10 timeout {dnsguard.MIN_TTL + dnsguard.GRACE_SECS}s" in script
            assert "192.0.2.11" in script
            wild = await ask(port, "files.pythonhosted.org")
            assert addresses(wild) == ["192.0.2.20"] and "name_1 {" in installs.scripts[-1]
            for refused in ("example.com", "pythonhosted.org", "www.pypi.org"):
                r = await ask(port, refused)
                assert r.rcode() == dns.rcode.REFUSED and not r.answer, refused
            assert up.asked == ["pypi.org", "files.pythonhosted.org"]  # refused names never left
            v6 = await ask(port, "pypi.org", "AAAA")  # IPv6 stays closed: an empty answer
            assert v6.rcode() == dns.rcode.NOERROR and not v6.answer
            assert len(installs.scripts) == 2 and up.asked[-1] == "files.pythonhosted.org"
            log = guard.decisions("sb1")
            assert [(d["name"], d["allowed"]) for d in log] == [
                ("pypi.org", True), ("files.pythonhosted.org", True), ("example.com", False),
                ("pythonhosted.org", False), ("www.pypi.org", False)]
    asyncio.run(go())


def test_the_resolver_answers_hosts_file_names_without_the_upstream(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("# test names\n10.201.0.1 api.test Other.TEST.\nnot-an-address x.test\n")
    monkeypatch.setenv(dnsguard.HOSTS_ENV, str(hosts))
    assert parse_hosts(hosts.read_text()) == {"api.test": [IPv4Address("10.201.0.1")],
                                              "other.test": [IPv4Address("10.201.0.1")]}

    async def go() -> None:
        installs = Installs()
        async with resolver(policy(["api.test", "pypi.org"]), installs) as (_, port, up):
            assert addresses(await ask(port, "api.test")) == ["10.201.0.1"]
            assert (await ask(port, "other.test")).rcode() == dns.rcode.REFUSED  # listed, not allowed
            hosts.write_text("10.201.0.9 api.test\n")  # read again when it changes
            os.utime(hosts, (1, 1))
            assert addresses(await ask(port, "api.test")) == ["10.201.0.9"]
            assert up.asked == [] and len(installs.scripts) == 2
    asyncio.run(go())


def test_garbage_is_dropped_and_a_failed_install_is_servfail() -> None:
    async def go() -> None:
        installs = Installs(fail=True)
        async with resolver(policy(["pypi.org"]), installs) as (guard, port, _):
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.setblocking(False)
                await asyncio.get_running_loop().sock_connect(s, ("127.0.0.1", port))
                for junk in (b"\x00", os.urandom(40), b"x" * (dnsguard.MAX_QUERY_BYTES + 1)):
                    s.send(junk)
                # A response is never reflected back either.
                reply = dns.message.make_response(dns.message.make_query("pypi.org", "A"))
                s.send(reply.to_wire())
                query = dns.message.make_query("pypi.org", "A")
                s.send(query.to_wire())
                got = dns.message.from_wire(await asyncio.get_running_loop().sock_recv(s, 4096))
            # The first answer is to the one question: nothing came back for the rest.
            assert got.id == query.id and got.rcode() == dns.rcode.SERVFAIL and not got.answer
            assert guard.decisions("sb1")[-1]["allowed"] is False
    asyncio.run(go())


def test_detach_closes_the_socket_and_a_policy_without_names_has_none() -> None:
    async def go() -> None:
        guard = NameGuard(upstreams=[], install=Installs())
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        await guard.attach(child(policy(["pypi.org"])), sock=sock)
        assert guard.attached() == ["sb1"]
        await guard.attach(child(policy(["192.0.2.1"])))  # no names any more: no resolver
        assert guard.attached() == [] and sock.fileno() == -1
        await guard.detach("sb1")  # twice: nothing to do
    asyncio.run(go())


# ------------------------------------------------------------------ with a sandbox's network


@needs_root
def test_a_name_policys_network_serves_its_resolver_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real sandbox network (namespace, veth, rules; no VM) with names: its resolver's socket is
    in its namespace and goes with it; a resolver that cannot start fails the spawn's network
    with nothing left of it (namespace, lease, socket)."""
    from forkd.controller.network import Networks
    from forkd.host.hostlock import HostClaims
    from forkd.store.registry import Registry

    networks = Networks(tmp_path, Registry(tmp_path / "forkd.db").sandboxes,
                        netplan.AddressPlan.parse(netplan.DEFAULT_CIDR), HostClaims(tmp_path / "locks"))

    async def go() -> None:
        req = await networks.prepare(tap=netplan.DEFAULT_TAP, dns=("192.0.2.53",),
                                     egress=policy(["pypi.org"]), per_child_netns=False, what="test")
        assert req is not None
        owner = f"sb-dnstest-{os.getpid()}"
        net = await networks.acquire(owner, req)
        try:
            assert networks.names.attached() == [owner]
            listed = subprocess.run(["ip", "netns", "exec", net.netns, "ss", "-Hunl"], capture_output=True,
                                    text=True, check=True).stdout
            assert f"{netplan.TAP_IP}:53" in listed
            # ... and its inspector's listening socket (TCP to answered addresses comes here).
            listening = subprocess.run(["ip", "netns", "exec", net.netns, "ss", "-Htnl"],
                                       capture_output=True, text=True, check=True).stdout
            assert f"{netplan.TAP_IP}:{netplan.INSPECT_PORT}" in listening
            # A restarted daemon re-adopts the live network: its resolver again (the old one's
            # socket died with its daemon; here it is closed the same way).
            await networks.names.detach(owner)
            again = Networks(tmp_path, Registry(tmp_path / "forkd.db").sandboxes,
                             netplan.AddressPlan.parse(netplan.DEFAULT_CIDR), HostClaims(tmp_path / "locks2"))
            await again.reap({owner})
            assert again.names.attached() == [owner]
            await again.names.close()
        finally:
            await networks.release(net)
        assert networks.names.attached() == [] and not Path("/run/netns", net.netns).exists()

        def refuse(netns: str, address: tuple[str, int]) -> socket.socket:
            raise OSError(98, "Address already in use")

        monkeypatch.setattr(netns_mod, "udp_socket_in", refuse)
        with pytest.raises(VMError, match=r"starting the resolver of .*Address already in use"):
            await networks.acquire(owner + "b", req)
        assert networks.names.attached() == [] and networks.owners() == []
        assert not Path("/run/netns", f"{netplan.NETNS_PREFIX}{owner}b").exists()
        monkeypatch.undo()

        made: list[socket.socket] = []
        real_udp = netns_mod.udp_socket_in

        def udp_then_remember(netns: str, address: tuple[str, int]) -> socket.socket:
            made.append(real_udp(netns, address))
            return made[-1]

        def refuse_tcp(netns: str, address: tuple[str, int], backlog: int) -> socket.socket:
            raise OSError(98, "Address already in use")

        # The inspector's listener cannot be made: the resolver's socket, made first, is closed too.
        monkeypatch.setattr(netns_mod, "udp_socket_in", udp_then_remember)
        monkeypatch.setattr(netns_mod, "tcp_listener_in", refuse_tcp)
        with pytest.raises(VMError, match=r"Address already in use"):
            await networks.acquire(owner + "c", req)
        assert len(made) == 1 and made[0].fileno() == -1
        assert networks.names.attached() == [] and networks.owners() == []
        assert not Path("/run/netns", f"{netplan.NETNS_PREFIX}{owner}c").exists()
        await networks.close()

    asyncio.run(go())
