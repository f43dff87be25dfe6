"""``forkd secret``: the value comes from stdin or an environment variable, never an argument, and
no command prints one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from forkd.cli import context
from forkd.cli.main import app as cli_app
from forkd.sdk import Controller
from tests.fakes.app import TOKEN, Daemon, daemon_app
from tests.fakes.daemon import clear_env
from tests.fakes.transport import ViaTestClient

VALUE = "cli-secret-" + "3" * 30


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    clear_env(monkeypatch)
    with daemon_app(tmp_path, snapshots=()) as daemon:
        # The CLI's controller reaches the app on the real runtime through its test client.
        monkeypatch.setattr(context, "make_controller",
                            lambda url, token, ca_cert=None: Controller(
                                url="http://forkd.test", token=TOKEN, transport=ViaTestClient(daemon.client)))
        yield daemon


def test_set_reads_stdin_or_an_environment_variable_and_nothing_prints_a_value(
        api: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    made = runner.invoke(cli_app, ["secret", "set", "API_TOKEN", "--json"], input=VALUE + "\n")
    assert made.exit_code == 0, made.output
    assert api.runtime.secrets.resolve("API_TOKEN") == VALUE  # the newline a shell adds is dropped
    monkeypatch.setenv("NEW_TOKEN", VALUE + "2")
    again = runner.invoke(cli_app, ["secret", "set", "API_TOKEN", "--from-env", "NEW_TOKEN", "--json"])
    assert again.exit_code == 0 and '"version": 2' in again.output, again.output
    assert api.runtime.secrets.resolve("API_TOKEN") == VALUE + "2"
    for args in (["secret", "ls"], ["secret", "show", "API_TOKEN"], ["secret", "ls", "--json"]):
        out = runner.invoke(cli_app, args)
        assert out.exit_code == 0 and "API_TOKEN" in out.output and VALUE not in out.output, out.output
    unset = runner.invoke(cli_app, ["secret", "set", "X", "--from-env", "NO_SUCH_VARIABLE_HERE"])
    assert unset.exit_code != 0 and "NO_SUCH_VARIABLE_HERE is not set" in unset.output
    gone = runner.invoke(cli_app, ["secret", "rm", "API_TOKEN"])
    assert gone.exit_code == 0 and api.runtime.secrets.all() == []
