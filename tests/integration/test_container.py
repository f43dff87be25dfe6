"""The daemon in its container image: deploy/Dockerfile built with Debian's podman from a base made
here (container_image.py), run privileged, and a smoke test through its published port: a
template, a spawn, eval, a fork and a branch. Skipped where podman is not installed (`make setup`
installs it)."""

from __future__ import annotations

import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from forkd.config import VERSION

from . import container_image
from .conftest import images_dir, qemu_processes_of
from .daemon_fixture import free_port

pytestmark = [pytest.mark.vm,
              pytest.mark.skipif(container_image.PODMAN is None,
                                 reason="podman is not installed (make setup installs it)")]


@pytest.fixture(scope="module")
def container() -> Iterator[tuple[str, str, str]]:
    build = container_image.BUILD
    if build is None:  # the session did not start it (e.g. run with -p no:randomly from elsewhere)
        build = container_image.ImageBuild(images_dir(), Path(tempfile.mkdtemp(prefix="forkd-ctr-")) / "log")
        build.start()
    print(f"\ncontainer image built in {build.wait():.0f}s (from the start of its build)")
    data = Path(tempfile.mkdtemp(prefix="fkc-", dir="/tmp"))
    token = secrets.token_hex(32)
    (data / "token").write_text(token)
    (data / "token").chmod(0o600)
    inside = f"/forkd-{secrets.token_hex(4)}"  # the data dir's path in the container, and on QEMU's argv
    name = f"forkd-test-{secrets.token_hex(4)}"
    port = free_port()
    run = container_image.podman(
        "run", "-d", "--name", name, "--privileged", *container_image.ulimits(),
        "-p", f"127.0.0.1:{port}:8889", "-v", f"{data}:{inside}", "-v", f"{images_dir()}:/images",
        "-e", "FORKD_IMAGES_DIR=/images", container_image.IMAGE,
        "daemon", "--bind", "0.0.0.0:8889", "--data-dir", inside, "--token-file", f"{inside}/token")
    try:
        subprocess.run(run, check=True, capture_output=True, timeout=120)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                logs = subprocess.run(container_image.podman("logs", name), capture_output=True, text=True)
                raise AssertionError(f"the containerised daemon did not answer:\n{logs.stdout[-3000:]}"
                                     f"{logs.stderr[-3000:]}")
            time.sleep(0.5)
        yield url, token, inside
    finally:
        # podman stops it with SIGTERM (the daemon stops its QEMUs), then SIGKILL after 20 s.
        subprocess.run(container_image.podman("rm", "-f", "-t", "20", name), capture_output=True, timeout=120)
        leftover = qemu_processes_of(Path(inside))
        shutil.rmtree(data, ignore_errors=True)
        assert not leftover, f"QEMU processes of the container left behind: {leftover}"


def test_the_daemon_runs_in_its_container_image(container: tuple[str, str, str]) -> None:
    url, token, inside = container
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=300) as c:
        assert c.get("/version").json()["version"] == VERSION
        made = c.post("/v1/snapshots", json={"tag": "ctr-py", "boot_wait_secs": 180})
        assert made.status_code == 201 and made.json()["status"] == "ready", made.text
        [sb] = c.post("/v1/sandboxes", json={"snapshot_tag": "ctr-py"}).json()
        # Its QEMU runs in the container: this host sees it with the container's data dir on its argv.
        assert any(sb["id"] in line for line in qemu_processes_of(Path(inside)))
        assert c.post(f"/v1/sandboxes/{sb['id']}/eval", json={"code": "exec('x = 6 * 7')"}).status_code == 200
        forked = c.post(f"/v1/sandboxes/{sb['id']}/fork", json={"count": 2})
        assert forked.status_code == 201 and forked.json()["errors"] == [], forked.text
        for child in forked.json()["children"]:
            assert c.post(f"/v1/sandboxes/{child['id']}/eval", json={"code": "x"}).json()["result"] == "42"
        branched = c.post(f"/v1/sandboxes/{sb['id']}/branch", json={"tag": "ctr-branch"})
        assert branched.status_code == 201 and branched.json()["status"] == "ready", branched.text
        [later] = c.post("/v1/sandboxes", json={"snapshot_tag": "ctr-branch"}).json()
        assert c.post(f"/v1/sandboxes/{later['id']}/eval", json={"code": "x"}).json()["result"] == "42"
