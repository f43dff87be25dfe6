"""The accelerator a host runs guests with, and why snapshots cannot move between them.

Which one a host really has is decided by a boot probe (``probe.py``); this
module only names the pair (accelerator, CPU model) that a snapshot records.
"""

from __future__ import annotations

from dataclasses import dataclass

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
