"""``forkd doctor`` checks: they run anywhere, never raise, and always say how to fix."""

from __future__ import annotations

import shutil
import sys
import time
import types
from pathlib import Path

import pytest

from forkd import doctor
from forkd.config import DataDir
from forkd.host import prereqs


@pytest.fixture(autouse=True)
def _hermetic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # A shared images dir or a forced accelerator from the caller's shell would
    # change what the checks report.
    monkeypatch.delenv("FORKD_IMAGES_DIR", raising=False)
    monkeypatch.delenv("FORKD_ACCEL", raising=False)


def _stub_accel(monkeypatch: pytest.MonkeyPatch, cached_probe: object) -> None:
    module = types.ModuleType("forkd.vmm.probe")
    module.cached_probe = cached_probe  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "forkd.vmm.probe", module)


def test_run_checks_on_empty_data_dir(tmp_path: Path) -> None:
    started = time.monotonic()
    checks = doctor.run_checks(tmp_path / "data")
    assert time.monotonic() - started < 20
    names = [c.name for c in checks]
    assert len(names) == len(set(names)), "check names must be unique"
    for c in checks:
        assert isinstance(c.name, str) and c.name
        assert isinstance(c.detail, str) and c.detail, c
        assert isinstance(c.ok, bool) and isinstance(c.required, bool)
        if not c.ok:
            assert c.fix, f"failed check {c.name!r} has no fix"
        assert "check crashed" not in c.detail, c  # a crash is a doctor bug
    by_name = {c.name: c for c in checks}
    expected = {
        "qemu", "qemu-img", "image tools", "static busybox", "root", "/dev/kvm",
        "accelerator", "guest image", "disk space", "userfaultfd", "memfd", "/dev/shm",
        "cgroups", "netns", "/dev/net/tun", "vhost-vsock",
    }
    assert expected <= set(by_name)
    for optional in ("cgroups", "netns", "/dev/net/tun", "vhost-vsock", "/dev/kvm"):
        assert by_name[optional].required is False

    qemu = by_name["qemu"]
    assert qemu.ok == (shutil.which("qemu-system-x86_64") is not None)
    if qemu.ok:
        assert "QEMU emulator version" in qemu.detail

    image = by_name["guest image"]  # a fresh data dir has no image
    assert image.ok is False and image.required is True
    assert image.fix == "forkd image build"
    assert not (tmp_path / "data").exists(), "the doctor must not create the data dir"

    report = doctor.format_report(checks)
    for c in checks:
        assert c.name in report
    assert "fix: forkd image build" in report
    assert "required check(s) failed" in report
    assert doctor.passed(checks) is False


def test_missing_qemu_has_apt_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        prereqs, "QEMU", prereqs.Tool("forkd-no-such-qemu", "qemu-system-x86", "runs VMs")
    )
    check = doctor.check_qemu()
    assert check.ok is False and check.required is True
    assert check.fix == "apt-get install -y --no-install-recommends qemu-system-x86"
    assert "forkd-no-such-qemu" in check.detail


def test_accel_never_probed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _stub_accel(monkeypatch, lambda data: None)
    check = doctor.check_accel(DataDir.from_env(tmp_path))
    assert check.ok is False and check.required is False
    assert check.fix is not None and "forkd doctor --probe" in check.fix


def test_accel_reports_probe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[DataDir] = []

    def cached_probe(data: DataDir) -> dict:
        seen.append(data)
        return {"accel": "tcg", "cpu": "max", "probed_at_unix": int(time.time()),
                "kvm_error": "no boot within 20s"}

    _stub_accel(monkeypatch, cached_probe)
    data = DataDir.from_env(tmp_path)
    check = doctor.check_accel(data)
    assert seen == [data]
    assert check.ok is True
    assert "tcg" in check.detail and "max" in check.detail
    assert "no boot within 20s" in check.detail


def test_accel_stale_after_qemu_upgrade(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    probe = {"accel": "kvm", "cpu": "host", "key": {"qemu": "QEMU emulator version 7.2.0"}}
    _stub_accel(monkeypatch, lambda data: probe)
    check = doctor.check_accel(DataDir.from_env(tmp_path), "QEMU emulator version 8.2.2 (x)")
    assert check.ok is False and "stale" in check.detail and check.fix


def test_accel_probe_error_is_a_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def broken(data: DataDir) -> dict:
        raise RuntimeError("boom")

    _stub_accel(monkeypatch, broken)
    check = doctor.check_accel(DataDir.from_env(tmp_path))
    assert check.ok is False and "boom" in check.detail and check.fix


def test_low_disk_space_is_a_warning(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(doctor, "MIN_FREE_BYTES", 1 << 60)
    check = doctor.check_disk_space(DataDir.from_env(tmp_path / "not" / "yet"))
    assert check.ok is False and check.required is False and check.fix


def test_crashing_check_becomes_failed_check() -> None:
    def crash() -> doctor.Check:
        raise OSError("weird host")

    check = doctor._guarded("odd", crash)
    assert check.name == "odd" and check.ok is False
    assert "weird host" in check.detail and check.fix


def test_only_required_failures_fail_overall() -> None:
    checks = [
        doctor.Check("a", True, "fine"),
        doctor.Check("b", False, "optional thing missing", "do x", required=False),
    ]
    assert doctor.passed(checks) is True
    report = doctor.format_report(checks)
    assert "[warn] b" in report and "fix: do x" in report
    assert "all required checks passed" in report
    checks.append(doctor.Check("c", False, "broken", "do y"))
    assert doctor.passed(checks) is False
    assert "[FAIL] c" in doctor.format_report(checks)
