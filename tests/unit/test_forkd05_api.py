"""forkd 0.5 wire compatibility of the REST layer, on FakeRuntime: the fields the published
``forkd`` 0.5.3 SDK and ``forkd-mcp`` 0.2.1 send, compaction and workspaces; plus the two host
helpers behind ``measure_diff`` and ``prewarm``. The published clients themselves drive a real
daemon in tests/integration/test_compat_clients.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from forkd.errors import VMError
from forkd.host import pagecache, procmem
from forkd.sdk import Controller, NotFoundError
from tests.fakes.app import AUTH, TOKEN, app_client
from tests.fakes.runtime import FakeRuntime
from tests.fakes.transport import ViaTestClient

SB = "sb-67a1b3-0000"


@pytest.fixture
def fake() -> FakeRuntime:
    rt = FakeRuntime()
    rt.add_snapshot("py")
    rt.add_sandbox(SB, live_fork=True)
    return rt


@pytest.fixture
def client(tmp_path: Path, fake: FakeRuntime) -> Iterator[TestClient]:
    with app_client(tmp_path, fake, headers=AUTH) as c:
        yield c


def error(resp: Any, status: int) -> str:
    assert resp.status_code == status, resp.text
    assert set(resp.json()) == {"error"}
    return str(resp.json()["error"])


# ------------------------------------------------------------------ spawn


def test_mcp_spawn_body_is_accepted_and_prewarm_reaches_the_runtime(client: TestClient,
                                                                    fake: FakeRuntime) -> None:
    # forkd-mcp 0.2.1's spawn_sandboxes always sends exactly this shape.
    body = {"snapshot_tag": "py", "n": 1, "per_child_netns": False, "memory_limit_mib": 256,
            "prewarm": False}
    assert client.post("/v1/sandboxes", json=body).status_code == 201
    assert client.post("/v1/sandboxes", json={**body, "prewarm": True, "hugepages": True,
                                              "live_fork": True}).status_code == 201
    spawns = [c for c in fake.calls if c.name == "spawn"]
    assert "prewarm" not in spawns[0].kwargs and spawns[1].kwargs["prewarm"] is True


def test_unknown_fields_no_client_sends_are_still_400(client: TestClient) -> None:
    assert "unknown field 'prewarn'" in error(
        client.post("/v1/sandboxes", json={"snapshot_tag": "py", "prewarn": True}), 400)
    assert "unknown field 'measure'" in error(
        client.post(f"/v1/sandboxes/{SB}/branch", json={"measure": True}), 400)
    assert error(client.post("/v1/sandboxes", json={"snapshot_tag": "py", "hugepages": "yes"}), 400)


# ------------------------------------------------------------------ branch


def test_measure_diff_reports_the_anchors_fields(client: TestClient, fake: FakeRuntime) -> None:
    resp = client.post(f"/v1/sandboxes/{SB}/branch", json={"measure_diff": True})
    assert resp.status_code == 201, resp.text
    info = resp.json()
    assert {"diff_ms", "diff_physical_bytes", "diff_logical_bytes"} <= set(info)
    assert info["diff_logical_bytes"] == 512 << 20
    assert fake.calls[-1].kwargs == {"tag": None, "mode": "full", "wait": True, "measure_diff": True}
    # The fields are kept with the snapshot, as the anchor's registry kept them.
    assert client.get(f"/v1/snapshots/{info['tag']}").json()["diff_physical_bytes"] == 128 << 20


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
def test_mode_rules_of_the_anchor(client: TestClient, fake: FakeRuntime, body: dict[str, Any]) -> None:
    error(client.post(f"/v1/sandboxes/{SB}/branch", json=body), 400)
    assert "branch" not in fake.names()


def test_legacy_live_is_mode_live(client: TestClient, fake: FakeRuntime) -> None:
    resp = client.post(f"/v1/sandboxes/{SB}/branch", json={"live": True, "wait": False})
    assert resp.status_code == 201, resp.text
    assert fake.calls[-1].kwargs["mode"] == "live" and fake.calls[-1].kwargs["wait"] is False


def test_parent_tag_is_checked_against_the_lineage(client: TestClient) -> None:
    first = client.post(f"/v1/sandboxes/{SB}/branch", json={"diff": True, "parent_tag": "py"})
    assert first.status_code == 201, first.text
    # The next branch is recorded on the first one; the source's snapshot is still accepted.
    for parent in (first.json()["tag"], "py"):
        assert client.post(f"/v1/sandboxes/{SB}/branch", json={"parent_tag": parent}).status_code == 201
    assert "not the parent" in error(
        client.post(f"/v1/sandboxes/{SB}/branch", json={"mode": "diff", "parent_tag": "other"}), 409)


def test_unknown_but_well_formed_id_is_404(client: TestClient) -> None:
    assert "not alive" in error(client.get("/v1/sandboxes/sb-nope-0000"), 404)
    assert "invalid sandbox id" in error(client.get("/v1/sandboxes/.hidden"), 400)


# ------------------------------------------------------------------ compact


def test_compact(client: TestClient, fake: FakeRuntime) -> None:
    resp = client.post("/v1/snapshots/py/compact", json={"to": "py-flat"})
    assert resp.status_code == 201, resp.text
    assert resp.json()["tag"] == "py-flat" and resp.json()["compacted_from"] == "py"
    error(client.post("/v1/snapshots/py/compact", json={"to": "py-flat"}), 409)
    error(client.post("/v1/snapshots/nope/compact", json={"to": "x"}), 404)
    error(client.post("/v1/snapshots/py/compact", json={}), 400)
    error(client.post("/v1/snapshots/py/compact", json={"to": "../x"}), 400)


# ------------------------------------------------------------------ workspaces


def test_workspace_lifecycle(client: TestClient, fake: FakeRuntime) -> None:
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
    assert sandbox not in fake.sandboxes


def test_suspend_diff_flag_picks_the_mode(client: TestClient, fake: FakeRuntime) -> None:
    client.post("/v1/workspaces", json={"name": "w2", "snapshot_tag": "py"})
    assert client.post("/v1/workspaces/w2/suspend", json={"diff": True}).status_code == 200
    assert [c.kwargs for c in fake.calls if c.name == "suspend_workspace"] == [{"mode": "diff"}]


def test_our_sdk_speaks_compact_and_workspaces(client: TestClient, fake: FakeRuntime) -> None:
    with Controller(url="http://forkd.test", token=TOKEN, transport=ViaTestClient(client)) as c:
        assert c.compact_snapshot("py", "py-flat")["compacted_from"] == "py"
        made = c.create_workspace("w3", "py", memory_limit_mib=256)
        assert made["status"] == "running"
        assert c.suspend_workspace("w3", diff=True)["status"] == "suspended"
        assert [w["name"] for w in c.list_workspaces()] == ["w3"]
        assert c.resume_workspace("w3")["live_sandbox_id"] == made["live_sandbox_id"]
        assert c.get_workspace("w3")["status"] == "running"
        c.delete_workspace("w3")
        with pytest.raises(NotFoundError, match="workspace 'w3'"):
            c.get_workspace("w3")
    suspends = [call.kwargs for call in fake.calls if call.name == "suspend_workspace"]
    assert suspends == [{"mode": "diff"}]


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
