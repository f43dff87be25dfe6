"""What a child costs the host, read from real QEMUs: a child that wrote 100 MiB holds about
100 MiB more private RAM than a fresh sibling, both share pages with their snapshot, and disk
written in the guest shows in its own disk layers."""

from __future__ import annotations

import time

import pytest

from forkd.controller.costs import TOTALS_TTL_SECS
from forkd.controller.options import ForkOptions
from forkd.controller.runtime import Runtime
from forkd.errors import Conflict

from .conftest import Loop

pytestmark = pytest.mark.vm

MIB = 1 << 20


def test_a_child_that_wrote_100_mib_holds_about_100_mib_more_of_its_own(
        loop: Loop, runtime: Runtime, snapshot: str) -> None:
    fresh, writer = loop.run(runtime.spawn(snapshot, 2))
    try:
        # Written page by page (not calloc'ed zero pages the guest never touches), and kept alive.
        out = loop.run(runtime.eval(writer.id, "_blob = bytearray(b'x') * (100 << 20); len(_blob)"))
        assert out["result"] == str(100 << 20), out
        loop.run(runtime.exec(writer.id, ["sh", "-c", "head -c 8388608 /dev/urandom > /root/blob && sync"]))
        a = loop.run(runtime.costs.of(fresh.id))
        b = loop.run(runtime.costs.of(writer.id))
        assert a["ram_bytes"] == b["ram_bytes"] == fresh.config.mem_mib * MIB
        for cost in (a, b):
            assert cost["shared_bytes"] > 0  # the restore read the snapshot's pages it needed
            assert cost["shared_bytes"] + cost["private_bytes"] + cost["untouched_bytes"] == cost["ram_bytes"]
        grown = b["private_bytes"] - a["private_bytes"]
        assert 90 * MIB <= grown <= 140 * MIB, (a, b)
        assert b["disk_bytes"] - a["disk_bytes"] >= 8 * MIB, (a, b)
        # /metrics' sums count both (cached for a few seconds: wait the cache out first).
        time.sleep(TOTALS_TTL_SECS)
        totals = runtime.costs.totals()
        assert totals["private"] >= a["private_bytes"] + b["private_bytes"]
        assert totals["shared"] >= a["shared_bytes"] + b["shared_bytes"]
        # A hibernated sandbox holds no RAM: a 409 that says so, not a figure.
        loop.run(runtime.hibernation.hibernate(fresh.id))
        with pytest.raises(Conflict, match="hibernated"):
            loop.run(runtime.costs.of(fresh.id))
    finally:
        for sb in (fresh, writer):
            loop.run(runtime.kill(sb.id))


def test_a_forks_report_says_what_each_child_costs(loop: Loop, runtime: Runtime, snapshot: str) -> None:
    [source] = loop.run(runtime.spawn(snapshot, 1))
    report = loop.run(runtime.fork(source.id, 2, ForkOptions()))
    try:
        assert report.errors == []
        assert [m["sandbox_id"] for m in report.memory] == [c.id for c in report.children]
        for cost in report.memory:
            assert cost["shared_bytes"] > 0 and cost["ram_bytes"] == source.config.mem_mib * MIB
        assert report.info()["memory"] == report.memory
    finally:
        for sb in (source, *report.children):
            loop.run(runtime.kill(sb.id))
