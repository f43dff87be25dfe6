"""An E2B user's server in a sandbox, reached as get_host names it, unchanged: a guest HTTP server
on a port, get_host(port) -> {port}-{id}.{E2B_DOMAIN}, and a request to that host. Where no DNS
answers for the domain (here), the request goes to FORKD_TEST_PORT_PROXY with that Host header,
as a wildcard record pointing there would send it."""

import os
import sys
import time

import httpx
from e2b import Sandbox

template = sys.argv[1] if len(sys.argv) > 1 else "base"
with Sandbox.create(template) as sbx:
    sbx.files.write("/tmp/www/hello.txt", "hello through get_host\n")
    sbx.commands.run("cd /tmp/www && python3 -m http.server 8000", background=True)
    host = sbx.get_host(8000)
    assert host == f"8000-{sbx.sandbox_id}.{os.environ['E2B_DOMAIN']}", host
    deadline = time.monotonic() + 60
    while True:  # until the server listens (502 before)
        r = httpx.get(f"{os.environ['FORKD_TEST_PORT_PROXY']}/hello.txt", headers={"Host": host}, timeout=30)
        if r.status_code != 502 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert r.status_code == 200 and r.text == "hello through get_host\n", (r.status_code, r.text[:300])
print("get_host ok")
