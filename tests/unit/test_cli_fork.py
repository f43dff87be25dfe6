"""``forkd fork --from-sandbox``, ``forkd promote`` and ``forkd checkpoints`` against the real app.

The CLI's controller talks to the FastAPI app (through Starlette's TestClient)
backed by the in-memory FakeRuntime, which forks, promotes and keeps
checkpoint policies; a child whose memory limit is under 128 MiB fails to come
up, which is how these tests make partial forks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from forkd.api.app import create_app
from forkd.api.settings import Settings
from forkd.cli import context, output
from forkd.cli.main import app
from forkd.sdk import Controller
from tests.fakes.daemon import clear_env
from tests.fakes.runtime import FakeRuntime
from tests.unit.test_sdk_api import TOKEN, ViaTestClient

SOURCE = "sb-abcdef-0100"


@pytest.fixture
def runtime() -> FakeRuntime:
    rt = FakeRuntime()
    rt.add_snapshot("py")
    rt.add_sandbox(SOURCE)
    return rt


@pytest.fixture
def cli(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, runtime: FakeRuntime
) -> Iterator[CliRunner]:
    """A CliRunner whose commands reach the real app over a FakeRuntime."""
    clear_env(monkeypatch)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    settings = Settings(token_file=token_file, data_dir=tmp_path / "data",
                        audit_log=tmp_path / "audit.log")
    with TestClient(create_app(settings, runtime=runtime), raise_server_exceptions=False) as tc:

        def make(url: str | None, token: str | None, ca_cert: str | None = None) -> Controller:
            return Controller(url="http://forkd.test", token=TOKEN, transport=ViaTestClient(tc))

        monkeypatch.setattr(context, "make_controller", make)
        yield CliRunner()


def forkd(cli: CliRunner, *args: str) -> Any:
    return cli.invoke(app, list(args))


def test_fork_from_sandbox_table(
    cli: CliRunner, runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output.console, "width", 160)  # a terminal wide enough for every column
    result = forkd(cli, "fork", "--from-sandbox", SOURCE, "-n", "2", "-e", "A=1", "-l", "team=ml")
    assert result.exit_code == 0, result.output
    kids = [sb for sb in runtime.sandboxes if sb != SOURCE]
    assert len(kids) == 2 and all(k in result.stdout for k in kids)
    assert f"forked 2 from {SOURCE}" in result.stdout
    assert "source paused 48 ms" in result.stdout
    assert "team=ml" in result.stdout  # the LABELS column
    assert "error" not in result.stderr
    assert ("fork", (SOURCE, 2), {"tree": False, "keep_snapshot": False}) in runtime.calls


def test_partial_fork_shows_each_failure_and_exits_1(cli: CliRunner, runtime: FakeRuntime) -> None:
    result = forkd(cli, "fork", "--from-sandbox", SOURCE, "-n", "2", "--memory-limit-mib", "64")
    assert result.exit_code == 1
    assert "error: child 0 failed: child 0 was OOM-killed at restore" in result.stderr
    assert "error: child 1 failed" in result.stderr
    assert f"forked 0 of 2 from {SOURCE}" in result.stdout
    assert set(runtime.sandboxes) == {SOURCE}


def test_partial_fork_json_still_prints_the_answer(cli: CliRunner, runtime: FakeRuntime) -> None:
    result = forkd(cli, "fork", "--from-sandbox", SOURCE, "-n", "1", "--memory-limit-mib", "64",
                   "--json")
    assert result.exit_code == 1
    out = json.loads(result.stdout)
    assert out["children"] == [] and out["errors"][0]["index"] == 0


def test_fork_tree_promote_and_ls_by_tree(cli: CliRunner, runtime: FakeRuntime) -> None:
    result = forkd(cli, "fork", "--from-sandbox", SOURCE, "-n", "3", "--tree", "--json")
    assert result.exit_code == 0, result.output
    tree = json.loads(result.stdout)
    tree_id = tree["tree_id"]
    kids = [k["id"] for k in tree["children"]]
    assert [k["metadata"]["fork_index"] for k in tree["children"]] == ["0", "1", "2"]

    listed = forkd(cli, "ls", "--label", f"fork_tree_id={tree_id}", "--json")
    assert [sb["id"] for sb in json.loads(listed.stdout)] == kids

    promoted = forkd(cli, "promote", kids[1], "--tree-id", tree_id, "--replace-parent")
    assert promoted.exit_code == 0, promoted.output
    assert f"promoted {kids[1]} of tree {tree_id}" in promoted.stdout
    assert f"killed {kids[0]}" in promoted.stdout and f"killed {kids[2]}" in promoted.stdout
    assert f"killed parent {SOURCE}" in promoted.stdout
    assert f"{SOURCE} now names {kids[1]}" in promoted.stdout
    assert set(runtime.sandboxes) == {kids[1]}
    assert runtime.calls[-1].kwargs == {"tree_id": tree_id, "cleanup_siblings": True,
                                        "replace_parent": True}


def test_promote_without_cleanup_json(cli: CliRunner, runtime: FakeRuntime) -> None:
    tree = json.loads(forkd(cli, "fork", "--from-sandbox", SOURCE, "-n", "2", "--tree", "--json").stdout)
    winner = tree["children"][0]["id"]
    result = forkd(cli, "promote", winner, "--no-cleanup-siblings", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["winner"]["id"] == winner and out["deleted"] == []
    assert len(runtime.sandboxes) == 3


def test_promote_outside_a_tree_is_an_error(cli: CliRunner) -> None:
    result = forkd(cli, "promote", SOURCE)
    assert result.exit_code == 1
    assert "is not a child of fork-tree" in result.stderr


def test_checkpoints_show_set_off(cli: CliRunner, runtime: FakeRuntime) -> None:
    shown = forkd(cli, "checkpoints", SOURCE)
    assert shown.exit_code == 0, shown.output
    assert f"{SOURCE} has no checkpoint policy" in shown.stdout
    assert "no checkpoints kept" in shown.stdout

    set_ = forkd(cli, "checkpoints", SOURCE, "--every", "5", "--keep", "2", "--mode", "diff")
    assert set_.exit_code == 0, set_.output
    assert "every 5 exec/eval calls, keeps 2, mode diff" in set_.stdout
    assert runtime.calls[-1] == ("set_checkpoints", (SOURCE,), {"every": 5, "keep": 2, "mode": "diff"})

    runtime.add_snapshot("ckpt-1", checkpoint_of=SOURCE)
    listed = forkd(cli, "checkpoints", SOURCE)
    assert "ckpt-1" in listed.stdout

    off = forkd(cli, "checkpoints", SOURCE, "--off", "--json")
    assert off.exit_code == 0, off.output
    out = json.loads(off.stdout)
    assert out["policy"] is None and [c["tag"] for c in out["checkpoints"]] == ["ckpt-1"]


def test_checkpoints_of_a_missing_sandbox(cli: CliRunner) -> None:
    result = forkd(cli, "checkpoints", "sb-abcdef-0999", "--every", "1")
    assert result.exit_code == 1
    assert "is not alive" in result.stderr


def test_fork_tree_table_says_how_to_promote(cli: CliRunner) -> None:
    result = forkd(cli, "fork", "--from-sandbox", SOURCE, "-n", "2", "--tree")
    assert result.exit_code == 0, result.output
    assert "tree ft-" in result.stdout
    assert "forkd promote CHILD_ID" in result.stdout
