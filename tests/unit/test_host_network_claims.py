"""Two daemons on one host (issue 38, item 8): a hibernated sandbox's address index stays its own,
a wake whose index was taken while no daemon held it gets another, and each daemon's host rules
(masquerade, guard) are its own, so one daemon's stop never takes another's. No VM: the host
side is a fake of /sys/class/net that the stand-in ``create``/``remove`` keep."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any

import pytest

from forkd.controller.network import NetRequest, Networks
from forkd.host import childnet, netplan
from forkd.host import netns as netns_mod
from forkd.host.accel import Accel, VMConfig
from forkd.host.egress import EgressPolicy
from forkd.host.hostlock import HostClaims
from forkd.host.netplan import AddressPlan, ChildNet
from forkd.store.records import DiskChain, SandboxRecord
from forkd.store.registry import Registry
from forkd.store.rows.sandboxes import NetworkRows

REQ = NetRequest(tap="forkd-tap0", dns=(), egress=EgressPolicy(), blocked=(), nat=True)


class FakeHost:
    """The host's fkn<i> devices and each daemon's masquerade elements, as create/remove change them."""

    def __init__(self) -> None:
        self.veths: set[int] = set()
        self.elements: dict[str, set[str]] = {}  # host table -> addresses
        self.namespaces: set[str] = set()

    async def create(self, net: ChildNet, blocked: list[IPv4Network]) -> None:
        assert net.index is not None and net.ip is not None
        if net.index in self.veths:
            raise childnet.VMError("creating the veth pair failed: RTNETLINK answers: File exists")
        self.veths.add(net.index)
        self.namespaces.add(net.netns)
        if net.nat:
            self.elements.setdefault(net.nat_table, set()).add(net.ip)

    async def remove(self, net: ChildNet) -> list[str]:
        if net.nat and net.ip:
            self.elements.get(net.nat_table, set()).discard(net.ip)
        if net.netns in self.namespaces:
            self.namespaces.discard(net.netns)
            if net.index is not None:
                self.veths.discard(net.index)
        return []


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> FakeHost:
    fake = FakeHost()

    async def guard(table: str, plan: AddressPlan, uids: set[int]) -> None:
        pass

    monkeypatch.setattr(childnet, "create", fake.create)
    monkeypatch.setattr(childnet, "remove", fake.remove)
    monkeypatch.setattr(childnet, "install_host_guard", guard)
    monkeypatch.setattr(childnet, "veths_in_use", lambda: set(fake.veths))
    monkeypatch.setattr(childnet, "missing_prerequisites", lambda: [])
    monkeypatch.setattr(childnet, "host_addresses", lambda: [])
    monkeypatch.setattr(childnet, "forwarding_enabled", lambda path=None: True)
    monkeypatch.setattr(netns_mod, "netns_exists", lambda name: name in fake.namespaces)
    return fake


def _daemon(tmp_path: Path, name: str) -> tuple[Networks, NetworkRows]:
    (tmp_path / name).mkdir(exist_ok=True)
    rows = Registry(tmp_path / f"{name}.db").sandboxes
    return Networks(tmp_path / name, rows, AddressPlan.parse(netplan.DEFAULT_CIDR),
                    HostClaims(tmp_path / "locks")), rows  # one host: one lock directory


def _row(rows: Any, net: ChildNet) -> None:
    rows.insert(SandboxRecord(id=net.owner, snapshot_tag="py", dir="/tmp/nowhere", created_at_unix=1,
                              config=VMConfig(512, 1, Accel.tcg()), disk=DiskChain.fresh(Path("/x"), "py"),
                              pid=None, network=net))


def test_a_hibernated_sandboxs_address_is_nobody_elses_while_its_daemon_lives(
        tmp_path: Path, host: FakeHost) -> None:
    a, _ = _daemon(tmp_path, "a")
    b, _ = _daemon(tmp_path, "b")

    async def scenario() -> None:
        parked = await a.acquire("sb-aaaaaa-0001", REQ)
        assert parked.index == 0
        await a.park(parked)  # hibernated: its fkn0 is gone from the host
        assert 0 not in host.veths
        other = await b.acquire("sb-bbbbbb-0001", REQ)
        assert other.index == 1, "another daemon took the index of a hibernated sandbox"
        assert await a.unpark(parked) == parked  # it wakes at its own address
        # b's element is b's: a's kill of its sandbox leaves it, and vice versa.
        assert host.elements == {a.nat_table: {parked.ip}, b.nat_table: {other.ip}}
        await a.release(parked)
        assert host.elements[b.nat_table] == {other.ip}

    asyncio.run(scenario())
    assert a.nat_table != b.nat_table


def test_a_wake_whose_address_was_taken_while_its_daemon_was_down_gets_another(
        tmp_path: Path, host: FakeHost) -> None:
    a, rows = _daemon(tmp_path, "a")
    b, _ = _daemon(tmp_path, "b")

    async def scenario() -> None:
        parked = await a.acquire("sb-aaaaaa-0001", REQ)
        _row(rows, parked)
        await a.park(parked)
        a._host_claims.close()  # daemon a dies: the kernel drops its claims
        other = await b.acquire("sb-bbbbbb-0001", REQ)
        assert other.index == parked.index  # nobody held it
        again, rows_again = _daemon(tmp_path, "a")  # daemon a restarts on its data dir
        await again.reap(alive={parked.owner})
        woken = await again.unpark(parked)
        assert woken.index != other.index and woken.ip != other.ip
        assert rows_again.get(parked.owner).network == woken
        lease = json.loads((tmp_path / "a" / "net" / f"{parked.owner}.json").read_text())
        assert lease["index"] == woken.index
        assert host.elements[b.nat_table] == {other.ip}
        # Its kill removes its own element, never b's, though b's has its old address.
        await again.release(woken)
        assert host.elements[b.nat_table] == {other.ip}

    asyncio.run(scenario())


def test_each_data_dir_has_its_own_host_table(tmp_path: Path) -> None:
    one, two = netplan.host_nat_table(tmp_path / "a"), netplan.host_nat_table(tmp_path / "b")
    assert one != two and one == netplan.host_nat_table(tmp_path / "a" / ".." / "a")
    assert netplan.HOST_TABLE_RE.match(one)
    net = ChildNet(owner="x", netns="forkd-x", owns_netns=True, nat=True, nat_table=one)
    assert ChildNet.from_json(json.loads(json.dumps(net.to_json()))) == net
    # A lease or row written before per-daemon tables: its element is in the old shared table.
    old = net.to_json()
    del old["nat_table"]
    assert ChildNet.from_json(old).nat_table == netplan.NFT_TABLE
    # It reaches an nft script: nothing but a name forkd makes.
    with pytest.raises(childnet.InvalidRequest):
        ChildNet.from_json({**net.to_json(), "nat_table": "forkd\nflush ruleset"})


def test_the_guard_refuses_other_users_new_connections_to_sandbox_addresses() -> None:
    script = netplan.host_guard("forkd-0123456789ab", AddressPlan.parse("10.201.0.0/16"), {1000, 0})
    assert "ip daddr 10.201.0.0/16 ip daddr != 10.201.0.1 ct state new meta skuid != { 0, 1000 }" in script
    assert "flush chain ip forkd-0123456789ab output" in script  # installing it twice never doubles it
    if shutil.which("nft") is None or childnet.os.geteuid() != 0:
        pytest.skip("nft -c needs nft and root")
    proc = subprocess.run(["nft", "-c", "-f", "-"], input=script, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr + script
