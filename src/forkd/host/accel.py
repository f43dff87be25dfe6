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

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> VMConfig:
        return cls(int(d["mem_mib"]), int(d["vcpus"]), Accel(d["accel"], d["cpu"]),
                   str(d.get("machine") or LEGACY_MACHINE))


@dataclass(frozen=True)
class ProbeGuest:
    """What the accelerator probe (vmm/probe.py) boots: the image's kernel and initramfs."""

    kernel: Path
    initrd: Path
    kernel_version: str
