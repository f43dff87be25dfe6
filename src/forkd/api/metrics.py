"""Prometheus metrics, kept in a per-app CollectorRegistry.

A private registry (instead of prometheus_client's global one) lets several
apps live in one process - tests, or an embedding program - without
"Duplicated timeseries" errors.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from forkd.config import VERSION
from forkd.controller.results import PoolReport

log = logging.getLogger(__name__)

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

# Forking is ~0.1 s per child on KVM and ~1 s under TCG; batches can take minutes.
# The Hibernator's counters (controller/hibernation.py ``counts``): key, gauge, help.
HIBERNATION_GAUGES = (
    ("hibernated", "forkd_sandboxes_hibernated", "Sandboxes hibernated now (on disk, no QEMU)."),
    ("hibernated_bytes", "forkd_hibernated_bytes", "Disk the hibernated sandboxes' saved state takes."),
    ("hibernations", "forkd_hibernations", "Hibernations since the daemon started."),
    ("wakes", "forkd_hibernation_wakes", "Wakes of hibernated sandboxes since the daemon started."),
    ("wake_failures", "forkd_hibernation_wake_failures", "Wakes that failed (the sandbox stays hibernated)."),
)
# The fleet-wide split of what live sandboxes hold (controller/costs.py), by "kind".
MEMORY_KINDS = (
    ("shared", "guest RAM read from snapshots and not written (page cache; shared with siblings)"),
    ("private", "guest RAM written since the restore (each sandbox's own)"),
    ("disk", "the sandboxes' own disk layers on the host"),
)
_SPAWN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, math.inf)
_EXEC_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, math.inf)
# Pause windows from the seeds: live ~50 ms, diff ~200 ms, full 0.5-8 s.
_PAUSE_MS_BUCKETS = (5, 10, 25, 50, 100, 200, 500, 1000, 2000, 4000, 8000, 16000, math.inf)


def _counter(source: Callable[[], dict[str, Any]], key: str) -> Callable[[], int]:
    """One number of ``source()``'s counters (0 when it has none by that name)."""
    return lambda: int(source().get(key, 0))


def _safe_count(count: Callable[[], int]) -> Callable[[], float]:
    def sample() -> float:
        try:
            return float(count())
        except Exception as exc:  # a scrape must not fail because the registry is busy
            log.warning("metrics: cannot count: %s", exc)
            return math.nan

    return sample


PoolsSource = Callable[[], list[PoolReport]]
RefillSource = Callable[[], list[tuple[str, float]]]


class _PoolCollector(Collector):
    """Per-pool gauges and counters, read from the runtime at scrape time (its PoolInfo dicts)."""

    def __init__(self, pools: PoolsSource) -> None:
        self._pools = pools

    def collect(self) -> Iterator[Metric]:
        target = GaugeMetricFamily("forkd_pool_target", "Warm pool target size.", labels=["tag"])
        ready = GaugeMetricFamily("forkd_pool_ready", "Warm pool members restored and paused.",
                                  labels=["tag"])
        claims = CounterMetricFamily("forkd_pool_claims", "Children handed out from a warm pool.",
                                     labels=["tag"])
        misses = CounterMetricFamily("forkd_pool_misses", "Children of a pooled snapshot restored fresh "
                                     "(pool empty, options differed, or a member failed its claim).",
                                     labels=["tag"])
        try:
            pools = self._pools()
        except Exception as exc:  # a scrape must not fail because the runtime is busy
            log.warning("metrics: cannot list pools: %s", exc)
            pools = []
        for pool in pools:
            tag = [str(pool["tag"])]
            target.add_metric(tag, pool["size"])
            ready.add_metric(tag, pool["ready"])
            claims.add_metric(tag, pool["claims"])
            misses.add_metric(tag, pool["misses"])
        yield from (target, ready, claims, misses)


class Metrics:
    def __init__(self, count_snapshots: Callable[[], int], count_sandboxes: Callable[[], int],
                 pools: PoolsSource | None = None, refill_times: RefillSource | None = None,
                 count_paused: Callable[[], int] | None = None,
                 hibernation: Callable[[], dict[str, Any]] | None = None,
                 costs: Callable[[], dict[str, int]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # Gauges are computed at scrape time from the runtime, so they can never
        # drift from what the registry says (e.g. sandboxes reaped on restart).
        snapshots = Gauge("forkd_snapshots_total", "Registered snapshots.", registry=self.registry)
        snapshots.set_function(_safe_count(count_snapshots))
        sandboxes = Gauge("forkd_sandboxes_active", "Currently alive sandbox VMs.", registry=self.registry)
        sandboxes.set_function(_safe_count(count_sandboxes))
        if count_paused is not None:
            paused = Gauge("forkd_sandboxes_paused", "Sandboxes paused for being idle (idle_pause_secs).",
                           registry=self.registry)
            paused.set_function(_safe_count(count_paused))
        if hibernation is not None:
            for key, name, help_text in HIBERNATION_GAUGES:
                gauge = Gauge(name, help_text, registry=self.registry)
                gauge.set_function(_safe_count(_counter(hibernation, key)))
        if costs is not None:
            held = Gauge("forkd_sandbox_bytes", "Bytes the live sandboxes hold, summed, by kind: "
                         + "; ".join(f"{k}: {text}" for k, text in MEMORY_KINDS) + ".",
                         ["kind"], registry=self.registry)
            for kind, _text in MEMORY_KINDS:
                held.labels(kind=kind).set_function(_safe_count(_counter(costs, kind)))
        build = Gauge(
            "forkd_build_info",
            "Always 1; the label carries the build version.",
            ["version"],
            registry=self.registry,
        )
        build.labels(version=VERSION).set(1)
        self.spawn_seconds = Histogram(
            "forkd_spawn_seconds",
            "Wall time of one POST /v1/sandboxes call (all n children).",
            buckets=_SPAWN_BUCKETS,
            registry=self.registry,
        )
        self.restore_phase_seconds = Histogram(
            "forkd_restore_phase_seconds",
            "Per child: seconds from the start of its restore until each phase ended "
            "(qemu_up, restored: device state loaded, running: guest resumed, ready: its agent "
            "answered; guest_hook: the guest's own time in the post-restore call).",
            ["phase"],
            buckets=_SPAWN_BUCKETS,
            registry=self.registry,
        )
        self.exec_seconds = Histogram(
            "forkd_exec_seconds",
            "Wall time of one exec in a sandbox, round trip.",
            buckets=_EXEC_BUCKETS,
            registry=self.registry,
        )
        self.branch_pause_ms = Histogram(
            "forkd_branch_pause_ms",
            "Source sandbox pause window of a BRANCH, in milliseconds.",
            buckets=_PAUSE_MS_BUCKETS,
            registry=self.registry,
        )

        self.fork_seconds = Histogram(
            "forkd_fork_seconds",
            "Wall time of one fork of a running sandbox (POST /v1/sandboxes/{id}/fork or fork-tree): "
            "the branch plus every child answering.",
            buckets=_SPAWN_BUCKETS,
            registry=self.registry,
        )

        self.pool_refill_seconds = Histogram(
            "forkd_pool_refill_seconds",
            "Time to restore, reseed and pause one warm pool member.",
            ["tag"],
            buckets=_SPAWN_BUCKETS,
            registry=self.registry,
        )
        self._refill_times = refill_times
        if pools is not None:
            self.registry.register(_PoolCollector(pools))

    def observe_restores(self, records: list[Any]) -> None:
        """Per-phase restore timings of freshly forked children."""
        for record in records:
            for phase, secs in record.timings.items():
                self.restore_phase_seconds.labels(phase=phase.removesuffix("_s")).observe(secs)

    def render(self) -> bytes:
        # Refills happen in the runtime's background task; their times are collected here.
        if self._refill_times is not None:
            try:
                for tag, secs in self._refill_times():
                    self.pool_refill_seconds.labels(tag=tag).observe(secs)
            except Exception as exc:
                log.warning("metrics: cannot read pool refill times: %s", exc)
        return generate_latest(self.registry)
