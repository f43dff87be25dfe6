"""The accelerator a host runs guests with, and why snapshots cannot move between them.

Which one a host really has is decided by a boot probe (``vmm/probe.py``); this
module only names the pair (accelerator, CPU model) that a snapshot records, the
rest of the machine configuration a snapshot pins (``VMConfig``: the registry
stores it, the VMM launches it) and what the probe boots (``ProbeGuest``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forkd.errors import IncompatibleSnapshot

# Bounds of a config read back from anywhere (bounds.MEM_MIB and bounds.VCPUS bound new ones).
MAX_MEM_MIB = 1 << 20
MAX_VCPUS = 64


@dataclass(frozen=True)
class Accel:
    """An accelerator and the CPU model that goes with it; snapshots record both."""

    name: str  # "kvm" | "tcg"
    cpu: str

    @classmethod
    def tcg(cls) -> Accel:
        return cls("tcg", "max")

    @classmethod
    def kvm(cls) -> Accel:
        # PVM-style nested KVM (as on our CI hosts) rejects arch-capabilities.
        return cls("kvm", "host,-arch-capabilities")

    def args(self) -> list[str]:
        accel = "tcg,thread=multi" if self.name == "tcg" else self.name
        return ["-accel", accel, "-cpu", self.cpu]


def check_compatible(snapshot_accel: Accel, host_accel: Accel, tag: str) -> None:
    """A snapshot taken under one accelerator/CPU model cannot be restored under another."""
    if snapshot_accel != host_accel:
        raise IncompatibleSnapshot(
            f"snapshot {tag!r} was taken under {snapshot_accel.name} (cpu {snapshot_accel.cpu}) but "
            f"this host runs guests under {host_accel.name} (cpu {host_accel.cpu}); CPU state "
            "cannot move between them: re-create the snapshot on this host"
        )


# QEMU's -machine options of a snapshot that recorded none (vmm/cmdline.py: MACHINE).
LEGACY_MACHINE = "microvm,x-option-roms=off,isa-serial=on,rtc=on,acpi=on,memory-backend=mem"
# New TCG templates drop the PIT (vmm/cmdline.py: machine_for says why).
NO_PIT = ",pit=off"
# Every -machine a forkd makes. A snapshot's config may come from a store or an archive, and its
# machine reaches QEMU's command line: anything else (",firmware=/host/file") is refused.
KNOWN_MACHINES = frozenset({LEGACY_MACHINE, LEGACY_MACHINE + NO_PIT})
# The only accelerator and CPU model pairs a forkd runs guests with (Accel.tcg(), Accel.kvm()).
KNOWN_CPUS = {"tcg": "max", "kvm": "host,-arch-capabilities"}


@dataclass(frozen=True)
class VMConfig:
    """The parts of a VM's configuration a snapshot pins down (a new one: ``vmm.cmdline.new_config``)."""

    mem_mib: int
    vcpus: int
    accel: Accel
    machine: str = LEGACY_MACHINE  # QEMU's -machine options

    def to_json(self) -> dict[str, Any]:
        return {"mem_mib": self.mem_mib, "vcpus": self.vcpus,
                "accel": self.accel.name, "cpu": self.accel.cpu, "machine": self.machine}

    def __post_init__(self) -> None:
        # Every field reaches QEMU's command line: a config is only ever one forkd could have made.
        if self.machine not in KNOWN_MACHINES:
            raise ValueError(f"machine {self.machine[:200]!r} is not one forkd makes")
        if KNOWN_CPUS.get(self.accel.name) != self.accel.cpu:
            raise ValueError(f"accelerator {self.accel.name[:32]!r} with cpu {self.accel.cpu[:64]!r} is not "
                             f"one forkd runs guests with ({KNOWN_CPUS})")
        for name, value, high in (("mem_mib", self.mem_mib, MAX_MEM_MIB), ("vcpus", self.vcpus, MAX_VCPUS)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
                raise ValueError(f"{name} must be an integer from 1 to {high}")

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> VMConfig:
        """Checked field by field (``ValueError`` names the one that is wrong): a snapshot's config
        may come from a store or an archive (store/snapshot_meta.py)."""
        if not isinstance(d, dict):
            raise ValueError("config must be an object")
        machine = d.get("machine") or LEGACY_MACHINE
        accel, cpu = d.get("accel"), d.get("cpu")
        if not isinstance(machine, str) or not isinstance(accel, str) or not isinstance(cpu, str):
            raise ValueError("config's accel, cpu and machine must be strings")
        return cls(d.get("mem_mib"), d.get("vcpus"), Accel(accel, cpu), machine)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ProbeGuest:
    """What the accelerator probe (vmm/probe.py) boots: the image's kernel and initramfs."""

    kernel: Path
    initrd: Path
    kernel_version: str
