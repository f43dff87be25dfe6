"""A PVM /dev/kvm is recognised from the host's facts, and the probe skips its 20 s KVM boot
(issue 38, item 22). The MSR file and /sys/module stand in as files under tmp_path."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from forkd import doctor
from forkd.config import DataDir
from forkd.host import kvmflavour
from forkd.host.accel import Accel, ProbeGuest
from forkd.vmm import probe


def _msr_file(path: Path, value: bytes) -> Path:
    """A sparse file holding ``value`` at the PVM MSR's offset, as /dev/cpu/0/msr reads it."""
    with open(path, "wb") as f:
        f.seek(kvmflavour.PVM_MSR)
        f.write(value.ljust(8, b"\0"))
    return path


def test_the_kvm_pvm_module_says_pvm(tmp_path: Path) -> None:
    (tmp_path / "sys" / "kvm_pvm").mkdir(parents=True)
    reason = kvmflavour.pvm_reason(tmp_path / "sys", tmp_path / "no-msr")
    assert reason is not None and "kvm_pvm" in reason and "PVM" in reason


def test_the_pvm_msr_says_pvm(tmp_path: Path) -> None:
    (tmp_path / "sys").mkdir()
    msr = _msr_file(tmp_path / "msr", b"PVM")
    reason = kvmflavour.pvm_reason(tmp_path / "sys", msr)
    assert reason is not None and "0x4b564d11" in reason


@pytest.mark.parametrize("value", [b"KVM", b"\0"])
def test_another_msr_value_or_none_readable_says_nothing(tmp_path: Path, value: bytes) -> None:
    (tmp_path / "sys" / "kvm_intel").mkdir(parents=True)
    assert kvmflavour.pvm_reason(tmp_path / "sys", _msr_file(tmp_path / "msr", value)) is None
    assert kvmflavour.pvm_reason(tmp_path / "sys", tmp_path / "missing") is None
    assert kvmflavour.read_msr(kvmflavour.PVM_MSR, tmp_path / "missing") is None


def test_a_pvm_host_is_probed_without_a_kvm_boot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    booted: list[str] = []

    async def boot_probe(guest: ProbeGuest, accel: Accel, timeout: float, tmp: Path) -> tuple[bool, str]:
        booted.append(accel.name)
        return True, ""

    real_exists = os.path.exists
    monkeypatch.setattr(probe.os.path, "exists", lambda p: p == "/dev/kvm" or real_exists(p))
    monkeypatch.setattr(probe, "boot_probe", boot_probe)
    monkeypatch.setattr(probe, "_probe_key", lambda guest: {"qemu": "test"})
    monkeypatch.setattr(kvmflavour, "pvm_reason", lambda: "/dev/kvm is PVM (module kvm_pvm is loaded)")
    guest = ProbeGuest(tmp_path / "vmlinuz", tmp_path / "initrd", "6.1")
    result: dict[str, Any] = asyncio.run(probe.probe(DataDir(tmp_path / "data"), guest, force=True))
    assert booted == ["tcg"]
    assert result["accel"] == "tcg"
    assert "PVM" in result["kvm_error"] and "without a boot" in result["kvm_error"]


def test_doctor_shows_why_kvm_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        pytest.skip("doctor's /dev/kvm check opens the real device: none usable here")
    monkeypatch.setattr(kvmflavour, "pvm_reason", lambda: "/dev/kvm is PVM (module kvm_pvm is loaded)")
    check = doctor.check_kvm()
    assert not check.ok and not check.required
    assert "PVM" in check.detail and "TCG" in check.detail


def test_this_hosts_pvm_is_recognised_for_real() -> None:
    if not (kvmflavour.SYS_MODULE / kvmflavour.PVM_MODULE).is_dir() and \
            kvmflavour.read_msr(kvmflavour.PVM_MSR) is None:
        pytest.skip("no kvm_pvm module and /dev/cpu/0/msr unreadable (no msr module, or not root): "
                    "this host gives no PVM sign to read")
    reason = kvmflavour.pvm_reason()
    assert reason is not None and "PVM" in reason
