"""Sandbox isolation with real VMs: memory cgroups, per-child netns, snapshots with a NIC.

Needs root (cgroups, network namespaces, tap devices). Every namespace, tap and
cgroup made here is removed again, also when a test fails. Two template boots at
most: the session's ``py`` snapshot and ``py-tap`` (a NIC on a tap of that name,
which the daemon makes inside each sandbox's namespace: no host set-up). The
network itself (addresses, egress) is tests/integration/test_network.py's.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from forkd.config import DataDir
from forkd.controller.options import SpawnOptions
from forkd.controller.runtime import Runtime, SnapshotSpec
from forkd.errors import GuestError, InvalidRequest
from forkd.host import cgroups
from forkd.host.accel import Accel, VMConfig
from forkd.host.egress import EgressPolicy
from forkd.store.layout import SnapshotDir
from forkd.store.registry import DiskChain, SandboxRecord

from .conftest import Loop, child_netns_turn, images_dir

pytestmark = [
    pytest.mark.vm,
    pytest.mark.skipif(os.geteuid() != 0, reason="cgroups, netns and taps need root"),
]

SETUP = Path(__file__).resolve().parents[2] / "scripts" / "netns-setup.sh"
TAP = "forkd-tap-t"
N_NETNS = 2
CGROUPS: list[Path] = []  # every sandbox cgroup made here; none may survive the module


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=check)


def netns_inode(path: str) -> int:
    return os.stat(path).st_ino


def kill_all(loop: Loop, runtime: Runtime, sbs) -> None:
    loop.gather(*(runtime.kill(sb.id) for sb in sbs if sb.id in runtime.sandboxes))


def forkd_netns() -> list[str]:
    return sorted(p.name for p in Path("/run/netns").glob("forkd-child-*"))


@pytest.fixture(scope="module", autouse=True)
def _child_netns_turn() -> Iterator[None]:
    """The module provisions, makes and counts forkd-child-<i> throughout: it holds the turn."""
    with child_netns_turn():
        yield


@pytest.fixture(scope="module")
def netns(loop: Loop, runtime: Runtime) -> Iterator[list[str]]:
    """forkd-child-0..1, each with lo up and a tap named TAP inside."""
    if forkd_netns():
        pytest.skip(f"forkd-child-* namespaces already exist on this host: {forkd_netns()}")
    try:
        sh(str(SETUP), str(N_NETNS), "--tap", TAP)
        sh(str(SETUP), str(N_NETNS), "--tap", TAP)  # idempotent
        yield [f"forkd-child-{i}" for i in range(N_NETNS)]
    finally:
        # Kill what still runs in them before they go; N+1 covers the one a test adds.
        for sb in runtime.list_sandboxes():
            if sb.netns:
                with contextlib.suppress(Exception):
                    loop.run(runtime.kill(sb.id))
        sh(str(SETUP), str(N_NETNS + 1), "--teardown")
    assert forkd_netns() == []


@pytest.fixture(scope="module")
def tap_snapshot(loop: Loop, runtime: Runtime) -> Iterator[str]:
    # No host tap exists: the template boots in a namespace the daemon makes with one.
    assert not Path(f"/sys/class/net/{TAP}").exists()
    loop.run(runtime.create_snapshot(SnapshotSpec(tag="py-tap", tap=TAP, boot_wait_secs=180)))
    try:
        yield "py-tap"
    finally:
        loop.run(runtime.delete_snapshot("py-tap", force=True))


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("bad", [0, 32, 63, (1 << 20) + 1])
def test_memory_limit_out_of_range_is_400(loop: Loop, runtime: Runtime, bad: int) -> None:
    with pytest.raises(InvalidRequest, match="memory_limit_mib must be between 64"):
        loop.run(runtime.spawn("no-such-tag", 1, SpawnOptions(memory_limit_mib=bad)))


def test_bad_tap_name_is_400(loop: Loop, runtime: Runtime) -> None:
    with pytest.raises(InvalidRequest, match="not a valid interface name"):
        loop.run(runtime.create_snapshot(SnapshotSpec(tag="bad-tap", tap="tap0,script=/bin/x")))


def test_egress_without_a_nic_is_400_before_booting(loop: Loop, runtime: Runtime, snapshot: str) -> None:
    with pytest.raises(InvalidRequest, match="need a network device"):
        loop.run(runtime.create_snapshot(SnapshotSpec(tag="no-nic", egress=EgressPolicy.from_request(True))))
    assert "no-nic" not in {s.tag for s in runtime.list_snapshots()}
    with pytest.raises(InvalidRequest, match="has no network device"):
        loop.run(runtime.spawn(snapshot, 1,
                               SpawnOptions.from_request({"network": {"allow_out": ["192.0.2.7"]}})))


def test_missing_netns_are_made_and_removed(loop: Loop, runtime: Runtime, snapshot: str) -> None:
    # Runs before the netns fixture provisions any namespace.
    if forkd_netns():
        pytest.skip("forkd-child-* namespaces exist")
    sbs = loop.run(runtime.spawn(snapshot, 2, SpawnOptions(per_child_netns=True)))
    try:
        assert sorted(sb.netns for sb in sbs) == ["forkd-child-0", "forkd-child-1"] == forkd_netns()
        for sb in sbs:
            assert netns_inode(f"/proc/{sb.pid}/ns/net") == netns_inode(f"/run/netns/{sb.netns}")
            assert sb.info().get("ip") is None  # no NIC: a namespace of its own, no network
    finally:
        kill_all(loop, runtime, sbs)
    assert forkd_netns() == []


# ------------------------------------------------------------- memory cgroup


def test_memory_limit_puts_qemu_in_its_own_cgroup(loop: Loop, runtime: Runtime, snapshot: str) -> None:
    if cgroups.detect() == "none":
        pytest.skip("no cgroup memory controller on this host")
    [sb] = loop.run(runtime.spawn(snapshot, 1, SpawnOptions(memory_limit_mib=256)))
    path = Path(sb.cgroup)
    CGROUPS.append(path)
    try:
        assert sb.memory_limit_mib == 256
        assert sb.info()["memory_limit_mib"] == 256
        assert runtime.get_sandbox(sb.id).memory_limit_mib == 256
        assert path.name == sb.id and path.parent.name == "forkd"
        handle = cgroups.handle_for(path)
        assert handle.pids() == [sb.pid]  # QEMU itself, no wrapper left behind
        procs = (path / "cgroup.procs").read_text().split()
        assert str(sb.pid) in procs
        limit_file = path / ("memory.max" if handle.version == "v2" else "memory.limit_in_bytes")
        assert int(limit_file.read_text()) == 256 << 20
        # The kernel agrees that QEMU runs in it, and charges it.
        own = Path(f"/proc/{sb.pid}/cgroup").read_text()
        assert f"/forkd/{sb.id}" in own
        usage = path / ("memory.current" if handle.version == "v2" else "memory.usage_in_bytes")
        assert int(usage.read_text()) > 1 << 20
        assert loop.run(runtime.ping(sb.id))["pong"] is True
    finally:
        loop.run(runtime.kill(sb.id))
    assert not path.exists(), "cgroup left behind after kill"


def test_child_over_its_memory_limit_is_oom_killed(loop: Loop, runtime: Runtime, snapshot: str) -> None:
    if cgroups.detect() == "none":
        pytest.skip("no cgroup memory controller on this host")
    if any(line.strip() for line in Path("/proc/swaps").read_text().splitlines()[1:]):
        pytest.skip("with swap the kernel swaps instead of OOM-killing")
    [limited, free] = [loop.run(runtime.spawn(snapshot, 1, SpawnOptions(memory_limit_mib=m)))[0]
                       for m in (160, 1024)]
    path = Path(limited.cgroup)
    CGROUPS.extend(Path(sb.cgroup) for sb in (limited, free))
    try:
        code = "bytearray(300 << 20)[::4096].count(0)"  # writes 300 MiB of guest pages
        loop.run(runtime.exec(free.id, ["python3", "-c", f"print({code})"], timeout_secs=300))
        with pytest.raises(GuestError):
            loop.run(runtime.exec(limited.id, ["python3", "-c", f"print({code})"], timeout_secs=300))
        rc = loop.run(runtime.sandboxes.vm(limited.id).process.wait_exit(), timeout=10)
        assert rc == -9  # SIGKILL
        # It was the cgroup's OOM killer (v1: memory.oom_control, v2: memory.events).
        events = path / ("memory.events" if (path / "memory.events").exists() else "memory.oom_control")
        counts = dict(line.split() for line in events.read_text().splitlines())
        assert int(counts["oom_kill"]) >= 1, counts
        assert loop.run(runtime.ping(free.id))["pong"] is True
    finally:
        loop.gather(runtime.kill(limited.id), runtime.kill(free.id))
    assert not path.exists()


def test_restart_removes_the_cgroups_of_dead_sandboxes(loop: Loop, tmp_path: Path) -> None:
    if cgroups.detect() == "none":
        pytest.skip("no cgroup memory controller on this host")
    data = DataDir(tmp_path / "data", images_dir())
    rt = loop.run(Runtime.open(data))
    # A registered sandbox whose QEMU died with the daemon, and a run dir no row
    # points at (the daemon died between creating the cgroup and registering it).
    dead, orphan = "sb-dead00-0000", "sb-dead00-0001"
    handles = [cgroups.create(i, 128) for i in (dead, orphan)]
    CGROUPS.extend(h.path for h in handles)
    try:
        for i in (dead, orphan):
            (data.sandboxes / i).mkdir()
        (data.sandboxes / orphan / "cgroup").write_text(f"{handles[1].path}\n")
        rt.registry.sandboxes.insert(SandboxRecord(
            id=dead, snapshot_tag="py", dir=str(data.sandboxes / dead), created_at_unix=0,
            config=VMConfig(512, 1, Accel.tcg()), disk=DiskChain.fresh(data.sandboxes / dead, "py"),
            pid=None, memory_limit_mib=128, cgroup=str(handles[0].path)))
        loop.run(rt.close())
        rt = loop.run(Runtime.open(data))  # re-adopts the living, reaps the dead
        assert rt.list_sandboxes() == []
        assert [h.path.exists() for h in handles] == [False, False]
        assert list(data.sandboxes.iterdir()) == []
    finally:
        loop.run(rt.close())
        for h in handles:
            h.remove(wait=0)


# ------------------------------------------------------------ per-child netns


def test_per_child_netns_places_each_child_in_its_namespace(
    loop: Loop, runtime: Runtime, snapshot: str, netns: list[str]
) -> None:
    host = netns_inode("/proc/self/ns/net")
    sbs = loop.run(runtime.spawn(snapshot, 2, SpawnOptions(per_child_netns=True)))
    try:
        assert sorted(sb.netns for sb in sbs) == netns
        for sb in sbs:
            assert sb.info()["netns"] == sb.netns
            child = netns_inode(f"/proc/{sb.pid}/ns/net")
            assert child != host
            assert child == netns_inode(f"/run/netns/{sb.netns}")
            assert b"qemu-system" in Path(f"/proc/{sb.pid}/cmdline").read_bytes()
        assert len({netns_inode(f"/proc/{sb.pid}/ns/net") for sb in sbs}) == 2
        for ping in loop.gather(*(runtime.ping(sb.id) for sb in sbs)):
            assert ping["pong"] is True

        # All provisioned namespaces taken: the next child gets forkd-child-2, made for it and
        # removed with it (the provisioned ones stay).
        [third] = loop.run(runtime.spawn(snapshot, 1, SpawnOptions(per_child_netns=True)))
        assert third.netns == "forkd-child-2" and Path("/run/netns/forkd-child-2").exists()
        loop.run(runtime.kill(third.id))
        assert not Path("/run/netns/forkd-child-2").exists() and forkd_netns() == netns

        # Indices are allocated across live sandboxes: a freed one is reused first.
        first = next(sb for sb in sbs if sb.netns == "forkd-child-0")
        loop.run(runtime.kill(first.id))
        [again] = loop.run(runtime.spawn(snapshot, 1,
                                         SpawnOptions(per_child_netns=True, memory_limit_mib=512)))
        sbs.append(again)
        CGROUPS.append(Path(again.cgroup))
        assert again.netns == "forkd-child-0"
        assert netns_inode(f"/proc/{again.pid}/ns/net") == netns_inode("/run/netns/forkd-child-0")
        assert cgroups.handle_for(again.cgroup).pids() == [again.pid]
        assert loop.run(runtime.ping(again.id))["pong"] is True
    finally:
        kill_all(loop, runtime, sbs)


# ------------------------------------------------------- snapshot with a NIC


def test_tap_snapshot_records_its_tap(runtime: Runtime, tap_snapshot: str) -> None:
    snap = runtime.get_snapshot(tap_snapshot)
    meta = SnapshotDir(Path(snap.dir)).read_meta()
    assert meta["tap"] == TAP
    assert json.loads((Path(snap.dir) / "snapshot.json").read_text())["tap"] == TAP


def test_tap_snapshot_forks_into_namespaces_with_a_nic(
    loop: Loop, runtime: Runtime, tap_snapshot: str, netns: list[str]
) -> None:
    sbs = loop.run(runtime.spawn(tap_snapshot, 2, SpawnOptions(per_child_netns=True)))
    try:
        assert sorted(sb.netns for sb in sbs) == netns
        for ping in loop.gather(*(runtime.ping(sb.id) for sb in sbs)):
            assert ping["pong"] is True
        for sb in sbs:
            assert netns_inode(f"/proc/{sb.pid}/ns/net") == netns_inode(f"/run/netns/{sb.netns}")
            res = loop.run(runtime.exec(sb.id, ["cat", "/proc/net/dev"]))
            assert res["exit_code"] == 0 and "eth0:" in res["stdout"], res
            # The namespace's tap has carrier: this child's QEMU holds it open.
            link = sh("ip", "-netns", sb.netns, "-oneline", "link", "show", "dev", TAP).stdout
            assert "LOWER_UP" in link and "NO-CARRIER" not in link, link
    finally:
        kill_all(loop, runtime, sbs)


def test_a_provisioned_namespace_without_the_tap_gets_one_for_the_child(
    loop: Loop, runtime: Runtime, tap_snapshot: str, netns: list[str]
) -> None:
    sh("ip", "netns", "add", "forkd-child-2")  # provisioned without a tap; the fixture deletes it
    sbs = loop.run(runtime.spawn(tap_snapshot, 3, SpawnOptions(per_child_netns=True)))
    try:
        third = next(sb for sb in sbs if sb.netns == "forkd-child-2")
        assert third.network is not None and not third.network.owns_netns and third.network.owns_tap
        assert "eth0:" in loop.run(runtime.exec(third.id, ["cat", "/proc/net/dev"]))["stdout"]
    finally:
        kill_all(loop, runtime, sbs)
    # Ours went (the tap forkd added, its rules); the namespace someone provisioned stays.
    assert Path("/run/netns/forkd-child-2").exists()
    assert TAP not in sh("ip", "-n", "forkd-child-2", "-o", "link").stdout
    assert sh("ip", "netns", "exec", "forkd-child-2", "nft", "list", "ruleset").stdout.strip() == ""
    sh("ip", "netns", "del", "forkd-child-2")


def test_tap_snapshot_without_per_child_netns_gives_each_child_a_namespace(
    loop: Loop, runtime: Runtime, tap_snapshot: str
) -> None:
    sbs = loop.run(runtime.spawn(tap_snapshot, 2))  # once refused: a host tap serves one VM
    try:
        for sb in sbs:
            assert sb.netns == f"forkd-{sb.id}"
            assert netns_inode(f"/proc/{sb.pid}/ns/net") == netns_inode(f"/run/netns/{sb.netns}")
            res = loop.run(runtime.exec(sb.id, ["cat", "/proc/net/dev"]))
            assert "eth0:" in res["stdout"]
            link = sh("ip", "-netns", sb.netns, "-oneline", "link", "show", "dev", TAP).stdout
            assert "LOWER_UP" in link, link
        assert not Path(f"/sys/class/net/{TAP}").exists()  # nothing on the host's side but veths
    finally:
        kill_all(loop, runtime, sbs)
    assert not any(Path(f"/run/netns/{sb.netns}").exists() for sb in sbs)


def test_nothing_left_behind(runtime: Runtime) -> None:
    assert [sb for sb in runtime.list_sandboxes() if sb.netns or sb.memory_limit_mib] == []
    assert [p for p in CGROUPS if p.exists()] == []
