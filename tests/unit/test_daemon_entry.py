"""One daemon command line: ``forkd daemon`` and ``python -m forkd.api`` are the same command.

Options, ``FORKD_*`` variables and exit statuses are checked through both
entry points; ``serve`` is replaced so that nothing listens, except in the
last test, which starts uvicorn on a free loopback port on the real runtime over the QEMU double.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer
import uvicorn
from typer.testing import CliRunner

import forkd.api.server as server
from forkd.api import command as daemon_cmd
from forkd.api.app import create_app
from forkd.api.settings import ConfigError, Settings
from forkd.cli.main import app as forkd_app
from tests.fakes.app import open_runtime

TOKEN = "9c1d7e3a5b0f2468ace13579bdf02468"
# Every option the old argparse ``python -m forkd.api`` had.
OLD_MODULE_OPTIONS = {
    "--bind", "--token-file", "--tls-cert", "--tls-key", "--data-dir", "--keep-sandboxes",
    "--no-keep-sandboxes", "--audit-log", "--max-body-bytes", "--branch-concurrency", "--log-level",
}


def cli_command() -> typer.core.TyperCommand:
    group = typer.main.get_command(forkd_app)
    assert isinstance(group, typer.core.TyperGroup)
    command = group.commands["daemon"]
    assert isinstance(command, typer.core.TyperCommand)
    return command


def module_command() -> typer.core.TyperCommand:
    command = typer.main.get_command(daemon_cmd.standalone())
    assert isinstance(command, typer.core.TyperCommand)
    return command


def describe_params(command: typer.core.TyperCommand) -> list[tuple[Any, ...]]:
    return [
        (p.name, tuple(p.opts), tuple(p.secondary_opts), p.envvar, repr(p.default),
         repr(getattr(getattr(p, "type_descriptor", None), "annotation", None)),
         getattr(p, "min", None), getattr(p, "max", None), getattr(p, "help", None))
        for p in command.params
    ]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for p in cli_command().params:
        if isinstance(p.envvar, str):
            monkeypatch.delenv(p.envvar, raising=False)


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Replace ``serve``: record its arguments and report ready at once."""
    calls: list[dict[str, Any]] = []

    def fake_serve(settings: Settings, log_level: str = "info",
                   on_ready: Callable[[], None] | None = None) -> None:
        calls.append({"settings": settings, "log_level": log_level, "on_ready": on_ready})
        if on_ready is not None:
            on_ready()

    monkeypatch.setattr(server, "serve", fake_serve)
    return calls


def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


EntryPoint = Callable[[list[str]], tuple[int, str, str]]


def via_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(forkd_app, ["daemon", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def via_module(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = daemon_cmd.main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


ENTRY_POINTS = [pytest.param(via_cli, id="forkd-daemon"), pytest.param(via_module, id="python-m-forkd.api")]


# ------------------------------------------------------------ same command


def test_both_entry_points_have_exactly_the_same_options() -> None:
    assert describe_params(cli_command()) == describe_params(module_command())
    # ... because they are the same function.
    the_daemon = inspect.unwrap(daemon_cmd.daemon)
    for command in (cli_command(), module_command()):
        assert command.callback is not None
        assert inspect.unwrap(command.callback) is the_daemon


def test_the_daemon_has_every_option_the_old_module_had() -> None:
    opts = {o for p in cli_command().params for o in (*p.opts, *p.secondary_opts)}
    assert opts >= OLD_MODULE_OPTIONS


def test_every_option_has_a_forkd_variable() -> None:
    for p in cli_command().params:
        if p.name in {"json_", "help"} or not isinstance(p, typer.core.TyperOption):
            continue
        assert isinstance(p.envvar, str) and p.envvar.startswith("FORKD_"), p.name
        assert p.envvar == "FORKD_" + p.opts[0].removeprefix("--").replace("-", "_").upper(), p.name


def test_python_m_forkd_api_help_is_the_daemon_help() -> None:
    proc = subprocess.run([sys.executable, "-m", "forkd.api", "--help"], capture_output=True, text=True,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)},
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "Usage: python -m forkd.api [OPTIONS]" in proc.stdout
    cli_help = CliRunner().invoke(forkd_app, ["daemon", "--help"], env={"COLUMNS": "200"}).stdout
    flags = re.compile(r"--[a-z][a-z-]+")
    assert set(flags.findall(proc.stdout)) == set(flags.findall(cli_help))
    assert "FORKD_AUDIT_LOG" in proc.stdout and "FORKD_MAX_BODY_BYTES" in proc.stdout
    assert "Examples:" in proc.stdout


# ------------------------------------------------- options reach the settings


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_flags_reach_the_settings(entry: Any, served: list[dict[str, Any]], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    tok = token_file(tmp_path)
    code, _, err = entry([
        "--bind", "[::1]:9001", "--token-file", str(tok), "--tls-cert", "c.pem", "--tls-key", "k.pem",
        "--data-dir", str(tmp_path / "d"), "--keep-sandboxes", "--audit-log", str(tmp_path / "a.log"),
        "--max-body-bytes", "4096", "--branch-concurrency", "9", "--log-level", "DEBUG",
    ], capsys)
    assert code == 0, err
    (call,) = served
    assert call["settings"] == Settings(
        host="::1", port=9001, token_file=tok, tls_cert=Path("c.pem"), tls_key=Path("k.pem"),
        data_dir=tmp_path / "d", keep_sandboxes=True, audit_log=tmp_path / "a.log",
        max_body_bytes=4096, branch_concurrency=9,
    )
    assert call["log_level"] == "debug" and call["on_ready"] is None


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_defaults(entry: Any, served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = entry([], capsys)
    assert (code, out) == (0, ""), err
    assert served[0]["settings"] == Settings()
    assert served[0]["log_level"] == "info"


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_variables_reach_the_settings_and_flags_win(
    entry: Any, served: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = {
        "FORKD_BIND": "0.0.0.0:9002", "FORKD_TOKEN_FILE": str(token_file(tmp_path)),
        "FORKD_TLS_CERT": "c.pem", "FORKD_TLS_KEY": "k.pem", "FORKD_DATA_DIR": str(tmp_path / "d"),
        "FORKD_KEEP_SANDBOXES": "yes", "FORKD_AUDIT_LOG": str(tmp_path / "a.log"),
        "FORKD_MAX_BODY_BYTES": "2048", "FORKD_BRANCH_CONCURRENCY": "3", "FORKD_LOG_LEVEL": "warning",
        "FORKD_REGISTRY_MIRROR": "docker.io=http://127.0.0.1:5000/,ghcr.io=https://m.example",
        "FORKD_REGISTRY_AUTH": str(tmp_path / "config.json"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert entry([], capsys)[0] == 0
    from_variables = served[-1]["settings"]
    assert served[-1]["log_level"] == "warning"
    # Programs embedding the daemon read the same variables the same way.
    assert Settings.from_env() == from_variables
    assert (from_variables.host, from_variables.port) == ("0.0.0.0", 9002)
    assert from_variables.keep_sandboxes is True
    assert (from_variables.max_body_bytes, from_variables.branch_concurrency) == (2048, 3)
    assert from_variables.audit_log == tmp_path / "a.log"
    assert from_variables.registry_mirrors == {"docker.io": "http://127.0.0.1:5000", "ghcr.io": "https://m.example"}
    assert from_variables.registry_auth == tmp_path / "config.json"

    assert entry(["--bind", "127.0.0.1:9003", "--no-keep-sandboxes", "--branch-concurrency", "5",
                  "--log-level", "error"], capsys)[0] == 0
    flagged = served[-1]["settings"]
    assert (flagged.port, flagged.keep_sandboxes, flagged.branch_concurrency) == (9003, False, 5)
    assert flagged.max_body_bytes == 2048 and served[-1]["log_level"] == "error"


# ---------------------------------------------------------------- --json


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_json_prints_one_line_once_listening(entry: Any, served: list[dict[str, Any]], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    tok = token_file(tmp_path)
    code, out, err = entry(["--json", "--bind", "127.0.0.1:9004", "--token-file", str(tok),
                            "--data-dir", str(tmp_path / "d")], capsys)
    assert code == 0, err
    assert served[0]["on_ready"] is not None
    assert out.count("\n") == 1
    info = json.loads(out)
    assert info["listening"] is True and info["url"] == "http://127.0.0.1:9004"
    assert info["auth"] == "bearer" and info["tls"] is False
    assert info["data_dir"] == str(tmp_path / "d") and info["audit_log"] == str(tmp_path / "d" / "audit.log")
    assert info["api"] == "v1" and isinstance(info["pid"], int)
    assert TOKEN not in out


def test_global_json_flag_works_for_the_daemon_too(served: list[dict[str, Any]]) -> None:
    result = CliRunner().invoke(forkd_app, ["--json", "daemon"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["url"] == "http://127.0.0.1:8889"


# ---------------------------------------------------------- refusals


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bind", "0.0.0.0:9005"], "without a bearer token"),
        (["--max-body-bytes", "100"], "--max-body-bytes"),
        (["--branch-concurrency", "0"], "--branch-concurrency"),
        (["--branch-concurrency", "65"], "--branch-concurrency"),
        (["--log-level", "loud"], "--log-level"),
        (["--tls-key", "k.pem"], "--tls-cert and --tls-key"),
        (["--bind", "nonsense"], "bad bind address"),
    ],
)
def test_unsafe_or_unusable_settings_exit_2(entry: Any, args: list[str], message: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    # The real serve(): it validates before it binds anything.
    code, out, err = entry([*args, "--data-dir", str(tmp_path)], capsys)
    assert code == 2
    assert message in err and out == ""


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_placeholder_token_exits_2(entry: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "token"
    bad.write_text("changeme\n")
    code, _, err = entry(["--token-file", str(bad), "--data-dir", str(tmp_path)], capsys)
    assert code == 2 and "placeholder" in err


@pytest.mark.parametrize(
    ("settings", "message"),
    [(Settings(branch_concurrency=65), "between 1 and 64"), (Settings(max_body_bytes=1023), "1024 bytes")],
)
def test_embedders_get_the_same_bounds(settings: Settings, message: str) -> None:
    """Settings built in code (or by Settings.from_env) are held to the command line's bounds."""
    with pytest.raises(ConfigError, match=message):
        server.validate_settings(settings)


# ------------------------------------------------- ready only once listening


def test_on_ready_fires_after_the_socket_listens(tmp_path: Path) -> None:
    settings = Settings(audit_log=tmp_path / "a.log")
    seen: list[str] = []

    async def main() -> None:
        async with open_runtime(tmp_path, snapshots=()) as runtime:
            await serve(create_app(settings, runtime=runtime))

    async def serve(app: Any) -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error", lifespan="on")
        srv: server._Server

        def ready() -> None:
            seen.append("ready")
            assert srv.servers and srv.servers[0].sockets  # bound before we are told

        srv = server._Server(config, ready)
        config.load()  # what uvicorn.Server.serve() does before startup()
        srv.lifespan = config.lifespan_class(config)
        await srv.startup()
        try:
            assert seen == ["ready"]
            port = srv.servers[0].sockets[0].getsockname()[1]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert (await reader.read()).startswith(b"HTTP/1.1 200")
            writer.close()
        finally:
            await srv.shutdown()

    asyncio.run(main())


def test_a_registry_mirror_must_name_a_registry_and_an_http_url() -> None:
    from forkd.api.settings import ConfigError, parse_mirrors

    assert parse_mirrors(["docker.io=http://[::1]:5000"]) == {"docker.io": "http://[::1]:5000"}
    for bad in ("docker.io", "docker.io=ftp://x", "=http://x", "docker.io=http://x/path"):
        with pytest.raises(ConfigError, match="registry mirror"):
            parse_mirrors(bad)
