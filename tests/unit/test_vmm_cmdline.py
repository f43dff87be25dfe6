"""The kernel command line forkd gives a template, read back the way the agent reads it."""

from __future__ import annotations

from pathlib import Path

import pytest

from forkd.guest.agent.setup import cmdline_options, dev_links
from forkd.guest.agent.warm import warm_list
from forkd.host.accel import Accel, VMConfig
from forkd.vmm import cmdline as vmm_cmdline
from forkd.vmm.cmdline import AGENT_PORT_NAME, kernel_cmdline


@pytest.mark.parametrize("warm", [[], ["numpy"], ["numpy", "json.decoder"]])
def test_the_agent_warms_exactly_what_was_asked(tmp_path: Path, warm: list[str]) -> None:
    cmdline = tmp_path / "cmdline"
    cmdline.write_text(kernel_cmdline(warm, accel=Accel.tcg()) + "\n")
    opts = cmdline_options(str(cmdline))
    assert warm_list(opts.get("warm")) == warm  # [] means none, not the agent's default
    assert opts["port"] == AGENT_PORT_NAME


def test_probe_mode_and_tsc_hint() -> None:
    words = kernel_cmdline([], accel=Accel.tcg(), probe=True).split()
    assert "forkd.probe=1" in words and "panic=-1" in words
    assert not any(w.startswith("tsc_early_khz") for w in kernel_cmdline([], accel=Accel.kvm()).split())


def test_a_snapshot_without_a_recorded_machine_restores_with_the_legacy_one() -> None:
    old = {"mem_mib": 512, "vcpus": 1, "accel": "tcg", "cpu": "max"}  # written before machines were recorded
    assert VMConfig.from_json(old).machine == vmm_cmdline.LEGACY_MACHINE
    new = vmm_cmdline.new_config(512, 1, Accel.tcg())
    assert VMConfig.from_json(new.to_json()) == new


def test_new_tcg_templates_have_no_pit_when_the_tsc_rate_is_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vmm_cmdline, "host_tsc_khz", lambda: 2_600_000)
    cfg = vmm_cmdline.new_config(512, 1, Accel.tcg())
    assert cfg.machine.endswith(",pit=off")
    spec = vmm_cmdline.LaunchSpec(config=cfg, mem_path=Path("/s/mem"), share_ram=False, disk=Path("/d.qcow2"),
                              qmp_fd=3, agent_fd=4, console_log=Path("/c.log"), incoming=True)
    argv = vmm_cmdline.build_argv("qemu", spec)
    assert argv[argv.index("-machine") + 1] == cfg.machine
    # Without the rate the guest would calibrate its TSC against the PIT: keep it.
    monkeypatch.setattr(vmm_cmdline, "host_tsc_khz", lambda: None)
    assert "pit=off" not in vmm_cmdline.new_config(512, 1, Accel.tcg()).machine
    assert "pit=off" not in vmm_cmdline.new_config(512, 1, Accel.kvm()).machine


def test_kernel_cmdline_quiets_idle_wakeups() -> None:
    words = vmm_cmdline.kernel_cmdline(["numpy"], accel=Accel.tcg()).split()
    assert set(vmm_cmdline.IDLE_QUIET) <= set(words)


def test_the_agent_links_dev_fd_and_the_std_streams_as_an_init_would(tmp_path: Path) -> None:
    """devtmpfs has no /dev/fd: bash's `. /dev/fd/N` and `<(...)` failed in the guest without it."""
    (tmp_path / "stdin").symlink_to("/elsewhere")  # one that is there stays as it is
    dev_links(str(tmp_path))
    dev_links(str(tmp_path))  # again: nothing to do, no error
    assert {p.name: str(p.readlink()) for p in tmp_path.iterdir()} == {
        "fd": "/proc/self/fd", "stdin": "/elsewhere", "stdout": "/proc/self/fd/1",
        "stderr": "/proc/self/fd/2"}
