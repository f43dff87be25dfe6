#!/usr/bin/env python3
"""What a name policy costs per sandbox: its resolver (host/dnsguard.py) and the answers it installs.

For ``--children`` sandbox networks (namespace, tap, veth, nftables; no VM), made by
``Networks.acquire`` as a spawn makes them, once with an address policy and once with
a name policy of the same size:

  set-up      acquire p50 of each (a name policy adds the resolver's socket in the namespace)
  resolver    the daemon's Python heap (tracemalloc) and open file descriptors added by the
              name policy's resolvers, per sandbox (the kernel's side: one idle UDP socket)
  first name  from inside each namespace (a client socket made there), the time from a
              question for an allowed name to its answer, which waits for the answered
              address to be in the sandbox's set (an ``nft`` run): what a first connection to
              a name costs on top of one to an address rule (which costs nothing here); and a
              refused name (no ``nft``) beside it; the CPU time both took (the daemon's and its
              ``nft`` children's)

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
from forkd.host import childnet, dnsguard, netplan
from forkd.host import netns as netns_mod
from forkd.host.egress import EgressPolicy
from forkd.host.netplan import ChildNet
from network_setup import ms, timed

RESULTS = Path(__file__).resolve().parent / "results"
ENTRIES = 16
ADDRESSES = EgressPolicy.from_request(None, {"allow_out": [f"10.201.0.1:{8000 + i}" for i in range(ENTRIES)]})
NAMES = EgressPolicy.from_request(None, {"allow_out": [f"n{i}.bench.test:443" for i in range(ENTRIES - 1)]
                                         + ["*.cdn.bench.test:443"]})


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


async def make(networks: Networks, policy: EgressPolicy, children: int, tag: str) -> tuple[list[ChildNet],
                                                                                          list[float]]:
    req = await networks.prepare(tap=netplan.DEFAULT_TAP, dns=("10.0.0.2",), egress=policy,
                                 per_child_netns=False, what="bench")
    assert req is not None
    made, secs = [], []
    for i in range(children):
        net, s = await timed(networks.acquire(f"sb-bench{tag}-{i:04d}", req))
        made.append(net)
        secs.append(s)
    return made, secs


async def measure(networks: Networks, children: int) -> dict[str, Any]:
    tracemalloc.start()
    rss0, fds0 = rss_kib(), fds()
    plain, plain_up = await make(networks, ADDRESSES, children, "a")
    rss1, fds1 = rss_kib(), fds()
    named, named_up = await make(networks, NAMES, children, "n")
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
    for net in [*plain, *named]:
        await networks.release(net)
    assert networks.owners() == [] and networks.names.attached() == []
    return {
        "children": children, "entries": ENTRIES,
        "setup_addresses": ms(plain_up), "setup_names": ms(named_up),
        "resolver_heap_kib_per_sandbox": round(((rss2 - rss1) - (rss1 - rss0)) / children, 1),
        "resolver_fds_per_sandbox": round(((fds2 - fds1) - (fds1 - fds0)) / children, 2),
        "first_name_answer": ms([s for _, s in first]),
        "refused_name_answer": ms([s for _, s in refused]),
        "cpu_ms_per_first_answer": round((cpu1 - cpu0) / children * 1000, 2),
        "cpu_ms_per_refused_answer": round((cpu2 - cpu1) / children * 1000, 2),
    }


def table(r: dict[str, Any]) -> str:
    return "\n".join([
        f"{r['children']} sandboxes, {r['entries']} entries each",
        f"set-up p50: addresses {r['setup_addresses']['p50_ms']} ms, names {r['setup_names']['p50_ms']} ms",
        f"resolver per sandbox: {r['resolver_heap_kib_per_sandbox']} KiB Python heap, "
        f"{r['resolver_fds_per_sandbox']} fd",
        f"first answer to an allowed name (address installed): p50 {r['first_name_answer']['p50_ms']} ms, "
        f"p95 {r['first_name_answer']['p95_ms']} ms, {r['cpu_ms_per_first_answer']} ms CPU",
        f"answer to a refused name: p50 {r['refused_name_answer']['p50_ms']} ms, "
        f"{r['cpu_ms_per_refused_answer']} ms CPU",
        "an address rule adds nothing to a first connection (no resolution, no set update)",
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
            row = await measure(rt.networks, args.children)
        finally:
            await rt.close()
            shutil.rmtree(data.root, ignore_errors=True)
    result = {
        "what": "the per-sandbox cost of a name policy: its resolver, and the first answer to a name",
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
