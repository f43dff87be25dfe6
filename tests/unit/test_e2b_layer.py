"""The E2B layer's routing, credentials and error shapes, and its file transfers, on the real
runtime over the QEMU double (tests/fakes/vmm.py, guest.py): every route reaches the real
controller, and what a sandbox's guest was asked is read from its request log.

The SDKs themselves run against a real daemon in tests/integration/test_compat_clients.py;
these check, fast, that each failure reaches the SDK in the shape it maps to the right
exception, and that no credential opens what it should not.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import io
import json
import tarfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from forkd.api.e2b import uploads
from forkd.api.e2b.guest_metrics import METRICS_SCRIPT
from forkd.api.e2b.shapes import ENVD_VERSION
from forkd.api.e2b.tokens import AccessTokens, load_or_make_key
from forkd.controller.runtime import SnapshotSpec
from forkd.errors import InvalidRequest, TooLarge
from forkd.guest.client import AgentClient
from forkd.host import childnet
from tests.fakes.app import TOKEN, Daemon, daemon_app

SB = "sb-67a1b3-0000"  # an id no sandbox has, where any id does
OTHER = "sb-67a1b3-0001"
KEY = {"X-API-KEY": TOKEN}


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with daemon_app(tmp_path, snapshots=("base",), max_file_bytes=1 << 20) as d:
        yield d


@pytest.fixture
def sb(daemon: Daemon) -> str:
    """A running sandbox of ``base``."""
    return daemon.sandbox("base").id


@pytest.fixture
def other(daemon: Daemon, sb: str) -> str:
    """Another, started after ``sb``."""
    return daemon.sandbox("base").id


@pytest.fixture
def client(daemon: Daemon) -> TestClient:
    return daemon.client


def alive(daemon: Daemon) -> set[str]:
    return {r.id for r in daemon.runtime.list_sandboxes()}


def created(daemon: Daemon, resp: Any) -> Any:
    """The record of the sandbox an E2B create answered with."""
    assert resp.status_code == 201, resp.text
    return daemon.runtime.get_sandbox(resp.json()["sandboxID"])


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


def put(daemon: Daemon, sandbox_id: str, path: str, data: bytes) -> None:
    """A file in the sandbox's guest, written through the real files API."""
    daemon.run(daemon.runtime.files.write, sandbox_id, path, _chunks(data), max_bytes=1 << 20)


def stored(daemon: Daemon, sandbox_id: str, path: str) -> bytes | None:
    """The file's bytes in the sandbox's guest (None if there is none), read through the real files API."""

    async def read() -> bytes | None:
        listing = await daemon.runtime.files.list(sandbox_id, path.rsplit("/", 1)[0] or "/")
        names = {e["path"] for e in listing["entries"]}
        if path not in names:
            return None
        _, pieces = await daemon.runtime.files.open_read(sandbox_id, path)
        return b"".join([p async for p in pieces])

    return daemon.run(read)


def snapshots(daemon: Daemon) -> set[str]:
    return {s.tag for s in daemon.runtime.list_snapshots()}


def asked(daemon: Daemon, sandbox_id: str, *actions: str) -> list[dict[str, Any]]:
    """The sandbox's guest's requests of ``actions``, in order."""
    return [r for r in daemon.guest_requests(sandbox_id) if r.get("action") in actions]


def settle(daemon: Daemon, done: Callable[[], bool]) -> None:
    """Let the daemon's loop run until ``done()`` (what its own tasks do, e.g. the reaper's kill)."""
    for _ in range(400):
        if done():
            return
        daemon.run(asyncio.sleep, 0.025)
    assert done()


def envd_headers(sandbox: str, token: str | None = None, port: str = "49983") -> dict[str, str]:
    return {"E2b-Sandbox-Id": sandbox, "E2b-Sandbox-Port": port,
            "X-Access-Token": token if token is not None else AccessTokens(TOKEN.encode()).envd(sandbox)}


def basic(user: str) -> dict[str, str]:
    """The header E2B's SDK sends for ``user=...`` (envd >= 0.4.0 sends none for its default user)."""
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:".encode()).decode()}


def rest_error(resp: Any, status: int) -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"code", "message"} and body["code"] == status, body
    return str(body["message"])


# ------------------------------------------------------------------ control plane


def test_the_control_plane_wants_the_daemon_token_as_api_key(client: TestClient, sb: str) -> None:
    assert "E2B_API_KEY" in rest_error(client.get(f"/sandboxes/{sb}"), 401)
    assert "E2B_API_KEY" in rest_error(client.get(f"/sandboxes/{sb}", headers={"X-API-KEY": "nope"}), 401)
    # forkd's own API still wants its bearer token, not the API key.
    assert client.get("/v1/sandboxes", headers={"X-API-KEY": TOKEN}).status_code == 401


def test_the_control_plane_before_the_runtime_is_made_is_503_in_the_sdk_shape(tmp_path: Path) -> None:
    """Its routes take the runtime by ``Depends`` (e2b/deps.py): until the daemon's lifespan made
    one, each answers 503 in E2B's shape, and the unserved paths still answer 501."""
    from forkd.api.e2b.control import create_control_app
    from forkd.api.limits import BranchGate

    app = create_control_app(lambda: None, AccessTokens(TOKEN.encode()), TOKEN, BranchGate(1),
                             tmp_path / "uploads")
    key = {"X-API-KEY": TOKEN}
    with TestClient(app, raise_server_exceptions=False) as early:
        for resp in (early.get(f"/sandboxes/{SB}", headers=key), early.get("/v2/sandboxes", headers=key),
                     early.get("/snapshots", headers=key), early.get("/templates/web/tags", headers=key),
                     early.get("/templates/aliases/web", headers=key), early.get("/volumes", headers=key)):
            assert "still starting" in rest_error(resp, 503)
        assert "not supported by forkd" in rest_error(early.get("/teams", headers=key), 501)
        assert "E2B_API_KEY" in rest_error(early.get(f"/sandboxes/{SB}"), 401)


@pytest.mark.parametrize(("body", "why"), [
    ({}, "templateID"),
    ({"templateID": "base", "allow_internet_access": "yes"}, "allow_internet_access"),
    ({"templateID": "base", "network": {"rules": {"x": []}}}, "network.rules"),
    ({"templateID": "base", "volumeMounts": [{"name": "v", "path": "/etc"}]}, "would cover the guest's own"),
    ({"templateID": "base", "volumeMounts": [{"name": "v"}]}, "volumeMounts[0] must be an object"),
    ({"templateID": "base", "mcp": ["not", "an", "object"]}, "mcp must be an object"),
    ({"templateID": "base", "timeout": "300"}, "timeout"),
    ({"templateID": "base", "envVars": {"A": 1}}, "envVars"),
    ({"templateID": "base", "bogus": 1}, "unknown field"),
])
def test_create_refuses_what_it_cannot_do_in_the_sdk_shape(daemon: Daemon, client: TestClient,
                                                            body: dict[str, Any], why: str) -> None:
    assert why in rest_error(client.post("/v2/sandboxes", json=body, headers={"X-API-KEY": TOKEN}), 400)
    assert alive(daemon) == set()  # nothing started


def test_create_answers_the_sdk_sandbox_model(daemon: Daemon, client: TestClient) -> None:
    before = time.time()
    resp = client.post("/v2/sandboxes", headers={"X-API-KEY": TOKEN},
                       json={"templateID": "base", "metadata": {"a": "b"}, "envVars": {"K": "v"},
                             "autoPause": False, "timeout": 60})
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert body["templateID"] == "base" and body["envdVersion"] == ENVD_VERSION
    tokens = AccessTokens(TOKEN.encode())
    assert body["envdAccessToken"] == tokens.envd(body["sandboxID"])
    assert body["trafficAccessToken"] == tokens.traffic(body["sandboxID"])
    record = created(daemon, resp)
    [restored] = asked(daemon, record.id, "restored")  # the env reaches the guest at its restore
    assert restored["env"] == {"K": "v"} and record.metadata == {"a": "b"}
    assert record.expires_at_unix is not None and before + 60 <= record.expires_at_unix <= time.time() + 60
    # mcp is the SDK's to act on (it starts mcp-gateway in the sandbox): accepted as it is.
    with_mcp = client.post("/v2/sandboxes", headers={"X-API-KEY": TOKEN},
                           json={"templateID": "base", "mcp": {"github": {"token": "x"}}})
    assert with_mcp.status_code == 201, with_mcp.text


def test_auto_pause_hibernates_at_the_timeout_rather_than_kill(daemon: Daemon, client: TestClient) -> None:
    for refused in ({"autoResume": {"enabled": "no"}, "autoPause": True},
                    {"autoResume": {"enabled": True}}):
        assert "autoResume" in rest_error(client.post("/v2/sandboxes", headers={"X-API-KEY": TOKEN},
                                                      json={"templateID": "base", **refused}), 400)
    before = time.time()
    resp = client.post("/v2/sandboxes", headers={"X-API-KEY": TOKEN},
                       json={"templateID": "base", "autoPause": True, "timeout": 60,
                             "autoResume": {"enabled": True}})
    record = created(daemon, resp)
    assert record.hibernate_on_timeout is True and record.expires_at_unix is not None
    assert before + 60 <= record.expires_at_unix <= time.time() + 60
    assert record.auto_resume is True
    # Omitted, as E2B's API takes it: off (traffic does not wake it; connect does).
    resp = client.post("/v2/sandboxes", headers={"X-API-KEY": TOKEN},
                       json={"templateID": "base", "autoPause": True, "timeout": 60})
    assert created(daemon, resp).auto_resume is False


def test_set_timeout_zero_is_now_and_negative_is_refused(daemon: Daemon, client: TestClient, sb: str,
                                                         other: str) -> None:
    """The SDK's ``set_timeout(0)`` (its tests use it to force the timeout's pause at once)."""
    key = {"X-API-KEY": TOKEN}
    negative = client.post(f"/sandboxes/{other}/timeout", headers=key, json={"timeout": -1})
    assert "timeout" in rest_error(negative, 400)
    assert daemon.runtime.get_sandbox(other).expires_at_unix is None  # untouched
    assert client.post(f"/sandboxes/{sb}/timeout", headers=key, json={"timeout": 0}).status_code == 204
    # Due now: the reaper ends it (it was not made with autoPause), and nothing else.
    settle(daemon, lambda: sb not in alive(daemon))
    assert alive(daemon) == {other}


@pytest.fixture
def net(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> str:
    """A snapshot whose children have a NIC (a real netns and tap). The host's IP forwarding is read
    as on: an egress beyond the host needs it, and this host's setting is not the test's."""
    monkeypatch.setattr(childnet, "forwarding_enabled", lambda *_: True)
    daemon.run(daemon.runtime.create_snapshot, SnapshotSpec(tag="net", nic=True))
    return "net"


def test_e2b_network_options_become_the_egress_policy(daemon: Daemon, client: TestClient, net: str) -> None:
    resp = client.post("/v2/sandboxes", headers={"X-API-KEY": TOKEN},
                       json={"templateID": net, "allow_internet_access": True,
                             "network": {"allowOut": ["192.0.2.7:443"], "denyOut": [], "rules": {}}})
    record = created(daemon, resp)
    assert record.network is not None and record.egress is not None
    assert record.egress.info() == {"allow_internet_access": True, "allow_out": ["192.0.2.7:443"],
                                    "deny_out": [], "allow_public_traffic": True, "mask_request_host": None,
                                    "rules": {}}


@pytest.mark.parametrize(("network", "why"), [
    ({"allow_public_traffic": False}, "spells it allowPublicTraffic"),
    ({"allowPublicTrafic": False}, "network.allowPublicTrafic"),
    ({"denyIn": []}, "network.denyIn"),
])
def test_an_unknown_network_field_is_refused_never_a_looser_policy(
        daemon: Daemon, client: TestClient, network: dict[str, Any], why: str, sb: str) -> None:
    """A restriction spelled wrong (even as false or empty) is a 400, not a sandbox with public ports."""
    policy = daemon.runtime.describe_sandbox(sb)["egress"]
    resp = client.post("/v2/sandboxes", headers={"X-API-KEY": TOKEN},
                       json={"templateID": "base", "network": network})
    assert why in rest_error(resp, 400)
    assert alive(daemon) == {sb}  # nothing started
    # The same field in an update is refused too, and the sandbox's policy is untouched.
    update = client.put(f"/sandboxes/{sb}/network", headers={"X-API-KEY": TOKEN}, json=network)
    assert why in rest_error(update, 400)
    assert daemon.runtime.describe_sandbox(sb)["egress"] == policy


def test_the_sdks_camel_case_allow_public_traffic_makes_the_ports_private(
        daemon: Daemon, client: TestClient) -> None:
    resp = client.post("/v2/sandboxes", headers={"X-API-KEY": TOKEN},
                       json={"templateID": "base",
                             "network": {"allowPublicTraffic": False, "dnsServers": []}})
    record = created(daemon, resp)
    assert record.egress is not None and record.egress.info()["allow_public_traffic"] is False


def test_older_sdks_create_and_connect_through_the_v1_routes(daemon: Daemon, client: TestClient,
                                                             sb: str) -> None:
    """SDKs before 2.46 POST /sandboxes (with ``secure``, ignored as E2B ignores it) and
    /sandboxes/{id}/connect (its timeout required)."""
    key = {"X-API-KEY": TOKEN}
    before = time.time()
    resp = client.post("/sandboxes", headers=key,
                       json={"templateID": "base", "timeout": 60, "secure": True, "metadata": {"a": "b"}})
    record = created(daemon, resp)
    assert resp.json()["templateID"] == "base" and resp.json()["envdAccessToken"]
    assert record.metadata == {"a": "b"}
    assert record.expires_at_unix is not None and before + 60 <= record.expires_at_unix <= time.time() + 60
    assert "no_such" in rest_error(client.post("/sandboxes", headers=key,
                                               json={"templateID": "base", "no_such": 1}), 400)
    assert client.post(f"/sandboxes/{sb}/pause", headers=key).status_code == 204
    assert "timeout" in rest_error(client.post(f"/sandboxes/{sb}/connect", headers=key, json={}), 400)
    resumed = client.post(f"/sandboxes/{sb}/connect", headers=key, json={"timeout": 60})
    assert resumed.status_code == 201 and resumed.json()["sandboxID"] == sb, resumed.text


def test_pause_info_list_and_connect_resume(daemon: Daemon, client: TestClient, sb: str, other: str) -> None:
    """E2B's pause, info, list and connect."""
    key = {"X-API-KEY": TOKEN}
    assert client.get(f"/sandboxes/{sb}", headers=key).json()["state"] == "running"
    assert client.post(f"/sandboxes/{sb}/pause", headers=key).status_code == 204
    assert alive(daemon) == {other}  # its VM is gone, its state kept
    assert client.get(f"/sandboxes/{sb}", headers=key).json()["state"] == "paused"
    assert "already paused" in rest_error(client.post(f"/sandboxes/{sb}/pause", headers=key), 409)
    states = {s["sandboxID"]: s["state"] for s in client.get("/v2/sandboxes", headers=key).json()}
    assert states == {sb: "paused", other: "running"}
    resp = client.post(f"/v2/sandboxes/{sb}/connect", headers=key, json={"timeout": 60})
    assert resp.status_code == 201, resp.text
    assert resp.json()["sandboxID"] == sb and resp.json()["templateID"] == "base"
    assert alive(daemon) == {sb, other} and daemon.runtime.get_sandbox(sb).expires_at_unix is not None
    assert client.post(f"/v2/sandboxes/{sb}/connect", headers=key, json={"timeout": 60}).status_code == 200


def test_an_unknown_template_says_how_to_make_it(client: TestClient) -> None:
    resp = client.post("/v2/sandboxes", json={"templateID": "nope"}, headers={"X-API-KEY": TOKEN})
    assert "forkd snapshot --tag nope" in rest_error(resp, 404)


def test_unsupported_control_routes_are_501_in_the_sdk_shape(client: TestClient, sb: str) -> None:
    for method, path in (("GET", f"/sandboxes/{sb}/logs"), ("GET", "/templates/t1"), ("GET", "/teams")):
        assert "docs/E2B.md" in rest_error(client.request(method, path, headers={"X-API-KEY": TOKEN}), 501)


def test_snapshots_are_branches_listed_filtered_and_deleted(daemon: Daemon, client: TestClient, sb: str,
                                                           other: str) -> None:
    """E2B's create_snapshot is a full BRANCH whose tag is the snapshotID (the create route's
    template), list shows sandboxes' snapshots but not forkd's own, delete is forkd's."""
    key = {"X-API-KEY": TOKEN}
    made = client.post(f"/sandboxes/{sb}/snapshots", headers=key, json={})
    assert made.status_code == 201, made.text
    unnamed = made.json()["snapshotID"]
    assert made.json() == {"snapshotID": unnamed, "names": [unnamed]}
    record = daemon.runtime.get_snapshot(unnamed)
    assert record.branched_from == sb and record.mode == "full"
    # A snapshot's time is in whole seconds: the next one is made in a later second, so newer.
    while int(time.time()) <= record.created_at_unix:
        time.sleep(0.05)
    named = client.post(f"/sandboxes/{other}/snapshots", headers=key,
                        json={"name": "snap-x", "memory": False})
    assert named.status_code == 201 and named.json() == {"snapshotID": "snap-x", "names": ["snap-x"]}
    assert daemon.runtime.get_snapshot("snap-x").created_at_unix > record.created_at_unix  # newer
    # A sandbox made from it forks from that tag.
    child = client.post("/v2/sandboxes", headers=key, json={"templateID": "snap-x"})
    assert child.status_code == 201 and child.json()["templateID"] == "snap-x"
    # A paused sandbox's state snapshot is forkd's own: not listed.
    assert client.post(f"/sandboxes/{other}/pause", headers=key).status_code == 204

    def listed(query: str = "") -> list[str]:
        resp = client.get(f"/snapshots{query}", headers=key)
        assert resp.status_code == 200, resp.text
        return [s["snapshotID"] for s in resp.json()]

    assert listed() == ["snap-x", unnamed]
    assert listed(f"?sandboxID={sb}") == [unnamed] and listed("?name=snap-x") == ["snap-x"]
    assert listed("?name=snap-x-does-not-exist") == []
    page = client.get("/snapshots?limit=1", headers=key)
    assert [s["snapshotID"] for s in page.json()] == ["snap-x"] and page.headers["x-next-token"] == "1"
    assert listed("?limit=1&nextToken=1") == [unnamed]
    # Taken names, bad names, paused sources and unknown fields are refused, saying why.
    assert "exists already" in rest_error(
        client.post(f"/sandboxes/{sb}/snapshots", headers=key, json={"name": "base"}), 409)
    assert "not a forkd snapshot tag" in rest_error(
        client.post(f"/sandboxes/{sb}/snapshots", headers=key, json={"name": "team/x:v1"}), 400)
    assert "is paused" in rest_error(client.post(f"/sandboxes/{other}/snapshots", headers=key, json={}), 409)
    assert "unknown field" in rest_error(
        client.post(f"/sandboxes/{sb}/snapshots", headers=key, json={"names": "x"}), 400)
    assert "limit" in rest_error(client.get("/snapshots?limit=0", headers=key), 400)
    rest_error(client.post("/sandboxes/sb-67a1b3-0009/snapshots", headers=key, json={}), 404)
    # Delete: the SDK's delete_snapshot is DELETE /templates/{id}: True (204), then False (404).
    # forkd refuses to delete what a sandbox or a later snapshot (here other's paused state) needs.
    assert "dependent snapshots" in rest_error(client.delete("/templates/snap-x", headers=key), 409)
    assert "snap-x" in snapshots(daemon)
    assert client.delete(f"/templates/{unnamed}", headers=key).status_code == 204
    assert unnamed not in snapshots(daemon)
    rest_error(client.delete(f"/templates/{unnamed}", headers=key), 404)
    rest_error(client.delete("/templates/.hidden", headers=key), 404)
    # Templates (and forkd's own snapshots) are not deleted through E2B's API.
    assert "DELETE /v1/snapshots/base" in rest_error(client.delete("/templates/base", headers=key), 400)
    assert "base" in snapshots(daemon)


def test_bodies_are_bounded_in_the_sdk_shape(client: TestClient) -> None:
    big = {"templateID": "base", "metadata": {"k": "x" * (2 << 20)}}
    assert "limit" in rest_error(client.post("/v2/sandboxes", json=big, headers={"X-API-KEY": TOKEN}), 413)


def test_list_is_newest_first_unless_asked_otherwise(daemon: Daemon, client: TestClient, sb: str,
                                                     other: str) -> None:
    """E2B's spec: ``GET /v2/sandboxes`` is by start time, newest first by default (issue 20)."""
    assert daemon.runtime.describe_sandbox(sb)["started"] < daemon.runtime.describe_sandbox(other)["started"]
    key = {"X-API-KEY": TOKEN}

    def ids(**params: str) -> list[str]:
        resp = client.get("/v2/sandboxes", params=params, headers=key)
        assert resp.status_code == 200, resp.text
        return [e["sandboxID"] for e in resp.json()]

    assert ids() == [other, sb]
    assert ids(order="desc") == [other, sb]
    assert ids(order="asc") == [sb, other]
    # Pages follow the same order.
    first = client.get("/v2/sandboxes", params={"limit": "1"}, headers=key)
    assert [e["sandboxID"] for e in first.json()] == [other]
    assert ids(limit="1", nextToken=first.headers["x-next-token"]) == [sb]
    assert "order" in rest_error(client.get("/v2/sandboxes", params={"order": "up"}, headers=key), 400)


def test_a_filesystem_only_pause_is_a_disk_only_hibernation(daemon: Daemon, client: TestClient,
                                                            sb: str) -> None:
    """``pause(keep_memory=False)`` (``memory: false``) keeps the disk alone: a disk-only hibernation,
    listed as paused, that envd traffic does not wake even with autoResume on (E2B's auto-resume
    refuses such a sandbox); connect resumes it (a cold boot) under the same id and token."""
    key = {"X-API-KEY": TOKEN}
    assert daemon.runtime.get_sandbox(sb).auto_resume is True
    resp = client.post(f"/sandboxes/{sb}/pause", json={"memory": False}, headers=key)
    assert resp.status_code == 204, resp.text
    assert not daemon.runtime.suspender.has(sb)  # not forkd's pause
    hibernation = daemon.runtime.get_sandbox(sb).hibernation
    assert hibernation is not None and hibernation.memory is False
    assert client.get(f"/sandboxes/{sb}", headers=key).json()["state"] == "paused"
    asleep = client.get("/health", headers=envd_headers(sb))
    assert asleep.status_code == 502 and "filesystem-only" in asleep.json()["message"], asleep.text
    assert "already paused" in rest_error(client.post(f"/sandboxes/{sb}/pause", json={"memory": False},
                                                      headers=key), 409)
    resumed = client.post(f"/sandboxes/{sb}/connect", json={"timeout": 60}, headers=key)
    assert resumed.status_code == 201, resumed.text
    assert resumed.json()["sandboxID"] == sb
    assert resumed.json()["envdAccessToken"] == client.post(
        f"/sandboxes/{sb}/connect", json={"timeout": 60}, headers=key).json()["envdAccessToken"]
    assert client.get("/health", headers=envd_headers(sb)).status_code == 204
    assert "memory" in rest_error(client.post(f"/sandboxes/{sb}/pause", json={"memory": "no"},
                                              headers=key), 400)
    # At a timeout: autoPauseMemory false asks for the filesystem-only pause then (a disk-only
    # hibernation), without autoResume; it means nothing without autoPause.
    made = client.post("/v2/sandboxes", headers=key, json={"templateID": "base", "autoPause": True,
                                                           "autoPauseMemory": False, "timeout": 3})
    record = created(daemon, made)
    assert record.hibernate_on_timeout is True and record.hibernate_on_timeout_memory is False
    assert record.auto_resume is False
    for body in ({"autoPauseMemory": False}, {"autoPause": True, "autoPauseMemory": False,
                                              "autoResume": {"enabled": True}},
                 {"autoPause": True, "autoPauseMemory": "no"}):
        assert "autoPauseMemory" in rest_error(client.post("/v2/sandboxes", headers=key,
                                                           json={"templateID": "base", **body}), 400)
    # With its memory (the default, or memory: true): forkd's pause, a branch of its state.
    assert client.post(f"/sandboxes/{sb}/pause", json={"memory": True}, headers=key).status_code == 204
    paused = daemon.runtime.suspender.get(sb)
    assert daemon.runtime.get_snapshot(paused.state_tag).mode == "full"


GUEST_METRICS = """MemTotal:         482012 kB
MemAvailable:     400000 kB
Cached:            50000 kB
cpu  100 0 100 800 0 0 0 0 0 0
cpu  150 0 150 900 0 0 0 0 0 0
ncpu 2
/dev/vda 2040373248 612345678 1400000000 31% /
"""


class _Agent:
    """The real typed agent calls (``AgentClient``), but for those a test's subclass answers itself."""

    def __init__(self, real: AgentClient) -> None:
        self.real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_metrics_are_a_sample_taken_in_the_guest(daemon: Daemon, client: TestClient, sb: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``get_metrics``: one sample from the guest's /proc and df, now; none for a range the
    sandbox did not run in (issue 20)."""
    gateway = daemon.runtime.agents
    real_call = gateway.call
    scripts: list[object] = []

    class Guest(_Agent):
        """The guest's shell, at the agent gateway: the metrics script prints this guest's /proc and df."""

        async def exec(self, req: dict[str, Any], timeout: float) -> dict[str, Any]:
            if req.get("args") == ["/bin/sh", "-c", METRICS_SCRIPT]:
                scripts.append(req["args"])
                return {"stdout": GUEST_METRICS, "stderr": "", "exit_code": 0, "error": None,
                        "timed_out": False}
            return await self.real.exec(req, timeout)

    async def call(sandbox_id: str, ask: Callable[[Any], Awaitable[Any]]) -> Any:
        return await real_call(sandbox_id, lambda agent: ask(Guest(agent)))

    monkeypatch.setattr(gateway, "call", call)
    key = {"X-API-KEY": TOKEN}
    resp = client.get(f"/sandboxes/{sb}/metrics", headers=key)
    assert resp.status_code == 200, resp.text
    [sample] = resp.json()
    assert (sample["cpuCount"], sample["cpuUsedPct"]) == (2, 50.0)  # 100 busy of 200 jiffies
    assert (sample["memTotal"], sample["memUsed"], sample["memCache"]) == (
        482012 * 1024, 82012 * 1024, 50000 * 1024)
    assert (sample["diskTotal"], sample["diskUsed"]) == (2040373248, 612345678)
    assert abs(sample["timestampUnix"] - time.time()) < 60
    assert len(scripts) == 1  # the route ran the script in the guest
    started = int(daemon.runtime.get_sandbox(sb).created_at_unix)
    before = client.get(f"/sandboxes/{sb}/metrics", params={"start": started - 7200, "end": started - 3600},
                        headers=key)
    assert before.json() == []
    assert client.get(f"/sandboxes/{sb}/metrics", params={"start": int(time.time()) - 5},
                      headers=key).json() != []
    bogus = client.get(f"/sandboxes/{sb}/metrics", params={"bogus": 1}, headers=key)
    assert "bogus" in rest_error(bogus, 400)


# ------------------------------------------------------------------ in-sandbox traffic


def test_each_sandbox_has_its_own_access_token(client: TestClient, sb: str, other: str) -> None:
    assert client.get("/health", headers=envd_headers(sb)).status_code == 204
    other_token = AccessTokens(TOKEN.encode()).envd(other)
    for token in ("", other_token, TOKEN):
        headers = envd_headers(sb, token=token)
        assert "access token" in rest_error(client.get("/health", headers=headers), 401)
    # Connect calls get Connect's error shape.
    resp = client.post("/filesystem.Filesystem/Stat", json={"path": "/tmp"},
                       headers=envd_headers(sb, token="x"))
    assert resp.status_code == 401 and resp.json()["code"] == "unauthenticated"


def test_the_traffic_token_opens_only_the_interpreter(client: TestClient, sb: str) -> None:
    traffic = AccessTokens(TOKEN.encode()).traffic(sb)
    headers = {"E2b-Sandbox-Id": sb, "E2b-Sandbox-Port": "49983", "E2B-Traffic-Access-Token": traffic}
    rest_error(client.get("/health", headers=headers), 401)


def test_a_sandbox_that_is_not_running_answers_like_e2bs_proxy(client: TestClient, sb: str) -> None:
    gone = "sb-000000-0009"
    assert "was not found" in rest_error(client.get("/health", headers=envd_headers(gone)), 502)
    resp = client.post("/filesystem.Filesystem/Stat", json={"path": "/"}, headers=envd_headers(gone))
    assert resp.json()["code"] == "unavailable" and "was not found" in resp.json()["message"]
    assert "port is not open" in rest_error(client.get("/", headers=envd_headers(sb, port="8080")), 502)


def test_files_round_trip_octet_stream_gzip_and_multipart(daemon: Daemon, client: TestClient,
                                                          sb: str) -> None:
    data = bytes(range(256)) * 10
    up = client.post("/files", params={"path": "/tmp/new/a.bin"}, content=data,
                     headers={**envd_headers(sb), "Content-Type": "application/octet-stream"})
    assert up.status_code == 200, up.text
    assert up.json() == [{"name": "a.bin", "type": "file", "path": "/tmp/new/a.bin"}]  # parents made
    assert client.get("/files", params={"path": "/tmp/new/a.bin"}, headers=envd_headers(sb)).content == data

    zipped = client.post("/files", params={"path": "rel.bin"}, content=gzip.compress(data),
                         headers={**envd_headers(sb), "Content-Type": "application/octet-stream",
                                  "Content-Encoding": "gzip"})
    assert zipped.json()[0]["path"] == "/home/user/rel.bin"  # relative paths are under the user's home
    # Every transfer acts as E2B's default user, or as the one the SDK names (query or Basic header).
    transfers = asked(daemon, sb, "file_write_open", "file_read", "file_mkdir", "file_stat")
    assert transfers and {r.get("user") for r in transfers} == {"user"}
    assert stored(daemon, sb, "/home/user/rel.bin") == data
    as_root = client.post("/files", params={"path": "rel.bin", "username": "root"}, content=b"r",
                          headers={**envd_headers(sb), "Content-Type": "application/octet-stream"})
    assert as_root.json()[0]["path"] == "/root/rel.bin"
    opened = asked(daemon, sb, "file_write_open")[-1]
    assert opened["path"] == "/root/rel.bin" and opened["user"] == "root"
    client.get("/files", params={"path": "rel.bin"}, headers={**envd_headers(sb), **basic("root")})
    last = daemon.guest_requests(sb)[-1]
    assert last["action"] in ("file_stat", "file_read") and last["path"] == "/root/rel.bin"
    as_root_reads = [r for r in asked(daemon, sb, "file_stat", "file_read") if r["path"] == "/root/rel.bin"]
    assert as_root_reads and {r.get("user") for r in as_root_reads} == {"root"}
    assert "invalid user" in rest_error(client.get("/files", params={"path": "a", "username": "a/b"},
                                                   headers=envd_headers(sb)), 400)

    multi = client.post("/files", headers=envd_headers(sb),
                        files=[("file", ("/tmp/m1.bin", b"\x00one")), ("file", ("/tmp/m2.bin", b"\xfftwo"))])
    assert [e["path"] for e in multi.json()] == ["/tmp/m1.bin", "/tmp/m2.bin"], multi.text
    assert stored(daemon, sb, "/tmp/m2.bin") == b"\xfftwo"
    assert "No such file" in rest_error(client.get("/files", params={"path": "/nope"},
                                                   headers=envd_headers(sb)), 404)


def test_filesystem_service_speaks_connect_json(daemon: Daemon, client: TestClient, sb: str) -> None:
    put(daemon, sb, "/tmp/f.txt", b"abc")
    stat = client.post("/filesystem.Filesystem/Stat", json={"path": "/tmp/f.txt"}, headers=envd_headers(sb))
    assert stat.status_code == 200, stat.text
    assert stat.json()["entry"]["type"] == "FILE_TYPE_FILE" and stat.json()["entry"]["size"] == "3"
    listed = client.post("/filesystem.Filesystem/ListDir", json={"path": "/tmp"}, headers=envd_headers(sb))
    assert [e["name"] for e in listed.json()["entries"]] == ["f.txt"]
    missing = client.post("/filesystem.Filesystem/Stat", json={"path": "/tmp/x"}, headers=envd_headers(sb))
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    made = client.post("/filesystem.Filesystem/MakeDir", json={"path": "/tmp/d"}, headers=envd_headers(sb))
    assert made.json()["entry"]["type"] == "FILE_TYPE_DIRECTORY"
    again = client.post("/filesystem.Filesystem/MakeDir", json={"path": "/tmp/d"}, headers=envd_headers(sb))
    assert again.json()["code"] == "already_exists"
    watch = client.post("/filesystem.Filesystem/CreateWatcher", json={"path": "/tmp"},
                        headers=envd_headers(sb))
    watcher = watch.json()["watcherId"]
    daemon.run(daemon.runtime.files.mkdir, sb, "/tmp/e")  # in the guest, after the watch began
    got = client.post("/filesystem.Filesystem/GetWatcherEvents", json={"watcherId": watcher},
                      headers=envd_headers(sb))
    assert got.json()["events"] == [{"name": "e", "type": "EVENT_TYPE_CREATE"}]
    stop = client.post("/filesystem.Filesystem/RemoveWatcher", json={"watcherId": watcher},
                       headers=envd_headers(sb))
    assert stop.status_code == 200
    gone = client.post("/filesystem.Filesystem/GetWatcherEvents", json={"watcherId": watcher},
                       headers=envd_headers(sb))
    assert gone.json()["code"] == "not_found"


def test_filesystem_calls_act_as_the_named_user(daemon: Daemon, client: TestClient, sb: str) -> None:
    """E2B's default user is ``user`` (relative paths under /home/user); ``user="root"`` arrives as a
    Basic Authorization header and is honoured; a malformed one is refused."""
    put(daemon, sb, "/home/user/f.txt", b"abc")
    put(daemon, sb, "/root/g.txt", b"abc")

    def last() -> tuple[str, str | None]:
        request = daemon.guest_requests(sb)[-1]
        return request["path"], request.get("user")

    stat = client.post("/filesystem.Filesystem/Stat", json={"path": "f.txt"}, headers=envd_headers(sb))
    assert stat.status_code == 200, stat.text
    assert last() == ("/home/user/f.txt", "user")
    stat = client.post("/filesystem.Filesystem/Stat", json={"path": "g.txt"},
                       headers={**envd_headers(sb), **basic("root")})
    assert stat.status_code == 200, stat.text
    assert last() == ("/root/g.txt", "root")
    client.post("/filesystem.Filesystem/MakeDir", json={"path": "d"}, headers=envd_headers(sb))
    assert [(r["action"], r.get("user")) for r in daemon.guest_requests(sb)[-2:]] == [
        ("file_mkdir", "user"), ("file_stat", "user")]
    for bad in ("Bearer x", "Basic %%%", "Basic " + base64.b64encode(b"a b:").decode()):
        resp = client.post("/filesystem.Filesystem/Stat", json={"path": "f.txt"},
                           headers={**envd_headers(sb), "Authorization": bad})
        assert resp.status_code == 400 and resp.json()["code"] == "invalid_argument", (bad, resp.text)


def test_removing_what_is_not_there_is_done(daemon: Daemon, client: TestClient, sb: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """envd's Remove of a missing path succeeds (issue 20); a gone sandbox is still an error."""
    put(daemon, sb, "/tmp/f.txt", b"abc")
    for path in ("/tmp/f.txt", "/tmp/f.txt", "/tmp/never/there"):
        resp = client.post("/filesystem.Filesystem/Remove", json={"path": path}, headers=envd_headers(sb))
        assert resp.status_code == 200 and resp.json() == {}, resp.text
    assert stored(daemon, sb, "/tmp/f.txt") is None
    files = daemon.runtime.files
    real_remove = files.remove

    async def gone(sandbox_id: str, path: str, *, recursive: bool = False, user: str | None = None) -> None:
        await daemon.runtime.kill(sandbox_id)  # killed while the call was on its way
        await real_remove(sandbox_id, path, recursive=recursive, user=user)

    monkeypatch.setattr(files, "remove", gone)
    resp = client.post("/filesystem.Filesystem/Remove", json={"path": "/tmp/x"}, headers=envd_headers(sb))
    assert resp.json()["code"] == "unavailable" and "was not found" in resp.json()["message"], resp.text


def test_entries_carry_owner_group_and_symlink_target(daemon: Daemon, client: TestClient, sb: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's owner and group names and a link's resolved target reach envd's EntryInfo (issue 20)."""
    link = {"path": "/root/ln", "name": "ln", "type": "file", "size": 3, "mode": 0o644, "mtime": 1.5,
            "owner": "root", "group": "staff", "target": "/root/d/f.txt"}
    dangling = {**link, "name": "dead", "path": "/root/dead", "type": "symlink", "target": "/root/nope"}
    plain = {**link, "name": "f.txt", "path": "/root/d/f.txt"}
    del plain["target"]

    gateway = daemon.runtime.agents
    real_call = gateway.call

    class Guest(_Agent):
        """The agent's answers for a guest with a link and other owners (the scripted guest has neither)."""

        async def file_stat(self, req: dict[str, Any], timeout: float) -> Any:
            if req.get("path") == "/home/user/ln":  # "ln" as E2B's user
                return link
            return await self.real.file_stat(req, timeout)

        async def file_list(self, req: dict[str, Any], timeout: float) -> Any:
            if req.get("path") == "/root":
                return {"path": "/root", "entries": [dangling, plain], "truncated": False}
            return await self.real.file_list(req, timeout)

    async def call(sandbox_id: str, ask: Callable[[Any], Awaitable[Any]]) -> Any:
        return await real_call(sandbox_id, lambda agent: ask(Guest(agent)))

    monkeypatch.setattr(gateway, "call", call)
    resp = client.post("/filesystem.Filesystem/Stat", json={"path": "ln"}, headers=envd_headers(sb))
    assert resp.status_code == 200, resp.text
    entry = resp.json()["entry"]
    assert entry["type"] == "FILE_TYPE_FILE" and entry["symlinkTarget"] == "/root/d/f.txt"
    assert entry["owner"] == "root" and entry["group"] == "staff" and entry["permissions"] == "-rw-r--r--"
    assert entry["isSymlink"] is True
    entries = client.post("/filesystem.Filesystem/ListDir", json={"path": "/root"},
                          headers=envd_headers(sb)).json()["entries"]
    assert [(e["type"], e.get("symlinkTarget"), e.get("isSymlink", False)) for e in entries] == [
        ("FILE_TYPE_SYMLINK", "/root/nope", True), ("FILE_TYPE_FILE", None, False)]


# ------------------------------------------------------------------ pieces


async def _stream(*chunks: bytes) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c


def test_gzip_bombs_stop_at_the_limit() -> None:
    import asyncio

    bomb = gzip.compress(b"\0" * (4 << 20))

    async def drain() -> int:
        return sum([len(x) async for x in uploads.inflate(_stream(bomb), 1 << 20)])

    with pytest.raises(TooLarge):
        asyncio.run(drain())
    with pytest.raises(InvalidRequest):
        asyncio.run(uploads.inflate(_stream(b"not gzip"), 1 << 20).__anext__())


def test_the_key_is_made_once_and_private(tmp_path: Path) -> None:
    key = load_or_make_key(tmp_path)
    assert load_or_make_key(tmp_path) == key and len(key) == 32
    assert (tmp_path / "e2b.key").stat().st_mode & 0o777 == 0o600
    assert AccessTokens(key).envd(SB) != AccessTokens(key).envd(OTHER) != AccessTokens(key).traffic(OTHER)
    assert json.dumps(AccessTokens(lambda: key).envd(SB)) == json.dumps(AccessTokens(key).envd(SB))


def _signed(path: str, operation: str, user: str | None, sandbox: str,
            expires_in: int | None = None) -> dict[str, str]:
    """The query of a signed file URL, made by the published SDK's own signing function."""
    from e2b.sandbox.signature import get_signature

    signed = get_signature(path, operation, user, AccessTokens(TOKEN.encode()).envd(sandbox),
                           expires_in)
    query = {"path": path, "signature": signed["signature"]}
    if user:
        query["username"] = user
    if signed["expiration"] is not None:
        query["signature_expiration"] = str(signed["expiration"])
    return query


def test_a_signed_file_url_names_its_sandbox_and_stands_for_its_token(daemon: Daemon, client: TestClient,
                                                                      sb: str, other: str) -> None:
    """``download_url``/``upload_url`` of a secure sandbox: no token and no E2b-Sandbox-Id, the
    signature alone; it opens that sandbox's file and nothing else (issue 20)."""
    put(daemon, sb, "/home/user/s.txt", b"signed")
    resp = client.get("/files", params=_signed("s.txt", "read", "user", sb))
    assert resp.status_code == 200 and resp.content == b"signed", resp.text
    resp = client.get("/files", params=_signed("s.txt", "read", "user", sb, expires_in=120))
    assert resp.status_code == 200 and resp.content == b"signed", resp.text
    up = client.post("/files", params=_signed("up.txt", "write", "user", sb), content=b"uploaded",
                     headers={"Content-Type": "application/octet-stream"})
    assert up.status_code == 200, up.text
    assert stored(daemon, sb, "/home/user/up.txt") == b"uploaded"
    # Expired: E2B's exact answer.
    resp = client.get("/files", params=_signed("s.txt", "read", "user", sb, expires_in=-120))
    assert resp.status_code == 401 and resp.json() == {"code": 401, "message": "signature is already expired"}
    # A read signature does not write, another path is not covered, another user is not the signer.
    for params, method in ((_signed("s.txt", "read", "user", sb), "POST"),
                           ({**_signed("s.txt", "read", "user", sb), "path": "other.txt"}, "GET"),
                           ({**_signed("s.txt", "read", "user", sb), "username": "root"}, "GET")):
        resp = client.request(method, "/files", params=params)
        assert resp.status_code == 401, (params, resp.text)
    # Aimed at another sandbox with this one's signature: the token check refuses it.
    resp = client.get("/files", params=_signed("s.txt", "read", "user", sb),
                      headers={"E2b-Sandbox-Id": other, "E2b-Sandbox-Port": "49983"})
    assert resp.status_code == 401, resp.text
    # Not a signature at all: a clear 400 before any hashing.
    resp = client.get("/files", params={"path": "s.txt", "signature": "x" * 500})
    assert resp.status_code == 400 and "v1 file signature" in resp.json()["message"], resp.text


def test_template_build_through_the_control_plane(daemon: Daemon, client: TestClient) -> None:
    """The calls Template.build makes, in its order, with the statuses the SDK's client parses."""
    key = {"X-API-KEY": TOKEN}
    made = client.post("/v3/templates", json={"name": "web", "cpuCount": 1, "memoryMB": 512}, headers=key)
    assert made.status_code == 202, made.text
    build_id = made.json()["buildID"]
    assert made.json()["templateID"] == "web" and made.json()["names"] == ["web"]
    files_hash = "c" * 64
    link = client.get(f"/templates/web/files/{files_hash}", headers=key)
    assert link.status_code == 201 and link.json()["present"] is False
    url = link.json()["url"]
    assert f"/templates/web/files/{files_hash}?expires=" in url and "&signature=" in url
    assert link.json()["headers"] == {"X-API-KEY": TOKEN}  # SDKs from 2.46 send them with the upload
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("app/a.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"a"))
    # Older SDKs send no key: the URL's signature lets the upload in, for that hash only.
    other_hash = url.replace(files_hash, "e" * 64)
    assert "API key" in rest_error(client.put(other_hash, content=buf.getvalue()), 401)
    assert "API key" in rest_error(client.put(url.replace("signature=", "signature=0"), content=b"x"), 401)
    expired = url.split("?")[0] + "?expires=1&signature=" + url.split("signature=")[1]
    assert "API key" in rest_error(client.put(expired, content=b"x"), 401)
    assert client.put(url, content=buf.getvalue()).status_code == 200
    assert client.get(f"/templates/web/files/{files_hash}", headers=key).json()["present"] is True
    steps = [{"type": "COPY", "args": ["app/*", "app", "", ""], "filesHash": files_hash},
             {"type": "RUN", "args": ["echo hi"]}]
    started = client.post(f"/v2/templates/web/builds/{build_id}", json={"steps": steps}, headers=key)
    assert started.status_code == 202, started.text
    status: dict[str, Any] = {}
    for _ in range(400):  # the build runs on the daemon's loop
        status = client.get(f"/templates/web/builds/{build_id}/status", headers=key).json()
        if status["status"] not in ("waiting", "building"):
            break
        daemon.run(asyncio.sleep, 0.025)
    assert status["status"] == "ready", status
    steps_logged = [e["step"] for e in status["logEntries"]]
    # The template's own boot ("base") first, then each step in order, then the snapshot.
    assert [k for i, k in enumerate(steps_logged) if k != "base" and k not in steps_logged[:i]] == [
        "1", "2", "finalize"], steps_logged
    assert "web" in snapshots(daemon)
    assert client.get("/templates/aliases/web", headers=key).json() == {"templateID": "web", "public": False}
    assert client.get("/templates/aliases/nope", headers=key).status_code == 404
    # Refused up front, in the SDK's shape.
    other = client.post("/v3/templates", json={"name": "x"}, headers=key).json()["buildID"]
    assert "fromImage: " in rest_error(client.post(
        f"/v2/templates/x/builds/{other}", json={"fromImage": "Ubuntu:22.04"}, headers=key), 400)
    assert "only type" in rest_error(client.post(
        f"/v2/templates/x/builds/{other}", json={"fromImage": "ubuntu:22.04", "fromImageRegistry": {
            "type": "aws", "awsAccessKeyId": "k"}}, headers=key), 400)
    assert "tags must be" in rest_error(client.post("/v3/templates", json={"name": "web", "tags": "a"},
                                                    headers=key), 400)
    assert "neither part empty" in rest_error(client.post("/v3/templates", json={"name": "web:"},
                                                          headers=key), 400)


def test_a_tagged_template_name_is_the_snapshot_alias_dot_tag(daemon: Daemon, client: TestClient) -> None:
    """E2B's alias:tag: built as the snapshot alias.tag, found and started by that name."""
    key = {"X-API-KEY": TOKEN}
    made = client.post("/v3/templates", json={"name": "web:v1-0"}, headers=key)
    assert made.status_code == 202, made.text
    assert made.json()["templateID"] == "web.v1-0" and made.json()["tags"] == ["v1-0"]
    assert made.json()["names"] == ["web:v1-0"] and made.json()["aliases"] == ["web"]
    build_id = made.json()["buildID"]
    started = client.post(f"/v2/templates/web.v1-0/builds/{build_id}", json={"steps": []}, headers=key)
    assert started.status_code == 202, started.text
    settle(daemon, lambda: client.get(f"/templates/web.v1-0/builds/{build_id}/status",
                                      headers=key).json()["status"] not in ("waiting", "building"))
    assert "web.v1-0" in snapshots(daemon)
    assert client.get("/templates/aliases/web:v1-0", headers=key).json()["templateID"] == "web.v1-0"
    # Tags given with a build are more names of its snapshot once it is built.
    tagged = client.post("/v3/templates", json={"name": "api:v2", "tags": ["stable", "api:prod"]},
                         headers=key).json()
    assert tagged["tags"] == ["v2", "stable", "prod"]
    client.post(f"/v2/templates/api.v2/builds/{tagged['buildID']}", json={"steps": []}, headers=key)
    settle(daemon, lambda: client.get(f"/templates/api.v2/builds/{tagged['buildID']}/status",
                                      headers=key).json()["status"] not in ("waiting", "building"))
    assert client.get("/templates/aliases/api:prod", headers=key).json()["templateID"] == "api.v2"
    assert client.get("/templates/aliases/api:stable", headers=key).json()["templateID"] == "api.v2"
    created = client.post("/sandboxes", json={"templateID": "web:v1-0"}, headers=key)
    assert created.status_code == 201, created.text
    assert created.json()["templateID"] == "web.v1-0"
    missing = client.post("/sandboxes", json={"templateID": "web:nope"}, headers=key)
    assert "web.nope" in rest_error(missing, 404)


def test_assigned_tags_are_more_names_of_a_build(daemon: Daemon, client: TestClient) -> None:
    """Template.assign_tags / remove_tags / get_tags: alias:prod stands for the build alias:v1."""
    key = {"X-API-KEY": TOKEN}
    daemon.snapshot("web.v1")
    made = client.post("/templates/tags", json={"target": "web:v1", "tags": ["prod", "web:latest"]},
                       headers=key)
    assert made.status_code == 201, made.text
    assert made.json()["tags"] == ["prod", "latest"]
    build_id = made.json()["buildID"]
    assert str(uuid.UUID(build_id)) == build_id
    created = client.post("/sandboxes", json={"templateID": "web:prod"}, headers=key)
    assert created.status_code == 201 and created.json()["templateID"] == "web.v1", created.text
    assert client.get("/templates/aliases/web:latest", headers=key).json()["templateID"] == "web.v1"
    listed = client.get("/templates/web/tags", headers=key).json()
    assert [t["tag"] for t in listed] == ["v1", "prod", "latest"]
    assert {t["buildID"] for t in listed} == {build_id}
    for bad in (":x", "web:", "other:x"):
        assert "tag" in rest_error(client.post("/templates/tags", json={"target": "web:v1", "tags": [bad]},
                                               headers=key), 400)
    rest_error(client.post("/templates/tags", json={"target": "web:nope", "tags": ["x"]}, headers=key), 404)
    gone = client.request("DELETE", "/templates/tags", json={"name": "web", "tags": ["prod"]}, headers=key)
    assert gone.status_code == 204, gone.text
    rest_error(client.post("/sandboxes", json={"templateID": "web:prod"}, headers=key), 404)
    assert "own name" in rest_error(client.request("DELETE", "/templates/tags", json={
        "name": "web", "tags": ["v1"]}, headers=key), 400)
    rest_error(client.request("DELETE", "/templates/tags", json={"name": "web", "tags": ["prod"]},
                              headers=key), 404)


def test_template_names() -> None:
    from forkd.api.e2b.template_names import snapshot_tag, tag_of

    assert snapshot_tag("base") == "base" and snapshot_tag("base:default") == "base"
    assert snapshot_tag("my-env:v1.2") == "my-env.v1.2" and tag_of("my-env:v1.2") == "v1.2"
    assert snapshot_tag("a.b") == "a.b" and tag_of("a.b") == "default"
    for bad, message in ((":x", "neither part empty"), ("x:", "neither part empty"),
                         ("a.b:c", "may not hold"), ("a:b:c", "may not hold"), ("a/b", "forkd tag"),
                         ("a:" + "b" * 64, "forkd tag")):
        with pytest.raises(InvalidRequest, match=message):
            snapshot_tag(bad)


def test_template_uploads_live_in_the_data_dir_made_at_the_first_upload(daemon: Daemon) -> None:
    """Nothing in /tmp (a killed daemon used to leave a directory there per start): the
    uploads go to <data>/e2b-uploads, made at the first upload, and a daemon's first upload
    clears what an earlier daemon on that data dir left."""
    uploads = daemon.data / "e2b-uploads"
    assert not uploads.exists()  # not made at the start
    uploads.mkdir(parents=True)  # as an earlier daemon on this data dir left it
    (uploads / "left-by-a-killed-daemon.tar").write_bytes(b"old")
    c = daemon.client
    key = {"X-API-KEY": TOKEN}
    assert c.post("/v3/templates", json={"name": "web"}, headers=key).status_code == 202
    assert (uploads / "left-by-a-killed-daemon.tar").exists()  # not touched before an upload
    upload = c.put(f"/templates/web/files/{'d' * 64}", content=b"plain tar bytes", headers=key)
    assert upload.status_code == 200, upload.text
    assert sorted(p.name for p in uploads.iterdir()) == [f"{'d' * 64}.tar"]
    assert (uploads / f"{'d' * 64}.tar").read_bytes() == b"plain tar bytes"
    assert uploads.stat().st_mode & 0o077 == 0


def test_auto_resume_off_keeps_a_paused_sandbox_asleep_until_connect(daemon: Daemon,
                                                                      client: TestClient) -> None:
    """E2B's autoResume {"enabled": false}: once its timeout paused (hibernated) it, envd traffic
    answers 502 (the SDK's is_running() is False) instead of waking it; connect resumes it."""
    resp = client.post("/v2/sandboxes", headers={"X-API-KEY": TOKEN},
                       json={"templateID": "base", "autoPause": True, "timeout": 60,
                             "autoResume": {"enabled": False}})
    record = created(daemon, resp)
    assert record.hibernate_on_timeout is True and record.auto_resume is False
    sandbox_id, token = resp.json()["sandboxID"], resp.json()["envdAccessToken"]
    headers = envd_headers(sandbox_id, token)
    assert client.get("/health", headers=headers).status_code == 204  # running: served as ever
    daemon.run(daemon.runtime.hibernation.hibernate, sandbox_id)  # what its timeout does
    asleep = client.get("/health", headers=headers)
    assert asleep.status_code == 502 and "autoResume is off" in asleep.json()["message"], asleep.text
    info = client.get(f"/sandboxes/{sandbox_id}", headers={"X-API-KEY": TOKEN})
    assert info.json()["state"] == "paused", info.text
    assert daemon.runtime.get_sandbox(sandbox_id).hibernation is not None  # still asleep
    assert client.post(f"/sandboxes/{sandbox_id}/connect", headers={"X-API-KEY": TOKEN},
                       json={"timeout": 60}).status_code == 201
    assert client.get("/health", headers=headers).status_code == 204
    # With autoResume on, the same request is served (and wakes it).
    resp = client.post("/v2/sandboxes", headers={"X-API-KEY": TOKEN},
                       json={"templateID": "base", "autoPause": True, "timeout": 60,
                             "autoResume": {"enabled": True}})
    woken = created(daemon, resp)
    daemon.run(daemon.runtime.hibernation.hibernate, woken.id)
    assert daemon.runtime.get_sandbox(woken.id).hibernation is not None
    assert client.get("/health", headers=envd_headers(woken.id)).status_code == 204
    stat = client.post("/filesystem.Filesystem/Stat", json={"path": "/tmp"}, headers=envd_headers(woken.id))
    assert stat.status_code == 200, stat.text  # served by its guest: woken
    assert daemon.runtime.get_sandbox(woken.id).hibernation is None


def test_update_network_replaces_the_egress_and_keeps_the_inbound_settings(
        daemon: Daemon, client: TestClient, net: str, other: str) -> None:
    """E2B's ``update_network`` (PUT /sandboxes/{id}/network): allowOut and denyOut replace the old
    lists (omitted: cleared), an omitted allow_internet_access keeps the sandbox's, its port
    settings stay; what forkd lacks is a 400, as is a bad entry."""
    key = {"X-API-KEY": TOKEN}
    sb = created(daemon, client.post("/v2/sandboxes", headers=key, json={
        "templateID": net, "allow_internet_access": True,
        "network": {"denyOut": ["0.0.0.0/0"], "allowOut": ["1.1.1.1"], "allowPublicTraffic": True}})).id

    def egress() -> dict[str, Any]:
        policy = daemon.runtime.get_sandbox(sb).egress
        assert policy is not None
        return policy.info()

    resp = client.put(f"/sandboxes/{sb}/network", headers=key, json={"denyOut": ["8.8.8.8"]})
    assert resp.status_code == 204, resp.text
    assert egress() == {"allow_internet_access": True, "allow_out": [], "deny_out": ["8.8.8.8"],
                        "allow_public_traffic": True, "mask_request_host": None, "rules": {}}
    assert client.put(f"/sandboxes/{sb}/network", headers=key,
                      json={"allow_internet_access": False}).status_code == 204
    assert egress()["allow_internet_access"] is False and egress()["deny_out"] == []
    # Names, exact and wildcard, with ports: as forkd's own API takes them.
    assert client.put(f"/sandboxes/{sb}/network", headers=key, json={
        "allowOut": ["PyPI.org", "*.pythonhosted.org:443"], "denyOut": ["x.example"]}).status_code == 204
    assert egress()["allow_out"] == ["pypi.org", "*.pythonhosted.org:443"]
    assert egress()["deny_out"] == ["x.example"]
    assert "nor a DNS name" in rest_error(client.put(f"/sandboxes/{sb}/network", headers=key,
                                                     json={"allowOut": ["-bad.example"]}), 400)
    assert "egressProxy" in rest_error(client.put(f"/sandboxes/{sb}/network", headers=key,
                                                  json={"egressProxy": {"address": "x:1"}}), 400)
    assert egress()["allow_internet_access"] is False  # the refused ones changed nothing
    no_nic = client.put(f"/sandboxes/{other}/network", headers=key, json={})
    assert "network device" in rest_error(no_nic, 400)


def test_guest_metrics_refuses_what_the_script_does_not_print() -> None:
    from forkd.api.e2b.guest_metrics import guest_metrics

    assert guest_metrics(GUEST_METRICS)["cpu_count"] >= 1
    for garbage in ("", "MemTotal: lots kB", GUEST_METRICS.replace("ncpu", "n")):
        with pytest.raises(ValueError):
            guest_metrics(garbage)
