"""Sandbox networks: the one owner of which namespaces, addresses and host links are taken.

A child of a snapshot with a NIC gets a network namespace of its own, made at
spawn and removed with it (``host/netplan.py`` draws it, ``host/childnet.py``
makes it): ``forkd-<sandbox id>``, or with ``per_child_netns`` the seeds'
``forkd-child-<i>``, made when missing (and then removed), used as it is when
``scripts/netns-setup.sh`` provisioned it (then only forkd's additions go).
A template with a NIC gets the same, under ``forkd-tpl-<hex>``.

Every network is a *lease*: a JSON file under ``<data dir>/net/`` written
before anything is made on the host and deleted after everything is removed,
so a daemon that dies half-way leaves a record that the next one reaps
(``reap``), whether or not a sandbox row got written.

An address index is held host-wide for as long as its lease lives (a claim on
the name of its host device, ``fkn<i>``: ``host/hostlock.py``), also while its
sandbox is hibernated and that device is gone: no other daemon takes it. A
claim dies with its daemon, so a restarted daemon may find the index of a
hibernated sandbox taken meanwhile: its wake then gives it another (``unpark``;
the guest does not see it, only the host's side of its address changes).

The host-side rules (masquerade, and the guard that keeps other local users
off the sandboxes' addresses) are in this daemon's own host table
(``netplan.host_nat_table``), made with its first network and dropped when it
stops with no element left: another daemon's stop never touches them.

A sandbox's egress policy can be replaced while it lives (``update``): its
namespace's table is rewritten in one ``nft -f`` transaction, its host
masquerade element added or removed, then its lease and its row's ``network``
(this class is the one writer of that column). A hibernated sandbox's policy
is only written down: its wake makes its network from the row.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

from forkd.controller.sandbox_events import SandboxEvents
from forkd.errors import InvalidRequest, VMError
from forkd.host import childnet, netplan
from forkd.host import netns as netns_mod
from forkd.host.dnsguard import NameGuard
from forkd.host.egress import EgressPolicy
from forkd.host.hostlock import HostClaims
from forkd.host.netplan import NETNS_PREFIX, UPLINK, AddressPlan, ChildNet
from forkd.store.records import SandboxRecord
from forkd.store.rows.sandboxes import NetworkRows

log = logging.getLogger("forkd.network")
# How often a spawn takes another address when another daemon made the same veth first.
VETH_RACE_RETRIES = 3


@dataclass(frozen=True)
class NetRequest:
    """What every child of one spawn gets: checked, with the host facts its rules need."""

    tap: str | None  # the snapshot's NIC; None: a namespace only (per_child_netns, no NIC)
    dns: tuple[str, ...]
    egress: EgressPolicy
    blocked: tuple[IPv4Network, ...]  # closed even to allow_internet_access: the plan, the host
    nat: bool  # its policy reaches beyond the host: masquerade on the host


def no_nic_message(what: str) -> str:
    return (f"{what} has no network device, so allow_internet_access and network do not apply; "
            "create the snapshot with \"nic\": true to give its children a network")


class Networks:
    def __init__(self, root: Path, sandboxes: NetworkRows, plan: AddressPlan | None = None,
                 host_claims: HostClaims | None = None, *, events: SandboxEvents | None = None,
                 resolve_secret: Callable[[str], str | None] | None = None) -> None:
        """``events``: where it hears of teardowns (a sandbox's network goes with it); None for a
        ``Networks`` on its own, whose caller releases networks itself. ``resolve_secret``: a
        secret's value by name, for header rules (controller/secrets.py)."""
        self._dir = root / "net"
        self._sandboxes = sandboxes
        self.plan = plan or AddressPlan.from_env()
        # forkd-child-<i> are the host's names: another daemon may hold some (host/hostlock.py).
        self._host_claims = host_claims or HostClaims()
        self._leases: dict[str, ChildNet] = {}  # owner -> its network
        self._indices: set[int] = set()  # being made right now (no lease yet in _leases)
        self._child_netns: set[int] = set()  # forkd-child-<i> being claimed right now
        self.nat_table = netplan.host_nat_table(root)  # this daemon's host table
        self._guarded = False  # its guard is installed (once per daemon: it outlives no sandbox)
        self._guard_lock = asyncio.Lock()
        # The resolvers of sandboxes with names in their egress: attached once a network is made,
        # detached before it goes (a resolver's socket holds its namespace alive).
        # A sandbox with header rules keeps its own CA beside its lease (<owner>.ca.pem, 0600).
        self.names = NameGuard(ca_dir=self._dir, resolve_secret=resolve_secret)
        if events is not None:
            events.on_removed(self.after_removed)

    # ---------------------------------------------------------------- checks

    async def prepare(self, *, tap: str | None, dns: tuple[str, ...], egress: EgressPolicy,
                      per_child_netns: bool, what: str) -> NetRequest | None:
        """The checks of a spawn (400 before any VM starts); None if its children need no network."""
        if tap is None and not egress.is_default:
            raise InvalidRequest(no_nic_message(what))
        if tap is None and not per_child_netns:
            return None
        childnet.check_prerequisites(what)
        host: list[IPv4Address] = []
        nat = False
        if tap is not None:
            host = await asyncio.to_thread(childnet.host_addresses)
            nat = egress.leaves_host([*host, self.plan.gateway])
            forwarding = childnet.forwarding_enabled()
            if nat and not forwarding:
                raise InvalidRequest(
                    f"the egress asked for ({json.dumps(egress.info())}) reaches beyond this host, which "
                    f"needs IP forwarding, and net.ipv4.ip_forward is 0: {childnet.FORWARDING_FIX}")
            # Where a name leads is known only once it is answered: beyond the host if the host
            # forwards; without forwarding, names reach only the host's own addresses.
            nat = nat or (bool(egress.allow_names) and forwarding)
        blocked = (self.plan.network, *(IPv4Network(a) for a in host))
        return NetRequest(tap, dns, egress, blocked, nat)

    # ---------------------------------------------------------------- per_child_netns names

    def _child_netns_held(self) -> set[int]:
        """The ``forkd-child-<i>`` this daemon's sandboxes live in."""
        return {i for sb in self._sandboxes.all() if (i := netns_mod.netns_index(sb.netns)) is not None}

    def claim_child_netns(self, n: int) -> list[int]:
        """The ``n`` lowest ``forkd-child-<i>`` no live or starting sandbox, of this daemon or another
        on the host, holds (no await: atomic within this daemon; the host claim spans daemons)."""
        used = self._child_netns_held() | self._child_netns
        indices: list[int] = []
        i = 0
        while len(indices) < n:
            if i not in used and self._host_claims.try_claim(netns_mod.child_netns(i)):
                indices.append(i)
            i += 1
        self._child_netns.update(indices)
        return indices

    def release_child_netns(self, indices: list[int]) -> None:
        """The spawn that claimed ``indices`` ended: names its sandboxes did not take go back."""
        self._child_netns.difference_update(indices)
        for i in set(indices) - self._child_netns_held():
            self._host_claims.release(netns_mod.child_netns(i))

    # ---------------------------------------------------------------- leases

    def _claim_index(self) -> int:
        """The lowest address index nobody holds, on this host (no await: atomic), claimed host-wide
        (the caller's lease holds the claim from then on; ``_drop_lease`` gives it back)."""
        taken = self._indices | {n.index for n in self._leases.values() if n.index is not None}
        taken |= childnet.veths_in_use()  # other daemons on this host share the device names
        while True:
            index = netns_mod.lowest_free(taken, 1)[0]
            if index >= self.plan.capacity:
                raise VMError(f"the sandbox network {self.plan.network} is full ({self.plan.capacity} "
                              "sandboxes); give a larger one with FORKD_NET_CIDR")
            # A hibernated sandbox of another daemon holds its index with no device on the host.
            if self._host_claims.try_claim(AddressPlan.veth(index)):
                break
            taken.add(index)
        self._indices.add(index)
        return index

    def _unclaim_index(self, index: int | None) -> None:
        if index is not None and index not in self._indices and \
                not any(n.index == index for n in self._leases.values()):
            self._host_claims.release(AddressPlan.veth(index))

    async def _ensure_guard(self) -> None:
        """This daemon's host table and its guard, before its first sandbox address exists."""
        if self._guarded:
            return
        async with self._guard_lock:
            if not self._guarded:
                await childnet.install_host_guard(self.nat_table, self.plan, {0, os.geteuid()})
                self._guarded = True

    def _lease_path(self, owner: str) -> Path:
        return self._dir / f"{owner}.json"

    def _write_lease(self, net: ChildNet) -> None:
        self._dir.mkdir(mode=0o700, exist_ok=True)
        tmp = self._lease_path(net.owner).with_suffix(".tmp")
        tmp.write_text(json.dumps(net.to_json()))
        os.replace(tmp, self._lease_path(net.owner))
        self._leases[net.owner] = net

    def _drop_lease(self, owner: str) -> None:
        net = self._leases.pop(owner, None)
        with contextlib.suppress(FileNotFoundError):
            self._lease_path(owner).unlink()
        self.names.forget_ca(owner)
        if net is not None:
            self._unclaim_index(net.index)

    @staticmethod
    def template_owner() -> str:
        return f"tpl-{secrets.token_hex(4)}"

    async def acquire(self, owner: str, req: NetRequest, netns: str | None = None) -> ChildNet:
        """Make ``owner``'s network: in ``netns`` (a ``forkd-child-<i>``) or its own namespace."""
        name = netns or f"{NETNS_PREFIX}{owner}"
        owns = not netns_mod.netns_exists(name)
        owns_tap = req.tap is not None and owns
        if req.tap is not None and not owns:
            # Provisioned (scripts/netns-setup.sh): use its tap if it has one; never touch a link
            # that is not ours.
            links = await asyncio.to_thread(childnet.netns_links, name)
            if UPLINK in links:
                raise VMError(f"network namespace {name} already has an interface {UPLINK}, which is "
                              f"not forkd's: delete it (ip -n {name} link del {UPLINK}) or the namespace")
            owns_tap = req.tap not in links
        if req.tap is not None:
            await self._ensure_guard()
        for attempt in range(VETH_RACE_RETRIES + 1):
            index = self._claim_index() if req.tap is not None else None
            try:
                net = ChildNet(owner=owner, netns=name, owns_netns=owns, tap=req.tap, owns_tap=owns_tap,
                               index=index, ip=str(self.plan.address(index)) if index is not None else None,
                               gateway=str(self.plan.gateway) if index is not None else None,
                               egress=req.egress, dns=req.dns, nat=req.nat, nat_table=self.nat_table)
                self._write_lease(net)  # before anything exists: a crash from here on is reaped
            finally:
                if index is not None:
                    self._indices.discard(index)  # from now on the lease holds it
                    self._unclaim_index(index)  # unless the lease was not written
            try:
                await childnet.create(net, list(req.blocked))
            except VMError:
                self._drop_lease(owner)  # create removed what it made (our veth included)
                # Another daemon on this host took the same free index between our look at
                # /sys/class/net and our `ip link add`: its veth is there now. Take another.
                if index is not None and attempt < VETH_RACE_RETRIES and \
                        index in await asyncio.to_thread(childnet.veths_in_use):
                    log.info("%s was made by someone else meanwhile (another daemon on this host); "
                             "%s takes another address", AddressPlan.veth(index), owner)
                    continue
                raise
            except BaseException:
                self._drop_lease(owner)
                raise
            await self._attach_names(net)
            return net
        raise AssertionError("unreachable")

    async def _attach_names(self, net: ChildNet, *, keep_lease: bool = False) -> None:
        """``net``'s resolver, if its policy has names; on a failure its network goes (its lease
        too, unless ``keep_lease``: a hibernated sandbox's wake keeps its address), and why."""
        try:
            await self.names.attach(net)
        except BaseException as exc:
            await (self.park(net) if keep_lease else self.release(net))
            if isinstance(exc, OSError):
                raise VMError(f"starting the resolver of {net.owner} in {net.netns}: {exc}") from exc
            raise

    async def release(self, net: ChildNet) -> None:
        """Remove ``net`` from the host (its QEMU is gone), then its lease."""
        await self.names.detach(net.owner)
        errors = await childnet.remove(net)
        for err in errors:
            log.warning("removing the network of %s: %s", net.owner, err)
        self._drop_lease(net.owner)

    async def park(self, net: ChildNet) -> None:
        """A hibernated sandbox's network leaves the host, but its lease stays: its address (the
        lease's index) is nobody else's, and ``unpark`` makes the same network again."""
        await self.names.detach(net.owner)
        for err in await childnet.remove(net):
            log.warning("removing the network of hibernated %s: %s", net.owner, err)

    async def unpark(self, net: ChildNet) -> ChildNet:
        """Make a hibernated sandbox's network again as its lease says: same namespace, address,
        egress rules; the network made. What a daemon that died mid-hibernation left of it goes
        first. If its address index is another's now (another daemon took it while no daemon of
        ours held its claim), it gets another one: lease and row say so before anything is made."""
        if netns_mod.netns_exists(net.netns):
            await self.park(net)
        req = await self.prepare(tap=net.tap, dns=net.dns, egress=net.egress, per_child_netns=True,
                                 what=f"sandbox {net.owner}")
        blocked = list(req.blocked) if req is not None else []
        if net.tap is not None:
            await self._ensure_guard()
        for attempt in range(VETH_RACE_RETRIES + 1):
            if net.index is not None and not self._holds_index(net.index):
                net = self._reindex(net)
            try:
                await childnet.create(net, blocked)
            except VMError:
                # Someone without a claim (an older forkd) made the device between our look and ours.
                if net.index is not None and attempt < VETH_RACE_RETRIES and \
                        net.index in await asyncio.to_thread(childnet.veths_in_use):
                    continue
                raise
            self._leases[net.owner] = net
            await self._attach_names(net, keep_lease=True)
            return net
        raise AssertionError("unreachable")

    def _holds_index(self, index: int) -> bool:
        """Whether this daemon holds ``index`` host-wide and nobody's device has it."""
        if not self._host_claims.try_claim(AddressPlan.veth(index)):
            return False
        return index not in childnet.veths_in_use()

    def _reindex(self, net: ChildNet) -> ChildNet:
        """``net`` at a new address index (no await: atomic); its lease and row rewritten."""
        assert net.index is not None
        old = net.index
        index = self._claim_index()
        try:
            new = dataclasses.replace(net, index=index, ip=str(self.plan.address(index)),
                                      gateway=str(self.plan.gateway))
            self._write_lease(new)
            self._sandboxes.set_network(net.owner, new)
        finally:
            self._indices.discard(index)
            self._unclaim_index(index)  # unless the lease was written
        self._unclaim_index(old)
        log.warning("the address of hibernated %s (%s, index %d) was taken by another daemon on this "
                    "host while no daemon of ours held it; it wakes at %s", net.owner, net.ip, old, new.ip)
        return new

    async def update(self, record: SandboxRecord, egress: EgressPolicy) -> ChildNet:
        """Replace the egress policy of sandbox ``record`` (the caller holds its lock): its rules
        now (one transaction), or, hibernated, at its wake; then its lease and row. 400 without a
        NIC or for a policy this host cannot serve (forwarding off); on any failure the old rules,
        lease and row stay."""
        what = f"sandbox {record.id}"
        net = self._leases.get(record.id) or record.network
        if net is None or net.tap is None:
            raise InvalidRequest(f"{what} has no network device, so it has no network to update; "
                                 "spawn it from a snapshot created with \"nic\": true")
        req = await self.prepare(tap=net.tap, dns=net.dns, egress=egress, per_child_netns=True, what=what)
        assert req is not None
        new = dataclasses.replace(net, egress=egress, nat=req.nat)
        if record.hibernation is None:
            # No answer of the old policy may land in the new policy's sets: its resolver stops
            # (its questions in flight abandoned) while the rules change, and starts on the new.
            await self.names.detach(record.id)
            try:
                await childnet.update(net, new, list(req.blocked))
            except BaseException:
                await self._reattach(net)
                raise
        try:
            self._write_lease(new)
            self._sandboxes.set_network(record.id, new)
            if record.hibernation is None:
                await self.names.attach(new)
        except BaseException:
            with contextlib.suppress(OSError):
                self._write_lease(net)
            if record.hibernation is None:
                await self.names.detach(record.id)
                await childnet.update(new, net, list(req.blocked))
                await self._reattach(net)
            raise
        log.info("egress of %s is now %s", record.id, json.dumps(egress.info()))
        return new

    async def _reattach(self, net: ChildNet) -> None:
        """Best effort, after a failed update: the resolver of the policy that stays."""
        try:
            await self.names.attach(net)
        except (OSError, VMError) as exc:
            log.warning("restarting the resolver of %s: %s", net.owner, exc)

    async def after_removed(self, record: SandboxRecord) -> None:
        """``SandboxEvents.removed`` hook: a torn-down sandbox's network goes with it."""
        net = self._leases.get(record.id) or record.network
        if net is not None:
            await self.release(net)
        if (i := netns_mod.netns_index(record.netns)) is not None and i not in self._child_netns:
            self._host_claims.release(netns_mod.child_netns(i))

    def launcher(self, net: ChildNet) -> list[str]:
        """argv prefix that runs QEMU in ``net``'s namespace (same pid)."""
        return netns_mod.launcher(net.netns)

    # ---------------------------------------------------------------- restart

    async def reap(self, alive: set[str]) -> None:
        """Start-up: keep the leases of sandboxes still alive (their address indices claimed again,
        where nobody took them meanwhile), remove every other network."""
        for i in sorted(self._child_netns_held()):
            # Our claims died with the previous daemon; a survivor takes its name back.
            if not self._host_claims.try_claim(netns_mod.child_netns(i)):
                log.warning("%s, where a sandbox of ours lives, is claimed by another daemon on this "
                            "host meanwhile", netns_mod.child_netns(i))
        if not self._dir.is_dir():
            return
        for path in sorted(self._dir.iterdir()):
            if path.suffix == ".tmp":  # a lease never finished: nothing was made for it yet
                path.unlink(missing_ok=True)
                continue
            try:
                net = ChildNet.from_json(json.loads(path.read_text()))
            except (OSError, ValueError, KeyError, InvalidRequest) as exc:
                log.warning("unreadable network lease %s (%s); removing it", path.name, exc)
                path.unlink(missing_ok=True)
                continue
            self._leases[net.owner] = net
            if net.owner not in alive:
                log.info("removing the network of %s (%s), left by an earlier daemon", net.owner, net.netns)
                await self.release(net)
            elif net.index is not None and not self._host_claims.try_claim(AddressPlan.veth(net.index)):
                log.warning("the address index %d of %s is claimed by another daemon on this host "
                            "meanwhile", net.index, net.owner)
            elif net.tap is not None and netns_mod.netns_exists(net.netns):
                try:
                    await self._ensure_guard()  # a re-adopted running sandbox: its guard again
                except (VMError, OSError) as exc:  # the next spawn tries again; the start goes on
                    log.warning("the host's guard of the sandbox addresses: %s", exc)
                # Its resolver died with the previous daemon: a re-adopted sandbox gets it again.
                await self._reattach(net)

    def owners(self) -> list[str]:
        """Who holds a network now (the tests check that teardown leaves none)."""
        return sorted(self._leases)

    async def close(self) -> None:
        """The daemon stops: drop its host table (masquerade, guard) if no sandbox of it uses it."""
        await self.names.close()
        self._host_claims.close()
        try:
            await childnet.remove_host_nat_if_unused(self.nat_table)
        except (VMError, OSError) as exc:
            log.warning("could not remove the host's masquerade table: %s", exc)
