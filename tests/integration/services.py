"""Real services the travel and fleet tests start: an S3-compatible server and etcd.

* S3: moto's server (``moto[server]`` from PyPI), in a thread of the test
  process on a free loopback port, or (the fleet test) as its own process in a
  network namespace. forkd talks to it through boto3 exactly as to AWS
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
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
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
def s3_server_process(launcher: Sequence[str], host: str, port: int = 9000) -> Iterator[S3Server]:
    """moto's S3 server as a process of its own (``moto_server``), run by ``launcher`` (in a
    network namespace: another "machine"), with one empty bucket."""
    import boto3

    binary = Path(sys.executable).with_name("moto_server")
    s3 = S3Server(f"http://{host}:{port}", f"{BUCKET}-{secrets.token_hex(4)}")
    logdir = Path(tempfile.mkdtemp(prefix="fkd-s3-"))
    log = open(logdir / "moto.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([*launcher, str(binary), "-H", host, "-p", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        client = boto3.client("s3", endpoint_url=s3.endpoint, aws_access_key_id="test",
                              aws_secret_access_key="test", region_name="us-east-1")
        while True:
            try:
                client.create_bucket(Bucket=s3.bucket)
                break
            except Exception:  # not listening yet (botocore's connection errors have no one base)
                assert proc.poll() is None and time.monotonic() < deadline, (
                    f"moto_server did not start: {(logdir / 'moto.log').read_text()[-2000:]}")
                time.sleep(0.2)
        yield s3
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
        shutil.rmtree(logdir, ignore_errors=True)


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
def etcd_server(launcher: Sequence[str] = (), host: str = "127.0.0.1") -> Iterator[Etcd]:
    """A one-member etcd (Debian's etcd-server; scripts/install-deps.sh): on free loopback ports,
    or on etcd's own ports at ``host`` when ``launcher`` runs it in a namespace of its own."""
    binary = shutil.which("etcd")
    assert binary, "etcd is not installed: run scripts/install-deps.sh (Debian's etcd-server)"
    client, peer = (free_port(), free_port()) if not launcher else (2379, 2380)
    data = Path(tempfile.mkdtemp(prefix="fkd-etcd-"))
    url = f"http://{host}:{client}"
    log = open(data / "etcd.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [*launcher, binary, "--name", "forkd-test", "--data-dir", str(data / "member"),
         "--listen-client-urls", url, "--advertise-client-urls", url,
         "--listen-peer-urls", f"http://{host}:{peer}",
         "--initial-advertise-peer-urls", f"http://{host}:{peer}",
         "--initial-cluster", f"forkd-test=http://{host}:{peer}"],
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
