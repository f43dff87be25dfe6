"""The fleet without VMs: placement, host records, ids that name hosts, and a real etcd with
real HTTP hosts (the daemon, on the real runtime over the QEMU double) behind a real gateway."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from forkd.api.app import create_app
from forkd.api.settings import Settings
from forkd.errors import InvalidRequest
from forkd.fleet.etcd import EtcdClient, prefix_end
from forkd.fleet.hosts import KEY_PREFIX, HostRecord
from forkd.fleet.member import FleetMember
from forkd.fleet.membership import Membership
from forkd.fleet.placement import by_load, holders, spawn_candidates, spread_plan, volume_holders
from forkd.gateway import GatewaySettings, create_gateway_app
from forkd.gateway.volumes import MAX_NAMED, named_volumes
from forkd.sdk import Controller
from forkd.store import layout
from tests.fakes.app import fake_qemu, guest_image
from tests.integration.services import Etcd, etcd_server


def host(host_id: str, *, load: int = 0, capacity: int = 10, tags: tuple[str, ...] = (),
         pools: dict[str, int] | None = None, store: bool = True, mem: int = 1000,
         volumes: tuple[str, ...] = ()) -> HostRecord:
    return HostRecord(host_id, f"http://127.0.0.1:1/{host_id}", capacity, load, list(tags), pools or {}, mem,
                      store, volumes=list(volumes))


# ------------------------------------------------------------------ placement and records


def test_a_spawn_goes_to_a_holder_first_then_the_least_loaded_that_can_pull() -> None:
    hosts = [host("a", load=5), host("b", load=1), host("c", load=9, tags=("py",)),
             host("d", load=0, store=False), host("e", load=2, tags=("py",), pools={"py": 2})]
    assert [h.host_id for h in spawn_candidates(hosts, "py")] == ["e", "c", "b", "a"]
    assert [h.host_id for h in spawn_candidates(hosts, "other")] == ["b", "e", "a", "c"]  # d has no store
    assert [h.host_id for h in spawn_candidates(hosts, "py", pinned="d")] == ["d"]
    assert [h.host_id for h in holders(hosts, "py")] == ["e", "c"]
    assert [h.host_id for h in by_load([host("x", load=1, capacity=2), host("y", load=3, capacity=100)])] == \
        ["y", "x"]


def test_a_spread_fork_starts_on_the_sources_host_then_fills_the_least_loaded() -> None:
    hosts = [host("a", load=4), host("b"), host("c"), host("d", store=False)]

    def plan(source: str, count: int, pool: list[HostRecord] = hosts) -> dict[str, int]:
        return {h.host_id: n for h, n in spread_plan(pool, source, count)}

    # The source's host takes the first child whatever its load; d cannot pull from the store.
    assert plan("a", 1) == {"a": 1}
    assert plan("a", 7) == {"a": 1, "b": 3, "c": 3}
    # Equal hosts share evenly, the source's first.
    assert plan("b", 6, [host("b"), host("c"), host("e")]) == {"b": 2, "c": 2, "e": 2}
    # A source host without a store keeps them all (nobody else could start from its branch).
    assert plan("d", 5) == {"d": 5}
    assert plan("zz", 3) == {} and plan("a", 0) == {}


def test_a_sandbox_that_mounts_volumes_is_placed_where_they_all_are() -> None:
    hosts = [host("a", load=1, volumes=("data",)), host("b", load=0, volumes=("data", "logs")),
             host("c", volumes=("logs",))]
    assert [h.host_id for h in volume_holders(hosts, ["data"])] == ["b", "a"]
    assert [h.host_id for h in volume_holders(hosts, ["data", "logs"])] == ["b"]
    assert volume_holders(hosts, ["data", "nowhere"]) == []
    # What the gateway reads of a spawn's (or E2B create's) body: the names, or None for a body it
    # leaves to a host to refuse.
    assert named_volumes(b'{"volumes": [{"name": "b", "mount": "/x"}, {"name": "a"}, {"name": "b"}]}',
                         "volumes") == ["a", "b"]
    assert named_volumes(b'{"snapshot_tag": "py"}', "volumes") == []
    for bad in (b"not json", b'{"volumes": {"name": "a"}}', b'{"volumes": [{"host_path": "/etc"}]}',
                b'{"volumes": [{"name": "../x"}]}', b'{"volumes": [{"name": 7}]}',
                b'{"volumes": [%s]}' % b",".join([b'{"name": "a"}'] * (MAX_NAMED + 1))):
        assert named_volumes(bad, "volumes") is None, bad


def test_a_host_record_round_trips_and_a_bad_one_is_refused() -> None:
    record = host("h1", load=3, tags=("py", "b1"), pools={"py": 1}, volumes=("data",))
    assert HostRecord.from_json(record.to_json()) == record
    assert record.key() == KEY_PREFIX + "h1" and record.load == 0.3
    for bad in ('{"host_id": "H1!", "url": "http://x", "capacity": 1}', '{"host_id": "h1"}',
                '{"host_id": "h1", "url": "file:///etc", "capacity": 1}', "not json"):
        with pytest.raises(InvalidRequest):
            HostRecord.from_json(bad)


def test_sandbox_ids_name_their_host() -> None:
    prefix = layout.new_batch_prefix("h7")
    assert prefix.startswith("sb-h7-") and len(prefix) == len("sb-h7-") + 6
    assert layout.host_of(f"{prefix}-0003") == "h7"
    assert layout.host_of("sb-abcdef-0000") is None
    for ok in ("sb-abcdef-0000", "sb-h1-abcdef-0000", "sb-0123456789abcdef-abcdef-0000"):
        layout.check_sandbox_id(ok)
    # Well-formed ids that name no fleet host: a host answers 404 for them, not 400.
    for no_host in ("sb-H1-abcdef-0000", "sb-h_1-abcdef-0000", "sb-0123456789abcdefg-abcdef-0000",
                    "sb-h1--0000"):
        assert layout.check_sandbox_id(no_host) == no_host and layout.host_of(no_host) is None
    for bad in ("../sb-h1-abcdef-0000", "sb h1", "sb,h1", "-sb", "x" * 49):
        with pytest.raises(InvalidRequest):
            layout.check_sandbox_id(bad)
    with pytest.raises(InvalidRequest):
        layout.new_batch_prefix("Bad-Host")


def test_prefix_end() -> None:
    assert prefix_end("forkd/hosts/") == "forkd/hosts0"


# ------------------------------------------------------------------ a real etcd


@pytest.fixture(scope="module")
def etcd() -> Iterator[Etcd]:
    with etcd_server() as server:
        yield server


def test_a_member_registers_updates_and_leaves(etcd: Etcd) -> None:
    async def scenario() -> None:
        state = {"tags": ["py"]}
        member = FleetMember(EtcdClient([etcd.url]), lambda: host("m1", tags=tuple(state["tags"])), ttl=2)
        view = Membership(EtcdClient([etcd.url]), interval=0.1)
        await member.start()
        await view.refresh()
        assert view.get("m1") is not None and view.get("m1").snapshots == ["py"]  # type: ignore[union-attr]
        state["tags"] = ["py", "b1"]
        await asyncio.sleep(3)  # past the TTL: kept alive by the member all along
        await view.refresh()
        assert view.get("m1").snapshots == ["py", "b1"]  # type: ignore[union-attr]
        gone = view.gone("m1")
        assert not gone.is_set()
        await member.stop()  # revokes the lease: gone at once, not after the TTL
        await view.refresh()
        assert view.get("m1") is None and gone.is_set()
        await view.stop()

    asyncio.run(scenario())


def test_a_host_that_stops_refreshing_leaves_when_its_lease_ends(etcd: Etcd) -> None:
    async def scenario() -> float:
        client = EtcdClient([etcd.url])
        lease = await client.grant(2)
        await client.put(host("dead").key(), host("dead").to_json(), lease=lease)
        started = time.monotonic()
        view = Membership(EtcdClient([etcd.url]), interval=0.1)
        await view.start()
        assert view.get("dead") is not None
        await asyncio.wait_for(view.gone("dead").wait(), timeout=10)
        await view.stop()
        assert await client.keepalive(lease) == 0  # expired: a member would register anew
        await client.close()
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 2 + 3  # the 2 s lease, etcd's expiry tick, slack for a busy host


def test_a_member_whose_lease_ran_out_while_its_record_changed_registers_again(etcd: Etcd) -> None:
    """A host cut off from etcd past its TTL whose record changed meanwhile: its first call once
    healed is the put, which etcd refuses (its lease is gone); it must grant a new lease, not
    retry the dead one for ever (found by the fleet test's partition of a namespaced host)."""
    async def scenario() -> None:
        state = {"tags": ["py"]}
        member = FleetMember(EtcdClient([etcd.url]), lambda: host("m2", tags=tuple(state["tags"])), ttl=2)
        view = Membership(EtcdClient([etcd.url]), interval=0.1)
        await member.step()  # registered, but nothing keeps it alive: as while partitioned
        await view.start()
        await asyncio.wait_for(view.gone("m2").wait(), timeout=10)
        state["tags"] = ["py", "b1"]  # it changed while cut off
        await member.step()
        await member.step()
        await view.refresh()
        assert view.get("m2") is not None and view.get("m2").snapshots == ["py", "b1"]  # type: ignore[union-attr]
        await member.stop()
        await view.stop()

    asyncio.run(scenario())


def test_an_unreachable_etcd_is_an_error_not_a_hang() -> None:
    async def scenario() -> None:
        client = EtcdClient([f"http://127.0.0.1:{free_port()}"], timeout=1)
        with pytest.raises(Exception, match="no etcd endpoint answered"):
            await client.get_prefix(KEY_PREFIX)
        await client.close()

    started = time.monotonic()
    asyncio.run(scenario())
    assert time.monotonic() - started < 5


# ------------------------------------------------------------------ a real gateway


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """Accepts connections and never answers: a host that hangs."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


TOKEN = "c3f1a9e2b7d44e0f8a6b5c2d1e0f9a8b"


def put_host(etcd: Etcd, record: HostRecord, ttl: int = 30) -> None:
    async def go() -> None:
        client = EtcdClient([etcd.url])
        lease = await client.grant(ttl)
        await client.put(record.key(), record.to_json(), lease=lease)
        await client.close()

    asyncio.run(go())


@pytest.fixture
def gateway(etcd: Etcd, tmp_path: Path) -> Iterator[dict[str, Any]]:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    with contextlib.ExitStack() as stack:
        stack.enter_context(fake_qemu(tmp_path))
        urls: dict[str, str] = {}
        sandboxes: dict[str, str] = {}
        # Two daemons: ga holds "seed" and runs a sandbox of it; gb holds "py" and runs one of it.
        for name, tag in (("ga", "seed"), ("gb", "py")):
            data = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fkt-", dir="/tmp")))
            guest_image(data / "images")
            urls[name] = stack.enter_context(serve(create_app(
                Settings(token_file=token_file, audit_log=tmp_path / f"{name}.log", data_dir=data,
                         host_id=name))))
            with Controller(url=urls[name], token=TOKEN) as daemon:
                daemon.create_snapshot(tag)
                sandboxes[name] = daemon.spawn_sandboxes(tag)[0]["id"]
            put_host(etcd, HostRecord(name, urls[name], 10, 1, [tag], {}, 1000, False))
        settings = GatewaySettings(etcd=[etcd.url], token_file=token_file, poll_interval=0.1,
                                   request_timeout=60, publish=False)
        url = stack.enter_context(serve(create_gateway_app(settings)))
        client = stack.enter_context(httpx.Client(base_url=url, timeout=30,
                                                  headers={"Authorization": f"Bearer {TOKEN}"}))
        yield {"client": client, "sandboxes": sandboxes, "urls": urls}
        asyncio.run(_clear(etcd))


async def _clear(etcd: Etcd) -> None:
    client = EtcdClient([etcd.url])
    for kv in await client.get_prefix(KEY_PREFIX):
        await client.delete(kv.key)
    await client.close()


def test_the_gateway_routes_like_one_daemon(gateway: dict[str, Any]) -> None:
    c: httpx.Client = gateway["client"]
    assert c.get("/healthz").json() == {"ok": True}
    assert httpx.get(str(c.base_url) + "/v1/sandboxes").status_code == 401  # the gateway checks the token
    assert {h["host_id"] for h in c.get("/v1/fleet").json()} == {"ga", "gb"}
    # The holder of py gets the spawn; its id names it.
    r = c.post("/v1/sandboxes", json={"snapshot_tag": "py", "n": 2})
    assert r.status_code == 201 and r.headers["x-forkd-host"] == "gb"
    assert all(sb["id"].startswith("sb-gb-") for sb in r.json())
    # Per-sandbox calls go to the owner.
    ga, gb = gateway["sandboxes"]["ga"], gateway["sandboxes"]["gb"]
    assert ga.startswith("sb-ga-") and gb.startswith("sb-gb-")
    assert c.get(f"/v1/sandboxes/{ga}").headers["x-forkd-host"] == "ga"
    assert c.post(f"/v1/sandboxes/{gb}/ping").json()["pong"] is True
    # Lists merge every host.
    ids = {sb["id"] for sb in c.get("/v1/sandboxes").json()}
    assert {ga, gb} <= ids and len(ids) == 4
    assert sorted(s["tag"] for s in c.get("/v1/snapshots").json()) == ["py", "seed"]
    # A bad query is the hosts' usual 400.
    bad = c.get("/v1/sandboxes", params={"nope": "1"})
    assert bad.status_code == 400 and "unknown query parameter" in bad.json()["error"]


def test_the_gateway_explains_ids_it_cannot_route(gateway: dict[str, Any]) -> None:
    c: httpx.Client = gateway["client"]
    r = c.get("/v1/sandboxes/sb-zz-abcdef-0000")
    assert r.status_code == 404 and "left the fleet" in r.json()["error"]
    r = c.get("/v1/sandboxes/sb-abcdef-0000")
    assert r.status_code == 404 and "names no host" in r.json()["error"]
    r = c.get("/v1/sandboxes/not-an-id")
    assert r.status_code == 404 and "names no host" in r.json()["error"]
    r = c.get("/v1/sandboxes/.not-an-id")
    assert r.status_code == 400 and "invalid sandbox id" in r.json()["error"]
    r = c.post("/v1/sandboxes", json={"snapshot_tag": "py"}, headers={"X-Forkd-Host": "zz"})
    assert r.status_code == 404 and "not in the fleet" in r.json()["error"]
    # A tag nobody holds, and no host can pull: a host answers its 404.
    r = c.post("/v1/sandboxes", json={"snapshot_tag": "nowhere"})
    assert r.status_code == 404 and "nowhere" in r.json()["error"]


def test_the_gateway_routes_e2b_traffic_by_sandbox_and_never_lends_its_token(gateway: dict[str, Any]) -> None:
    url = str(gateway["client"].base_url)
    key = {"X-API-Key": TOKEN}
    # The gateway's token does not stand in for E2B's credentials: the host answers E2B's 401.
    r = httpx.get(f"{url}/sandboxes")
    assert r.status_code == 401 and "API key" in r.json()["message"], r.text
    r = httpx.get(f"{url}/sandboxes", headers={"Authorization": f"Bearer {TOKEN[::-1]}"})
    assert r.status_code == 401, r.text
    on_a, on_b = gateway["sandboxes"]["ga"], gateway["sandboxes"]["gb"]
    # Lists merge every host's sandboxes, and page across them: a page of one, then a token that
    # carries each host's place, until the last page has none.
    listed = httpx.get(f"{url}/v2/sandboxes", headers=key)
    assert listed.status_code == 200, listed.text
    assert {on_a, on_b} == {s["sandboxID"] for s in listed.json()} and "x-next-token" not in listed.headers
    pages, token = [], None
    while True:
        page = httpx.get(f"{url}/v2/sandboxes", headers=key,
                         params={"limit": 1, **({"nextToken": token} if token else {})})
        assert page.status_code == 200, page.text
        pages.append([s["sandboxID"] for s in page.json()])
        token = page.headers.get("x-next-token")
        if token is None:
            break
    assert sorted(pages) == sorted([[on_a], [on_b]]), pages
    bad = httpx.get(f"{url}/v2/sandboxes", headers=key, params={"nextToken": "not a token"})
    assert bad.status_code == 400 and "nextToken" in bad.json()["message"], bad.text
    bad = httpx.get(f"{url}/v2/sandboxes", headers=key, params={"limit": 0})  # the host's own 400
    assert bad.status_code == 400 and "limit" in bad.json()["message"], bad.text
    # A call that names a sandbox goes to its host; envd's header and E2B's host name form too.
    got = httpx.get(f"{url}/sandboxes/{on_b}", headers=key)
    assert got.status_code == 200 and got.headers["x-forkd-host"] == "gb", got.text
    for headers in ({"E2b-Sandbox-Id": on_a}, {"Host": f"49983-{on_a}.e2b.test"}):
        r = httpx.get(f"{url}/health", headers=headers)
        assert r.headers.get("x-forkd-host") == "ga", (headers, r.status_code, r.text)
    # A sandbox of no host of the fleet is E2B's 404, naming why.
    gone = httpx.get(f"{url}/sandboxes/sb-zz-abcdef-0000", headers=key)
    assert gone.status_code == 404 and "left the fleet" in gone.json()["message"]
    # A create is placed as a spawn: on the host that holds the template.
    made = httpx.post(f"{url}/sandboxes", headers=key, json={"templateID": "py"})
    assert made.status_code == 201 and made.headers["x-forkd-host"] == "gb", made.text
    # A sandbox's access token opens it through the gateway; one minted on the other host (for
    # its own sandbox) does not.
    other = httpx.post(f"{url}/sandboxes", headers=key, json={"templateID": "seed"})
    assert other.status_code == 201 and other.headers["x-forkd-host"] == "ga", other.text
    on_gb, on_ga = made.json(), other.json()

    def read_root(sandbox: dict[str, Any], token: str) -> httpx.Response:
        return httpx.get(f"{url}/files", params={"path": "/"},
                         headers={"E2b-Sandbox-Id": sandbox["sandboxID"], "X-Access-Token": token})

    assert read_root(on_gb, on_gb["envdAccessToken"]).status_code != 401
    refused = read_root(on_gb, on_ga["envdAccessToken"])
    assert refused.status_code == 401 and "access token" in refused.text, refused.text
    # envd's uploads are relayed as they come, past the gateway's 1 MiB limit on JSON bodies (the
    # host bounds them by its own): a 3 MiB file (a 413 from the gateway before).
    envd = {"E2b-Sandbox-Id": on_gb["sandboxID"], "X-Access-Token": on_gb["envdAccessToken"]}
    big = httpx.post(f"{url}/files", params={"path": "/tmp/big.bin"}, timeout=60, headers=envd,
                     files={"file": ("big.bin", b"x" * (3 << 20))})
    assert big.status_code == 200 and big.headers["x-forkd-host"] == "gb", big.text


def test_a_websocket_naming_no_sandbox_or_a_hostile_host_is_refused_before_the_handshake(
        gateway: dict[str, Any]) -> None:
    """The gateway relays a WebSocket only for a Host that names a sandbox of the fleet in the plain
    {port}-{id}.{domain} form (that Host becomes its own handshake's URL): one carrying '@' or '/',
    one past 300 characters, or one naming no sandbox of the fleet, is refused, never upgraded."""
    url = httpx.URL(str(gateway["client"].base_url))
    on_a = gateway["sandboxes"]["ga"]
    for host in (f"8000-{on_a}.x.test@127.0.0.1:22", f"8000-{on_a}.x.test/evil",
                 f"8000-{on_a}." + "a" * 300, "8000-sb-zz-abcdef-0000.x.test", "no-sandbox.x.test"):
        with socket.create_connection((url.host, url.port), timeout=10) as sock:
            sock.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                         "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
                         .encode())
            status = sock.recv(64).split(b"\r\n", 1)[0]
        assert status.split()[1] == b"403", (host, status)


def test_a_dead_or_hanging_host_never_holds_a_request(gateway: dict[str, Any], etcd: Etcd) -> None:
    c: httpx.Client = gateway["client"]
    # A host whose address refuses connections is skipped when placing a spawn.
    put_host(etcd, HostRecord("gc", f"http://127.0.0.1:{free_port()}", 1000, 0, ["py"], {"py": 5}, 9999,
                              True))
    deadline = time.monotonic() + 5
    while "gc" not in {h["host_id"] for h in c.get("/v1/fleet").json()}:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    r = c.post("/v1/sandboxes", json={"snapshot_tag": "py"})
    assert r.status_code == 201 and r.headers["x-forkd-host"] == "gb"
    # A host that accepts and never answers, whose lease then ends: the request is cut short.
    with silent_server() as url:
        put_host(etcd, HostRecord("gd", url, 10, 0, [], {}, 0, False), ttl=2)
        while "gd" not in {h["host_id"] for h in c.get("/v1/fleet").json()}:
            time.sleep(0.05)
        started = time.monotonic()
        r = c.get("/v1/sandboxes/sb-gd-abcdef-0000")
        took = time.monotonic() - started
    assert r.status_code == 502 and "left the fleet while serving" in r.json()["error"]
    assert took < 2 + 3, took  # cut short when the 2 s lease ends, not after the 60 s request timeout


# ------------------------------------------------------------------ capacity through the gateway

def full_host(retry_after: int) -> Any:
    """A host that is at capacity: every spawn is its 503 no_capacity (the daemon's answer shape)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def spawn(_request: Request) -> JSONResponse:
        return JSONResponse({"error": "this host is at capacity", "code": "no_capacity"}, status_code=503,
                            headers={"Retry-After": str(retry_after)})

    return Starlette(routes=[Route("/v1/sandboxes", spawn, methods=["POST"])])


def test_the_gateway_tries_the_next_host_past_a_full_one_and_is_503_when_all_are(
        etcd: Etcd, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    with contextlib.ExitStack() as stack:
        stack.enter_context(fake_qemu(tmp_path))
        full_a = stack.enter_context(serve(full_host(7)))
        full_b = stack.enter_context(serve(full_host(5)))
        data = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fkt-", dir="/tmp")))
        guest_image(data / "images")
        roomy_url = stack.enter_context(serve(create_app(
            Settings(token_file=token_file, audit_log=tmp_path / "gc.log", data_dir=data, host_id="gc"))))
        with Controller(url=roomy_url, token=TOKEN) as daemon:
            daemon.create_snapshot("py")
        # The full hosts hold py and are the least loaded: placement tries them first.
        put_host(etcd, HostRecord("ga", full_a, 10, 0, ["py"], {}, 1000, True))
        put_host(etcd, HostRecord("gb", full_b, 10, 1, ["py"], {}, 1000, True))
        settings = GatewaySettings(etcd=[etcd.url], token_file=token_file, poll_interval=0.1,
                                   request_timeout=60, publish=False)
        url = stack.enter_context(serve(create_gateway_app(settings)))
        client = stack.enter_context(httpx.Client(base_url=url, timeout=30,
                                                  headers={"Authorization": f"Bearer {TOKEN}"}))
        deadline = time.monotonic() + 10
        while len(client.get("/v1/fleet").json()) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # Only full hosts: the fleet is full, with the soonest Retry-After and each host's reason.
        r = client.post("/v1/sandboxes", json={"snapshot_tag": "py"})
        assert r.status_code == 503 and r.json()["code"] == "no_capacity"
        assert r.headers["retry-after"] == "5"
        assert "ga: this host is at capacity" in r.json()["error"] and "gb:" in r.json()["error"]
        # A host with room joins: the spawn goes past the full ones to it.
        put_host(etcd, HostRecord("gc", roomy_url, 10, 5, ["py"], {}, 1000, True))
        while len(client.get("/v1/fleet").json()) < 3:
            assert time.monotonic() < deadline + 10
            time.sleep(0.05)
        r = client.post("/v1/sandboxes", json={"snapshot_tag": "py"})
        assert r.status_code == 201 and r.headers["x-forkd-host"] == "gc"
        asyncio.run(_clear(etcd))


def test_a_volume_stays_on_its_host_and_the_gateway_finds_it(gateway: dict[str, Any],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """forkd's and E2B's volumes through the gateway. The hosts' records in etcd were written before
    any volume was made, so the gateway finds each by asking the hosts; every call that names a
    volume goes to its host, a create of a taken name to its holder (its 409), and a spawn that
    mounts one never goes to a host without it."""
    c: httpx.Client = gateway["client"]
    made = c.post("/v1/volumes", json={"name": "vol-b", "fs": "hostdir", "size_mib": 16},
                  headers={"X-Forkd-Host": "gb"})
    assert made.status_code == 201 and made.headers["x-forkd-host"] == "gb", made.text
    for _ in range(3):
        got = c.get("/v1/volumes/vol-b")
        assert got.status_code == 200 and got.headers["x-forkd-host"] == "gb", got.text
    again = c.post("/v1/volumes", json={"name": "vol-b", "fs": "hostdir"})
    assert again.status_code == 409 and again.headers["x-forkd-host"] == "gb", again.text
    assert "vol-b" in {v["name"] for v in c.get("/v1/volumes").json()}
    missing = c.get("/v1/volumes/nowhere")
    assert missing.status_code == 404 and "nowhere" in missing.json()["error"]
    # gb holds the volume, ga the snapshot "seed", and gb cannot pull: the spawn goes to gb,
    # which says what it lacks, rather than to ga, where the volume is not.
    r = c.post("/v1/sandboxes", json={"snapshot_tag": "seed",
                                      "volumes": [{"name": "vol-b", "mount": "/mnt/b"}]})
    assert r.status_code == 404 and r.headers["x-forkd-host"] == "gb" and "seed" in r.json()["error"], r.text

    # E2B's volumes, by the published SDK with its URLs at the gateway.
    from e2b import Volume
    from e2b.exceptions import AuthenticationException

    url = str(c.base_url)
    monkeypatch.setenv("E2B_API_KEY", TOKEN)
    monkeypatch.setenv("E2B_API_URL", url)
    monkeypatch.setenv("E2B_VOLUME_API_URL", url)
    vol = Volume.create("vol-e")
    holder = c.get("/v1/volumes/vol-e").headers["x-forkd-host"]
    big = bytes(range(256)) * (6 << 10)  # 1.5 MiB: past the gateway's 1 MiB JSON body limit, streamed
    vol.write_file("/big.bin", big)
    assert vol.read_file("/big.bin", format="bytes") == big
    assert "vol-e" in {v.name for v in Volume.list()} and "vol-b" in {v.name for v in Volume.list()}
    on_b = Volume.connect("vol-b")
    on_b.write_file("/note.txt", "on gb")
    assert on_b.read_file("/note.txt") == "on gb"
    assert Volume.get_info("vol-b").name == "vol-b"
    # A volume's token opens its own volume on its own host only.
    with pytest.raises(AuthenticationException):
        Volume("vol-b", "vol-b", token=vol.token).read_file("/note.txt")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=gateway["urls"][holder], headers=auth) as direct:
        assert direct.get("/v1/volumes/vol-e").status_code == 200  # where the gateway said
    assert Volume.destroy("vol-e") is True and Volume.destroy("vol-e") is False
    assert c.delete("/v1/volumes/vol-b").status_code == 204
    assert c.get("/v1/volumes/vol-b").status_code == 404
