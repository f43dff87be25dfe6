"""What a tenant (root in its guest) writes cannot exhaust the host: the console is capped."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from forkd.controller.runtime import Runtime
from forkd.vmm import console

from .conftest import Loop

pytestmark = pytest.mark.vm


def test_a_flooded_console_stays_capped(loop: Loop, runtime: Runtime, snapshot: str) -> None:
    sb = loop.run(runtime.spawn(snapshot, 1))[0]
    log = Path(sb.dir) / "console.log"
    try:
        # 3 MiB through the UART, three times the cap (~10 s under TCG).
        flood = "head -c 3145728 /dev/zero | tr '\\0' x > /dev/ttyS0"
        res = loop.run(runtime.exec(sb.id, ["sh", "-c", flood], timeout_secs=300))
        assert res["exit_code"] == 0, res
        deadline = time.monotonic() + 30
        while log.stat().st_size > console.MAX_BYTES:  # the warden sweeps once a second
            assert time.monotonic() < deadline, "the console log was never cut"
            time.sleep(0.2)
        prev = console.previous(log)
        assert prev.exists() and prev.stat().st_size <= console.KEEP_BYTES
        assert loop.run(runtime.ping(sb.id))["pong"] is True  # the guest is unharmed
    finally:
        loop.run(runtime.kill(sb.id))
