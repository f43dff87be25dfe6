"""`forkd push`/`pull` over a mock transport; `pack`/`unpack` errors; `gateway`/`daemon` refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from forkd.cli import context
from forkd.cli.main import app
from forkd.config import DataDir
from forkd.errors import Conflict
from forkd.sdk import Controller
from forkd.store.datalock import DataDirLock
from tests.fakes.daemon import FakeDaemon, clear_env


@pytest.fixture
def daemon(monkeypatch: pytest.MonkeyPatch) -> FakeDaemon:
    clear_env(monkeypatch, "FORKD_DATA_DIR", "FORKD_ETCD", "FORKD_GATEWAY_BIND")
    fake = FakeDaemon()

    def make(url: str | None, token: str | None, ca_cert: str | None = None) -> Controller:
        return fake.controller(url, token)

    monkeypatch.setattr(context, "make_controller", make)
    return fake


def run(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


PUSHED = {"tag": "b1", "store": "s3://snaps/fk", "lineage": ["py", "b1"], "blobs": 7, "blobs_uploaded": 3,
          "bytes_uploaded": 3 * (1 << 20)}


def test_push_sends_force_only_when_asked_and_prints_the_result(daemon: FakeDaemon) -> None:
    daemon.on("POST", "/v1/snapshots/b1/push", httpx.Response(200, json=PUSHED))
    result = run("push", "b1")
    assert result.exit_code == 0, result.output
    assert "3 of 7 blobs uploaded" in result.output and "py → b1" in result.output
    assert daemon.requests[-1].content in (b"", b"null")
    result = run("--json", "push", "b1", "--force")
    assert json.loads(result.output) == PUSHED
    assert json.loads(daemon.requests[-1].content) == {"force": True}


def test_pull_reports_what_it_registered_and_errors_exit_1(daemon: FakeDaemon) -> None:
    daemon.on("POST", "/v1/snapshots/b1/pull",
              httpx.Response(200, json={"tag": "b1", "created": ["py", "b1"], "reused": [],
                                        "bytes_downloaded": 5 << 20}),
              httpx.Response(409, json={"error": "no object store is configured: start the daemon with "
                                                 "--store"}))
    first = run("pull", "b1")
    assert first.exit_code == 0 and "registered py, b1" in first.output
    second = run("pull", "b1")
    assert second.exit_code == 1 and "no object store is configured" in second.output


def test_unpack_of_a_missing_or_garbage_archive_says_so(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKD_ACCEL", "tcg")
    data = tmp_path / "data"
    missing = run("unpack", str(tmp_path / "nope.forkd"), "--data-dir", str(data))
    assert missing.exit_code == 1 and "does not exist" in missing.output
    garbage = tmp_path / "garbage.forkd"
    garbage.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 64)
    bad = run("unpack", str(garbage), "--data-dir", str(data))
    assert bad.exit_code == 1 and "corrupt archive" in bad.output
    nosnap = run("pack", "nosuch", "-o", str(tmp_path / "x.forkd"), "--data-dir", str(data))
    assert nosnap.exit_code == 1 and "not registered" in nosnap.output


def test_pack_and_unpack_refuse_while_a_daemon_has_the_data_dir(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Every Runtime holds its data dir shared; the offline commands, which write the registry from a
    second process, take it alone, so they refuse next to a running daemon and work once it is gone."""
    monkeypatch.setenv("FORKD_ACCEL", "tcg")
    data = DataDir.from_env(tmp_path / "data")
    daemon_holds = DataDirLock.shared(data)  # what Runtime.open takes
    try:
        for args in (["pack", "py", "-o", str(tmp_path / "x.forkd")], ["unpack", str(tmp_path / "x.forkd")]):
            busy = run(*args, "--data-dir", str(data.root))
            assert busy.exit_code == 1 and "a forkd daemon is running on it" in busy.output, busy.output
            assert "forkd push" in busy.output
        with pytest.raises(Conflict):
            DataDirLock.exclusive(data)
    finally:
        daemon_holds.release()
    alone = run("pack", "py", "-o", str(tmp_path / "x.forkd"), "--data-dir", str(data.root))
    assert alone.exit_code == 1 and "not registered" in alone.output  # got past the lock
    DataDirLock.shared(data).release()  # and let it go again
    offline = DataDirLock.exclusive(data)
    try:
        with pytest.raises(Conflict, match="offline forkd pack/unpack"):
            DataDirLock.shared(data)  # a daemon does not open the dir meanwhile
    finally:
        offline.release()


@pytest.mark.parametrize("args,words", [
    (["gateway", "--etcd", "ftp://x"], "must be an http"),
    (["gateway", "--etcd", "http://127.0.0.1:2379", "--bind", "0.0.0.0:8890"], "without --token-file"),
    (["gateway", "--etcd", "http://127.0.0.1:2379", "--bind", "nonsense"], "bad bind address"),
])
def test_the_gateway_refuses_unsafe_or_broken_settings(daemon: FakeDaemon, args: list[str],
                                                       words: str) -> None:
    result = run(*args)
    assert result.exit_code == 2 and words in result.output, result.output


@pytest.mark.parametrize("args,words", [
    (["daemon", "--etcd", "http://127.0.0.1:2379"], "--etcd needs --host-id"),
    (["daemon", "--host-id", "Bad_Host"], "--host-id"),
    (["daemon", "--store", "http://bucket"], "--store"),
    (["daemon", "--etcd", "http://e:2379", "--host-id", "h1", "--bind", "0.0.0.0:8889", "--token-file",
      "/nonexistent"], "token"),
])
def test_the_daemon_refuses_broken_fleet_settings(daemon: FakeDaemon, args: list[str], words: str) -> None:
    result = run(*args)
    assert result.exit_code == 2 and words in result.output, result.output
