"""The kernel command line forkd gives a template, read back the way the agent reads it."""

from __future__ import annotations

from pathlib import Path

import pytest

from forkd.guest.agent.setup import cmdline_options
from forkd.guest.agent.warm import warm_list
from forkd.host.accel import Accel
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
