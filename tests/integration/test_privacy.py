"""What forkd keeps on the host is private: checked as another local user (``nobody``).

A real daemon runs with umask 022 on a data directory like the seeds'
``/var/lib/forkd``: outside any private home, world-traversable (0755, made by
the administrator, not by forkd). It boots a template, forks children (one with
``live_fork``, whose memory goes to /dev/shm), runs commands, uploads a file,
branches, and packs a snapshot into an archive beside it. Then ``nobody`` tries
to read every file and list every directory that forkd created, and must fail on
each.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from forkd.host.shm import shm_dir_of

from .daemon_fixture import Daemon, free_port, shutdown_and_check, write_token

pytestmark = pytest.mark.vm

# Run as nobody: which of these paths it could read (files) or list (directories).
PROBE = r"""
import json, os, sys
readable = []
for path in json.load(sys.stdin):
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            with open(path, "rb") as f:
                f.read(1)
        readable.append(path)
    except OSError:
        pass
print(json.dumps(readable))
"""


def runuser_available() -> bool:
    return shutil.which("runuser") is not None and os.geteuid() == 0


@pytest.fixture(scope="module")
def shared_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="fkd-priv-", dir="/var/tmp"))
    root.chmod(0o755)  # as an administrator makes /var/lib/forkd
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(not runuser_available(), reason="needs root and runuser (util-linux) to act as nobody")
def test_nothing_forkd_creates_is_readable_by_another_user(shared_root: Path) -> None:
    # Only this daemon's own /dev/shm directory: another process's (another daemon, or one
    # planted by someone else) is none of this test's business.
    own_shm = shm_dir_of(shared_root)
    assert not own_shm.exists(), f"{own_shm} exists before the daemon started"
    token, token_file = write_token(shared_root)
    daemon = Daemon(root=shared_root, token=token, token_file=token_file, port=free_port(),
                    extra_args=["--audit-log", str(shared_root / "audit.log")])
    old = os.umask(0o022)
    try:
        daemon.start()
    finally:
        os.umask(old)
    try:
        with daemon.client(timeout=300) as http:
            assert http.post("/v1/snapshots", json={"tag": "py", "boot_wait_secs": 180}).status_code == 201
            [plain] = http.post("/v1/sandboxes", json={"snapshot_tag": "py"}).json()
            [live] = http.post("/v1/sandboxes", json={"snapshot_tag": "py", "live_fork": True}).json()
            for sb in (plain, live):
                out = http.post(f"/v1/sandboxes/{sb['id']}/exec",
                                json={"args": ["sh", "-c", "echo secret > /root/s; sync"]}).json()
                assert out["exit_code"] == 0, out
            r = http.put(f"/v1/sandboxes/{plain['id']}/files", params={"path": "/root/up"},
                         content=b"x" * 4096)
            assert r.status_code == 200, r.text
            assert http.post(f"/v1/sandboxes/{plain['id']}/branch", json={"mode": "diff"}).status_code == 201
            # A pack archive next to the data (travel staging and the archive were 0644).
            archive = shared_root / "py.forkd"
            packed = subprocess.run(
                [sys.executable, "-m", "forkd.cli", "pack", "py", "-o", str(archive), "--no-base",
                 "--data-dir", str(shared_root), "--json"], env=daemon.env(), capture_output=True,
                text=True, timeout=600, preexec_fn=lambda: os.umask(0o022))
            assert packed.returncode == 0, packed.stdout + packed.stderr
            # Everything forkd made so far, while its VMs run (sockets, logs, overlays, memory).
            harness = {token_file, daemon.log_path}
            paths = [p for p in shared_root.rglob("*") if p not in harness and not p.is_symlink()]
            shm_new = [own_shm, *own_shm.rglob("*")] if own_shm.is_dir() else []
            paths += shm_new
            kinds = {"snapshot memory": any(p.name == "mem" for p in paths),
                     "a sandbox's socket": any(stat.S_ISSOCK(p.lstat().st_mode) for p in paths),
                     "a console log": any(p.name == "console.log" for p in paths),
                     "the registry": any(p.name == "forkd.db" for p in paths),
                     "the audit log": (shared_root / "audit.log") in paths,
                     "memory on /dev/shm": bool(shm_new),
                     "a pack archive": archive in paths,
                     "travel's directory": (shared_root / "travel") in paths}
            assert all(kinds.values()), f"the scenario did not create: {kinds}"
            probe = subprocess.run(["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", PROBE],
                                   input=json.dumps([str(p) for p in paths]), capture_output=True,
                                   text=True, timeout=120, check=True)
            readable = json.loads(probe.stdout)
            loose = [f"{p} {stat.filemode(p.lstat().st_mode)}" for p in paths
                     if p.lstat().st_mode & 0o077 and not stat.S_ISLNK(p.lstat().st_mode)]
            print(f"\n{len(paths)} paths forkd created (incl. {len(shm_new)} on /dev/shm); "
                  f"readable by nobody: {len(readable)}; with group/other bits: {len(loose)}")
            assert readable == [], f"readable by another user: {readable[:20]}"
            # Group/other bits below a private directory are harmless, but say which exist.
            for line in loose[:10]:
                print("  mode with group/other bits (unreachable):", line)
    finally:
        with contextlib.suppress(Exception):
            shutdown_and_check(daemon)
