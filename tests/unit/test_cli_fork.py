"""``forkd fork --from-sandbox``, ``forkd promote`` and ``forkd checkpoints`` against the real app.

The CLI's controller talks to the FastAPI app (through Starlette's TestClient) on the real
runtime over the QEMU double (tests/fakes/vmm.py). A child whose memory limit is below what a
QEMU needs is OOM-killed by the kernel (the double uses as much), which is how these tests make
partial forks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from forkd.cli import context, output
from forkd.cli.main import app
from forkd.controller.runtime import Runtime
from forkd.sdk import Controller
from tests.fakes.app import TOKEN, Daemon, daemon_app, needs_memory_cgroups
from tests.fakes.daemon import clear_env
from tests.fakes.transport import ViaTestClient


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with daemon_app(tmp_path) as d:
        yield d


@pytest.fixture
def runtime(daemon: Daemon) -> Runtime:
    return daemon.runtime


@pytest.fixture
def source(daemon: Daemon) -> str:
    return daemon.sandbox("py").id


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, daemon: Daemon) -> CliRunner:
    """A CliRunner whose commands reach the app on the real runtime."""
    clear_env(monkeypatch)

    def make(url: str | None, token: str | None, ca_cert: str | None = None) -> Controller:
        return Controller(url="http://forkd.test", token=TOKEN, transport=ViaTestClient(daemon.client))

    monkeypatch.setattr(context, "make_controller", make)
    return CliRunner()


def alive(runtime: Runtime) -> set[str]:
    return {sb.id for sb in runtime.list_sandboxes()}


def forkd(cli: CliRunner, *args: str) -> Any:
    return cli.invoke(app, list(args))


def test_fork_from_sandbox_table(
    cli: CliRunner, daemon: Daemon, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output.console, "width", 160)  # a terminal wide enough for every column
    result = forkd(cli, "fork", "--from-sandbox", source, "-n", "2", "-e", "A=1", "-l", "team=ml")
    assert result.exit_code == 0, result.output
    kids = sorted(alive(daemon.runtime) - {source})
    assert len(kids) == 2 and all(k in result.stdout for k in kids)
    assert f"forked 2 from {source}" in result.stdout
    assert re.search(r"source paused \d+ ms", result.stdout), result.stdout
    assert "team=ml" in result.stdout  # the LABELS column
    assert "error" not in result.stderr
    for kid in kids:  # each child got its environment with its post-restore call
        assert daemon.guest_requests(kid, "restored")[-1]["env"] == {"A": "1"}
        assert daemon.runtime.get_sandbox(kid).metadata["team"] == "ml"


@needs_memory_cgroups
def test_partial_fork_shows_each_failure_and_exits_1(cli: CliRunner, runtime: Runtime, source: str) -> None:
    result = forkd(cli, "fork", "--from-sandbox", source, "-n", "2", "--memory-limit-mib", "64")
    assert result.exit_code == 1
    assert "error: child 0 failed: " in result.stderr and "was OOM-killed while restoring" in result.stderr
    assert "error: child 1 failed" in result.stderr
    assert f"forked 0 of 2 from {source}" in result.stdout
    assert alive(runtime) == {source}


@needs_memory_cgroups
def test_partial_fork_json_still_prints_the_answer(cli: CliRunner, source: str) -> None:
    result = forkd(cli, "fork", "--from-sandbox", source, "-n", "1", "--memory-limit-mib", "64",
                   "--json")
    assert result.exit_code == 1
    out = json.loads(result.stdout)
    assert out["children"] == [] and out["errors"][0]["index"] == 0


def test_fork_tree_promote_and_ls_by_tree(cli: CliRunner, runtime: Runtime, source: str) -> None:
    result = forkd(cli, "fork", "--from-sandbox", source, "-n", "3", "--tree", "--json")
    assert result.exit_code == 0, result.output
    tree = json.loads(result.stdout)
    tree_id = tree["tree_id"]
    kids = [k["id"] for k in tree["children"]]
    assert [k["metadata"]["fork_index"] for k in tree["children"]] == ["0", "1", "2"]

    listed = forkd(cli, "ls", "--label", f"fork_tree_id={tree_id}", "--json")
    assert sorted(sb["id"] for sb in json.loads(listed.stdout)) == sorted(kids)

    promoted = forkd(cli, "promote", kids[1], "--tree-id", tree_id, "--replace-parent")
    assert promoted.exit_code == 0, promoted.output
    assert f"promoted {kids[1]} of tree {tree_id}" in promoted.stdout
    assert f"killed {kids[0]}" in promoted.stdout and f"killed {kids[2]}" in promoted.stdout
    assert f"killed parent {source}" in promoted.stdout
    assert f"{source} now names {kids[1]}" in promoted.stdout
    assert alive(runtime) == {kids[1]}
    assert runtime.get_sandbox(source).id == kids[1]  # the parent's id names the winner now


def test_promote_without_cleanup_json(cli: CliRunner, runtime: Runtime, source: str) -> None:
    tree = json.loads(forkd(cli, "fork", "--from-sandbox", source, "-n", "2", "--tree", "--json").stdout)
    winner = tree["children"][0]["id"]
    result = forkd(cli, "promote", winner, "--no-cleanup-siblings", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["winner"]["id"] == winner and out["deleted"] == []
    assert len(alive(runtime)) == 3


def test_promote_outside_a_tree_is_an_error(cli: CliRunner, source: str) -> None:
    result = forkd(cli, "promote", source)
    assert result.exit_code == 1
    assert "was not made by a fork-tree" in result.stderr


def test_checkpoints_show_set_off(cli: CliRunner, daemon: Daemon, source: str) -> None:
    shown = forkd(cli, "checkpoints", source)
    assert shown.exit_code == 0, shown.output
    assert f"{source} has no checkpoint policy" in shown.stdout
    assert "no checkpoints kept" in shown.stdout

    set_ = forkd(cli, "checkpoints", source, "--every", "5", "--keep", "2", "--mode", "diff")
    assert set_.exit_code == 0, set_.output
    assert "every 5 exec/eval calls, keeps 2, mode diff" in set_.stdout
    policy = daemon.runtime.checkpoints.get(source)["policy"]
    assert policy is not None and (policy["every"], policy["keep"], policy["mode"]) == (5, 2, "diff")

    for _ in range(5):  # the fifth call takes a checkpoint, in the background
        daemon.run(daemon.runtime.exec, source, ["true"])
    daemon.run(daemon.runtime.checkpoints.wait_background)
    [checkpoint] = [c["tag"] for c in daemon.runtime.checkpoints.get(source)["checkpoints"]]
    listed = forkd(cli, "checkpoints", source)
    assert checkpoint in listed.stdout

    off = forkd(cli, "checkpoints", source, "--off", "--json")
    assert off.exit_code == 0, off.output
    out = json.loads(off.stdout)
    assert out["policy"] is None and [c["tag"] for c in out["checkpoints"]] == [checkpoint]


def test_checkpoints_of_a_missing_sandbox(cli: CliRunner) -> None:
    result = forkd(cli, "checkpoints", "sb-abcdef-0999", "--every", "1")
    assert result.exit_code == 1
    assert "is not alive" in result.stderr


def test_fork_tree_table_says_how_to_promote(cli: CliRunner, source: str) -> None:
    result = forkd(cli, "fork", "--from-sandbox", source, "-n", "2", "--tree")
    assert result.exit_code == 0, result.output
    assert "tree ft-" in result.stdout
    assert "forkd promote CHILD_ID" in result.stdout


def test_image_rm_goes_through_the_daemon_and_names_what_stands_on_it(cli: CliRunner, daemon: Daemon) -> None:
    """``forkd image rm``: the daemon refuses an image a snapshot stands on (the CLI says which and
    exits 1) and deletes one nothing does."""
    from tests.fakes.app import guest_image

    guest_image(daemon.runtime.data.images, "spare")
    result = forkd(cli, "image", "rm", "spare", "default")
    assert result.exit_code == 1, result.output
    assert "deleted image spare" in result.stdout
    assert "default: " in result.stderr and "snapshot(s) py" in result.stderr, result.stderr
    assert not (daemon.runtime.data.images / "spare").exists()
    assert (daemon.runtime.data.images / "default").is_dir()
