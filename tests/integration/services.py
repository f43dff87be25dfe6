"""Real services the travel and fleet tests start on loopback: an S3-compatible server and etcd.

* S3: moto's server (``moto[server]`` from PyPI), in a thread of the test
  process on a free port. forkd talks to it through boto3 exactly as to AWS
  S3, MinIO or R2: ``AWS_ENDPOINT_URL`` and credentials in the environment.
* etcd: Debian's ``etcd-server`` (3.4), as its own process with a throwaway
  data dir; forkd talks to its v3 JSON gateway on the client port.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

BUCKET = "forkd-test"


def free_port() -> int:
    """A free loopback port (this module stands alone: bench/fleet.py starts these services too)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class S3Server:
    endpoint: str
    bucket: str = BUCKET

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "test",
                "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"


@contextlib.contextmanager
def s3_server() -> Iterator[S3Server]:
    """moto's S3-compatible server on a free loopback port, with one empty bucket."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    # moto keeps its buckets in this process, shared by every server it runs: a bucket of its
    # own keeps one server's store from seeing another's (the travel modules', the fleet's).
    s3 = S3Server(f"http://127.0.0.1:{port}", f"{BUCKET}-{secrets.token_hex(4)}")
    try:
        boto3.client("s3", endpoint_url=s3.endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                     region_name="us-east-1").create_bucket(Bucket=s3.bucket)
        yield s3
    finally:
        server.stop()


@contextlib.contextmanager
def environ(env: dict[str, str]) -> Iterator[None]:
    """``env`` set in this process (and the daemons and clients it starts) for a while, then undone."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass
class Etcd:
    url: str
    proc: subprocess.Popen[bytes]
    data: Path


@contextlib.contextmanager
def etcd_server() -> Iterator[Etcd]:
    """A one-member etcd on free loopback ports (Debian's etcd-server; scripts/install-deps.sh)."""
    binary = shutil.which("etcd")
    assert binary, "etcd is not installed: run scripts/install-deps.sh (Debian's etcd-server)"
    client, peer = free_port(), free_port()
    data = Path(tempfile.mkdtemp(prefix="fkd-etcd-"))
    url = f"http://127.0.0.1:{client}"
    log = open(data / "etcd.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [binary, "--name", "forkd-test", "--data-dir", str(data / "member"),
         "--listen-client-urls", url, "--advertise-client-urls", url,
         "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"forkd-test=http://127.0.0.1:{peer}"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).json().get("health") == "true":
                    break
            except (httpx.HTTPError, ValueError):
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (
                f"etcd did not start: {(data / 'etcd.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield Etcd(url, proc, data)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
        shutil.rmtree(data, ignore_errors=True)
