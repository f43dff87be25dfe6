"""Two real daemons on one host, with data dirs of their own (issue 38, items 8 and 15).

* A hibernated sandbox's address index is claimed host-wide, so the other daemon's spawn takes
  another one, and the wake (which makes the sandbox's host device ``fkn<i>`` again) works; it
  failed with ``500 … RTNETLINK answers: File exists`` when the other daemon had taken it.
* Each daemon's host table (masquerade, guard) is its own: one daemon's stop leaves the other's.
* Another local user (``nobody``) cannot connect to a private sandbox's address directly; root
  (the daemon's user) and the daemon's port proxy still can.

Each daemon starts with the session's template with a NIC (booted once) registered as ``base``;
everything else is a restore.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from forkd.host import childnet, netplan

from .conftest import Seeder
from .daemon_fixture import Daemon, new_daemon, ok, shutdown_and_check, start_or_clean_up

pytestmark = [
    pytest.mark.vm,
    pytest.mark.skipif(os.geteuid() != 0, reason="namespaces, veths and nftables need root"),
    pytest.mark.skipif(bool(childnet.missing_prerequisites()),
                       reason=f"host networking missing: {childnet.missing_prerequisites()}"),
]

LINE_PORT, HTTP_PORT = 8123, 8124
GUEST_SERVERS = f"""
import http.server, socket, threading
_srv = socket.socket(); _srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
_srv.bind(("0.0.0.0", {LINE_PORT})); _srv.listen(8)
def _serve(s):
    while True:
        c, _ = s.accept(); c.sendall(b"still here\\n"); c.close()
threading.Thread(target=_serve, args=(_srv,), daemon=True).start()
_web = http.server.ThreadingHTTPServer(("0.0.0.0", {HTTP_PORT}), http.server.SimpleHTTPRequestHandler)
threading.Thread(target=_web.serve_forever, daemon=True).start()
"""
NOBODY = 65534


@pytest.fixture(scope="module")
def daemons(nic_snapshot: str, seed: Seeder) -> Iterator[tuple[Daemon, Daemon]]:
    a, b = new_daemon("fk2a-"), new_daemon("fk2b-")
    for d in (a, b):
        seed(d.root, base=nic_snapshot)
    start_or_clean_up(a)
    try:
        start_or_clean_up(b)
    except BaseException:
        shutdown_and_check(a)
        raise
    try:
        yield a, b
    finally:
        for d in (a, b):
            if d.proc is not None and d.proc.poll() is None:
                shutdown_and_check(d)


def spawn_serving(c: httpx.Client) -> dict[str, Any]:
    [sb] = ok(c.post("/v1/sandboxes", json={"snapshot_tag": "base"}, timeout=300))
    out = ok(c.post(f"/v1/sandboxes/{sb['id']}/eval", json={"code": GUEST_SERVERS + "'serving'"}))
    assert out["exit_code"] == 0, out
    return dict(sb)


def host_fetch(ip: str) -> str:
    with socket.create_connection((ip, LINE_PORT), timeout=10) as s:
        return s.recv(100).decode().strip()


def as_nobody_connect(ip: str) -> subprocess.CompletedProcess[str]:
    """A TCP connect to the sandbox's address from a process of another local user."""
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "bash", "-c",
         f"exec 3<>/dev/tcp/{ip}/{LINE_PORT} && head -c 10 <&3"],
        capture_output=True, text=True, timeout=30, cwd="/")


def through_proxy(d: Daemon, sandbox_id: str, **headers: str) -> httpx.Response:
    host = {"Host": f"{HTTP_PORT}-{sandbox_id}.localhost:{d.port}"}
    deadline = time.monotonic() + 30
    while True:  # until the guest's server listens
        r = httpx.get(f"http://127.0.0.1:{d.port}/", headers={**host, **headers}, timeout=30)
        if r.status_code != 502 or time.monotonic() > deadline:
            return r
        time.sleep(0.3)


def host_table_exists(d: Daemon) -> bool:
    table = netplan.host_nat_table(d.root)
    return subprocess.run(["nft", "list", "table", "ip", table], capture_output=True).returncode == 0


def hibernate(c: httpx.Client, sb_id: str, *, memory: bool = True) -> None:
    r = c.post(f"/v1/sandboxes/{sb_id}/hibernate", json={"memory": memory})
    assert r.status_code == 200 and r.json()["state"] == "hibernated", r.text


def wake(c: httpx.Client, sb_id: str) -> dict[str, Any]:
    woke = c.post(f"/v1/sandboxes/{sb_id}/eval", json={"code": "1 + 1"}, timeout=300)
    assert woke.status_code == 200 and woke.json()["result"] == "2", woke.text
    return dict(ok(c.get(f"/v1/sandboxes/{sb_id}")))


def test_two_daemons_keep_their_addresses_host_rules_and_private_ports(
        daemons: tuple[Daemon, Daemon]) -> None:
    a, b = daemons
    with a.client() as ca, b.client() as cb:
        asleep = spawn_serving(ca)
        assert host_fetch(asleep["ip"]) == "still here"
        # Item 8, for both kinds of hibernation: its host device is gone while it sleeps, and the
        # other daemon's next spawn must not take its address, or the wake cannot make it again.
        others = []
        for memory in (True, False):
            hibernate(ca, asleep["id"], memory=memory)
            other = spawn_serving(cb)
            others.append(other)
            assert other["ip"] != asleep["ip"], "another daemon took a hibernated sandbox's address"
            assert wake(ca, asleep["id"])["ip"] == asleep["ip"]
        other = others[0]
        assert host_fetch(other["ip"]) == "still here"

        # Item 15: another local user cannot reach the private sandbox's port around the proxy.
        refused = as_nobody_connect(other["ip"])
        assert refused.returncode != 0 and "refused" in refused.stderr.lower(), refused
        assert host_fetch(other["ip"]) == "still here"  # root, the daemon's user, still can
        assert through_proxy(b, other["id"]).status_code == 403  # private: no token, no way in
        assert through_proxy(b, other["id"], Authorization=f"Bearer {b.token}").status_code == 200

        # The claim dies with its daemon: if the index is taken while none runs, the wake moves.
        ok(ca.post(f"/v1/sandboxes/{asleep['id']}/eval", json={"code": GUEST_SERVERS + "'serving'"}))
        hibernate(ca, asleep["id"])
    a.kill9()
    with b.client() as cb:
        meanwhile = spawn_serving(cb)
    a.start()
    with a.client() as ca, b.client() as cb:
        woken = wake(ca, asleep["id"])
        print(f"\nasleep at {asleep['ip']}, the other daemon's spawn meanwhile at {meanwhile['ip']}, "
              f"woken at {woken['ip']}")
        assert woken["ip"] != meanwhile["ip"]
        assert host_fetch(woken["ip"]) == "still here" and host_fetch(meanwhile["ip"]) == "still here"

        # One daemon's stop leaves the other's host table (its masquerade set and guard).
        assert host_table_exists(a) and host_table_exists(b)
    shutdown_and_check(a)
    assert not host_table_exists(a) and host_table_exists(b)
    assert host_fetch(other["ip"]) == "still here"
    refused = as_nobody_connect(other["ip"])
    assert refused.returncode != 0 and "refused" in refused.stderr.lower(), refused
