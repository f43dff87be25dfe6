"""QEMU command lines for template (booting) and child (restoring) microVMs.

A snapshot can only be restored by a QEMU with the *same* device configuration,
flags included, so both command lines come from one function and differ only
in how RAM is mapped and where the guest comes from (kernel vs. incoming state).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from forkd.guest import protocol
from forkd.host.accel import LEGACY_MACHINE, NO_PIT, Accel, VMConfig

# microvm needs acpi=on for this kernel to find its virtio-mmio devices (it lacks
# VIRTIO_MMIO_CMDLINE_DEVICES); no option ROMs keeps start-up short.
# The machine is part of the device configuration a snapshot pins down, so each
# snapshot records its own (VMConfig.machine); one that recorded none was taken
# with LEGACY_MACHINE, which is still today's.
MACHINE = LEGACY_MACHINE
# The firmware leaves the PIT counting (mode 3), and a guest kernel older than
# 6.9 that does not use it never stops it: QEMU then wakes ~36 times a second to
# toggle a masked interrupt (~5 ms of CPU a second per idle child under TCG).
# Without a PIT the guest calibrates nothing against it: under TCG it is told
# the TSC rate (tsc_early_khz, see kernel_cmdline), so new TCG snapshots have none (NO_PIT).
AGENT_PORT_NAME = protocol.PORT_NAME
RAM_ID = "mem"  # the migration stream names RAM blocks by this id: keep it fixed
# Every VM of a snapshot gets the same MAC: children are clones of the template, and
# each runs in its own network namespace. Locally administered (0x02 bit set).
GUEST_MAC = "52:54:00:66:6b:01"


def new_config(mem_mib: int, vcpus: int, accel: Accel) -> VMConfig:
    """The configuration of a template booted now (its snapshot keeps it)."""
    return VMConfig(mem_mib, vcpus, accel, machine_for(accel))


def machine_for(accel: Accel) -> str:
    """The -machine options of a new template under ``accel``."""
    if accel.name == "tcg" and host_tsc_khz():
        return MACHINE + NO_PIT
    # KVM guests get their clock rates from KVM; the PIT stays until that is measured there.
    return MACHINE


@dataclass(frozen=True)
class VolumeDrive:
    """One attached volume (store/volume_spec.py): a virtio-blk disk after the root disk.

    The list of them, in order, with their ``read_only`` flags and serials, is part of the
    device configuration: a snapshot restores only into a QEMU given the same list."""

    path: Path
    node: str  # the QEMU block node (a branch cuts it, as it cuts the root disk's)
    serial: str  # how the guest finds it (/sys/block/vdX/serial)
    read_only: bool = False

    def argv(self) -> list[str]:
        for value in (self.node, self.serial):
            if not value.replace("-", "").isalnum():
                raise ValueError(f"bad volume node or serial {value!r}")
        if "," in str(self.path):
            raise ValueError(f"a volume's path may not hold a comma: {self.path}")
        ro = ",read-only=on" if self.read_only else ""
        return ["-blockdev", f"node-name={self.node},driver=qcow2,file.driver=file,"
                f"file.filename={self.path},discard=unmap,cache.direct=off{ro}",
                "-device", f"virtio-blk-device,drive={self.node},serial={self.serial}"]


@dataclass
class LaunchSpec:
    """One QEMU invocation."""

    config: VMConfig
    mem_path: Path
    share_ram: bool  # True: RAM *is* the file (template); False: private CoW mapping of it
    disk: Path  # qcow2 overlay, always attached read-write
    qmp_fd: int  # listening unix socket handed to QEMU (see process.py)
    agent_fd: int
    console_log: Path
    kernel: Path | None = None
    initrd: Path | None = None
    append: str = ""
    incoming: bool = False
    tap: str | None = None  # host tap device for a virtio-net NIC (part of the snapshot's config)
    nic_placeholder: bool = False  # same NIC, dummy backend: for a VM that never runs
    extra: list[str] = field(default_factory=list)
    volumes: list[VolumeDrive] = field(default_factory=list)  # after the root disk, in order


def build_argv(qemu: str, spec: LaunchSpec) -> list[str]:
    if spec.incoming and (spec.kernel or spec.initrd):
        # QEMU would load them into guest RAM before the incoming state arrives,
        # dirtying (CoW-copying) exactly the pages a child should share.
        raise ValueError("a restored VM must not be given -kernel/-initrd")
    cfg = spec.config
    mem = (
        f"memory-backend-file,id={RAM_ID},size={cfg.mem_mib}M,mem-path={spec.mem_path},"
        f"share={'on' if spec.share_ram else 'off'}"
    )
    argv = [
        qemu,
        "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
        "-machine", cfg.machine,
        *cfg.accel.args(),
        "-m", f"{cfg.mem_mib}M",
        "-smp", str(cfg.vcpus),
        "-object", mem,
        "-blockdev",
        f"node-name=disk0,driver=qcow2,file.driver=file,file.filename={spec.disk},"
        "discard=unmap,cache.direct=off",
        "-device", "virtio-blk-device,drive=disk0",
        *(word for drive in spec.volumes for word in drive.argv()),
        "-object", "rng-random,id=rng0,filename=/dev/urandom",
        "-device", "virtio-rng-device,rng=rng0",
        "-device", "virtio-serial-device,max_ports=2",
        "-chardev", f"socket,id=agent,fd={spec.agent_fd},server=on,wait=off",
        "-device", f"virtserialport,chardev=agent,name={AGENT_PORT_NAME}",
        "-chardev", f"socket,id=qmp,fd={spec.qmp_fd},server=on,wait=off",
        "-mon", "chardev=qmp,mode=control",
        # Append mode: the daemon caps the log by cutting it (see vmm/console.py).
        "-chardev", f"file,id=console,path={spec.console_log},append=on",
        "-serial", "chardev:console",
    ]
    if spec.tap:
        if "," in spec.tap or "=" in spec.tap:
            raise ValueError(f"bad tap name {spec.tap!r}")
        # A VM that only loads and re-saves state (the branch helper) never runs:
        # it needs the same NIC for the device config, but no real tap behind it.
        # vnet_hdr=off: a saved virtio-net with vnet headers only loads into a
        # backend that has them too, which the placeholder (a hub port) has not.
        backend = ("hubport,id=net0,hubid=0" if spec.nic_placeholder
                   else f"tap,id=net0,ifname={spec.tap},script=no,downscript=no,vnet_hdr=off")
        argv += [
            "-netdev", backend,
            "-device", f"virtio-net-device,netdev=net0,mac={GUEST_MAC}",
        ]
    if spec.kernel:
        argv += ["-kernel", str(spec.kernel)]
    if spec.initrd:
        argv += ["-initrd", str(spec.initrd)]
    if spec.append:
        argv += ["-append", spec.append]
    if spec.incoming:
        argv += ["-incoming", "defer"]
    return argv + spec.extra


def host_tsc_khz() -> int | None:
    """The host's TSC rate; under TCG the guest's TSC ticks at the host's rate."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    return int(float(line.split(":")[1]) * 1000)
    except (OSError, ValueError, IndexError):
        pass
    return None


# What wakes an idle guest, and the words that stop it (measured with the guest's
# timer and workqueue trace events; docs/PERFORMANCE.md has the figures). Every
# wake-up costs the host CPU (TCG runs the guest's timer code; KVM exits), and a
# fan-out multiplies it by the number of idle children.
IDLE_QUIET = (
    "tsc=reliable",  # no clocksource watchdog timer (2 wake-ups/s); the TSC is the clock
    "nowatchdog",  # no soft/hard lockup watchdog hrtimer (every 4 s)
    "psi=0",  # no pressure-stall averaging (every 2 s), and less work in the scheduler
    "cgroup_disable=memory",  # no memcg stats flush (every 2 s); nothing in the guest uses memcg
    "sysctl.vm.compaction_proactiveness=0",  # kcompactd sleeps instead of waking twice a second
    "sysctl.vm.stat_interval=10",  # vmstat folding every 10 s instead of every second
)


def kernel_cmdline(warm_imports: list[str], *, accel: Accel, probe: bool = False,
                   extra: tuple[str, ...] = ()) -> str:
    # panic=-1 + -no-reboot: a guest that panics makes QEMU exit at once, so a
    # broken image fails fast instead of running into the boot timeout.
    words = ["console=ttyS0", "panic=-1", "quiet", "loglevel=3", f"forkd.port={AGENT_PORT_NAME}",
             *IDLE_QUIET]
    if accel.name == "tcg" and (khz := host_tsc_khz()):
        # Under TCG on a loaded host, calibrating the TSC against the PIT fails
        # now and then ("Unable to calibrate against PIT"); the kernel then marks
        # the TSC unstable and the boot hangs (1 boot in 4 here). Tell it the rate.
        words.append(f"tsc_early_khz={khz}")
    # Always said, even when empty: without it the agent warms its default (numpy),
    # and warm_imports=[] must mean none.
    words.append("forkd.warm=" + ",".join(warm_imports))
    if probe:
        words.append("forkd.probe=1")
    return " ".join([*words, *extra])
