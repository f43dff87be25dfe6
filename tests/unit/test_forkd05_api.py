"""forkd 0.5 wire compatibility of the REST layer, on the real Runtime over the QEMU double: the
fields the published ``forkd`` 0.5.3 SDK and ``forkd-mcp`` 0.2.1 send, compaction and workspaces;
plus the two host helpers behind ``measure_diff`` and ``prewarm``. The published clients themselves
drive a real daemon in tests/integration/test_compat_clients.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from forkd.controller.options import SpawnOptions
from forkd.controller.runtime import Runtime
from forkd.errors import VMError
from forkd.host import pagecache, procmem
from forkd.sdk import Controller, NotFoundError
from tests.fakes.app import AUTH, TOKEN, Daemon, daemon_app, needs_memory_cgroups
from tests.fakes.transport import ViaTestClient


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with daemon_app(tmp_path, headers=AUTH) as d:
        yield d


@pytest.fixture
def runtime(daemon: Daemon) -> Runtime:
    return daemon.runtime


@pytest.fixture
def sb(daemon: Daemon) -> str:
    """A live_fork sandbox (live branches need one)."""
    return daemon.run(daemon.runtime.spawn, "py", 1, SpawnOptions(live_fork=True))[0].id


@pytest.fixture
def client(daemon: Daemon) -> TestClient:
    return daemon.client


def error(resp: Any, status: int) -> str:
    assert resp.status_code == status, resp.text
    assert set(resp.json()) == {"error"}
    return str(resp.json()["error"])


# ------------------------------------------------------------------ spawn


@needs_memory_cgroups
def test_mcp_spawn_body_is_accepted_and_prewarm_reaches_the_runtime(client: TestClient,
                                                                    runtime: Runtime) -> None:
    # forkd-mcp 0.2.1's spawn_sandboxes always sends exactly this shape.
    body = {"snapshot_tag": "py", "n": 1, "per_child_netns": False, "memory_limit_mib": 256,
            "prewarm": False}
    first = client.post("/v1/sandboxes", json=body)
    assert first.status_code == 201, first.text
    second = client.post("/v1/sandboxes", json={**body, "prewarm": True, "hugepages": True,
                                                "live_fork": True})
    assert second.status_code == 201, second.text
    # Both came up, the second after its snapshot's memory was read ahead (prewarm).
    assert {first.json()[0]["id"], second.json()[0]["id"]} <= {s.id for s in runtime.list_sandboxes()}
    assert runtime.get_sandbox(second.json()[0]["id"]).live_fork is True


def test_unknown_fields_no_client_sends_are_still_400(client: TestClient, sb: str) -> None:
    assert "unknown field 'prewarn'" in error(
        client.post("/v1/sandboxes", json={"snapshot_tag": "py", "prewarn": True}), 400)
    assert "unknown field 'measure'" in error(
        client.post(f"/v1/sandboxes/{sb}/branch", json={"measure": True}), 400)
    assert error(client.post("/v1/sandboxes", json={"snapshot_tag": "py", "hugepages": "yes"}), 400)


# ------------------------------------------------------------------ branch


def test_measure_diff_reports_the_anchors_fields(client: TestClient, runtime: Runtime, sb: str) -> None:
    resp = client.post(f"/v1/sandboxes/{sb}/branch", json={"measure_diff": True})
    assert resp.status_code == 201, resp.text
    info = resp.json()
    assert {"diff_ms", "diff_physical_bytes", "diff_logical_bytes"} <= set(info)
    assert info["diff_logical_bytes"] == 512 << 20
    # What the child wrote of its RAM since its restore (the QEMU double's guest writes some).
    assert info["diff_physical_bytes"] > 0
    assert runtime.get_snapshot(info["tag"]).mode == "full"
    # The fields are kept with the snapshot, as the anchor's registry kept them.
    kept = client.get(f"/v1/snapshots/{info['tag']}").json()
    assert kept["diff_physical_bytes"] == info["diff_physical_bytes"]


@pytest.mark.parametrize("body", [
    {"measure_diff": True, "diff": True},
    {"measure_diff": True, "live": True},
    {"measure_diff": True, "mode": "diff"},
    {"diff": True, "live": True},
    {"mode": "full", "live": False},
    {"mode": "live", "diff": True},
    {"wait": False},
    {"wait": False, "diff": True},
])
def test_mode_rules_of_the_anchor(client: TestClient, runtime: Runtime, sb: str,
                                  body: dict[str, Any]) -> None:
    snapshots = runtime.list_snapshots()
    error(client.post(f"/v1/sandboxes/{sb}/branch", json=body), 400)
    assert runtime.list_snapshots() == snapshots  # nothing was branched


def test_legacy_live_is_mode_live(client: TestClient, runtime: Runtime, sb: str) -> None:
    resp = client.post(f"/v1/sandboxes/{sb}/branch", json={"live": True, "wait": False})
    assert resp.status_code == 201, resp.text
    assert runtime.get_snapshot(resp.json()["tag"]).mode == "live"
    assert resp.json()["status"] == "writing"  # answered before its RAM was written: wait false


def test_parent_tag_is_checked_against_the_lineage(client: TestClient, sb: str) -> None:
    first = client.post(f"/v1/sandboxes/{sb}/branch", json={"diff": True, "parent_tag": "py"})
    assert first.status_code == 201, first.text
    # The next branch is recorded on the first one; the source's snapshot is still accepted.
    for parent in (first.json()["tag"], "py"):
        assert client.post(f"/v1/sandboxes/{sb}/branch", json={"parent_tag": parent}).status_code == 201
    assert "not the parent" in error(
        client.post(f"/v1/sandboxes/{sb}/branch", json={"mode": "diff", "parent_tag": "other"}), 409)


def test_unknown_but_well_formed_id_is_404(client: TestClient) -> None:
    assert "not alive" in error(client.get("/v1/sandboxes/sb-nope-0000"), 404)
    assert "invalid sandbox id" in error(client.get("/v1/sandboxes/.hidden"), 400)


# ------------------------------------------------------------------ compact


def test_compact(client: TestClient) -> None:
    resp = client.post("/v1/snapshots/py/compact", json={"to": "py-flat"})
    assert resp.status_code == 201, resp.text
    assert resp.json()["tag"] == "py-flat" and resp.json()["compacted_from"] == "py"
    error(client.post("/v1/snapshots/py/compact", json={"to": "py-flat"}), 409)
    error(client.post("/v1/snapshots/nope/compact", json={"to": "x"}), 404)
    error(client.post("/v1/snapshots/py/compact", json={}), 400)
    error(client.post("/v1/snapshots/py/compact", json={"to": "../x"}), 400)


# ------------------------------------------------------------------ workspaces


def test_workspace_lifecycle(client: TestClient, runtime: Runtime) -> None:
    created = client.post("/v1/workspaces", json={"name": "w1", "snapshot_tag": "py"})
    assert created.status_code == 201, created.text
    ws = created.json()
    assert ws["status"] == "running" and ws["name"] == "w1" and ws["source_snapshot_tag"] == "py"
    sandbox = ws["live_sandbox_id"]
    error(client.post("/v1/workspaces", json={"name": "w1", "snapshot_tag": "py"}), 409)
    error(client.post("/v1/workspaces/w1/resume"), 409)

    suspended = client.post("/v1/workspaces/w1/suspend")
    assert suspended.status_code == 200, suspended.text
    assert suspended.json()["status"] == "suspended" and "live_sandbox_id" not in suspended.json()
    assert suspended.json()["current_state_tag"]
    error(client.post("/v1/workspaces/w1/suspend", json={"diff": True}), 409)

    resumed = client.post("/v1/workspaces/w1/resume").json()
    assert resumed["status"] == "running" and resumed["live_sandbox_id"] == sandbox
    assert [w["name"] for w in client.get("/v1/workspaces").json()] == ["w1"]
    assert client.delete("/v1/workspaces/w1").status_code == 204
    error(client.get("/v1/workspaces/w1"), 404)
    assert sandbox not in {s.id for s in runtime.list_sandboxes()}


def test_suspend_diff_flag_picks_the_mode(client: TestClient, runtime: Runtime) -> None:
    client.post("/v1/workspaces", json={"name": "w2", "snapshot_tag": "py"})
    suspended = client.post("/v1/workspaces/w2/suspend", json={"diff": True})
    assert suspended.status_code == 200, suspended.text
    assert runtime.get_snapshot(suspended.json()["current_state_tag"]).mode == "diff"


def test_our_sdk_speaks_compact_and_workspaces(client: TestClient, runtime: Runtime) -> None:
    with Controller(url="http://forkd.test", token=TOKEN, transport=ViaTestClient(client)) as c:
        assert c.compact_snapshot("py", "py-flat")["compacted_from"] == "py"
        made = c.create_workspace("w3", "py", memory_limit_mib=256)
        assert made["status"] == "running"
        suspended = c.suspend_workspace("w3", diff=True)
        assert suspended["status"] == "suspended"
        assert runtime.get_snapshot(suspended["current_state_tag"]).mode == "diff"
        assert [w["name"] for w in c.list_workspaces()] == ["w3"]
        assert c.resume_workspace("w3")["live_sandbox_id"] == made["live_sandbox_id"]
        assert c.get_workspace("w3")["status"] == "running"
        c.delete_workspace("w3")
        with pytest.raises(NotFoundError, match="workspace 'w3'"):
            c.get_workspace("w3")


# ------------------------------------------------------------------ host helpers


SMAPS = """\
55d0c0000000-55d0c0001000 r--p 00000000 fe:00 1 /usr/bin/qemu-system-x86_64
Size:                  4 kB
Anonymous:             4 kB
7f0000000000-7f0020000000 rw-p 00000000 fe:00 2 /data/snapshots/py/mem
Size:             524288 kB
Rss:               10000 kB
Anonymous:          8192 kB
Swap:                 64 kB
VmFlags: rd wr mr mw me
7f0020000000-7f0040000000 rw-p 00000000 00:00 0
Size:             524288 kB
Anonymous:        524288 kB
"""


def test_written_ram_is_the_private_pages_of_the_ram_mapping(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "smaps").write_text(SMAPS)
    # Only the file mapping of the RAM's size counts, not an anonymous one of that size.
    assert procmem.written_ram_bytes(42, 512 << 20, proc=tmp_path) == (8192 + 64) << 10
    with pytest.raises(VMError, match="no file mapping"):
        procmem.written_ram_bytes(42, 256 << 20, proc=tmp_path)
    with pytest.raises(VMError, match="cannot read"):
        procmem.written_ram_bytes(43, 512 << 20, proc=tmp_path)


def test_prefetch_reads_the_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "mem"
    with open(path, "wb") as f:
        f.write(b"x" * 1000)
        f.truncate(3 << 20)  # a sparse tail, like a snapshot's zero pages
    assert pagecache.prefetch(path) == 3 << 20
