"""SpawnOptions: one typed value from the request model to the Runtime, built without hand unpacking."""

from __future__ import annotations

from pathlib import Path

import pytest

from forkd import bounds
from forkd.api.schemas import ForkRequest, SpawnRequest
from forkd.controller.disk_quota import DiskQuotas
from forkd.controller.options import E2B_ONLY_FIELDS, EGRESS_FIELDS, ForkOptions, SpawnOptions, option_names
from forkd.controller.sandbox_events import SandboxEvents
from forkd.controller.sandboxes import SandboxTable
from forkd.errors import InvalidRequest
from forkd.guest.protocol import RestoreInputs
from forkd.host.accel import Accel
from forkd.host.egress import EgressPolicy
from forkd.store.registry import DiskChain, Registry, SandboxRecord
from forkd.vmm.cmdline import VMConfig
from tests.fakes.app import daemon_app, needs_memory_cgroups


def test_every_request_field_is_a_spawn_option() -> None:
    """A field added to SpawnRequest must exist in SpawnOptions (or be declared not an option)."""
    request = set(SpawnRequest.model_fields) - SpawnRequest.NOT_OPTIONS - set(EGRESS_FIELDS)
    options = option_names() - {"egress"} - set(E2B_ONLY_FIELDS)
    assert request == options


def test_every_fork_request_field_is_a_fork_option() -> None:
    """ForkOptions is its children's SpawnOptions plus a fork's own fields: a field added to
    ForkRequest must be one or the other."""
    request = set(ForkRequest.model_fields) - ForkRequest.NOT_OPTIONS - set(EGRESS_FIELDS)
    spawn = option_names()
    assert request - spawn == set(ForkOptions.OWN)
    assert ForkRequest().options() == ForkOptions()
    options = ForkRequest.model_validate({"hostname": "box-1", "keep_snapshot": True, "count": 2,
                                          "allow_internet_access": True}).options()
    assert options == ForkOptions(SpawnOptions(guest=RestoreInputs(hostname="box-1"),
                                               egress=EgressPolicy.from_request(True)), keep_snapshot=True)


@pytest.mark.parametrize("hostname", ["-a", "a..b", "a_b", "x" * 64, ".".join(["a" * 32] * 2), "a\nb", 7])
@pytest.mark.parametrize("route", ["/v1/sandboxes", "/v1/sandboxes/{id}/fork"])
def test_a_bad_hostname_is_a_400_naming_it(tmp_path: Path, route: str, hostname: object) -> None:
    with daemon_app(tmp_path, token=False) as daemon:
        client = daemon.client
        route = route.format(id=daemon.sandbox("py").id)
        r = client.post(route, json={"snapshot_tag": "py", "hostname": hostname} if "fork" not in route
                        else {"hostname": hostname})
        assert r.status_code == 400, r.text
        assert "hostname" in r.json()["error"]
        ok = client.post(route, json={"snapshot_tag": "py", "hostname": "a-1.b"} if "fork" not in route
                         else {"hostname": "a-1.b"})
        assert ok.status_code == 201, ok.text


def test_an_empty_request_gives_the_defaults() -> None:
    assert SpawnRequest(snapshot_tag="py").options() == SpawnOptions()


def test_every_field_reaches_the_options() -> None:
    body = {
        "snapshot_tag": "py", "n": 2, "per_child_netns": True, "memory_limit_mib": 256, "live_fork": True,
        "env": {"A": "1"}, "child_env": [{"B": "0"}, {"B": "1"}], "metadata": {"team": "ml"},
        "cpu_limit": 0.5, "pids_limit": 64, "timeout_secs": 30, "idle_pause_secs": 5, "prewarm": True,
        "hugepages": True, "disk_quota_mib": 64, "allow_internet_access": True,
        "network": {"allow_out": ["192.0.2.7:443"]}, "hostname": "box-1",
    }
    options = SpawnRequest.model_validate(body).options()
    assert options == SpawnOptions(
        per_child_netns=True, memory_limit_mib=256, live_fork=True, env={"A": "1"},
        child_env=[{"B": "0"}, {"B": "1"}], metadata={"team": "ml"}, cpu_limit=0.5, pids_limit=64,
        timeout_secs=30, idle_pause_secs=5, prewarm=True, disk_quota_mib=64,
        guest=RestoreInputs(hostname="box-1"),
        egress=EgressPolicy.from_request(True, {"allow_out": ["192.0.2.7:443"]}))
    assert options.given()["disk_quota_mib"] == 64 and "per_child_netns" in options.given()
    assert options.given()["hostname"] == "box-1"  # a guest input by its request field's name


def test_bounds_are_checked_by_the_options_themselves() -> None:
    for bad in ({"timeout_secs": 0}, {"idle_pause_secs": 0.5}, {"disk_quota_mib": -1},
                {"disk_quota_mib": int(bounds.DISK_QUOTA_MIB.high) + 1}):
        with pytest.raises(InvalidRequest):
            SpawnOptions(**bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="does not support spawn option"):
        SpawnOptions.from_request({"no_such_option": 1})


def test_the_daemon_default_quota_and_zero_for_none(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "forkd.db")
    events = SandboxEvents()
    table = SandboxTable(registry.sandboxes, registry.aliases, registry.prefixes, tmp_path, events)
    quotas = DiskQuotas(registry.sandboxes, table, events)
    assert quotas.quota_for(None) == bounds.DEFAULT_DISK_QUOTA_MIB
    assert quotas.quota_for(64) == 64 and quotas.quota_for(0) is None
    quotas.default_mib = 0
    assert quotas.quota_for(None) is None and quotas.quota_for(32) == 32
    registry.close()


def test_sandbox_info_reports_the_quota_and_the_layers_used(tmp_path: Path) -> None:
    record = SandboxRecord(id="sb-abcdef-0000", snapshot_tag="py", dir=str(tmp_path), created_at_unix=1,
                           config=VMConfig(512, 1, Accel.tcg()), disk=DiskChain.fresh(tmp_path, "py"),
                           disk_quota_mib=64)
    info = record.info()
    assert info["disk_quota_mib"] == 64 and "disk_used_mib" not in info  # no layer yet
    for name in ("disk.qcow2", "disk-1.qcow2"):
        (tmp_path / name).write_bytes(b"x" * (1 << 20))
    (tmp_path / "console.log").write_bytes(b"y" * (4 << 20))  # not a layer
    assert record.info()["disk_used_mib"] == pytest.approx(2, abs=0.1)


def test_the_api_passes_the_quota_and_sandbox_info_shows_it(tmp_path: Path) -> None:
    with daemon_app(tmp_path, token=False) as daemon:
        client = daemon.client
        r = client.post("/v1/sandboxes", json={"snapshot_tag": "py", "disk_quota_mib": 64})
        assert r.status_code == 201, r.text
        assert daemon.runtime.get_sandbox(r.json()[0]["id"]).disk_quota_mib == 64
        assert r.json()[0]["disk_quota_mib"] == 64
        r = client.post("/v1/sandboxes", json={"snapshot_tag": "py"})
        assert r.json()[0]["disk_quota_mib"] == bounds.DEFAULT_DISK_QUOTA_MIB  # the daemon's default
        assert "disk_quota_mib" not in client.post(
            "/v1/sandboxes", json={"snapshot_tag": "py", "disk_quota_mib": 0}).json()[0]
        r = client.post("/v1/sandboxes", json={"snapshot_tag": "py", "disk_quota_mib": -1})
        assert r.status_code == 400, r.text


@needs_memory_cgroups
def test_a_spawn_oom_killed_under_its_own_memory_limit_is_a_400_naming_it(tmp_path: Path) -> None:
    """A memory_limit_mib below what a restored child needs is the request's mistake: a 400 naming
    the OOM kill and the field to raise, not the 500 of a daemon failing (the QEMU double is
    OOM-killed under a small limit, as the kernel does; tests/fakes/vmm.py)."""
    with daemon_app(tmp_path, token=False) as daemon:
        r = daemon.client.post("/v1/sandboxes", json={"snapshot_tag": "py", "n": 1, "memory_limit_mib": 64})
        assert r.status_code == 400, r.text
        assert "OOM-killed while restoring" in r.json()["error"] and "memory_limit_mib" in r.json()["error"]
