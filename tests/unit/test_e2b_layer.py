"""The E2B layer's routing, credentials and error shapes, and its file transfers, on FakeRuntime.

The SDKs themselves run against a real daemon in tests/integration/test_compat_clients.py;
these check, fast, that each failure reaches the SDK in the shape it maps to the right
exception, and that no credential opens what it should not.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import tarfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from forkd.api.e2b import uploads
from forkd.api.e2b.shapes import ENVD_VERSION
from forkd.api.e2b.tokens import AccessTokens, load_or_make_key
from forkd.controller.options import SpawnOptions
from forkd.controller.watches import WatchEvent
from forkd.errors import InvalidRequest, NotFound, TooLarge
from forkd.store.records import Hibernation
from tests.fakes.app import TOKEN, app_client
from tests.fakes.runtime import FakeRuntime

SB = "sb-67a1b3-0000"
OTHER = "sb-67a1b3-0001"


@pytest.fixture
def fake() -> FakeRuntime:
    rt = FakeRuntime()
    rt.add_snapshot("base")
    rt.add_sandbox(SB, "base")
    rt.add_sandbox(OTHER, "base")
    rt.guest_files[SB] = {"/": None, "/tmp": None, "/root": None, "/home": None, "/home/user": None}
    return rt


@pytest.fixture
def client(tmp_path: Path, fake: FakeRuntime) -> Iterator[TestClient]:
    with app_client(tmp_path, fake, max_file_bytes=1 << 20) as c:
        yield c


def envd_headers(sandbox: str = SB, token: str | None = None, port: str = "49983") -> dict[str, str]:
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


def test_the_control_plane_wants_the_daemon_token_as_api_key(client: TestClient) -> None:
    assert "E2B_API_KEY" in rest_error(client.get(f"/sandboxes/{SB}"), 401)
    assert "E2B_API_KEY" in rest_error(client.get(f"/sandboxes/{SB}", headers={"X-API-KEY": "nope"}), 401)
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
                     early.get("/templates/aliases/web", headers=key)):
            assert "still starting" in rest_error(resp, 503)
        assert "not supported by forkd" in rest_error(early.get("/volumes", headers=key), 501)
        assert "E2B_API_KEY" in rest_error(early.get(f"/sandboxes/{SB}"), 401)


@pytest.mark.parametrize(("body", "why"), [
    ({}, "templateID"),
    ({"templateID": "base", "allow_internet_access": "yes"}, "allow_internet_access"),
    ({"templateID": "base", "network": {"rules": {"x": []}}}, "network.rules"),
    ({"templateID": "base", "volumeMounts": [{"name": "v", "path": "/v"}]}, "volumeMounts"),
    ({"templateID": "base", "mcp": ["not", "an", "object"]}, "mcp must be an object"),
    ({"templateID": "base", "timeout": "300"}, "timeout"),
    ({"templateID": "base", "envVars": {"A": 1}}, "envVars"),
    ({"templateID": "base", "bogus": 1}, "unknown field"),
])
def test_create_refuses_what_it_cannot_do_in_the_sdk_shape(client: TestClient, fake: FakeRuntime,
                                                            body: dict[str, Any], why: str) -> None:
    assert why in rest_error(client.post("/v2/sandboxes", json=body, headers={"X-API-KEY": TOKEN}), 400)
    assert "spawn" not in fake.names()


def test_create_answers_the_sdk_sandbox_model(client: TestClient, fake: FakeRuntime) -> None:
    resp = client.post("/v2/sandboxes", headers={"X-API-KEY": TOKEN},
                       json={"templateID": "base", "metadata": {"a": "b"}, "envVars": {"K": "v"},
                             "autoPause": False, "timeout": 60})
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert body["templateID"] == "base" and body["envdVersion"] == ENVD_VERSION
    tokens = AccessTokens(TOKEN.encode())
    assert body["envdAccessToken"] == tokens.envd(body["sandboxID"])
    assert body["trafficAccessToken"] == tokens.traffic(body["sandboxID"])
    [call] = [c for c in fake.calls if c.name == "spawn"]
    assert call.kwargs["env"] == {"K": "v"} and call.kwargs["metadata"] == {"a": "b"}
    assert call.kwargs["timeout_secs"] == 60
    # mcp is the SDK's to act on (it starts mcp-gateway in the sandbox): accepted as it is.
    with_mcp = client.post("/v2/sandboxes", headers={"X-API-KEY": TOKEN},
                           json={"templateID": "base", "mcp": {"github": {"token": "x"}}})
    assert with_mcp.status_code == 201, with_mcp.text


def test_auto_pause_hibernates_at_the_timeout_rather_than_kill(client: TestClient, fake: FakeRuntime) -> None:
    for refused in ({"autoResume": {"enabled": "no"}, "autoPause": True},
                    {"autoResume": {"enabled": True}}):
        assert "autoResume" in rest_error(client.post("/v2/sandboxes", headers={"X-API-KEY": TOKEN},
                                                      json={"templateID": "base", **refused}), 400)
    resp = client.post("/v2/sandboxes", headers={"X-API-KEY": TOKEN},
                       json={"templateID": "base", "autoPause": True, "timeout": 60,
                             "autoResume": {"enabled": True}})
    assert resp.status_code == 201, resp.text
    [call] = [c for c in fake.calls if c.name == "spawn"]
    assert call.kwargs["hibernate_on_timeout"] is True and call.kwargs["timeout_secs"] == 60
    assert call.kwargs.get("auto_resume", True) is True  # the option's default: not given
    # Omitted, as E2B's API takes it: off (traffic does not wake it; connect does).
    resp = client.post("/v2/sandboxes", headers={"X-API-KEY": TOKEN},
                       json={"templateID": "base", "autoPause": True, "timeout": 60})
    assert resp.status_code == 201, resp.text
    assert [c for c in fake.calls if c.name == "spawn"][-1].kwargs["auto_resume"] is False


def test_set_timeout_zero_is_now_and_negative_is_refused(client: TestClient, fake: FakeRuntime) -> None:
    """The SDK's ``set_timeout(0)`` (its tests use it to force the timeout's pause at once)."""
    key = {"X-API-KEY": TOKEN}
    assert client.post(f"/sandboxes/{SB}/timeout", headers=key, json={"timeout": 0}).status_code == 204
    assert [c.args for c in fake.calls if c.name == "set_timeout"] == [(SB, 0)]
    negative = client.post(f"/sandboxes/{SB}/timeout", headers=key, json={"timeout": -1})
    assert "timeout" in rest_error(negative, 400)


def test_e2b_network_options_become_the_egress_policy(client: TestClient, fake: FakeRuntime) -> None:
    resp = client.post("/v2/sandboxes", headers={"X-API-KEY": TOKEN},
                       json={"templateID": "base", "allow_internet_access": True,
                             "network": {"allowOut": ["192.0.2.7:443"], "denyOut": [], "rules": {}}})
    assert resp.status_code == 201, resp.text
    [call] = [c for c in fake.calls if c.name == "spawn"]
    assert call.kwargs["allow_internet_access"] is True
    assert call.kwargs["network"] == {"allow_out": ["192.0.2.7:443"]}


@pytest.mark.parametrize(("network", "why"), [
    ({"allow_public_traffic": False}, "spells it allowPublicTraffic"),
    ({"allowPublicTrafic": False}, "network.allowPublicTrafic"),
    ({"denyIn": []}, "network.denyIn"),
])
def test_an_unknown_network_field_is_refused_never_a_looser_policy(
        client: TestClient, fake: FakeRuntime, network: dict[str, Any], why: str) -> None:
    """A restriction spelled wrong (even as false or empty) is a 400, not a sandbox with public ports."""
    resp = client.post("/v2/sandboxes", headers={"X-API-KEY": TOKEN},
                       json={"templateID": "base", "network": network})
    assert why in rest_error(resp, 400)
    assert "spawn" not in fake.names()
    # The same field in an update is refused too, and the sandbox's policy is untouched.
    update = client.put(f"/sandboxes/{SB}/network", headers={"X-API-KEY": TOKEN}, json=network)
    assert why in rest_error(update, 400)
    assert "update_network" not in fake.names()


def test_the_sdks_camel_case_allow_public_traffic_makes_the_ports_private(
        client: TestClient, fake: FakeRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    given: list[SpawnOptions | None] = []
    real_spawn = fake.spawn

    async def spawn(tag: str, n: int = 1, options: SpawnOptions | None = None) -> list[Any]:
        given.append(options)
        return await real_spawn(tag, n, options)

    monkeypatch.setattr(fake, "spawn", spawn)
    resp = client.post("/v2/sandboxes", headers={"X-API-KEY": TOKEN},
                       json={"templateID": "base",
                             "network": {"allowPublicTraffic": False, "dnsServers": []}})
    assert resp.status_code == 201, resp.text
    [options] = given
    assert options is not None and options.egress is not None
    assert options.egress.info()["allow_public_traffic"] is False


def test_older_sdks_create_and_connect_through_the_v1_routes(client: TestClient, fake: FakeRuntime) -> None:
    """SDKs before 2.46 POST /sandboxes (with ``secure``, ignored as E2B ignores it) and
    /sandboxes/{id}/connect (its timeout required)."""
    key = {"X-API-KEY": TOKEN}
    resp = client.post("/sandboxes", headers=key,
                       json={"templateID": "base", "timeout": 60, "secure": True, "metadata": {"a": "b"}})
    assert resp.status_code == 201, resp.text
    assert resp.json()["templateID"] == "base" and resp.json()["envdAccessToken"]
    [call] = [c for c in fake.calls if c.name == "spawn"]
    assert call.kwargs["timeout_secs"] == 60 and call.kwargs["metadata"] == {"a": "b"}
    assert "no_such" in rest_error(client.post("/sandboxes", headers=key,
                                               json={"templateID": "base", "no_such": 1}), 400)
    assert client.post(f"/sandboxes/{SB}/pause", headers=key).status_code == 204
    assert "timeout" in rest_error(client.post(f"/sandboxes/{SB}/connect", headers=key, json={}), 400)
    resumed = client.post(f"/sandboxes/{SB}/connect", headers=key, json={"timeout": 60})
    assert resumed.status_code == 201 and resumed.json()["sandboxID"] == SB, resumed.text


def test_pause_info_list_and_connect_resume(client: TestClient, fake: FakeRuntime) -> None:
    """E2B's pause, info, list and connect on the fake (it covers the whole RuntimeLike)."""
    key = {"X-API-KEY": TOKEN}
    assert client.get(f"/sandboxes/{SB}", headers=key).json()["state"] == "running"
    assert client.post(f"/sandboxes/{SB}/pause", headers=key).status_code == 204
    assert SB in fake.paused and SB not in fake.sandboxes
    assert client.get(f"/sandboxes/{SB}", headers=key).json()["state"] == "paused"
    assert "already paused" in rest_error(client.post(f"/sandboxes/{SB}/pause", headers=key), 409)
    states = {s["sandboxID"]: s["state"] for s in client.get("/v2/sandboxes", headers=key).json()}
    assert states == {SB: "paused", OTHER: "running"}
    resp = client.post(f"/v2/sandboxes/{SB}/connect", headers=key, json={"timeout": 60})
    assert resp.status_code == 201, resp.text
    assert resp.json()["sandboxID"] == SB and resp.json()["templateID"] == "base"
    assert SB in fake.sandboxes and fake.sandboxes[SB].expires_at_unix is not None
    assert client.post(f"/v2/sandboxes/{SB}/connect", headers=key, json={"timeout": 60}).status_code == 200


def test_an_unknown_template_says_how_to_make_it(client: TestClient) -> None:
    resp = client.post("/v2/sandboxes", json={"templateID": "nope"}, headers={"X-API-KEY": TOKEN})
    assert "forkd snapshot --tag nope" in rest_error(resp, 404)


def test_unsupported_control_routes_are_501_in_the_sdk_shape(client: TestClient) -> None:
    for method, path in (("GET", f"/sandboxes/{SB}/logs"), ("GET", "/templates/t1"), ("GET", "/volumes")):
        assert "docs/E2B.md" in rest_error(client.request(method, path, headers={"X-API-KEY": TOKEN}), 501)


def test_snapshots_are_branches_listed_filtered_and_deleted(client: TestClient, fake: FakeRuntime) -> None:
    """E2B's create_snapshot is a full BRANCH whose tag is the snapshotID (the create route's
    template), list shows sandboxes' snapshots but not forkd's own, delete is forkd's."""
    key = {"X-API-KEY": TOKEN}
    made = client.post(f"/sandboxes/{SB}/snapshots", headers=key, json={})
    assert made.status_code == 201, made.text
    unnamed = made.json()["snapshotID"]
    assert made.json() == {"snapshotID": unnamed, "names": [unnamed]}
    assert fake.snapshots[unnamed].branched_from == SB and fake.snapshots[unnamed].mode is None
    assert [c.kwargs["mode"] for c in fake.calls if c.name == "branch"] == ["full"]
    named = client.post(f"/sandboxes/{OTHER}/snapshots", headers=key,
                        json={"name": "snap-x", "memory": False})
    assert named.status_code == 201 and named.json() == {"snapshotID": "snap-x", "names": ["snap-x"]}
    fake.snapshots["snap-x"].created_at_unix += 10  # newer
    # A sandbox made from it forks from that tag.
    child = client.post("/v2/sandboxes", headers=key, json={"templateID": "snap-x"})
    assert child.status_code == 201 and child.json()["templateID"] == "snap-x"
    # A paused sandbox's state snapshot is forkd's own: not listed.
    assert client.post(f"/sandboxes/{OTHER}/pause", headers=key).status_code == 204

    def listed(query: str = "") -> list[str]:
        resp = client.get(f"/snapshots{query}", headers=key)
        assert resp.status_code == 200, resp.text
        return [s["snapshotID"] for s in resp.json()]

    assert listed() == ["snap-x", unnamed]
    assert listed(f"?sandboxID={SB}") == [unnamed] and listed("?name=snap-x") == ["snap-x"]
    assert listed("?name=snap-x-does-not-exist") == []
    page = client.get("/snapshots?limit=1", headers=key)
    assert [s["snapshotID"] for s in page.json()] == ["snap-x"] and page.headers["x-next-token"] == "1"
    assert listed("?limit=1&nextToken=1") == [unnamed]
    # Taken names, bad names, paused sources and unknown fields are refused, saying why.
    assert "exists already" in rest_error(
        client.post(f"/sandboxes/{SB}/snapshots", headers=key, json={"name": "base"}), 409)
    assert "not a forkd snapshot tag" in rest_error(
        client.post(f"/sandboxes/{SB}/snapshots", headers=key, json={"name": "team/x:v1"}), 400)
    assert "is paused" in rest_error(client.post(f"/sandboxes/{OTHER}/snapshots", headers=key, json={}), 409)
    assert "unknown field" in rest_error(
        client.post(f"/sandboxes/{SB}/snapshots", headers=key, json={"names": "x"}), 400)
    assert "limit" in rest_error(client.get("/snapshots?limit=0", headers=key), 400)
    rest_error(client.post("/sandboxes/sb-67a1b3-0009/snapshots", headers=key, json={}), 404)
    # Delete: the SDK's delete_snapshot is DELETE /templates/{id}: True (204), then False (404).
    # forkd refuses to delete what a sandbox or a later snapshot (here OTHER's paused state) needs.
    assert "dependent snapshots" in rest_error(client.delete("/templates/snap-x", headers=key), 409)
    assert "snap-x" in fake.snapshots
    assert client.delete(f"/templates/{unnamed}", headers=key).status_code == 204
    assert unnamed not in fake.snapshots
    rest_error(client.delete(f"/templates/{unnamed}", headers=key), 404)
    rest_error(client.delete("/templates/.hidden", headers=key), 404)
    # Templates (and forkd's own snapshots) are not deleted through E2B's API.
    assert "DELETE /v1/snapshots/base" in rest_error(client.delete("/templates/base", headers=key), 400)
    assert "base" in fake.snapshots


def test_bodies_are_bounded_in_the_sdk_shape(client: TestClient) -> None:
    big = {"templateID": "base", "metadata": {"k": "x" * (2 << 20)}}
    assert "limit" in rest_error(client.post("/v2/sandboxes", json=big, headers={"X-API-KEY": TOKEN}), 413)


def test_list_is_newest_first_unless_asked_otherwise(client: TestClient, fake: FakeRuntime) -> None:
    """E2B's spec: ``GET /v2/sandboxes`` is by start time, newest first by default (issue 20)."""
    fake.sandboxes[SB].created_at_unix = 1_000
    fake.sandboxes[OTHER].created_at_unix = 2_000  # started later
    key = {"X-API-KEY": TOKEN}

    def ids(**params: str) -> list[str]:
        resp = client.get("/v2/sandboxes", params=params, headers=key)
        assert resp.status_code == 200, resp.text
        return [e["sandboxID"] for e in resp.json()]

    assert ids() == [OTHER, SB]
    assert ids(order="desc") == [OTHER, SB]
    assert ids(order="asc") == [SB, OTHER]
    # Pages follow the same order.
    first = client.get("/v2/sandboxes", params={"limit": "1"}, headers=key)
    assert [e["sandboxID"] for e in first.json()] == [OTHER]
    assert ids(limit="1", nextToken=first.headers["x-next-token"]) == [SB]
    assert "order" in rest_error(client.get("/v2/sandboxes", params={"order": "up"}, headers=key), 400)


def test_a_filesystem_only_pause_is_a_disk_only_hibernation(client: TestClient, fake: FakeRuntime) -> None:
    """``pause(keep_memory=False)`` (``memory: false``) keeps the disk alone: a disk-only hibernation,
    listed as paused, that envd traffic does not wake even with autoResume on (E2B's auto-resume
    refuses such a sandbox); connect resumes it (a cold boot) under the same id and token."""
    key = {"X-API-KEY": TOKEN}
    fake.sandboxes[SB].auto_resume = True
    resp = client.post(f"/sandboxes/{SB}/pause", json={"memory": False}, headers=key)
    assert resp.status_code == 204, resp.text
    assert not [c for c in fake.calls if c.name == "pause"]
    [call] = [c for c in fake.calls if c.name == "hibernate"]
    assert call.args == (SB,) and call.kwargs == {"memory": False}
    assert client.get(f"/sandboxes/{SB}", headers=key).json()["state"] == "paused"
    asleep = client.get("/health", headers=envd_headers(SB))
    assert asleep.status_code == 502 and "filesystem-only" in asleep.json()["message"], asleep.text
    assert "already paused" in rest_error(client.post(f"/sandboxes/{SB}/pause", json={"memory": False},
                                                      headers=key), 409)
    resumed = client.post(f"/sandboxes/{SB}/connect", json={"timeout": 60}, headers=key)
    assert resumed.status_code == 201, resumed.text
    assert resumed.json()["sandboxID"] == SB
    assert resumed.json()["envdAccessToken"] == client.post(
        f"/sandboxes/{SB}/connect", json={"timeout": 60}, headers=key).json()["envdAccessToken"]
    assert client.get("/health", headers=envd_headers(SB)).status_code == 204
    assert "memory" in rest_error(client.post(f"/sandboxes/{SB}/pause", json={"memory": "no"},
                                              headers=key), 400)
    # At a timeout: autoPauseMemory false asks for the filesystem-only pause then (a disk-only
    # hibernation), without autoResume; it means nothing without autoPause.
    made = client.post("/v2/sandboxes", headers=key, json={"templateID": "base", "autoPause": True,
                                                           "autoPauseMemory": False, "timeout": 3})
    assert made.status_code == 201, made.text
    [call] = [c for c in fake.calls if c.name == "spawn"]
    assert call.kwargs["hibernate_on_timeout"] is True and call.kwargs["hibernate_on_timeout_memory"] is False
    assert call.kwargs["auto_resume"] is False
    for body in ({"autoPauseMemory": False}, {"autoPause": True, "autoPauseMemory": False,
                                              "autoResume": {"enabled": True}},
                 {"autoPause": True, "autoPauseMemory": "no"}):
        assert "autoPauseMemory" in rest_error(client.post("/v2/sandboxes", headers=key,
                                                           json={"templateID": "base", **body}), 400)
    # With its memory (the default, or memory: true): forkd's pause, a branch of its state.
    assert client.post(f"/sandboxes/{SB}/pause", json={"memory": True}, headers=key).status_code == 204
    [call] = [c for c in fake.calls if c.name == "pause"]
    assert call.kwargs == {"mode": "full"}


GUEST_METRICS = """MemTotal:         482012 kB
MemAvailable:     400000 kB
Cached:            50000 kB
cpu  100 0 100 800 0 0 0 0 0 0
cpu  150 0 150 900 0 0 0 0 0 0
ncpu 2
/dev/vda 2040373248 612345678 1400000000 31% /
"""


def test_metrics_are_a_sample_taken_in_the_guest(client: TestClient, fake: FakeRuntime) -> None:
    """``get_metrics``: one sample from the guest's /proc and df, now; none for a range the
    sandbox did not run in (issue 20)."""

    async def exec_(sandbox_id: str, args: list[str], timeout_secs: float = 30, **_: Any) -> dict[str, Any]:
        assert args[:2] == ["/bin/sh", "-c"]
        return {"stdout": GUEST_METRICS, "stderr": "", "exit_code": 0, "error": None, "timed_out": False}

    fake.exec = exec_  # type: ignore[method-assign]
    key = {"X-API-KEY": TOKEN}
    resp = client.get(f"/sandboxes/{SB}/metrics", headers=key)
    assert resp.status_code == 200, resp.text
    [sample] = resp.json()
    assert (sample["cpuCount"], sample["cpuUsedPct"]) == (2, 50.0)  # 100 busy of 200 jiffies
    assert (sample["memTotal"], sample["memUsed"], sample["memCache"]) == (
        482012 * 1024, 82012 * 1024, 50000 * 1024)
    assert (sample["diskTotal"], sample["diskUsed"]) == (2040373248, 612345678)
    assert abs(sample["timestampUnix"] - time.time()) < 60
    started = int(fake.sandboxes[SB].created_at_unix)
    before = client.get(f"/sandboxes/{SB}/metrics", params={"start": started - 7200, "end": started - 3600},
                        headers=key)
    assert before.json() == []
    assert client.get(f"/sandboxes/{SB}/metrics", params={"start": int(time.time()) - 5},
                      headers=key).json() != []
    bogus = client.get(f"/sandboxes/{SB}/metrics", params={"bogus": 1}, headers=key)
    assert "bogus" in rest_error(bogus, 400)


# ------------------------------------------------------------------ in-sandbox traffic


def test_each_sandbox_has_its_own_access_token(client: TestClient) -> None:
    assert client.get("/health", headers=envd_headers()).status_code == 204
    other_token = AccessTokens(TOKEN.encode()).envd(OTHER)
    for headers in (envd_headers(token=""), envd_headers(token=other_token), envd_headers(token=TOKEN)):
        assert "access token" in rest_error(client.get("/health", headers=headers), 401)
    # Connect calls get Connect's error shape.
    resp = client.post("/filesystem.Filesystem/Stat", json={"path": "/tmp"}, headers=envd_headers(token="x"))
    assert resp.status_code == 401 and resp.json()["code"] == "unauthenticated"


def test_the_traffic_token_opens_only_the_interpreter(client: TestClient) -> None:
    traffic = AccessTokens(TOKEN.encode()).traffic(SB)
    headers = {"E2b-Sandbox-Id": SB, "E2b-Sandbox-Port": "49983", "E2B-Traffic-Access-Token": traffic}
    rest_error(client.get("/health", headers=headers), 401)


def test_a_sandbox_that_is_not_running_answers_like_e2bs_proxy(client: TestClient) -> None:
    gone = "sb-000000-0009"
    assert "was not found" in rest_error(client.get("/health", headers=envd_headers(gone)), 502)
    resp = client.post("/filesystem.Filesystem/Stat", json={"path": "/"}, headers=envd_headers(gone))
    assert resp.json()["code"] == "unavailable" and "was not found" in resp.json()["message"]
    assert "port is not open" in rest_error(client.get("/", headers=envd_headers(port="8080")), 502)


def test_files_round_trip_octet_stream_gzip_and_multipart(client: TestClient, fake: FakeRuntime) -> None:
    data = bytes(range(256)) * 10
    up = client.post("/files", params={"path": "/tmp/new/a.bin"}, content=data,
                     headers={**envd_headers(), "Content-Type": "application/octet-stream"})
    assert up.status_code == 200, up.text
    assert up.json() == [{"name": "a.bin", "type": "file", "path": "/tmp/new/a.bin"}]  # parents made
    assert client.get("/files", params={"path": "/tmp/new/a.bin"}, headers=envd_headers()).content == data

    zipped = client.post("/files", params={"path": "rel.bin"}, content=gzip.compress(data),
                         headers={**envd_headers(), "Content-Type": "application/octet-stream",
                                  "Content-Encoding": "gzip"})
    assert zipped.json()[0]["path"] == "/home/user/rel.bin"  # relative paths are under the user's home
    assert fake.guest_files[SB]["/home/user/rel.bin"] == data
    # Every transfer acts as E2B's default user, or as the one the SDK names (query or Basic header).
    writes = [c.kwargs["user"] for c in fake.calls if c.name in ("file_write", "file_read", "file_mkdir")]
    assert writes and set(writes) == {"user"}
    as_root = client.post("/files", params={"path": "rel.bin", "username": "root"}, content=b"r",
                          headers={**envd_headers(), "Content-Type": "application/octet-stream"})
    assert as_root.json()[0]["path"] == "/root/rel.bin" and fake.calls[-1].kwargs["user"] == "root"
    client.get("/files", params={"path": "rel.bin"}, headers={**envd_headers(), **basic("root")})
    assert fake.calls[-1].name == "file_stat" and fake.calls[-1].args[1] == "/root/rel.bin"
    assert fake.calls[-1].kwargs["user"] == "root"
    assert "invalid user" in rest_error(client.get("/files", params={"path": "a", "username": "a/b"},
                                                   headers=envd_headers()), 400)

    multi = client.post("/files", headers=envd_headers(),
                        files=[("file", ("/tmp/m1.bin", b"\x00one")), ("file", ("/tmp/m2.bin", b"\xfftwo"))])
    assert [e["path"] for e in multi.json()] == ["/tmp/m1.bin", "/tmp/m2.bin"], multi.text
    assert fake.guest_files[SB]["/tmp/m2.bin"] == b"\xfftwo"
    assert "No such file" in rest_error(client.get("/files", params={"path": "/nope"},
                                                   headers=envd_headers()), 404)


def test_filesystem_service_speaks_connect_json(client: TestClient, fake: FakeRuntime) -> None:
    fake.guest_files[SB]["/tmp/f.txt"] = b"abc"
    stat = client.post("/filesystem.Filesystem/Stat", json={"path": "/tmp/f.txt"}, headers=envd_headers())
    assert stat.status_code == 200, stat.text
    assert stat.json()["entry"]["type"] == "FILE_TYPE_FILE" and stat.json()["entry"]["size"] == "3"
    listed = client.post("/filesystem.Filesystem/ListDir", json={"path": "/tmp"}, headers=envd_headers())
    assert [e["name"] for e in listed.json()["entries"]] == ["f.txt"]
    missing = client.post("/filesystem.Filesystem/Stat", json={"path": "/tmp/x"}, headers=envd_headers())
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    made = client.post("/filesystem.Filesystem/MakeDir", json={"path": "/tmp/d"}, headers=envd_headers())
    assert made.json()["entry"]["type"] == "FILE_TYPE_DIRECTORY"
    again = client.post("/filesystem.Filesystem/MakeDir", json={"path": "/tmp/d"}, headers=envd_headers())
    assert again.json()["code"] == "already_exists"
    watch = client.post("/filesystem.Filesystem/CreateWatcher", json={"path": "/tmp"}, headers=envd_headers())
    watcher = watch.json()["watcherId"]
    fake.watches.pending[(SB, watcher)].append(WatchEvent("d", "create"))
    got = client.post("/filesystem.Filesystem/GetWatcherEvents", json={"watcherId": watcher},
                      headers=envd_headers())
    assert got.json()["events"] == [{"name": "d", "type": "EVENT_TYPE_CREATE"}]
    stop = client.post("/filesystem.Filesystem/RemoveWatcher", json={"watcherId": watcher},
                       headers=envd_headers())
    assert stop.status_code == 200
    gone = client.post("/filesystem.Filesystem/GetWatcherEvents", json={"watcherId": watcher},
                       headers=envd_headers())
    assert gone.json()["code"] == "not_found"


def test_filesystem_calls_act_as_the_named_user(client: TestClient, fake: FakeRuntime) -> None:
    """E2B's default user is ``user`` (relative paths under /home/user); ``user="root"`` arrives as a
    Basic Authorization header and is honoured; a malformed one is refused."""
    fake.guest_files[SB]["/home/user/f.txt"] = b"abc"
    fake.guest_files[SB]["/root/g.txt"] = b"abc"
    stat = client.post("/filesystem.Filesystem/Stat", json={"path": "f.txt"}, headers=envd_headers())
    assert stat.status_code == 200, stat.text
    assert fake.calls[-1].args[1] == "/home/user/f.txt" and fake.calls[-1].kwargs["user"] == "user"
    stat = client.post("/filesystem.Filesystem/Stat", json={"path": "g.txt"},
                       headers={**envd_headers(), **basic("root")})
    assert stat.status_code == 200, stat.text
    assert fake.calls[-1].args[1] == "/root/g.txt" and fake.calls[-1].kwargs["user"] == "root"
    client.post("/filesystem.Filesystem/MakeDir", json={"path": "d"}, headers=envd_headers())
    assert [c.kwargs["user"] for c in fake.calls[-2:]] == ["user", "user"]  # mkdir, then its stat
    for bad in ("Bearer x", "Basic %%%", "Basic " + base64.b64encode(b"a b:").decode()):
        resp = client.post("/filesystem.Filesystem/Stat", json={"path": "f.txt"},
                           headers={**envd_headers(), "Authorization": bad})
        assert resp.status_code == 400 and resp.json()["code"] == "invalid_argument", (bad, resp.text)


def test_removing_what_is_not_there_is_done(client: TestClient, fake: FakeRuntime) -> None:
    """envd's Remove of a missing path succeeds (issue 20); a gone sandbox is still an error."""
    fake.guest_files[SB]["/tmp/f.txt"] = b"abc"
    for path in ("/tmp/f.txt", "/tmp/f.txt", "/tmp/never/there"):
        resp = client.post("/filesystem.Filesystem/Remove", json={"path": path}, headers=envd_headers())
        assert resp.status_code == 200 and resp.json() == {}, resp.text
    assert "/tmp/f.txt" not in fake.guest_files[SB]

    async def gone(sandbox_id: str, path: str, *, recursive: bool = False, user: str | None = None) -> None:
        del fake.sandboxes[sandbox_id]  # killed while the call was on its way
        raise NotFound(f"sandbox {sandbox_id!r} not found")

    fake.files.remove = gone  # type: ignore[method-assign]
    resp = client.post("/filesystem.Filesystem/Remove", json={"path": "/tmp/x"}, headers=envd_headers())
    assert resp.json()["code"] == "unavailable" and "was not found" in resp.json()["message"], resp.text


def test_entries_carry_owner_group_and_symlink_target(client: TestClient, fake: FakeRuntime) -> None:
    """The agent's owner and group names and a link's resolved target reach envd's EntryInfo (issue 20)."""
    link = {"path": "/root/ln", "name": "ln", "type": "file", "size": 3, "mode": 0o644, "mtime": 1.5,
            "owner": "root", "group": "staff", "target": "/root/d/f.txt"}
    dangling = {**link, "name": "dead", "path": "/root/dead", "type": "symlink", "target": "/root/nope"}
    plain = {**link, "name": "f.txt", "path": "/root/d/f.txt"}
    del plain["target"]

    async def stat(sandbox_id: str, path: str, *, user: str | None = None) -> dict[str, Any]:
        return link

    async def listing(sandbox_id: str, path: str, *, user: str | None = None) -> dict[str, Any]:
        return {"path": path, "entries": [dangling, plain], "truncated": False}

    fake.files.stat = stat  # type: ignore[method-assign]
    fake.files.list = listing  # type: ignore[method-assign]
    resp = client.post("/filesystem.Filesystem/Stat", json={"path": "ln"}, headers=envd_headers())
    entry = resp.json()["entry"]
    assert entry["type"] == "FILE_TYPE_FILE" and entry["symlinkTarget"] == "/root/d/f.txt"
    assert entry["owner"] == "root" and entry["group"] == "staff" and entry["permissions"] == "-rw-r--r--"
    assert entry["isSymlink"] is True
    entries = client.post("/filesystem.Filesystem/ListDir", json={"path": "/root"},
                          headers=envd_headers()).json()["entries"]
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


def _signed(path: str, operation: str, user: str | None, sandbox: str = SB,
            expires_in: int | None = None) -> dict[str, str]:
    """The query of a signed file URL, made by the published SDK's own signing function."""
    from e2b.sandbox.signature import get_signature

    signed = get_signature(path, operation, user, AccessTokens(TOKEN.encode()).envd(sandbox),  # type: ignore[arg-type]
                           expires_in)
    query = {"path": path, "signature": signed["signature"]}
    if user:
        query["username"] = user
    if signed["expiration"] is not None:
        query["signature_expiration"] = str(signed["expiration"])
    return query


def test_a_signed_file_url_names_its_sandbox_and_stands_for_its_token(client: TestClient,
                                                                      fake: FakeRuntime) -> None:
    """``download_url``/``upload_url`` of a secure sandbox: no token and no E2b-Sandbox-Id, the
    signature alone; it opens that sandbox's file and nothing else (issue 20)."""
    fake.guest_files[SB]["/home/user/s.txt"] = b"signed"
    resp = client.get("/files", params=_signed("s.txt", "read", "user"))
    assert resp.status_code == 200 and resp.content == b"signed", resp.text
    resp = client.get("/files", params=_signed("s.txt", "read", "user", expires_in=120))
    assert resp.status_code == 200 and resp.content == b"signed", resp.text
    up = client.post("/files", params=_signed("up.txt", "write", "user"), content=b"uploaded",
                     headers={"Content-Type": "application/octet-stream"})
    assert up.status_code == 200, up.text
    assert fake.guest_files[SB]["/home/user/up.txt"] == b"uploaded"
    # Expired: E2B's exact answer.
    resp = client.get("/files", params=_signed("s.txt", "read", "user", expires_in=-120))
    assert resp.status_code == 401 and resp.json() == {"code": 401, "message": "signature is already expired"}
    # A read signature does not write, another path is not covered, another user is not the signer.
    for params, method in ((_signed("s.txt", "read", "user"), "POST"),
                           ({**_signed("s.txt", "read", "user"), "path": "other.txt"}, "GET"),
                           ({**_signed("s.txt", "read", "user"), "username": "root"}, "GET")):
        resp = client.request(method, "/files", params=params)
        assert resp.status_code == 401, (params, resp.text)
    # Aimed at another sandbox with this one's signature: the token check refuses it.
    resp = client.get("/files", params=_signed("s.txt", "read", "user"),
                      headers={"E2b-Sandbox-Id": OTHER, "E2b-Sandbox-Port": "49983"})
    assert resp.status_code == 401, resp.text
    # Not a signature at all: a clear 400 before any hashing.
    resp = client.get("/files", params={"path": "s.txt", "signature": "x" * 500})
    assert resp.status_code == 400 and "v1 file signature" in resp.json()["message"], resp.text


def test_template_build_through_the_control_plane(client: TestClient, fake: FakeRuntime) -> None:
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
    for _ in range(100):
        status = client.get(f"/templates/web/builds/{build_id}/status", headers=key).json()
        if status["status"] not in ("waiting", "building"):
            break
    assert status["status"] == "ready", status
    assert [e["step"] for e in status["logEntries"][:3]] == ["1", "2", "finalize"]
    assert "web" in fake.snapshots
    assert client.get("/templates/aliases/web", headers=key).json() == {"templateID": "web", "public": False}
    assert client.get("/templates/aliases/nope", headers=key).status_code == 404
    # Refused up front, in the SDK's shape.
    other = client.post("/v3/templates", json={"name": "x"}, headers=key).json()["buildID"]
    assert "not a forkd image" in rest_error(client.post(
        f"/v2/templates/x/builds/{other}", json={"fromImage": "ubuntu:22.04"}, headers=key), 400)
    assert "tags must be" in rest_error(client.post("/v3/templates", json={"name": "web", "tags": "a"},
                                                    headers=key), 400)
    assert "neither part empty" in rest_error(client.post("/v3/templates", json={"name": "web:"},
                                                          headers=key), 400)


def test_a_tagged_template_name_is_the_snapshot_alias_dot_tag(client: TestClient, fake: FakeRuntime) -> None:
    """E2B's alias:tag: built as the snapshot alias.tag, found and started by that name."""
    key = {"X-API-KEY": TOKEN}
    made = client.post("/v3/templates", json={"name": "web:v1-0"}, headers=key)
    assert made.status_code == 202, made.text
    assert made.json()["templateID"] == "web.v1-0" and made.json()["tags"] == ["v1-0"]
    assert made.json()["names"] == ["web:v1-0"] and made.json()["aliases"] == ["web"]
    build_id = made.json()["buildID"]
    started = client.post(f"/v2/templates/web.v1-0/builds/{build_id}", json={"steps": []}, headers=key)
    assert started.status_code == 202, started.text
    for _ in range(100):
        if client.get(f"/templates/web.v1-0/builds/{build_id}/status",
                      headers=key).json()["status"] not in ("waiting", "building"):
            break
    assert "web.v1-0" in fake.snapshots
    assert client.get("/templates/aliases/web:v1-0", headers=key).json()["templateID"] == "web.v1-0"
    # Tags given with a build are more names of its snapshot once it is built.
    tagged = client.post("/v3/templates", json={"name": "api:v2", "tags": ["stable", "api:prod"]},
                         headers=key).json()
    assert tagged["tags"] == ["v2", "stable", "prod"]
    client.post(f"/v2/templates/api.v2/builds/{tagged['buildID']}", json={"steps": []}, headers=key)
    for _ in range(100):
        if client.get(f"/templates/api.v2/builds/{tagged['buildID']}/status",
                      headers=key).json()["status"] not in ("waiting", "building"):
            break
    assert client.get("/templates/aliases/api:prod", headers=key).json()["templateID"] == "api.v2"
    assert client.get("/templates/aliases/api:stable", headers=key).json()["templateID"] == "api.v2"
    created = client.post("/sandboxes", json={"templateID": "web:v1-0"}, headers=key)
    assert created.status_code == 201, created.text
    assert created.json()["templateID"] == "web.v1-0"
    missing = client.post("/sandboxes", json={"templateID": "web:nope"}, headers=key)
    assert "web.nope" in rest_error(missing, 404)


def test_assigned_tags_are_more_names_of_a_build(client: TestClient, fake: FakeRuntime) -> None:
    """Template.assign_tags / remove_tags / get_tags: alias:prod stands for the build alias:v1."""
    key = {"X-API-KEY": TOKEN}
    fake.add_snapshot("web.v1")
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


def test_template_uploads_live_in_the_data_dir_made_at_the_first_upload(tmp_path: Path,
                                                                        fake: FakeRuntime) -> None:
    """Nothing in /tmp (a killed daemon used to leave a directory there per start): the
    uploads go to <data>/e2b-uploads, made at the first upload, and a daemon's first upload
    clears what an earlier daemon on that data dir left."""
    uploads = tmp_path / "data" / "e2b-uploads"
    uploads.mkdir(parents=True)
    (uploads / "left-by-a-killed-daemon.tar").write_bytes(b"old")
    with app_client(tmp_path, fake, max_file_bytes=1 << 20) as c:
        key = {"X-API-KEY": TOKEN}
        assert c.post("/v3/templates", json={"name": "web"}, headers=key).status_code == 202
        assert (uploads / "left-by-a-killed-daemon.tar").exists()  # not touched before an upload
        upload = c.put(f"/templates/web/files/{'d' * 64}", content=b"plain tar bytes", headers=key)
        assert upload.status_code == 200, upload.text
        assert sorted(p.name for p in uploads.iterdir()) == [f"{'d' * 64}.tar"]
        assert (uploads / f"{'d' * 64}.tar").read_bytes() == b"plain tar bytes"
        assert uploads.stat().st_mode & 0o077 == 0


def test_auto_resume_off_keeps_a_paused_sandbox_asleep_until_connect(client: TestClient,
                                                                      fake: FakeRuntime) -> None:
    """E2B's autoResume {"enabled": false}: once its timeout paused (hibernated) it, envd traffic
    answers 502 (the SDK's is_running() is False) instead of waking it; connect resumes it."""
    resp = client.post("/v2/sandboxes", headers={"X-API-KEY": TOKEN},
                       json={"templateID": "base", "autoPause": True, "timeout": 60,
                             "autoResume": {"enabled": False}})
    assert resp.status_code == 201, resp.text
    [call] = [c for c in fake.calls if c.name == "spawn"]
    assert call.kwargs["hibernate_on_timeout"] is True and call.kwargs["auto_resume"] is False
    sandbox_id, token = resp.json()["sandboxID"], resp.json()["envdAccessToken"]
    headers = envd_headers(sandbox_id, token)
    assert client.get("/health", headers=headers).status_code == 204  # running: served as ever
    fake.sandboxes[sandbox_id].hibernation = Hibernation(at_unix=1.0, pages=1, memory_bytes=4096,
                                                         devices_bytes=4096, pause_ms=1.0)
    asleep = client.get("/health", headers=headers)
    assert asleep.status_code == 502 and "autoResume is off" in asleep.json()["message"], asleep.text
    info = client.get(f"/sandboxes/{sandbox_id}", headers={"X-API-KEY": TOKEN})
    assert info.json()["state"] == "paused", info.text
    # With autoResume on, the same request would have been served (and woken it).
    fake.sandboxes[sandbox_id].auto_resume = True
    assert client.get("/health", headers=headers).status_code == 204


def test_update_network_replaces_the_egress_and_keeps_the_inbound_settings(
        client: TestClient, fake: FakeRuntime) -> None:
    """E2B's ``update_network`` (PUT /sandboxes/{id}/network): allowOut and denyOut replace the old
    lists (omitted: cleared), an omitted allow_internet_access keeps the sandbox's, its port
    settings stay; what forkd lacks is a 400, as is a bad entry."""
    from forkd.host.egress import EgressPolicy
    from forkd.host.netplan import ChildNet
    key = {"X-API-KEY": TOKEN}
    record = fake.sandboxes[SB]
    record.network = ChildNet(owner=SB, netns=f"forkd-{SB}", owns_netns=True, tap="forkd-tap0", owns_tap=True,
                              index=1, ip="10.201.0.3", gateway="10.201.0.1",
                              egress=EgressPolicy.from_request(True, {"deny_out": ["0.0.0.0/0"],
                                                                     "allow_out": ["1.1.1.1"],
                                                                     "allow_public_traffic": True}))
    resp = client.put(f"/sandboxes/{SB}/network", headers=key, json={"denyOut": ["8.8.8.8"]})
    assert resp.status_code == 204, resp.text
    assert record.egress.info() == {"allow_internet_access": True, "allow_out": [], "deny_out": ["8.8.8.8"],
                                    "allow_public_traffic": True, "mask_request_host": None}
    assert client.put(f"/sandboxes/{SB}/network", headers=key,
                      json={"allow_internet_access": False}).status_code == 204
    assert record.egress.info()["allow_internet_access"] is False and record.egress.info()["deny_out"] == []
    assert "domain names" in rest_error(client.put(f"/sandboxes/{SB}/network", headers=key,
                                                   json={"allowOut": ["example.com"]}), 400)
    assert "egressProxy" in rest_error(client.put(f"/sandboxes/{SB}/network", headers=key,
                                                  json={"egressProxy": {"address": "x:1"}}), 400)
    assert record.egress.info()["allow_internet_access"] is False  # the refused ones changed nothing
    no_nic = client.put(f"/sandboxes/{OTHER}/network", headers=key, json={})
    assert "network device" in rest_error(no_nic, 400)


def test_guest_metrics_refuses_what_the_script_does_not_print() -> None:
    from forkd.api.e2b.guest_metrics import guest_metrics

    assert guest_metrics(GUEST_METRICS)["cpu_count"] >= 1
    for garbage in ("", "MemTotal: lots kB", GUEST_METRICS.replace("ncpu", "n")):
        with pytest.raises(ValueError):
            guest_metrics(garbage)
