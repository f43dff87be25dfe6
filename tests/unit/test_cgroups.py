"""Per-sandbox cgroups (and the netns/tap helpers) against fake cgroup trees.

The real kernel behaviour (a QEMU in the cgroup, the limit file, rmdir) is in
tests/integration/test_isolation.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from forkd.errors import InvalidRequest
from forkd.host import cgroups, netns
from forkd.host.accel import Accel, VMConfig
from forkd.vmm.cmdline import GUEST_MAC, LaunchSpec, build_argv


def fake_v2(root: Path, controllers: str = "cpuset cpu io memory pids") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("\n")
    return root


def fake_v1(root: Path, own: str = "/") -> Path:
    mem = root / "memory"
    mem.mkdir(parents=True)
    (mem / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (mem / own.strip("/")).mkdir(parents=True, exist_ok=True)
    return mem


def self_cgroup(tmp_path: Path, memory_path: str) -> Path:
    p = tmp_path / "self-cgroup"
    p.write_text(f"9:name=systemd:/\n4:memory:{memory_path}\n3:cpuset:/\n0::/\n")
    return p


# ------------------------------------------------------------------ detection


def test_detect_pure_v2(tmp_path: Path) -> None:
    root = fake_v2(tmp_path / "cg")
    assert cgroups.detect(root) == "v2"
    h = cgroups.find_hierarchy(root)
    assert h is not None and h.base == root / "forkd" and h.limit_file == "memory.max"


def test_detect_hybrid_prefers_v1_memory_when_unified_has_no_memory(tmp_path: Path) -> None:
    # Our CI hosts: /sys/fs/cgroup is a tmpfs, unified/ has only hugetlb, v1 owns memory.
    root = tmp_path / "cg"
    fake_v2(root / "unified", controllers="hugetlb")
    mem = fake_v1(root)
    proc = self_cgroup(tmp_path, "/")
    assert cgroups.detect(root, proc) == "v1"
    h = cgroups.find_hierarchy(root, proc)
    assert h is not None and h.base == mem / "forkd" and h.limit_file == "memory.limit_in_bytes"


def test_detect_hybrid_with_memory_on_unified_is_v2(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    fake_v2(root / "unified")
    fake_v1(root)
    h = cgroups.find_hierarchy(root)
    assert h is not None and h.version == "v2" and h.base == root / "unified" / "forkd"


def test_v1_nests_under_the_daemons_own_cgroup(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    mem = fake_v1(root, own="/session/abc")
    h = cgroups.find_hierarchy(root, self_cgroup(tmp_path, "/session/abc"))
    assert h is not None and h.base == mem / "session" / "abc" / "forkd"


def test_v1_own_cgroup_not_visible_falls_back_to_the_mount(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    mem = fake_v1(root)
    h = cgroups.find_hierarchy(root, self_cgroup(tmp_path, "/not/here"))
    assert h is not None and h.base == mem / "forkd"
    missing = tmp_path / "no-such-file"
    h = cgroups.find_hierarchy(root, missing)
    assert h is not None and h.base == mem / "forkd"


def test_detect_none(tmp_path: Path) -> None:
    assert cgroups.detect(tmp_path) == "none"
    fake_v2(tmp_path / "cg", controllers="hugetlb")
    assert cgroups.detect(tmp_path / "cg") == "none"


def test_detect_real_host_answers() -> None:
    assert cgroups.detect() in ("v2", "v1", "none")


# ----------------------------------------------------------------- validation


@pytest.mark.parametrize("bad", [0, 1, 63, (1 << 20) + 1, -5, True, 256.0, "256", None])
def test_limit_validation_rejects(bad: object) -> None:
    with pytest.raises(InvalidRequest, match="memory_limit_mib"):
        cgroups.validate_limit(bad)


@pytest.mark.parametrize("good", [64, 256, 1 << 20])
def test_limit_validation_accepts(good: int) -> None:
    assert cgroups.validate_limit(good) == good


def test_create_validates_before_touching_anything(tmp_path: Path) -> None:
    root = fake_v2(tmp_path / "cg")
    with pytest.raises(InvalidRequest, match="between 64 and"):
        cgroups.create("sb-1", 32, root=root)
    assert not (root / "forkd").exists()
    for bad in ("", "../x", "a/b", ".hidden"):
        with pytest.raises(InvalidRequest):
            cgroups.create(bad, 128, root=root)


# ------------------------------------------------------------------- creation


def test_create_v2(tmp_path: Path) -> None:
    root = fake_v2(tmp_path / "cg")
    h = cgroups.create("sb-abc123-0000", 256, root=root)
    assert h.path == root / "forkd" / "sb-abc123-0000" and h.version == "v2"
    assert (h.path / "memory.max").read_text() == str(256 << 20)
    assert h.limit_mib() == 256
    # +memory enabled for forkd/ (in the root) and for the sandbox leaves (in forkd/).
    assert (root / "cgroup.subtree_control").read_text() == "+memory"
    assert (root / "forkd" / "cgroup.subtree_control").read_text() == "+memory"
    h.add_pid(4242)
    assert h.procs_file.read_text() == "4242"
    assert h.pids() == [4242]


def test_create_v2_leaves_enabled_controllers_alone(tmp_path: Path) -> None:
    root = fake_v2(tmp_path / "cg")
    (root / "cgroup.subtree_control").write_text("cpu memory pids\n")
    cgroups.create("sb-1", 128, root=root)
    assert (root / "cgroup.subtree_control").read_text() == "cpu memory pids\n"


def test_create_v1(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    mem = fake_v1(root, own="/svc")
    h = cgroups.create("sb-1", 512, root=root, proc_self_cgroup=self_cgroup(tmp_path, "/svc"))
    assert h.path == mem / "svc" / "forkd" / "sb-1" and h.version == "v1"
    assert (h.path / "memory.limit_in_bytes").read_text() == str(512 << 20)
    assert h.limit_mib() == 512
    assert cgroups.handle_for(h.path) == h


def test_create_without_a_memory_hierarchy_says_what_is_needed(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest) as err:
        cgroups.create("sb-1", 128, root=tmp_path)
    msg = str(err.value)
    assert "cgroup v2" in msg and "memory" in msg and "/sys/fs/cgroup/memory" in msg
    assert err.value.status == 400


def test_create_twice_is_refused(tmp_path: Path) -> None:
    root = fake_v2(tmp_path / "cg")
    cgroups.create("sb-1", 128, root=root)
    with pytest.raises(InvalidRequest, match="already exists"):
        cgroups.create("sb-1", 128, root=root)


def test_unwritable_hierarchy_gives_a_clear_error(tmp_path: Path) -> None:
    root = fake_v2(tmp_path / "cg")
    (root / "forkd").write_text("not a directory")  # mkdir of a leaf under it fails
    with pytest.raises(InvalidRequest, match="cannot set up the memory cgroup"):
        cgroups.create("sb-1", 128, root=root)


def test_remove(tmp_path: Path) -> None:
    root = fake_v2(tmp_path / "cg")
    h = cgroups.create("sb-1", 128, root=root)
    # A real cgroup directory can be rmdir'ed with its control files; a fake one cannot.
    assert h.remove(wait=0) is False
    for f in h.path.iterdir():
        f.unlink()
    assert h.remove() is True
    assert not h.path.exists()
    assert h.remove() is True  # already gone is fine


def test_parent_removed_only_if_made_here_and_empty(tmp_path: Path) -> None:
    made = fake_v2(tmp_path / "made")
    h = cgroups.create("sb-1", 128, root=made)
    for f in h.path.iterdir():
        f.unlink()
    assert cgroups.remove_parent_if_empty(made) is False  # a sandbox cgroup is still in it
    assert h.remove()
    (made / "forkd" / "cgroup.subtree_control").unlink()  # a real cgroup dir rmdirs with its files
    assert cgroups.remove_parent_if_empty(made) is True
    assert not (made / "forkd").exists()

    operators = fake_v2(tmp_path / "operators")
    (operators / "forkd").mkdir()  # pre-created (e.g. delegated, or with an overall limit)
    h = cgroups.create("sb-1", 128, root=operators)
    for f in h.path.iterdir():
        f.unlink()
    assert h.remove()
    (operators / "forkd" / "cgroup.subtree_control").unlink()
    assert cgroups.remove_parent_if_empty(operators) is False
    assert (operators / "forkd").is_dir()


def test_launcher_joins_then_execs_in_the_same_process(tmp_path: Path) -> None:
    root = fake_v2(tmp_path / "cg")
    h = cgroups.create("sb-1", 128, root=root)
    proc = subprocess.run([*h.launcher(), "/bin/sh", "-c", "echo $$"],
                          capture_output=True, text=True, check=True)
    # The exec'd command kept the pid that was written to cgroup.procs.
    assert h.pids() == [int(proc.stdout)]


def test_launcher_fails_if_the_cgroup_is_gone(tmp_path: Path) -> None:
    h = cgroups.CgroupHandle(tmp_path / "gone", "v2")
    proc = subprocess.run([*h.launcher(), "/bin/true"], capture_output=True, text=True)
    assert proc.returncode != 0


# ------------------------------------------------------- netns and tap helpers


def test_netns_names_and_indices() -> None:
    assert netns.child_netns(3) == "forkd-child-3"
    assert netns.netns_index("forkd-child-12") == 12
    for other in (None, "", "forkd-child-", "forkd-child-x", "other-1"):
        assert netns.netns_index(other) is None


def test_lowest_free_fills_holes_first() -> None:
    assert netns.lowest_free(set(), 3) == [0, 1, 2]
    assert netns.lowest_free({0, 2, 3}, 3) == [1, 4, 5]


def test_netns_launcher_and_existence(tmp_path: Path) -> None:
    (tmp_path / "forkd-child-0").touch()
    assert netns.netns_exists("forkd-child-0", tmp_path)
    assert not netns.netns_exists("forkd-child-1", tmp_path)
    argv = netns.launcher("forkd-child-0", tmp_path)
    assert argv[0].endswith("nsenter") and argv[1:] == [f"--net={tmp_path}/forkd-child-0", "--"]


@pytest.mark.parametrize("name", ["forkd-tap0", "t", "tap_1.x", "a" * 15])
def test_tap_names_accepted(name: str) -> None:
    assert netns.check_tap_name(name) == name


@pytest.mark.parametrize("name", ["", "a" * 16, "tap0,script=/x", "tap 0", "-tap", "a/b", 5, None])
def test_tap_names_rejected(name: object) -> None:
    with pytest.raises(InvalidRequest, match="not a valid interface name"):
        netns.check_tap_name(name)


@pytest.mark.parametrize("name", ["lo", "uplink0"])
def test_tap_names_taken_inside_every_namespace_are_rejected(name: str) -> None:
    with pytest.raises(InvalidRequest, match="taken inside every sandbox's namespace"):
        netns.check_tap_name(name)


def _spec(**kw) -> LaunchSpec:
    kw.setdefault("share_ram", False)
    return LaunchSpec(config=VMConfig(512, 1, Accel.tcg()), mem_path=Path("/s/mem"),
                      disk=Path("/r/disk.qcow2"), qmp_fd=3, agent_fd=4,
                      console_log=Path("/r/console.log"), **kw)


def test_build_argv_nic_only_with_tap() -> None:
    plain = build_argv("qemu", _spec())
    assert "-netdev" not in plain
    with_tap = build_argv("qemu", _spec(tap="forkd-tap0"))
    assert with_tap[: len(plain)] == plain
    assert with_tap[len(plain):] == [
        "-netdev", "tap,id=net0,ifname=forkd-tap0,script=no,downscript=no,vnet_hdr=off",
        "-device", f"virtio-net-device,netdev=net0,mac={GUEST_MAC}",
    ]
    # Template (booting) and child (restoring) lines carry the same NIC.
    template = build_argv("qemu", _spec(tap="forkd-tap0", kernel=Path("/k"), share_ram=True))
    assert template.count("-netdev") == 1 and "ifname=forkd-tap0" in " ".join(template)
    with pytest.raises(ValueError):
        build_argv("qemu", _spec(tap="x,script=/evil"))


# ------------------------------------------------------------- cpu and pids limits


def fake_v1_all(root: Path) -> dict[str, Path]:
    """A hybrid host: v1 memory, cpu and pids hierarchies; the unified tree has none."""
    fake_v2(root / "unified", controllers="hugetlb")
    mounts = {"memory": fake_v1(root)}
    for c in ("cpu", "pids"):
        mounts[c] = root / c
        mounts[c].mkdir()
        (mounts[c] / "cgroup.procs").write_text("")
    return mounts


def test_create_v2_cpu_and_pids_in_one_directory(tmp_path: Path) -> None:
    root = fake_v2(tmp_path / "cg")
    h = cgroups.create("sb-1", None, cpu=0.5, pids=64, root=root)
    assert h.path == root / "forkd" / "sb-1" and h.extra == ()
    assert (h.path / "cpu.max").read_text() == "50000 100000"
    assert (h.path / "pids.max").read_text() == "64"
    assert not (h.path / "memory.max").exists()  # no memory limit asked for
    assert (root / "cgroup.subtree_control").read_text() == "+cpu +pids"
    assert h.cpu_limit() == 0.5 and h.pids_limit() == 64


def test_create_v1_one_directory_per_hierarchy(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    mounts = fake_v1_all(root)
    proc = self_cgroup(tmp_path, "/")
    h = cgroups.create("sb-1", 256, cpu=1.5, pids=100, root=root, proc_self_cgroup=proc)
    assert h.path == mounts["memory"] / "forkd" / "sb-1" and h.version == "v1"
    assert h.extra == (mounts["cpu"] / "forkd" / "sb-1", mounts["pids"] / "forkd" / "sb-1")
    assert (h.extra[0] / "cpu.cfs_quota_us").read_text() == "150000"
    assert (h.extra[0] / "cpu.cfs_period_us").read_text() == "100000"
    assert (h.extra[1] / "pids.max").read_text() == "100"
    assert h.limit_mib() == 256 and h.cpu_limit() == 1.5 and h.pids_limit() == 100
    # Recorded paths give back the same handle; remove takes every directory.
    assert cgroups.handle_for(h.path, h.extra) == h
    for d in h.paths:
        for f in d.iterdir():
            f.unlink()  # a fake tree: files would stop rmdir (the kernel's do not)
    assert h.remove(wait=0) and not any(d.exists() for d in h.paths)


def test_create_v1_missing_controller_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    fake_v1(root)  # memory only: no cpu hierarchy
    with pytest.raises(InvalidRequest, match="cpu limit needs"):
        cgroups.create("sb-1", 256, cpu=0.5, root=root, proc_self_cgroup=self_cgroup(tmp_path, "/"))
    assert not (root / "memory" / "forkd" / "sb-1").exists()


@pytest.mark.parametrize(("cpu", "pids", "match"), [(0, None, "cpu_limit"), (65, None, "cpu_limit"),
                                                   (None, 8, "pids_limit"), (None, 64.0, "pids_limit"),
                                                   (None, None, "at least one")])
def test_cpu_and_pids_bounds(tmp_path: Path, cpu: float | None, pids: int | None, match: str) -> None:
    root = fake_v2(tmp_path / "cg")
    with pytest.raises(InvalidRequest, match=match):
        cgroups.create("sb-1", None, cpu=cpu, pids=pids, root=root)
    assert not (root / "forkd" / "sb-1").exists()


def test_launcher_joins_every_hierarchy(tmp_path: Path) -> None:
    dirs = [tmp_path / c for c in ("memory", "cpu", "pids")]
    for d in dirs:
        d.mkdir()
    h = cgroups.CgroupHandle(dirs[0], "v1", tuple(dirs[1:]))
    proc = subprocess.run([*h.launcher(), "/bin/sh", "-c", "echo $$"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    pid = proc.stdout.strip()
    assert [(d / "cgroup.procs").read_text().strip() for d in dirs] == [pid] * 3
    dirs[2].joinpath("cgroup.procs").unlink()
    dirs[2].rmdir()
    assert subprocess.run([*h.launcher(), "/bin/true"], capture_output=True).returncode != 0
