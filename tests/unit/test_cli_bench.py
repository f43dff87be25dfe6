"""``forkd bench`` against the daemon's app on the real runtime over the QEMU double: every step runs, the
answer has its figures, and everything the probe made is gone afterwards."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from forkd.cli import context
from forkd.cli.main import app as cli_app
from forkd.sdk import Controller
from tests.fakes.app import Daemon, daemon_app
from tests.fakes.daemon import clear_env
from tests.fakes.transport import ViaTestClient


@pytest.fixture
def daemon(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Daemon]:
    clear_env(monkeypatch)
    with daemon_app(tmp_path, token=False) as d:
        monkeypatch.setattr(context, "make_controller",
                            lambda url, token, ca=None: Controller(url="http://forkd.test",
                                                                   transport=ViaTestClient(d.client)))
        yield d


@pytest.mark.parametrize("args", [["--tag", "py"], []])
def test_bench_times_every_step_and_leaves_nothing(daemon: Daemon, tmp_path: Path, args: list[str]) -> None:
    runtime = daemon.runtime
    before = {s.tag for s in runtime.list_snapshots()}
    r = CliRunner().invoke(cli_app, ["bench", "--samples", "5", "--json", *args])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    for step in ("spawn", "exec", "eval"):
        assert out[step]["n"] >= 3 and out[step]["p50_ms"] >= 0
    assert out["branch"]["total_ms"] >= 0 and out["fanout"]["children"] == 5
    assert ("template_s" in out) == (not args)
    assert runtime.list_sandboxes() == []
    assert {s.tag for s in runtime.list_snapshots()} == before  # the branch (and template) are gone
    # The daemon's audit log: one line per request the bench made.
    calls = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    posts = [c["path"] for c in calls if c["method"] == "POST"]
    assert posts.count("/v1/sandboxes") == 5 and any(p.endswith("/branch") for p in posts)


def test_bench_table_for_people(daemon: Daemon) -> None:
    r = CliRunner().invoke(cli_app, ["bench", "--tag", "py", "--samples", "5"])
    assert r.exit_code == 0, r.output
    assert "exec true" in r.stdout and "fan-out of 5" in r.stdout and "removed" in r.stdout
