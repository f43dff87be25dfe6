"""A fleet on one machine: etcd, an S3 server, three forkd daemons and one gateway, all real.

Each daemon runs in a network namespace of its own with its own address, etcd
and the S3 server (moto) in another; only a network the test makes joins them
(a bridge in a namespace of its own, veth pairs: tests/integration/netns.py),
as separate machines would be. The gateway and the clients stay in the test's
namespace, joined to that network by one more veth. The daemons have separate
data directories and register in etcd under a short lease; clients talk only
to the gateway. Only one template is booted (on h1); the other hosts get
snapshots through the object store. Faults (a partition from etcd, the store
going away mid-start, kill -9 mid-fork) reuse the same fleet.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from forkd.config import DataDir
from forkd.host import fusefile
from forkd.store.layout import host_of

from .conftest import qemu_processes_of
from .daemon_fixture import (
    FORKD,
    Daemon,
    free_port,
    kill_qemus_of,
    make_data_dir,
    shutdown_and_check,
    write_token,
)
from .netns import Network, private_network
from .services import etcd_server, s3_server_process
from .test_compat_clients import CLIENTS, CLIENTS_VENV, ROOT, run_program
from .test_ways_in import serve_in

pytestmark = pytest.mark.vm

LEASE_TTL = 4
POLL = 0.5
HOSTS = ("h1", "h2", "h3")
# Every host has an address of its own, so every daemon listens on the same port, as on machines.
DAEMON_PORT = 8889
S3_PORT = 9000
# What h2 receives from the store before it goes away: the manifest and the small parts fit,
# a template's memory does not.
STORE_CUT_BYTES = 2 << 20
# What E2B's get_host names a sandbox's port under: {port}-{id}.{domain}. No DNS here: the program
# sends it to the gateway as the Host, as a wildcard record pointing at the gateway would.
GET_HOST_DOMAIN = "e2b.fleet.test"


@dataclass
class GatewayProc:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@dataclass
class Fleet:
    gateway: GatewayProc
    daemons: dict[str, Daemon]
    token: str
    net: Network
    etcd_url: str

    def client(self, timeout: float = 300) -> httpx.Client:
        return httpx.Client(base_url=self.gateway.url, timeout=timeout,
                            headers={"Authorization": f"Bearer {self.token}"})

    def hosts(self) -> dict[str, dict[str, Any]]:
        with self.client() as c:
            return {h["host_id"]: h for h in c.get("/v1/fleet").json()}

    def wait(self, what: str, check: Any, timeout: float = 30) -> float:
        started = time.monotonic()
        while not check():
            assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
            time.sleep(0.1)
        return time.monotonic() - started


def start_gateway(etcd_url: str, token_file: Path, root: Path) -> GatewayProc:
    port = free_port()
    log = root / "gateway.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORKD_")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(FORKD), "gateway", "--etcd", etcd_url, "--bind", f"127.0.0.1:{port}",
             "--token-file", str(token_file), "--poll-interval", str(POLL)],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    gw = GatewayProc(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{gw.url}/healthz", timeout=1).status_code == 200:
                return gw
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            gw.stop()
            raise AssertionError(f"the gateway did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with private_network([*HOSTS, "svc"]) as net, \
            etcd_server(net["svc"].launcher, net["svc"].address) as etcd, \
            s3_server_process(net["svc"].launcher, net["svc"].address, S3_PORT) as s3:
        shared = make_data_dir("fkg-")
        token, token_file = write_token(shared)
        daemons: dict[str, Daemon] = {}
        gateway: GatewayProc | None = None
        try:
            for host in HOSTS:
                machine = net[host]
                url = f"http://{machine.address}:{DAEMON_PORT}"
                # In the dict before it starts: a start that times out is still cleaned up.
                daemons[host] = Daemon(
                    root=make_data_dir(f"fk{host}-"), token=token, token_file=token_file, port=DAEMON_PORT,
                    host=machine.address, launcher=machine.launcher,
                    extra_args=["--host-id", host, "--etcd", etcd.url, "--store", s3.url("fleet"),
                                "--lease-ttl", str(LEASE_TTL), "--advertise-url", url],
                    extra_env={"FORKD_ACCEL": os.environ.get("FORKD_ACCEL", "auto"), **s3.env},
                )
                daemons[host].start()
            gateway = start_gateway(etcd.url, token_file, shared)
            fl = Fleet(gateway, daemons, token, net, etcd.url)
            fl.wait("three hosts in the fleet", lambda: set(fl.hosts()) == set(HOSTS))
            yield fl
        finally:
            if gateway is not None:
                gateway.stop()
                print(f"\ngateway log tail:\n{gateway.log.read_text()[-1500:]}")
            problems = []
            for daemon in daemons.values():
                try:
                    if daemon.proc is not None and daemon.proc.poll() is None:
                        shutdown_and_check(daemon)
                    else:
                        kill_qemus_of(daemon.root)  # the killed host's VMs
                        shutil.rmtree(daemon.root, ignore_errors=True)
                except Exception as exc:  # stop the others all the same
                    problems.append(exc)
            shutil.rmtree(shared, ignore_errors=True)
            if problems:
                raise problems[0]


def test_a_spawn_lands_on_the_host_holding_the_snapshot(fleet: Fleet) -> None:
    with fleet.client() as c:
        r = c.post("/v1/snapshots", json={"tag": "fl-py", "boot_wait_secs": 300},
                   headers={"X-Forkd-Host": "h1"})
        assert r.status_code == 201, r.text
        assert r.headers["x-forkd-host"] == "h1" and "warning" not in r.json(), r.json()  # published
        fleet.wait("h1 to list fl-py", lambda: "fl-py" in fleet.hosts()["h1"]["snapshots"])
        r = c.post("/v1/sandboxes", json={"snapshot_tag": "fl-py"})
        assert r.status_code == 201, r.text
        [child] = r.json()
        assert child["id"].startswith("sb-h1-") and r.headers["x-forkd-host"] == "h1"
        # No other host needed it, so none downloaded it.
        for host in ("h2", "h3"):
            with fleet.daemons[host].client() as direct:
                assert direct.get("/v1/snapshots").json() == []
        ping = c.post(f"/v1/sandboxes/{child['id']}/ping")
        assert ping.status_code == 200 and ping.json()["pong"] is True


def test_branch_on_host_a_then_fork_on_host_b(fleet: Fleet) -> None:
    with fleet.client() as c:
        [source] = c.post("/v1/sandboxes", json={"snapshot_tag": "fl-py"}).json()
        assert source["id"].startswith("sb-h1-")
        c.post(f"/v1/sandboxes/{source['id']}/exec",
               json={"args": ["sh", "-c", "echo time-travel > /root/marker && sync"]}).raise_for_status()
        remember = c.post(f"/v1/sandboxes/{source['id']}/eval", json={"code": "exec('answer = 6 * 7')"})
        remember.raise_for_status()
        r = c.post(f"/v1/sandboxes/{source['id']}/branch", json={"tag": "fl-branch", "mode": "diff"})
        assert r.status_code == 201 and r.json()["status"] == "ready", r.text
        assert "warning" not in r.json(), r.json()  # the gateway had h1 push it to the store
        # The source moves on; the branch keeps the past.
        c.post(f"/v1/sandboxes/{source['id']}/exec",
               json={"args": ["sh", "-c", "echo later > /root/marker"]}).raise_for_status()

        r = c.post("/v1/sandboxes", json={"snapshot_tag": "fl-branch"}, headers={"X-Forkd-Host": "h2"})
        assert r.status_code == 201, r.text
        [child] = r.json()
        assert child["id"].startswith("sb-h2-") and r.headers["x-forkd-host"] == "h2"
        seen = c.post(f"/v1/sandboxes/{child['id']}/exec", json={"args": ["cat", "/root/marker"]}).json()
        assert seen["stdout"] == "time-travel\n", seen
        assert c.post(f"/v1/sandboxes/{child['id']}/eval", json={"code": "answer"}).json()["result"] == "42"
        listed = {sb["id"] for sb in c.get("/v1/sandboxes").json()}
        assert {source["id"], child["id"]} <= listed
        tags = {s["tag"] for s in c.get("/v1/snapshots").json()}
        assert {"fl-py", "fl-branch"} <= tags


def test_a_spread_fork_tree_lands_on_several_hosts_and_promote_cleans_up_on_each(fleet: Fleet,
                                                                                 e2b_python: Path) -> None:
    with fleet.client(timeout=600) as c:
        [source] = c.post("/v1/sandboxes", json={"snapshot_tag": "fl-py"}).json()
        sid = source["id"]
        c.post(f"/v1/sandboxes/{sid}/exec",
               json={"args": ["sh", "-c", "echo spread > /root/seen && sync"]}).raise_for_status()
        c.post(f"/v1/sandboxes/{sid}/eval", json={"code": "exec('carried = 6 * 7')"}).raise_for_status()
        r = c.post(f"/v1/sandboxes/{sid}/fork-tree",
                   json={"count": 6, "spread": True, "child_env": [{"SLOT": str(i)} for i in range(6)]})
        assert r.status_code == 201, r.text
        report = r.json()
        assert report["errors"] == [] and len(report["children"]) == 6, report
        children = {int(ch["metadata"]["fork_index"]): ch["id"] for ch in report["children"]}
        assert sorted(children) == list(range(6))
        assert {ch["metadata"]["fork_tree_id"] for ch in report["children"]} == {report["tree_id"]}
        assert {ch["metadata"]["fork_parent_id"] for ch in report["children"]} == {sid}
        hosts = {host_of(child) for child in children.values()}
        # The source runs where the gateway put it (any host that holds fl-py by now); its host
        # branched and took its share.
        source_host = host_of(sid)
        assert len(hosts) >= 2 and source_host in hosts, (source_host, hosts)
        for index, child in children.items():
            # Each child, wherever it runs, starts from the source's memory and disk, with its own env.
            assert c.post(f"/v1/sandboxes/{child}/eval", json={"code": "carried"}).json()["result"] == "42"
            seen = c.post(f"/v1/sandboxes/{child}/exec",
                          json={"args": ["sh", "-c", "cat /root/seen; echo $SLOT"]}).json()
            assert seen["stdout"] == f"spread\n{index}\n", (child, seen)

        # E2B's paged list through the gateway, with the published SDK's paginator, two a page:
        # every sandbox of the fleet once, across the hosts.
        everyone = {sb["id"] for sb in c.get("/v1/sandboxes").json()}
        out = run_program(e2b_python, CLIENTS / "e2b" / "list_pages.py",
                          {"E2B_API_URL": fleet.gateway.url, "E2B_SANDBOX_URL": fleet.gateway.url,
                           "E2B_API_KEY": fleet.token}, "2")
        paged = json.loads(out.strip().splitlines()[-1])
        assert sorted(paged["ids"]) == sorted(everyone) and paged["pages"] == -(-len(everyone) // 2), paged

        winner = next(child for child in children.values() if host_of(child) != source_host)
        # A sandbox id names its host: the winner cannot take the id of a parent on another host.
        refused = c.post(f"/v1/sandboxes/{winner}/promote", json={"replace_parent": True})
        assert refused.status_code == 409 and "names its host" in refused.json()["error"]
        promoted = c.post(f"/v1/sandboxes/{winner}/promote", json={})
        assert promoted.status_code == 200, promoted.text
        deleted = {d["id"] for d in promoted.json()["deleted"] if d["deleted"]}
        assert deleted == set(children.values()) - {winner}, promoted.json()
        listed = {sb["id"] for sb in c.get("/v1/sandboxes").json()}
        assert winner in listed and sid in listed and not listed & deleted
        for gone in (winner, sid):
            assert c.delete(f"/v1/sandboxes/{gone}").status_code in (200, 204)
        # The branch was kept for the children elsewhere: it goes through the gateway, from every host.
        assert c.delete(f"/v1/snapshots/{report['snapshot_tag']}").status_code in (200, 204)


@pytest.fixture(scope="module")
def e2b_python() -> Path:
    """The published E2B SDK's interpreter (.venv-clients, made as `make test` makes it)."""
    subprocess.run(["bash", str(ROOT / "scripts" / "clients-venv.sh")], check=True, cwd=ROOT, timeout=900)
    return CLIENTS_VENV / "bin" / "python"


def proxied_to(fleet: Fleet, host: str) -> float:
    """Requests the gateway has proxied to ``host`` (its forkd_gateway_proxied counter)."""
    with fleet.client() as c:
        text = c.get("/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("forkd_gateway_proxied_total{") and f'host="{host}"' in line)


def ensure_base(fleet: Fleet, *, nic: bool = False) -> str:
    """The E2B programs' template ``base`` (``base-nic`` with a NIC, for a guest port that get_host
    names), booted on h3 (once a module); its tag."""
    tag = "base-nic" if nic else "base"
    with fleet.client(timeout=600) as c:
        if tag not in {s["tag"] for s in c.get("/v1/snapshots").json()}:
            made = c.post("/v1/snapshots", json={"tag": tag, "boot_wait_secs": 300, "nic": nic},
                          headers={"X-Forkd-Host": "h3"})
            assert made.status_code == 201, made.text
            fleet.wait(f"h3 to list {tag}", lambda: tag in fleet.hosts()["h3"]["snapshots"])
    return tag


@pytest.fixture
def base_pulls_undone(fleet: Fleet) -> Iterator[None]:
    """For a test whose sandboxes go where a volume is: the copies of ``base`` (booted on h3 first)
    that other hosts pulled from the store meanwhile are deleted after it (the store keeps it),
    since later tests start ``base`` on h2 as a snapshot only the store holds (CI of 7695931: a
    volume's program had left it on h2)."""
    def holders() -> set[str]:
        found = set()
        for name, daemon in fleet.daemons.items():
            with daemon.client() as direct:
                if "base" in {s["tag"] for s in direct.get("/v1/snapshots").json()}:
                    found.add(name)
        return found

    ensure_base(fleet)
    before = holders()
    yield
    for name in sorted(holders() - before):
        print(f"\n{name} pulled base during the test: its copy goes")
        with fleet.daemons[name].client() as direct:
            gone = direct.delete("/v1/snapshots/base")
            assert gone.status_code == 204, (name, gone.text)


@pytest.mark.parametrize("program", ["commands", "files", "lifecycle", "pty", "get_host"])
def test_e2b_programs_run_unchanged_through_the_gateway(fleet: Fleet, e2b_python: Path, program: str) -> None:
    """E2B's published SDK with E2B_API_URL and E2B_SANDBOX_URL at the gateway: creates are placed
    on the host holding the template, envd's traffic (streams included) follows each sandbox id to
    its host, and lists merge the hosts."""
    ensure_base(fleet)
    with fleet.client(timeout=600) as c:
        before = {sb["id"] for sb in c.get("/v1/sandboxes").json()}
    on_h3 = proxied_to(fleet, "h3")
    url = fleet.gateway.url
    env = {"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": fleet.token}
    args: tuple[str, ...] = ()
    if program == "get_host":  # a guest port needs a NIC: the module's NIC template
        env |= {"E2B_DOMAIN": GET_HOST_DOMAIN, "FORKD_TEST_PORT_PROXY": url}
        args = (ensure_base(fleet, nic=True),)
    out = run_program(e2b_python, CLIENTS / "e2b" / f"{program}.py", env, *args)
    assert out.strip().endswith(f"{program} ok"), out
    # The template's holder served the program's sandboxes: every call of it went there.
    assert proxied_to(fleet, "h3") - on_h3 >= 5
    with fleet.client() as c:
        assert {sb["id"] for sb in c.get("/v1/sandboxes").json()} == before  # it killed what it made


def test_a_websocket_to_a_sandbox_port_goes_through_the_gateway(fleet: Fleet) -> None:
    """A WebSocket to {port}-{id}.{domain}, as get_host names a sandbox's port: the gateway relays
    it to the sandbox's host (which relays it to the guest), both ways; one that names no sandbox
    of the fleet is refused before the handshake completes."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    tag = ensure_base(fleet, nic=True)
    gateway = httpx.URL(fleet.gateway.url)

    def to_gateway(host: str) -> Any:
        sock = socket.create_connection((gateway.host, gateway.port), timeout=30)
        return connect(f"ws://{host}/", sock=sock, open_timeout=30)

    with fleet.client(timeout=600) as c:
        [sb] = c.post("/v1/sandboxes", json={"snapshot_tag": tag,
                                             "network": {"allow_public_traffic": True}}).json()
        try:
            serve_in(c, sb["id"])
            deadline = time.monotonic() + 60
            while True:  # until the guest's echo server listens
                try:
                    ws = to_gateway(f"8002-{sb['id']}.{GET_HOST_DOMAIN}")
                    break
                except InvalidStatus:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            with ws:
                ws.send("through the gateway")
                assert ws.recv(timeout=30) == "echo:through the gateway"
        finally:
            c.delete(f"/v1/sandboxes/{sb['id']}")
    with pytest.raises(InvalidStatus) as refused:
        to_gateway(f"8002-sb-zz-abcdef-0000.{GET_HOST_DOMAIN}")
    assert refused.value.response.status_code == 403


@pytest.mark.usefixtures("base_pulls_undone")
def test_e2b_js_program_runs_unchanged_through_the_gateway(fleet: Fleet) -> None:
    """E2B's JavaScript SDK (npm ``e2b``, tests/clients/e2b-js): create, streamed and background
    commands, files, pause and connect, fork and kill (sandbox.mjs); a pty and a guest server
    reached as getHost names it (terminal.mjs), through the gateway to the template's host; a
    volume, its content calls and the two sandboxes that mount it on the volume's host (volumes.mjs)."""
    js = CLIENTS / "e2b-js"
    assert (js / "node_modules" / "e2b").is_dir(), "run `make node-deps` first"
    ensure_base(fleet)
    nic_tag = ensure_base(fleet, nic=True)  # a guest port needs a NIC
    with fleet.client() as c:
        before = {sb["id"] for sb in c.get("/v1/sandboxes").json()}
    url = fleet.gateway.url
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FORKD_", "E2B_"))}
    env = {**base, "E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": fleet.token,
           "E2B_DOMAIN": GET_HOST_DOMAIN, "FORKD_TEST_PORT_PROXY": url, "E2B_VOLUME_API_URL": url}
    for program, args in (("sandbox", ()), ("terminal", (nic_tag,)), ("volumes", ())):
        proc = subprocess.run(["node", f"{program}.mjs", *args], capture_output=True, text=True,
                              timeout=600, cwd=js, env=env)
        assert proc.returncode == 0 and proc.stdout.strip().endswith(f"{program} ok"), (
            f"node {program}.mjs exited with {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    with fleet.client() as c:
        assert {sb["id"] for sb in c.get("/v1/sandboxes").json()} == before


@pytest.mark.usefixtures("base_pulls_undone")
def test_a_sandbox_that_mounts_a_volume_runs_on_the_volumes_host(fleet: Fleet, e2b_python: Path) -> None:
    """A volume's files stay on the host that made it. One made on h1 (the template is h3's): a
    spawn through the gateway that mounts it lands on h1, which pulls the template from the store,
    and what its guest writes is in the volume, read back through the gateway; a spread fork of it
    keeps its children on h1, where they see the same files. Then E2B's volumes
    program, unchanged, with E2B_VOLUME_API_URL at the gateway too: its volume, wherever the
    gateway makes it, has both its sandboxes and its content calls on its host."""
    tag = ensure_base(fleet)
    with fleet.client(timeout=600) as c:
        before = {sb["id"] for sb in c.get("/v1/sandboxes").json()}
        made = c.post("/v1/volumes", json={"name": "fleet-vol", "fs": "hostdir", "size_mib": 16},
                      headers={"X-Forkd-Host": "h1"})
        assert made.status_code == 201 and made.headers["x-forkd-host"] == "h1", made.text
        try:
            r = c.post("/v1/sandboxes", json={"snapshot_tag": tag,
                                              "volumes": [{"name": "fleet-vol", "mount": "/mnt/v"}]})
            assert r.status_code == 201 and r.headers["x-forkd-host"] == "h1", r.text
            [sb] = r.json()
            assert sb["id"].startswith("sb-h1-")
            wrote = c.post(f"/v1/sandboxes/{sb['id']}/exec",
                           json={"args": ["sh", "-c", "echo from-h1 > /mnt/v/a.txt && cat /mnt/v/a.txt"]})
            assert wrote.status_code == 200 and wrote.json()["stdout"] == "from-h1\n", wrote.text
            info = c.get("/v1/volumes/fleet-vol")
            assert info.headers["x-forkd-host"] == "h1" and info.json()["sandboxes"] == [sb["id"]], info.text
            # A spread fork of it keeps its children on h1: the volume is h1's, and no store holds it.
            forked = c.post(f"/v1/sandboxes/{sb['id']}/fork", json={"count": 2, "spread": True})
            assert forked.status_code == 201, forked.text
            kids = [k["id"] for k in forked.json()["children"]]
            assert len(kids) == 2 and all(k.startswith("sb-h1-") for k in kids), forked.json()
            for kid in kids:
                seen = c.post(f"/v1/sandboxes/{kid}/exec", json={"args": ["cat", "/mnt/v/a.txt"]})
                assert seen.json()["stdout"] == "from-h1\n", seen.text
        finally:
            for sb_id in {s["id"] for s in c.get("/v1/sandboxes").json()} - before:
                c.delete(f"/v1/sandboxes/{sb_id}")
            # The fork's branch goes with its last child; until then the volume is in use (409).
            fleet.wait("fleet-vol to be unused", lambda: c.delete("/v1/volumes/fleet-vol").status_code != 409)
        assert c.get("/v1/volumes/fleet-vol").status_code == 404
    url = fleet.gateway.url
    env = {"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_VOLUME_API_URL": url, "E2B_API_KEY": fleet.token}
    out = run_program(e2b_python, CLIENTS / "e2b" / "volumes.py", env)
    assert out.strip().endswith("volumes ok"), out
    with fleet.client() as c:
        assert {sb["id"] for sb in c.get("/v1/sandboxes").json()} == before  # it killed what it made


def etcd_leases(fleet: Fleet) -> int:
    """How many leases etcd holds (only the daemons take leases: one each while in the fleet)."""
    r = httpx.post(f"{fleet.etcd_url}/v3/lease/leases", json={}, timeout=10)
    r.raise_for_status()
    return len(r.json().get("leases", []))


def test_a_host_cut_off_from_etcd_leaves_the_fleet_and_rejoins_once_healed(fleet: Fleet) -> None:
    """A partition of h3 from etcd only: a drop rule in h3's own namespace towards etcd's address.
    h3 still answers its clients, but its lease runs out and the gateway stops routing to it;
    once the rule is gone it registers again under a new lease, and no lease is left over."""
    etcd, h3 = fleet.net["svc"].address, fleet.net["h3"]
    assert etcd_leases(fleet) == len(HOSTS)
    tag = "base" if "base" in fleet.hosts()["h3"]["snapshots"] else "fl-py"
    h3.nft(f"table inet fkpart {{ chain out {{ type filter hook output priority 0; policy accept; "
           f"ip daddr {etcd} tcp dport 2379 drop\n }}\n}}\n")
    try:
        fleet.wait("h3 to leave the fleet", lambda: "h3" not in fleet.hosts(), timeout=LEASE_TTL + 20)
        with fleet.daemons["h3"].client(timeout=10) as direct:  # cut from etcd, not from its clients
            assert direct.get("/healthz").status_code == 200
        with fleet.client(timeout=30) as c:
            pinned = c.post("/v1/sandboxes", json={"snapshot_tag": tag}, headers={"X-Forkd-Host": "h3"})
            assert pinned.status_code == 404 and "not in the fleet" in pinned.json()["error"], pinned.text
        assert etcd_leases(fleet) == len(HOSTS) - 1  # h3's ran out
    finally:
        h3.nft("delete table inet fkpart")
    fleet.wait("h3 to rejoin the fleet", lambda: "h3" in fleet.hosts(), timeout=LEASE_TTL + 20)
    assert etcd_leases(fleet) == len(HOSTS)
    with fleet.client(timeout=300) as c:
        r = c.post("/v1/sandboxes", json={"snapshot_tag": tag}, headers={"X-Forkd-Host": "h3"})
        assert r.status_code == 201 and r.headers["x-forkd-host"] == "h3", r.text
        [child] = r.json()
        assert c.post(f"/v1/sandboxes/{child['id']}/ping").json()["pong"] is True
        assert c.delete(f"/v1/sandboxes/{child['id']}").status_code in (200, 204)


def test_the_store_going_away_mid_lazy_start_fails_cleanly(fleet: Fleet) -> None:
    """h2 lazily starts base (h3's template), which only the store holds for it, and the store goes away once
    the first STORE_CUT_BYTES have arrived (a rule in h2's namespace: from then on every packet
    to the store is answered with a reset, as by a host that is gone). The spawn fails with an
    error naming the store and leaves no registered snapshot, sandbox, QEMU or FUSE mount, and
    the store still lists the tag. (The retry once the store is back: the next test.)"""
    h2, s3 = fleet.daemons["h2"], fleet.net["svc"].address
    ensure_base(fleet)
    with h2.client() as direct:
        assert "base" not in {s["tag"] for s in direct.get("/v1/snapshots").json()}  # store-only there
        before = {sb["id"] for sb in direct.get("/v1/sandboxes").json()}
    qemus = len(qemu_processes_of(h2.root))
    fleet.net["h2"].nft(
        f"table inet fkstore {{ quota received {{ over {STORE_CUT_BYTES} bytes }}\n"
        f" chain in {{ type filter hook input priority 0; policy accept;"
        f" ip saddr {s3} tcp sport {S3_PORT} quota name \"received\"\n }}\n"
        f" chain out {{ type filter hook output priority 0; policy accept;"
        f" ip daddr {s3} tcp dport {S3_PORT} quota name \"received\" reject with tcp reset\n }}\n}}\n")
    try:
        with fleet.client(timeout=600) as c:
            r = c.post("/v1/sandboxes", json={"snapshot_tag": "base"}, headers={"X-Forkd-Host": "h2"})
        print(f"\nspawn with the store gone mid-start: {r.status_code} {r.text[:600]}")
        assert r.status_code >= 500 and "store" in r.json()["error"], r.text
        with h2.client() as direct:
            assert "base" not in {s["tag"] for s in direct.get("/v1/snapshots").json()}
            assert {sb["id"] for sb in direct.get("/v1/sandboxes").json()} == before
        fleet.wait("the failed child's QEMU to go", lambda: len(qemu_processes_of(h2.root)) == qemus)
        fleet.wait("the lazy mounts to go", lambda: fusefile.mounts_under(h2.root) == [])
    finally:
        fleet.net["h2"].nft("delete table inet fkstore")
    with fleet.client(timeout=600) as c:
        assert "base" in {s["tag"] for s in c.get("/v1/snapshots").json()}  # nothing acknowledged lost


def test_once_the_store_is_back_the_same_spawn_succeeds(fleet: Fleet) -> None:
    """Nothing of the failed lazy import is in the way: no directory of it is left (a late write
    into it once recreated one, and the retry was refused 409: store/layout.discard)."""
    h2 = fleet.daemons["h2"]
    left = DataDir(h2.root).snapshots / "base"
    assert not left.exists(), sorted(p.name for p in left.iterdir())
    with fleet.client(timeout=600) as c:
        r = c.post("/v1/sandboxes", json={"snapshot_tag": "base"}, headers={"X-Forkd-Host": "h2"})
        assert r.status_code == 201 and r.headers["x-forkd-host"] == "h2", r.text
        [child] = r.json()
        assert c.post(f"/v1/sandboxes/{child['id']}/ping").json()["pong"] is True
        assert c.delete(f"/v1/sandboxes/{child['id']}").status_code in (200, 204)


def spread_fork_in_flight(fleet: Fleet, source: str) -> tuple[threading.Thread, dict[str, Any]]:
    """A spread fork-tree of 6 from ``source`` through the gateway, running in a thread."""
    answer: dict[str, Any] = {}

    def fork() -> None:
        with fleet.client(timeout=600) as c:
            answer["response"] = c.post(f"/v1/sandboxes/{source}/fork-tree",
                                        json={"count": 6, "spread": True})
    thread = threading.Thread(target=fork, daemon=True)
    thread.start()
    return thread, answer


def test_a_host_killed_mid_fork_is_reported_gone_and_new_spawns_go_elsewhere(fleet: Fleet) -> None:
    """kill -9 of h2 while a spread fork-tree is putting children on it: the fork answers with
    h2's children failed (naming h2) and the others up; h2's sandboxes are reported gone once its
    lease ends and spawns go elsewhere. Restarted, h2 rejoins with no QEMU it does not account
    for, etcd holds one lease per host, and every acknowledged snapshot is still there."""
    h2 = fleet.daemons["h2"]
    with fleet.client(timeout=300) as c:
        on_h2 = [sb for sb in c.get("/v1/sandboxes").json() if sb["id"].startswith("sb-h2-")]
        assert on_h2, "the previous test left a sandbox on h2"
        victim = on_h2[0]["id"]
        [source] = c.post("/v1/sandboxes", json={"snapshot_tag": "fl-py"},
                          headers={"X-Forkd-Host": "h1"}).json()
        acknowledged = {s["tag"] for s in c.get("/v1/snapshots").json()}
    qemus = len(qemu_processes_of(h2.root))
    thread, answer = spread_fork_in_flight(fleet, source["id"])
    # h2's share is under way once a QEMU of its starts (the branch has reached it through the store).
    fleet.wait("h2 to start its share of the fork", lambda: len(qemu_processes_of(h2.root)) > qemus
               or not thread.is_alive(), timeout=300)
    assert thread.is_alive(), f"the fork finished before h2 started a child: {answer}"
    with fleet.client(timeout=30) as c:
        h2.kill9()
        killed = time.monotonic()
        slowest = 0.0
        while True:
            asked = time.monotonic()
            r = c.get(f"/v1/sandboxes/{victim}")
            slowest = max(slowest, time.monotonic() - asked)
            if r.status_code == 404:
                break
            assert r.status_code == 502, r.text  # until the lease ends: unreachable, at once
            assert time.monotonic() - killed < LEASE_TTL + 10, "h2 was never reported gone"
            time.sleep(0.1)
        gone_after = time.monotonic() - killed
        print(f"\nh2 killed: its sandbox reported gone after {gone_after:.1f}s (lease TTL {LEASE_TTL}s, "
              f"gateway poll {POLL}s); slowest answer meanwhile {slowest * 1000:.0f} ms")
        assert "left the fleet" in r.json()["error"]
        # The lease ends at most LEASE_TTL after the kill (its last refresh was before it); etcd
        # expires leases on a ~0.5 s tick and the gateway re-reads every POLL s. A liveness bound
        # with slack for a busy machine, not a speed figure.
        assert gone_after <= LEASE_TTL + 2 * POLL + 2
        assert slowest < 5, "a request to the dead host hung"
        assert victim not in {sb["id"] for sb in c.get("/v1/sandboxes").json()}
        assert "h2" not in fleet.hosts()

        r = c.post("/v1/sandboxes", json={"snapshot_tag": "fl-branch"})
        assert r.status_code == 201, r.text
        assert r.headers["x-forkd-host"] != "h2" and not r.json()[0]["id"].startswith("sb-h2-")
        pinned = c.post("/v1/sandboxes", json={"snapshot_tag": "fl-py"}, headers={"X-Forkd-Host": "h2"})
        assert pinned.status_code == 404 and "not in the fleet" in pinned.json()["error"]

    thread.join(300)
    assert not thread.is_alive(), "the fork through the gateway hung on the dead host"
    r = answer["response"]
    assert r.status_code == 201, r.text
    report = r.json()
    up = {int(ch["metadata"]["fork_index"]): ch["id"] for ch in report["children"]}
    failed = {e["index"]: e["error"] for e in report["errors"]}
    print(f"\nfork-tree with h2 killed mid-fork: up {sorted(up)}, failed {failed}")
    assert sorted([*up, *failed]) == list(range(6)) and failed, report  # each child: up or failed
    assert all("h2" in why for why in failed.values()), failed
    assert {host_of(child) for child in up.values()} <= {"h1", "h3"}, up

    # Restarted on its data dir: it rejoins, and every QEMU left running is one it lists.
    h2.start()
    fleet.wait("h2 to rejoin the fleet", lambda: "h2" in fleet.hosts())
    with h2.client() as direct:
        kept = [sb for sb in direct.get("/v1/sandboxes").json() if sb["state"] != "hibernated"]
    assert len(qemu_processes_of(h2.root)) == len(kept), (qemu_processes_of(h2.root), kept)
    assert etcd_leases(fleet) == len(HOSTS)
    with fleet.client(timeout=300) as c:
        assert acknowledged <= {s["tag"] for s in c.get("/v1/snapshots").json()}
        for child in [source["id"], *up.values()]:
            assert c.delete(f"/v1/sandboxes/{child}").status_code in (200, 204)


def test_three_hosts_at_two_sandboxes_each_take_six_spawns_and_refuse_the_seventh(fleet: Fleet) -> None:
    """The three daemons restarted on their data dirs with ``--max-sandboxes 2``: six spawns
    through the gateway land two per host (a full host answers no_capacity and the gateway tries
    the next), and the seventh is answered 503 no_capacity with a Retry-After."""
    with fleet.client(timeout=300) as c:
        for sb in c.get("/v1/sandboxes").json():
            assert c.delete(f"/v1/sandboxes/{sb['id']}").status_code in (200, 204)
    for daemon in fleet.daemons.values():
        daemon.stop()
        daemon.extra_args += ["--max-sandboxes", "2"]
        daemon.start()
    fleet.wait("three hosts in the fleet", lambda: set(fleet.hosts()) == set(HOSTS))
    with fleet.client(timeout=600) as c:
        made = []
        for _ in range(6):
            r = c.post("/v1/sandboxes", json={"snapshot_tag": "fl-py"})
            assert r.status_code == 201, r.text
            made += [sb["id"] for sb in r.json()]
        assert Counter(host_of(sb) for sb in made) == dict.fromkeys(HOSTS, 2), made
        full = c.post("/v1/sandboxes", json={"snapshot_tag": "fl-py"})
        assert full.status_code == 503 and full.json()["code"] == "no_capacity", full.text
        assert int(full.headers["retry-after"]) >= 1
        for sb in made:
            assert c.delete(f"/v1/sandboxes/{sb}").status_code in (200, 204)
