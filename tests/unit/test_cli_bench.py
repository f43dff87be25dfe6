"""``forkd bench`` against the daemon's app on the fake runtime: every step runs, the
answer has its figures, and everything the probe made is gone afterwards."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from forkd.api.app import create_app
from forkd.cli import context
from forkd.cli.main import app as cli_app
from forkd.sdk import Controller
from tests.fakes.daemon import clear_env
from tests.fakes.runtime import FakeRuntime
from tests.fakes.transport import ViaTestClient


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRuntime]:
    clear_env(monkeypatch)
    rt = FakeRuntime()
    rt.add_snapshot("py")
    with TestClient(create_app(runtime=rt), raise_server_exceptions=False) as tc:
        monkeypatch.setattr(context, "make_controller",
                            lambda url, token, ca=None: Controller(url="http://forkd.test",
                                                                   transport=ViaTestClient(tc)))
        yield rt


@pytest.mark.parametrize("args", [["--tag", "py"], []])
def test_bench_times_every_step_and_leaves_nothing(runtime: FakeRuntime, args: list[str]) -> None:
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
    names = runtime.names()
    assert names.count("spawn") == 5 and "branch" in names


def test_bench_table_for_people(runtime: FakeRuntime) -> None:
    r = CliRunner().invoke(cli_app, ["bench", "--tag", "py", "--samples", "5"])
    assert r.exit_code == 0, r.output
    assert "exec true" in r.stdout and "fan-out of 5" in r.stdout and "removed" in r.stdout
