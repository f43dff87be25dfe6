#!/usr/bin/env python3
"""What a name policy costs per sandbox: its resolver and inspector (host/dnsguard.py,
host/egress_inspect.py), the answers it installs, and a first connection checked by its name.

For ``--children`` sandbox networks (namespace, tap, veth, nftables; no VM), made by
``Networks.acquire`` as a spawn makes them, once with an address policy and once with
a name policy of the same size:

  set-up      acquire p50 of each (a name policy adds the resolver's UDP socket and the
              inspector's listening TCP socket in the namespace)
  resolver    the daemon's Python heap (tracemalloc) and open file descriptors added by the
  + inspector name policy's resolvers and inspectors, per sandbox (the kernel's side: one idle
              UDP socket and one idle listening TCP socket)
  first name  from inside each namespace (a client socket made there), the time from a
              question for an allowed name to its answer, which waits for the answered
              address to be in the sandbox's set (an ``nft`` run): what a first connection to
              a name costs on top of one to an address rule (which costs nothing here); and a
              refused name (no ``nft``) beside it; the CPU time both took (the daemon's and its
              ``nft`` children's)

  first TLS   a TLS connection (connect, handshake, one request and its answer) to a server on
  connection  the sandboxes' gateway, from each sandbox's namespace: straight (what an address
              rule lets through), through the sandbox's inspector (its SNI read and checked, the
              original destination dialled from the namespace, the bytes spliced), and through
              the inspector for a host with a header rule (TLS terminated with the sandbox's CA,
              the request read and rewritten with a secret put in, TLS to the server verified);
              and the CPU each took (client, server and inspector are all this process). The
              inspector is reached on loopback here, as nft's redirect of a guest's packet needs
              a guest.

Names are answered from a hosts file (``FORKD_DNS_HOSTS``): nothing leaves the host.
Needs root. Prints a table and writes bench/results/name_policy.json.

Usage: .venv/bin/python bench/name_policy.py [--children 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shutil
import socket
import ssl
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import dns.message
import dns.rcode

from common import scratch_data
from forkd.controller.network import Networks
from forkd.controller.runtime import Runtime
from forkd.host import childnet, dnsguard, egress_tls, netplan
from forkd.host import netns as netns_mod
from forkd.host.egress import EgressPolicy
from forkd.host.egress_inspect import Inspector, ServeFn
from forkd.host.egress_tls import SandboxCA
from forkd.host.netplan import ChildNet
from network_setup import ms, timed

RESULTS = Path(__file__).resolve().parent / "results"
ENTRIES = 16
ADDRESSES = EgressPolicy.from_request(None, {"allow_out": [f"10.201.0.1:{8000 + i}" for i in range(ENTRIES)]})
NAMES = EgressPolicy.from_request(None, {"allow_out": [f"n{i}.bench.test:443" for i in range(ENTRIES - 1)]
                                         + ["*.cdn.bench.test:443"]})
# The same, with a header rule (a secret put in) on the CDN's names: their TLS is intercepted.
RULES = EgressPolicy.from_request(None, {"allow_out": [str(e) for e in NAMES.allow_out], "rules": {
    "*.cdn.bench.test": [{"transform": {"headers": {"Authorization": "Bearer ${secrets.TOKEN}"}}}]}})


def rss_kib() -> int:
    """The Python heap the daemon's objects take (tracemalloc: RSS moves by allocator arenas)."""
    return tracemalloc.get_traced_memory()[0] // 1024


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


async def ask(net: ChildNet, name: str) -> tuple[int, float]:
    """One question from inside ``net``'s namespace to its resolver: (rcode, seconds)."""
    sock = await asyncio.to_thread(netns_mod.udp_socket_in, net.netns, (str(netplan.TAP_IP), 0))
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(sock, (str(netplan.TAP_IP), netplan.RESOLVER_PORT))
        t = time.perf_counter()
        await loop.sock_sendall(sock, dns.message.make_query(name, "A").to_wire())
        reply = await asyncio.wait_for(loop.sock_recv(sock, 4096), 10)
        secs = time.perf_counter() - t
    finally:
        sock.close()
    return dns.message.from_wire(reply).rcode(), secs


def server_tls(folder: Path) -> ssl.SSLContext:
    """The bench server's TLS context: a certificate for ``*.cdn.bench.test`` from a throwaway CA,
    which the daemon's side is told to trust (``FORKD_EGRESS_CA_FILE``) for the intercepted runs."""
    ca = SandboxCA.make("bench upstream")
    (folder / "upstream-ca.pem").write_text(ca.pem)
    os.environ[egress_tls.CA_FILE_ENV] = str(folder / "upstream-ca.pem")
    return ca.server_context("*.cdn.bench.test")


async def answer(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await r.read(4096)
    w.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    await w.drain()
    w.close()


CLIENT_TLS = ssl.create_default_context()
CLIENT_TLS.check_hostname = False
CLIENT_TLS.verify_mode = ssl.CERT_NONE  # the bench's throwaway certificate; nothing is checked by it


async def tls_request(sock: socket.socket, dst: tuple[str, int], name: str,
                      header: str = "") -> float:
    """Seconds from connect to the answer of one request over TLS (``sock``: unconnected)."""
    t = time.perf_counter()
    await asyncio.get_running_loop().sock_connect(sock, dst)
    r, w = await asyncio.open_connection(sock=sock, ssl=CLIENT_TLS, server_hostname=name)
    w.write(f"GET / HTTP/1.1\r\nHost: {name}\r\n{header}\r\n".encode())
    await w.drain()
    got = await asyncio.wait_for(r.read(), 10)
    secs = time.perf_counter() - t
    w.close()
    assert got.startswith(b"HTTP/1.1 204"), got[:64]
    return secs


async def first_connections(named: list[ChildNet], gateway: str, folder: Path) -> dict[str, Any]:
    """Each sandbox's first TLS connection to a server on the gateway, straight and inspected."""
    server = await asyncio.start_server(answer, gateway, 0, ssl=server_tls(folder))
    dst = (gateway, server.sockets[0].getsockname()[1])
    straight, inspected = [], []
    cpu0 = cpu_s()
    for net in named:
        sock = await asyncio.to_thread(netns_mod.tcp_socket_in, net.netns)
        straight.append(await tls_request(sock, dst, "x0.cdn.bench.test"))
    cpu1 = cpu_s()
    log: list[tuple[Any, ...]] = []
    for i, net in enumerate(named):
        # The policy's entry is *.cdn.bench.test:443; the bench server's port is whatever was free.
        inspector = Inspector(lambda name, _d, policy=net.egress: policy.allows_connection(name, 443),
                              lambda *e: log.append(e), destination=lambda _s: dst,
                              dial=dnsguard.dial_from(net.netns))
        front = await asyncio.start_server(inspector.handle, "127.0.0.1", 0)
        client = socket.socket()
        client.setblocking(False)
        name = f"x{i}.cdn.bench.test"
        inspected.append(await tls_request(client, front.sockets[0].getsockname()[:2], name))
        front.close()
    cpu2 = cpu_s()
    rule = RULES.rule_for("x0.cdn.bench.test")
    assert rule is not None
    intercepted = []
    for i, net in enumerate(named):
        ca = SandboxCA.make(f"bench {i}")  # each sandbox's own, as the daemon makes it

        def serve_for(name: str, tls: bool, netns: str = net.netns, ca: SandboxCA = ca) -> ServeFn:
            return egress_tls.server_for(name, tls, rule=rule, ca=ca, resolve={"TOKEN": "bench-secret"}.get,
                                         dial=dnsguard.dial_from(netns))

        inspector = Inspector(lambda name, _d: RULES.allows_connection(name, 443), lambda *e: log.append(e),
                              destination=lambda _s: dst, intercept=serve_for)
        front = await asyncio.start_server(inspector.handle, "127.0.0.1", 0)
        client = socket.socket()
        client.setblocking(False)
        intercepted.append(await tls_request(client, front.sockets[0].getsockname()[:2],
                                             f"x{i}.cdn.bench.test", "X-Token: ${secrets.TOKEN}\r\n"))
        front.close()
    cpu3 = cpu_s()
    server.close()
    refused = [e for e in log if not e[2]]
    assert not refused, refused[:3]
    n = len(named)
    return {"first_tls_straight": ms(straight), "first_tls_inspected": ms(inspected),
            "first_tls_intercepted": ms(intercepted),
            "cpu_ms_per_tls_straight": round((cpu1 - cpu0) / n * 1000, 2),
            "cpu_ms_per_tls_inspected": round((cpu2 - cpu1) / n * 1000, 2),
            "cpu_ms_per_tls_intercepted": round((cpu3 - cpu2) / n * 1000, 2)}


async def make(networks: Networks, policy: EgressPolicy, children: int, tag: str,
               made_all: list[ChildNet]) -> tuple[list[ChildNet], list[float]]:
    req = await networks.prepare(tap=netplan.DEFAULT_TAP, dns=("10.0.0.2",), egress=policy,
                                 per_child_netns=False, what="bench")
    assert req is not None
    made, secs = [], []
    for i in range(children):
        net, s = await timed(networks.acquire(f"sb-bench{tag}-{i:04d}", req))
        made.append(net)
        made_all.append(net)
        secs.append(s)
    return made, secs


async def measure(networks: Networks, children: int, folder: Path) -> dict[str, Any]:
    made: list[ChildNet] = []
    try:
        return await _measure(networks, children, folder, made)
    finally:  # a failure leaves no namespace behind either
        for net in made:
            await networks.release(net)
        assert networks.owners() == [] and networks.names.attached() == []


async def _measure(networks: Networks, children: int, folder: Path, made: list[ChildNet]) -> dict[str, Any]:
    tracemalloc.start()
    rss0, fds0 = rss_kib(), fds()
    _plain, plain_up = await make(networks, ADDRESSES, children, "a", made)
    rss1, fds1 = rss_kib(), fds()
    named, named_up = await make(networks, NAMES, children, "n", made)
    rss2, fds2 = rss_kib(), fds()
    tracemalloc.stop()
    # A network of either kind holds a lease and a host claim (an fd); the resolver is the rest.
    cpu0 = cpu_s()
    first = [await ask(net, f"x{i}.cdn.bench.test") for i, net in enumerate(named)]
    cpu1 = cpu_s()
    refused = [await ask(net, "elsewhere.test") for net in named]
    cpu2 = cpu_s()
    assert all(rc == dns.rcode.NOERROR for rc, _ in first), first[:3]
    assert all(rc == dns.rcode.REFUSED for rc, _ in refused), refused[:3]
    connections = await first_connections(named, str(networks.plan.gateway), folder)
    return {
        "children": children, "entries": ENTRIES,
        "setup_addresses": ms(plain_up), "setup_names": ms(named_up),
        "resolver_and_inspector_heap_kib_per_sandbox": round(((rss2 - rss1) - (rss1 - rss0)) / children, 1),
        "resolver_and_inspector_fds_per_sandbox": round(((fds2 - fds1) - (fds1 - fds0)) / children, 2),
        "first_name_answer": ms([s for _, s in first]),
        "refused_name_answer": ms([s for _, s in refused]),
        "cpu_ms_per_first_answer": round((cpu1 - cpu0) / children * 1000, 2),
        "cpu_ms_per_refused_answer": round((cpu2 - cpu1) / children * 1000, 2),
        **connections,
    }


def table(r: dict[str, Any]) -> str:
    return "\n".join([
        f"{r['children']} sandboxes, {r['entries']} entries each",
        f"set-up p50: addresses {r['setup_addresses']['p50_ms']} ms, names {r['setup_names']['p50_ms']} ms",
        f"resolver and inspector per sandbox: {r['resolver_and_inspector_heap_kib_per_sandbox']} KiB "
        f"Python heap, {r['resolver_and_inspector_fds_per_sandbox']} fds",
        f"first answer to an allowed name (address installed): p50 {r['first_name_answer']['p50_ms']} ms, "
        f"p95 {r['first_name_answer']['p95_ms']} ms, {r['cpu_ms_per_first_answer']} ms CPU",
        f"answer to a refused name: p50 {r['refused_name_answer']['p50_ms']} ms, "
        f"{r['cpu_ms_per_refused_answer']} ms CPU",
        "an address rule adds nothing to a first connection (no resolution, no set update)",
        f"first TLS connection (connect to answer), straight | inspected by name: "
        f"p50 {r['first_tls_straight']['p50_ms']} | {r['first_tls_inspected']['p50_ms']} ms, "
        f"p95 {r['first_tls_straight']['p95_ms']} | {r['first_tls_inspected']['p95_ms']} ms, "
        f"CPU {r['cpu_ms_per_tls_straight']} | {r['cpu_ms_per_tls_inspected']} ms",
        f"first TLS connection intercepted for a header rule (a secret put in): "
        f"p50 {r['first_tls_intercepted']['p50_ms']} ms, p95 {r['first_tls_intercepted']['p95_ms']} ms, "
        f"CPU {r['cpu_ms_per_tls_intercepted']} ms",
    ])


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--children", type=int, default=100)
    ap.add_argument("--out", type=Path, default=RESULTS / "name_policy.json")
    args = ap.parse_args()
    if missing := childnet.missing_prerequisites():
        sys.exit(f"host networking is missing: {'; '.join(missing)}")
    with tempfile.NamedTemporaryFile("w", suffix=".hosts") as hosts:
        hosts.write("".join(f"10.201.0.1 x{i}.cdn.bench.test\n" for i in range(args.children)))
        hosts.flush()
        os.environ[dnsguard.HOSTS_ENV] = hosts.name
        data = scratch_data("forkd-bench-names-")
        rt = await Runtime.open(data)
        try:
            row = await measure(rt.networks, args.children, data.root)
        finally:
            await rt.close()
            shutil.rmtree(data.root, ignore_errors=True)
    result = {
        "what": "the per-sandbox cost of a name policy: its resolver and inspector, the first answer to a "
                "name, and a first TLS connection checked by its name against one let through by address",
        "host": {"machine": platform.machine(), "kernel": platform.release(), "cpus": os.cpu_count(),
                 "note": "shared, busy 2-core host: figures are noisy"},
        "result": row, "measured_at_unix": int(time.time()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(row))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
