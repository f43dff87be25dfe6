"""``forkd doctor``: can this host run forkd, and if not, what exactly to do about it.

One module of about 500 lines on purpose: a flat list of small, independent checks,
each with its own fix text, reads best in one place.

Every check is cheap and side-effect free (nothing is booted, installed or
mounted), never raises, and a failed check always carries a concrete fix.
Checks with ``required=False`` describe optional features (per-child network
namespaces, memory limits, …) or plain information: they never make the
overall result fail.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import importlib
import os
import platform
import shutil
import struct
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forkd.config import DataDir
from forkd.errors import ForkdError
from forkd.host import childnet, kvmflavour, prereqs
from forkd.host.netplan import AddressPlan

MIN_FREE_BYTES = 5 << 30  # a rootfs image, its debootstrap cache and a few snapshots
APT_INSTALL = "apt-get install -y --no-install-recommends"

# userfaultfd(2) has no libc wrapper on older glibc and no os.* binding.
_USERFAULTFD_SYSCALL = {"x86_64": 323, "aarch64": 282}
_UFFD_API = 0xAA
_UFFDIO_API = 0xC018AA3F  # _IOWR(0xAA, 0x3F, struct uffdio_api { u64 api, features, ioctls })
_UFFD_FEATURE_PAGEFAULT_FLAG_WP = 1 << 0  # what QEMU's background-snapshot needs
_UFFD_FEATURE_WP_HUGETLBFS_SHMEM = 1 << 12  # ... on shmem-backed guest RAM (Linux 5.19+)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str | None = None
    required: bool = True


def passed(checks: list[Check]) -> bool:
    """True unless a *required* check failed."""
    return all(c.ok or not c.required for c in checks)


def _when(unix: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(unix))


def _run(argv: list[str], timeout: float = 10.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


# ----------------------------------------------------------------------- tools


def _tool_version(name: str, tool: prereqs.Tool) -> Check:
    fix = f"{APT_INSTALL} {tool.package}"
    path = tool.path()
    if not path:
        return Check(name, False, f"{tool.command} not found ({tool.purpose})", fix)
    try:
        proc = _run([path, "--version"])
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check(name, False, f"{path} --version failed: {exc}", fix)
    first = (proc.stdout or proc.stderr).strip().splitlines()
    if proc.returncode != 0 or not first:
        return Check(name, False, f"{path} --version exited {proc.returncode}", fix)
    return Check(name, True, f"{first[0]} ({path})")


def check_qemu() -> Check:
    return _tool_version("qemu", prereqs.QEMU)


def check_qemu_img() -> Check:
    return _tool_version("qemu-img", prereqs.QEMU_IMG)


def check_image_tools() -> Check:
    missing = [t for t in prereqs.IMAGE_TOOLS if not t.path()]
    if missing:
        names = ", ".join(f"{t.command} ({t.purpose})" for t in missing)
        packages = " ".join(sorted({t.package for t in missing}))
        return Check("image tools", False, f"missing: {names}", f"{APT_INSTALL} {packages}")
    return Check(
        "image tools", True, "found " + ", ".join(t.command for t in prereqs.IMAGE_TOOLS)
    )


def check_static_busybox() -> Check:
    try:
        path = prereqs.static_busybox()
    except ForkdError as exc:  # missing, or a dynamically linked one
        return Check("static busybox", False, str(exc), f"{APT_INSTALL} busybox-static")
    return Check("static busybox", True, f"{path} is statically linked")


def check_root() -> Check:
    if os.geteuid() == 0:
        return Check("root", True, "running as root")
    return Check(
        "root",
        False,
        f"running as uid {os.geteuid()}; building images (debootstrap, chroot), network "
        "namespaces and cgroup limits need root",
        "run forkd as root, e.g. `sudo forkd doctor`",
    )


# ------------------------------------------------------------- acceleration


def check_kvm() -> Check:
    # Informational only: on PVM hosts /dev/kvm opens fine yet a stock guest
    # kernel hangs under it, so the boot probe (next check) decides, unless the
    # host says it is PVM (host/kvmflavour.py), which the probe then believes too.
    if not os.path.exists("/dev/kvm"):
        return Check(
            "/dev/kvm", False, "absent: guests will run under TCG (software emulation, slow)",
            "enable virtualisation in the BIOS/hypervisor, then `modprobe kvm_intel` "
            "(or kvm_amd)", required=False,
        )
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return Check(
            "/dev/kvm", False, f"present but cannot be opened: {exc.strerror}",
            "run as root or add the user to the kvm group: `usermod -aG kvm $USER`",
            required=False,
        )
    os.close(fd)
    if pvm := kvmflavour.pvm_reason():
        return Check("/dev/kvm", False, f"present, but {pvm}: guests run under TCG (the probe skips "
                     "its KVM boot)", "none needed; for KVM speed, run forkd on a host with hardware "
                     "virtualisation (VMX or SVM) rather than inside a PVM guest", required=False)
    return Check(
        "/dev/kvm", True, "present and opens (whether it boots guests is the probe's call)",
        required=False,
    )


def check_accel(data: DataDir, qemu_detail: str | None = None) -> Check:
    fix = "run `forkd doctor --probe`"
    forced = os.environ.get("FORKD_ACCEL", "auto").lower()
    try:
        # Imported lazily: the VMM layer is heavier and optional for the other checks.
        accel = importlib.import_module("forkd.vmm.probe")
        probe = accel.cached_probe(data)
    except Exception as exc:
        return Check(
            "accelerator", False, f"cannot read the boot probe: {type(exc).__name__}: {exc}",
            fix, required=False,
        )
    override = f"; FORKD_ACCEL={forced} overrides it" if forced != "auto" else ""
    if not probe:
        plan = ("boot-probe TCG alone (this /dev/kvm is PVM: no KVM boot to wait for)"
                if os.path.exists("/dev/kvm") and kvmflavour.pvm_reason()
                else "boot-probe KVM, then fall back to TCG")
        return Check(
            "accelerator", False,
            f"never probed: the first sandbox will {plan}" + override,
            fix, required=False,
        )
    name, cpu = probe.get("accel", "?"), probe.get("cpu", "?")
    detail = f"{name} (-cpu {cpu})"
    if isinstance(probed_at := probe.get("probed_at_unix"), (int, float)):
        detail += f", probed {_when(probed_at)}"
    if probe.get("kvm_error"):
        detail += f"; KVM unusable: {probe['kvm_error']}"
    # The probe is keyed by QEMU version: after an upgrade the cached answer is stale.
    key_qemu = (probe.get("key") or {}).get("qemu")
    if key_qemu and qemu_detail and not qemu_detail.startswith(key_qemu):
        return Check("accelerator", False, f"{detail}; stale (probed with {key_qemu})" + override,
                     "run `forkd doctor --probe`", required=False)
    return Check("accelerator", True, detail + override, required=False)


# -------------------------------------------------------------- data / image


def check_image(data: DataDir) -> Check:
    from forkd.image.builder import load_image  # lazy: pulls in the whole builder

    try:
        image = load_image(data)
    except ForkdError as exc:
        return Check("guest image", False, str(exc), "forkd image build")
    detail = f"{image.name} at {image.dir}"
    if kernel := image.meta.get("kernel_version"):
        detail += f", kernel {kernel}"
    if isinstance(built := image.meta.get("built_at_unix"), (int, float)):
        detail += f", built {_when(built)}"
    return Check("guest image", True, detail)


def _existing_ancestor(path: Path) -> Path:
    """The data dir may not exist yet: measure the filesystem it will be created on."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk_space(data: DataDir) -> Check:
    where = _existing_ancestor(data.root)
    try:
        free = shutil.disk_usage(where).free
    except OSError as exc:
        return Check("disk space", False, f"cannot stat {where}: {exc}",
                     f"create {data.root} or set FORKD_DATA_DIR", required=False)
    detail = f"{free / (1 << 30):.1f} GiB free under {data.root}"
    if free < MIN_FREE_BYTES:
        # A warning, not a failure: small tags may well fit.
        return Check(
            "disk space", False, f"{detail} (below {MIN_FREE_BYTES >> 30} GiB)",
            f"free space on {where} or point FORKD_DATA_DIR at a larger filesystem",
            required=False,
        )
    return Check("disk space", True, detail, required=False)


# ------------------------------------------------------------------- memory


def _userfaultfd_features() -> tuple[int | None, str]:
    """Open a userfaultfd, handshake, return (feature bits or None, why not)."""
    nr = _USERFAULTFD_SYSCALL.get(platform.machine())
    if nr is None:
        return None, f"unknown userfaultfd syscall number on {platform.machine()}"
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(nr, os.O_CLOEXEC | os.O_NONBLOCK)
    if fd < 0:
        err = ctypes.get_errno()
        return None, f"userfaultfd(2) failed: {os.strerror(err)}"
    try:
        # features=0 asks for nothing; the kernel answers with everything it supports.
        buf = bytearray(struct.pack("QQQ", _UFFD_API, 0, 0))
        fcntl.ioctl(fd, _UFFDIO_API, buf)
        return struct.unpack("QQQ", buf)[1], ""
    except OSError as exc:
        return None, f"UFFDIO_API handshake failed: {exc.strerror}"
    finally:
        os.close(fd)


def check_userfaultfd() -> Check:
    # QEMU's background-snapshot (the live branch) write-protects guest RAM
    # with userfaultfd; without it only stop-the-world branching works.
    name = "userfaultfd"
    sysctl = Path("/proc/sys/vm/unprivileged_userfaultfd")
    root = os.geteuid() == 0
    if not sysctl.exists() and not root and not os.path.exists("/dev/userfaultfd"):
        return Check(name, False, "not available to this user (no vm.unprivileged_userfaultfd)",
                     "run forkd as root")
    features, why = _userfaultfd_features()
    if features is None:
        fix = "run forkd as root" if not root else "use a kernel built with CONFIG_USERFAULTFD=y"
        if not root and sysctl.exists():
            fix += " or `sysctl -w vm.unprivileged_userfaultfd=1`"
        return Check(name, False, why, fix)
    if not features & _UFFD_FEATURE_PAGEFAULT_FLAG_WP:
        return Check(name, False, "available but without write-protect support",
                     "use Linux >= 5.7 with CONFIG_HAVE_ARCH_USERFAULTFD_WP (x86_64)")
    shmem = bool(features & _UFFD_FEATURE_WP_HUGETLBFS_SHMEM)
    return Check(name, True, "available with write-protect"
                 + (" (shmem too)" if shmem else " (not on shmem: needs Linux >= 5.19)"))


def check_memfd() -> Check:
    try:
        fd = os.memfd_create("forkd-doctor", os.MFD_CLOEXEC)
    except (OSError, AttributeError) as exc:
        return Check("memfd", False, f"memfd_create failed: {exc}",
                     "use Linux >= 3.17 and a Python built with memfd_create")
    try:
        os.ftruncate(fd, 1 << 20)  # shmem must accept a size, as guest RAM will
    except OSError as exc:
        return Check("memfd", False, f"memfd cannot be sized: {exc.strerror}",
                     "check the shmem limits (`sysctl kernel.shmmax`, tmpfs quotas)")
    finally:
        os.close(fd)
    return Check("memfd", True, "memfd_create works (shmem-backed guest RAM)")


def _mounts() -> list[list[str]]:
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        return [line.split() for line in f]
    return []


def check_shm() -> Check:
    fix = "mount -t tmpfs -o mode=1777 tmpfs /dev/shm"
    types = [m[2] for m in _mounts() if len(m) > 2 and m[1] == "/dev/shm"]
    if "tmpfs" not in types:
        found = f"mounted as {types[-1]}" if types else "not mounted"
        return Check("/dev/shm", False, f"/dev/shm is {found}, not tmpfs", fix)
    try:
        free = shutil.disk_usage("/dev/shm").free
    except OSError as exc:
        return Check("/dev/shm", False, f"tmpfs but unusable: {exc}", fix)
    return Check("/dev/shm", True, f"tmpfs, {free / (1 << 30):.1f} GiB free")


# ---------------------------------------------------------------- isolation


def check_cpu_pids_cgroups() -> Check:
    """cpu_limit and pids_limit: which hierarchy serves each (v2, or v1 on hybrid hosts)."""
    from forkd.host import cgroups

    where = {c: cgroups.detect_controller(c) for c in ("cpu", "pids")}
    detail = ", ".join(f"{c}: {v}" for c, v in where.items())
    missing = [c for c, v in where.items() if v == "none"]
    if not missing:
        return Check("cgroup cpu/pids", True, f"{detail} (cpu_limit, pids_limit available)", required=False)
    return Check(
        "cgroup cpu/pids", False, f"{detail}: {', '.join(m + '_limit' for m in missing)} unavailable",
        f"on cgroup v2: `echo {' '.join('+' + m for m in missing)} > /sys/fs/cgroup/cgroup.subtree_control`; "
        f"on v1: mount the hierarchy, e.g. "
        f"`mount -t cgroup -o {missing[0]} cgroup /sys/fs/cgroup/{missing[0]}`",
        required=False,
    )


def check_cgroups() -> Check:
    # Only needed for memory_limit_mib; v2 is preferred, v1 is the fallback.
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    v1 = Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")
    controllers: list[str] = []
    with contextlib.suppress(OSError):
        controllers = v2.read_text().split()
    if "memory" in controllers:
        return Check("cgroups", True, "v2 unified hierarchy with the memory controller "
                     "(memory.max)", required=False)
    if v1.exists():
        extra = " (v2 present without memory: hybrid)" if v2.exists() else ""
        return Check("cgroups", True, f"v1 memory controller (memory.limit_in_bytes){extra}",
                     required=False)
    detail = ("v2 hierarchy without the memory controller" if v2.exists()
              else "no cgroup memory controller mounted")
    return Check(
        "cgroups", False, detail + ": memory_limit_mib is unavailable",
        "boot with `systemd.unified_cgroup_hierarchy=1 cgroup_enable=memory`, or enable it: "
        "`echo +memory > /sys/fs/cgroup/cgroup.subtree_control`",
        required=False,
    )


NETWORK_NEEDS = "snapshots with a NIC (nic, tap) and per_child_netns"


def check_network_tools() -> Check:
    missing = [t for t in childnet.NET_TOOLS if t.path() is None]
    if missing:
        names = ", ".join(f"{t.command} ({t.purpose})" for t in missing)
        return Check("network tools", False, f"missing {names}: {NETWORK_NEEDS} are unavailable",
                     f"{APT_INSTALL} {' '.join(sorted({t.package for t in missing}))}", required=False)
    return Check("network tools", True, ", ".join(str(t.path()) for t in childnet.NET_TOOLS), required=False)


def check_network_privileges() -> Check:
    if childnet.has_caps(childnet.CAP_NET_ADMIN, childnet.CAP_SYS_ADMIN):
        return Check("network privileges", True, "CAP_NET_ADMIN and CAP_SYS_ADMIN", required=False)
    return Check("network privileges", False, f"no CAP_NET_ADMIN/CAP_SYS_ADMIN: {NETWORK_NEEDS} are "
                 "unavailable", "run the daemon as root", required=False)


def check_nftables() -> Check:
    nft = childnet.NFT.path()
    if not nft:
        return Check("nftables", False, "nft not found: sandboxes cannot get NAT or egress rules",
                     f"{APT_INSTALL} nftables", required=False)
    try:
        proc = _run([nft, "list", "tables"], timeout=5)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("nftables", False, f"`nft list tables` failed: {exc}", "run as root", required=False)
    if proc.returncode != 0:
        return Check("nftables", False, f"`nft list tables` failed: {proc.stderr.strip()}",
                     "run as root on a kernel with nf_tables (modprobe nf_tables)", required=False)
    return Check("nftables", True, f"nf_tables works ({nft})", required=False)


def check_ip_forward() -> Check:
    if childnet.forwarding_enabled():
        return Check("ip_forward", True, "net.ipv4.ip_forward=1: sandboxes can reach beyond the host when "
                     "their egress allows it", required=False)
    return Check("ip_forward", False, "net.ipv4.ip_forward=0: sandboxes reach the host when allowed, but "
                 "allow_internet_access (or an allow_out beyond the host) is refused with 400",
                 childnet.FORWARDING_FIX, required=False)


def check_net_cidr() -> Check:
    try:
        plan = AddressPlan.from_env()
    except ForkdError as exc:
        return Check("sandbox network", False, str(exc), "set FORKD_NET_CIDR to an unused IPv4 /16 (or "
                     "another size down to /29)", required=False)
    taken = [str(a) for a in childnet.host_addresses()
             if a in plan.network and a != plan.gateway]
    if taken:
        return Check("sandbox network", False, f"{plan.network} overlaps this host's addresses {taken}",
                     "set FORKD_NET_CIDR to an unused range, e.g. 10.202.0.0/16", required=False)
    return Check("sandbox network", True, f"{plan.network} (host side {plan.gateway}, room for "
                 f"{plan.capacity} sandboxes; FORKD_NET_CIDR changes it)", required=False)


def check_netns() -> Check:
    fix = f"{APT_INSTALL} iproute2"
    ip = prereqs.Tool("ip", "iproute2", "network namespaces").path()
    if not ip:
        return Check("netns", False, f"ip (iproute2) not found: {NETWORK_NEEDS} are unavailable",
                     fix, required=False)
    try:
        proc = _run([ip, "netns", "list"], timeout=5)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("netns", False, f"`ip netns list` failed: {exc}", fix, required=False)
    if proc.returncode != 0:
        return Check("netns", False, f"`ip netns list` failed: {proc.stderr.strip()}",
                     "use a kernel with CONFIG_NET_NS=y and a current iproute2", required=False)
    return Check("netns", True, f"`ip netns` works ({ip})", required=False)


def check_tun() -> Check:
    if os.path.exists("/dev/net/tun"):
        return Check("/dev/net/tun", True, "present (tap devices for guest networking)",
                     required=False)
    return Check("/dev/net/tun", False, f"absent: {NETWORK_NEEDS} are unavailable",
                 "modprobe tun", required=False)


def check_vsock() -> Check:
    # Not needed: the agent channel is virtio-serial, which works everywhere.
    if os.path.exists("/dev/vhost-vsock"):
        return Check("vhost-vsock", True, "present (unused: forkd talks over virtio-serial)",
                     required=False)
    return Check("vhost-vsock", False, "absent (fine: forkd talks over virtio-serial)",
                 "modprobe vhost_vsock (optional)", required=False)


# --------------------------------------------------------------------- report


def _guarded(name: str, fn: Callable[[], Check]) -> Check:
    """A doctor that crashes on an odd host is useless: a bug becomes a failed check."""
    try:
        return fn()
    except Exception as exc:
        return Check(name, False, f"check crashed: {type(exc).__name__}: {exc}",
                     "report this as a forkd bug", required=False)


def probe_accel(data_dir: str | Path | None = None) -> dict[str, Any]:
    """``forkd doctor --probe``: boot-probe the accelerator now (KVM, else TCG) and cache the answer.

    The one doctor step that is not side-effect free: it boots a tiny guest.
    """
    import asyncio

    from forkd.image.builder import load_image
    from forkd.vmm import probe

    data = DataDir.from_env(data_dir)
    result: dict[str, Any] = asyncio.run(probe.probe(data, load_image(data).probe_guest(), force=True))
    return result


def run_checks(data_dir: str | Path | None = None) -> list[Check]:
    """Run every check against the data dir (default: ``$FORKD_DATA_DIR`` etc.)."""
    data = DataDir.from_env(data_dir)
    qemu = _guarded("qemu", check_qemu)
    checks = [
        qemu,
        _guarded("qemu-img", check_qemu_img),
        _guarded("image tools", check_image_tools),
        _guarded("static busybox", check_static_busybox),
        _guarded("root", check_root),
        _guarded("/dev/kvm", check_kvm),
        _guarded("accelerator",
                 lambda: check_accel(data, qemu.detail if qemu.ok else None)),
        _guarded("guest image", lambda: check_image(data)),
        _guarded("disk space", lambda: check_disk_space(data)),
        _guarded("userfaultfd", check_userfaultfd),
        _guarded("memfd", check_memfd),
        _guarded("/dev/shm", check_shm),
        _guarded("cgroups", check_cgroups),
        _guarded("cgroup cpu/pids", check_cpu_pids_cgroups),
        _guarded("network tools", check_network_tools),
        _guarded("network privileges", check_network_privileges),
        _guarded("netns", check_netns),
        _guarded("/dev/net/tun", check_tun),
        _guarded("nftables", check_nftables),
        _guarded("ip_forward", check_ip_forward),
        _guarded("sandbox network", check_net_cidr),
        _guarded("vhost-vsock", check_vsock),
    ]
    return checks


def format_report(checks: list[Check]) -> str:
    """Plain text: one line per check, its fix indented below, then a verdict."""
    width = max((len(c.name) for c in checks), default=0)
    lines = []
    for c in checks:
        mark = "ok" if c.ok else ("FAIL" if c.required else "warn")
        lines.append(f"[{mark:^4}] {c.name:<{width}}  {c.detail}")
        if not c.ok and c.fix:
            lines.append(f"       {'':<{width}}  fix: {c.fix}")
    failed = [c.name for c in checks if c.required and not c.ok]
    warned = sum(1 for c in checks if not c.required and not c.ok)
    if failed:
        lines.append(f"\n{len(failed)} required check(s) failed: {', '.join(failed)}")
    else:
        lines.append("\nall required checks passed"
                     + (f" ({warned} optional warning(s))" if warned else ""))
    return "\n".join(lines)
