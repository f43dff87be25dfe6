"""Making and removing one sandbox's network on this host: runs what ``host/netplan.py`` plans.

A networked sandbox costs four short processes (``ip netns add``, an ``ip -batch``
in the host's namespace, one in the sandbox's, ``nft -f`` inside it through
``nsenter``), plus one ``nft`` for the host's masquerade when its policy reaches
beyond the host; ``bench/network_setup.py`` measures them. Removal is one or two.

Also the host facts a spawn needs before any VM starts: the tools, the
privileges, IP forwarding, the host's own addresses and its DNS resolvers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

from forkd.errors import InvalidRequest, VMError
from forkd.host import hostlock, netplan
from forkd.host import netns as netns_mod
from forkd.host.egress import parse_addresses
from forkd.host.netplan import ChildNet
from forkd.host.prereqs import Tool

IP = Tool("ip", "iproute2", "creates network namespaces, veth pairs and tap devices")
NFT = Tool("nft", "nftables", "installs each sandbox's NAT and egress rules")
NSENTER = Tool("nsenter", "util-linux", "runs QEMU and nft inside a sandbox's network namespace")
NET_TOOLS = (IP, NFT, NSENTER)

TUN = Path("/dev/net/tun")
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
RESOLV_CONFS = (Path("/run/systemd/resolve/resolv.conf"), Path("/etc/resolv.conf"))
# The host-wide lock around adding to, and dropping, the host's masquerade table.
HOST_NAT_LOCK = "host-nat"
MAX_DNS = 3  # the guest's libc reads at most three nameserver lines
# <linux/capability.h>: network configuration, and mounting the namespace at /run/netns.
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21
# An ``ip``/``nft`` run that takes longer than this is wedged (they take milliseconds).
COMMAND_TIMEOUT_SECS = 30.0


def _path(tool: Tool) -> str:
    return tool.path() or tool.command


def has_caps(*caps: int, status: Path = Path("/proc/self/status")) -> bool:
    """Whether this process has every capability in ``caps`` (effective set)."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                eff = int(line.split()[1], 16)
                return all(eff >> c & 1 for c in caps)
    except (OSError, ValueError):
        pass
    return os.geteuid() == 0


def missing_prerequisites() -> list[str]:
    """What a networked sandbox needs and this host lacks, each with its fix ([] when all is there)."""
    out: list[str] = []
    tools = [t for t in NET_TOOLS if t.path() is None]
    if tools:
        out.append(f"{', '.join(f'{t.command} ({t.purpose})' for t in tools)}: install with "
                   f"apt-get install -y {' '.join(sorted({t.package for t in tools}))}")
    if not TUN.exists():
        out.append(f"{TUN} (tap devices): load the tun module with modprobe tun")
    if not has_caps(CAP_NET_ADMIN, CAP_SYS_ADMIN):
        out.append("CAP_NET_ADMIN and CAP_SYS_ADMIN (network namespaces, veth pairs, nftables): "
                   "run the daemon as root")
    return out


def check_prerequisites(what: str) -> None:
    """400 naming every missing piece, before any VM starts."""
    missing = missing_prerequisites()
    if missing:
        raise InvalidRequest(f"{what} needs host networking that is missing: {'; '.join(missing)} "
                             "(forkd doctor lists every check)")


def forwarding_enabled(path: Path = IP_FORWARD) -> bool:
    try:
        return path.read_text().strip() == "1"
    except OSError:
        return False


FORWARDING_FIX = ("enable it with: sysctl -w net.ipv4.ip_forward=1 (and keep it with a line "
                  "net.ipv4.ip_forward=1 in /etc/sysctl.d/99-forkd.conf)")


def host_addresses() -> list[IPv4Address]:
    """The IPv4 addresses of the host's own interfaces (what "services on the host" listen on)."""
    proc = subprocess.run([_path(IP), "-json", "-4", "addr", "show"], capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_SECS)
    if proc.returncode != 0:
        raise VMError(f"`ip -json -4 addr show` failed: {proc.stderr.strip()}")
    found: list[str] = []
    for link in json.loads(proc.stdout or "[]"):
        found += [a.get("local", "") for a in link.get("addr_info", [])]
    return sorted(set(parse_addresses(found)))


def host_resolvers(paths: tuple[Path, ...] = RESOLV_CONFS) -> tuple[str, ...]:
    """The host's DNS servers a guest can reach (not loopback stubs); public ones if it has none."""
    for path in paths:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        words = [line.split()[1] for line in lines if line.startswith("nameserver") and len(line.split()) > 1]
        usable = [str(a) for a in parse_addresses(words) if not a.is_loopback and not a.is_unspecified]
        if usable:
            return tuple(dict.fromkeys(usable))[:MAX_DNS]
    return netplan.FALLBACK_DNS


def veths_in_use(sys_class_net: Path = Path("/sys/class/net")) -> set[int]:
    """Indices of the host's ``fkn<i>`` devices, whoever made them (another daemon shares the names)."""
    try:
        names = os.listdir(sys_class_net)
    except OSError:
        return set()
    return {i for i in map(netplan.AddressPlan.index_of_veth, names) if i is not None}


async def _run(argv: list[str], stdin: str = "", *, what: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, err = await asyncio.wait_for(proc.communicate(stdin.encode()), COMMAND_TIMEOUT_SECS)
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    if proc.returncode != 0:
        raise VMError(f"{what} failed: {err.decode(errors='replace').strip()[-800:]}")


def _in_netns(netns: str, script: str) -> list[str]:
    """argv that runs ``sh -c script`` in ``netns`` (sysctls under /proc/sys/net are per namespace)."""
    return [*netns_mod.launcher(netns), "/bin/sh", "-c", script]


def netns_links(netns: str) -> set[str]:
    """The interface names inside ``netns``."""
    proc = subprocess.run([_path(IP), "-netns", netns, "-oneline", "link", "show"], capture_output=True,
                          text=True, timeout=COMMAND_TIMEOUT_SECS)
    if proc.returncode != 0:
        raise VMError(f"listing the links of {netns} failed: {proc.stderr.strip()}")
    # "3: uplink0@if19: <BROADCAST,...": the name, without the peer's "@ifN"
    return {line.split(":")[1].strip().split("@")[0] for line in proc.stdout.splitlines() if ":" in line}


async def create(net: ChildNet, blocked: list[IPv4Network]) -> None:
    """Make ``net``; on any failure remove what was made and raise ``VMError``.

    Only what this call made is removed on a failure: a namespace that turns out
    to exist already (another daemon's, made a moment ago) is left alone, and the
    veth pair is deleted by its end inside the namespace, which exists only if
    this call made the pair.
    """
    if net.owns_netns:
        await _run([_path(IP), "netns", "add", net.netns], what=f"creating network namespace {net.netns}")
    nat_added = False
    try:
        if host := netplan.host_batch(net):
            await _run([_path(IP), "-batch", "-"], host, what=f"creating the veth pair of {net.netns}")
        await _run([_path(IP), "-netns", net.netns, "-batch", "-"], netplan.netns_batch(net),
                   what=f"setting up the links of {net.netns}")
        if net.tap is not None:
            sysctls = " && ".join(f"echo {v} > {k}" for k, v in netplan.netns_sysctls(net).items())
            await _run(_in_netns(net.netns, f"{sysctls} && exec {_path(NFT)} -f -"),
                       netplan.netns_ruleset(net, blocked), what=f"the nftables rules of {net.netns}")
        if net.nat and net.ip:
            async with hostlock.host_lock(HOST_NAT_LOCK):  # not while another daemon drops the table
                await _run([_path(NFT), "-f", "-"], netplan.host_nat_add(net.ip, net.nat_table),
                           what="adding the sandbox to the host's masquerade set")
            nat_added = True
    except BaseException:
        # The masquerade element is keyed by address alone: one this call did not add may be
        # another daemon's sandbox's (its veth took the index first), so it is left alone.
        await remove(net if nat_added else dataclasses.replace(net, nat=False))
        raise


async def update(old: ChildNet, new: ChildNet, blocked: list[IPv4Network]) -> None:
    """Replace the egress rules of a running sandbox's network ``old`` by ``new``'s (same namespace,
    links and address): the host's masquerade element first if ``new`` now leaves the host, the
    namespace's table in one transaction, and the element last if it no longer does. On a failure
    the old rules and element stay as they were, and ``VMError`` says why."""
    assert new.tap is not None and new.ip and (old.netns, old.ip) == (new.netns, new.ip)
    nat_added = False
    if new.nat and not old.nat:
        async with hostlock.host_lock(HOST_NAT_LOCK):
            await _run([_path(NFT), "-f", "-"], netplan.host_nat_add(new.ip, new.nat_table),
                       what="adding the sandbox to the host's masquerade set")
        nat_added = True
    try:
        rules = netplan.netns_ruleset_replace(new, blocked)
        await _run(_in_netns(new.netns, f"exec {_path(NFT)} -f -"), rules,
                   what=f"replacing the nftables rules of {new.netns}")
    except BaseException:
        if nat_added:
            await _run([_path(NFT), "-f", "-"], netplan.host_nat_remove(new.ip, new.nat_table),
                       what="leaving the masquerade set")
        raise
    if old.nat and not new.nat:
        await _run([_path(NFT), "-f", "-"], netplan.host_nat_remove(old.ip or new.ip, old.nat_table),
                   what="leaving the masquerade set")


async def allow_resolved(net: ChildNet, script: str) -> None:
    """Run ``script`` (``netplan.name_elements``: answered addresses into the sandbox's sets) in
    ``net``'s namespace, in one transaction."""
    await _run(_in_netns(net.netns, f"exec {_path(NFT)} -f -"), script,
               what=f"allowing resolved addresses in {net.netns}")


async def remove(net: ChildNet) -> list[str]:
    """Remove what ``create`` made (every step, whatever failed before); the errors, for the log."""
    errors: list[str] = []

    async def step(argv: list[str], stdin: str, what: str) -> None:
        try:
            await _run(argv, stdin, what=what)
        except (VMError, OSError) as exc:
            errors.append(str(exc))

    if net.nat and net.ip:
        await step([_path(NFT), "-f", "-"], netplan.host_nat_remove(net.ip, net.nat_table),
                   "leaving the masquerade set")
    if not netns_mod.netns_exists(net.netns):
        return errors
    # Deleting the namespace's end of the veth pair deletes both, at once (the namespace's own
    # clean-up would do it too, but later). ``-force``: what was never made is no error.
    inside = [f"link del dev {netplan.UPLINK}"] if net.tap is not None else []
    if not net.owns_netns and net.tap is not None:
        # A namespace someone else provisioned: take back what we added, leave the rest.
        inside.append(f"link del dev {net.tap}" if net.owns_tap else f"addr flush dev {net.tap}")
        undo = f"{_path(NFT)} delete table inet {netplan.NFT_TABLE} 2>/dev/null; echo 0 > {IP_FORWARD}"
        await step(_in_netns(net.netns, undo), "", f"removing forkd's rules from {net.netns}")
    if inside:
        await step([_path(IP), "-netns", net.netns, "-force", "-batch", "-"],
                   "".join(f"{line}\n" for line in inside), f"removing forkd's links from {net.netns}")
    if net.owns_netns:
        # Its tap, rules and sysctls go with it (once no QEMU holds it any more).
        await step([_path(IP), "netns", "del", net.netns], "", f"deleting {net.netns}")
    return errors


async def install_host_guard(table: str, plan: netplan.AddressPlan, uids: set[int]) -> None:
    """The daemon's host table with its guard (``netplan.host_guard``); idempotent."""
    async with hostlock.host_lock(HOST_NAT_LOCK):  # not while a close looks at the table to drop it
        await _run([_path(NFT), "-f", "-"], netplan.host_guard(table, plan, uids),
                   what="installing the host's guard of the sandbox addresses")


async def remove_host_nat_if_unused(table: str = netplan.NFT_TABLE) -> None:
    """Delete the daemon's host ``table`` (masquerade, guard) once its masquerade set is empty or
    absent: no sandbox of it needs the table."""
    nft = _path(NFT)
    if NFT.path() is None:
        return
    # Between our look at the set and the delete, another Runtime on the same data dir could add
    # its first element (its create holds the same lock), and the delete would take it away.
    async with hostlock.host_lock(HOST_NAT_LOCK):
        await _remove_host_nat_if_empty(nft, table)


async def _remove_host_nat_if_empty(nft: str, table: str = netplan.NFT_TABLE) -> None:
    proc = await asyncio.create_subprocess_exec(
        nft, "-j", "list", "table", "ip", table, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        return  # no such table: nothing to remove
    try:
        sets = [o["set"] for o in json.loads(out)["nftables"]
                if "set" in o and o["set"].get("name") == netplan.HOST_NAT_SET]
    except (ValueError, KeyError, TypeError, AttributeError):
        return
    if not sets or not sets[0].get("elem"):
        await _run([nft, "delete", "table", "ip", table], what="deleting the host's masquerade and guard")
