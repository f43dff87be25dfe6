"""Unit tests of the ``forkd`` CLI over a mock transport: flags, output, exit codes.

The CLI builds its Controller through ``forkd.cli.context.make_controller``;
the ``daemon`` fixture swaps that for one whose transport is a FakeDaemon.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from forkd.cli import context
from forkd.cli.main import app
from forkd.sdk import Controller
from tests.fakes.daemon import SB, FakeDaemon, clear_env, sandbox_info, snap_info


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_env(monkeypatch, "FORKD_BIND", "FORKD_DATA_DIR", "FORKD_TLS_CERT", "FORKD_TLS_KEY",
              "FORKD_KEEP_SANDBOXES")


@pytest.fixture
def daemon(monkeypatch: pytest.MonkeyPatch) -> FakeDaemon:
    """A FakeDaemon that every controller the CLI builds talks to."""
    fake = FakeDaemon()

    def make(url: str | None, token: str | None, ca_cert: str | None = None) -> Controller:
        return fake.controller(url, token)

    monkeypatch.setattr(context, "make_controller", make)
    return fake


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def run(runner: CliRunner, *args: str, input: str | None = None) -> Any:
    return runner.invoke(app, list(args), input=input)


# ---------------------------------------------------------- flag validation


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["snapshot", "--from-sandbox", SB, "--diff", "--live"], "mutually exclusive"),
        (["snapshot", "--from-sandbox", SB, "--no-wait"], "--no-wait requires --live"),
        (["snapshot", "--from-sandbox", SB, "--diff", "--no-wait"], "--no-wait requires --live"),
        (["snapshot", "--tag", "py", "--diff"], "only apply with --from-sandbox"),
        (["snapshot"], "--tag is required"),
        (["snapshot", "--from-sandbox", SB, "--image", "x", "--warm", "numpy"],
         "--image, --warm cannot be used with --from-sandbox"),
        (["branch", "--from-sandbox", SB, "--diff", "--live"], "mutually exclusive"),
        (["kill"], "give sandbox ID(s) or --all"),
        (["kill", SB, "--all"], "give sandbox ID(s) or --all"),
        (["exec", SB, "-e", "NOEQUALS", "--", "true"], "KEY=VALUE"),
        (["fork"], "give --tag (fork a snapshot) or --from-sandbox"),
        (["fork", "--tag", "py", "--from-sandbox", SB], "give --tag (fork a snapshot) or --from-sandbox"),
        (["fork", "--tag", "py", "--tree"], "--tree only applies with --from-sandbox"),
        (["fork", "--tag", "py", "--tree", "--keep-snapshot"],
         "--tree, --keep-snapshot only apply with --from-sandbox"),
        (["fork", "--tag", "py", "--env", "A"], "--env expects KEY=VALUE"),
        (["fork", "--from-sandbox", SB, "--label", "=x"], "--label expects KEY=VALUE"),
        (["ls", "--snapshots", "--label", "a=b"], "cannot be used with --snapshots"),
        (["ls", "--snapshots", "--limit", "5"], "cannot be used with --snapshots"),
        (["ls", "--state", "pool"], "pool"),
        (["ls", "--label", "novalue"], "--label expects KEY=VALUE"),
        (["checkpoints", SB, "--keep", "3"], "--keep and --mode need --every"),
        (["checkpoints", SB, "--mode", "live"], "--keep and --mode need --every"),
        (["checkpoints", SB, "--every", "3", "--off"], "--off and --every are mutually exclusive"),
    ],
)
def test_usage_errors_exit_2_without_a_request(
    runner: CliRunner, daemon: FakeDaemon, args: list[str], message: str
) -> None:
    result = run(runner, *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "Usage: forkd" in result.stderr
    assert result.stdout == ""
    assert daemon.requests == []


def test_out_of_range_n_is_a_usage_error(runner: CliRunner, daemon: FakeDaemon) -> None:
    result = run(runner, "fork", "--tag", "py", "-n", "0")
    assert result.exit_code == 2
    assert daemon.requests == []


def test_no_args_shows_help(runner: CliRunner) -> None:
    result = run(runner)
    assert result.exit_code in (0, 2)
    assert "snapshot" in result.output and "fork" in result.output


@pytest.mark.parametrize(
    "command",
    ["daemon", "snapshot", "fork", "branch", "ls", "snapshot-info", "kill", "rmi", "ping",
     "exec", "eval", "version", "doctor", "image", "image build", "image ls", "promote",
     "checkpoints", "timeout", "memory"],
)
def test_every_command_has_help(runner: CliRunner, command: str) -> None:
    result = run(runner, *command.split(), "--help")
    assert result.exit_code == 0, result.output
    assert "Usage: forkd" in result.stdout


# ------------------------------------------------------------------ branch


def test_snapshot_from_sandbox_live_no_wait_json(runner: CliRunner, daemon: FakeDaemon) -> None:
    info = snap_info("checkpoint-1", branched_from=SB, pause_ms=48, status="writing")
    daemon.on("POST", f"/v1/sandboxes/{SB}/branch", httpx.Response(201, json=info))
    result = run(runner, "snapshot", "--from-sandbox", SB, "--tag", "checkpoint-1",
                 "--live", "--no-wait", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == info
    assert daemon.body() == {"tag": "checkpoint-1", "mode": "live", "wait": False}


@pytest.mark.parametrize(
    ("flags", "body"),
    [([], {}), (["--diff"], {"mode": "diff"}), (["--live"], {"mode": "live"})],
)
def test_snapshot_from_sandbox_modes(
    runner: CliRunner, daemon: FakeDaemon, flags: list[str], body: dict[str, Any]
) -> None:
    daemon.on("POST", f"/v1/sandboxes/{SB}/branch",
              httpx.Response(201, json=snap_info("b", branched_from=SB, pause_ms=120)))
    result = run(runner, "snapshot", "--from-sandbox", SB, *flags)
    assert result.exit_code == 0, result.output
    assert daemon.body() == body
    assert "branched" in result.stdout and "120 ms" in result.stdout


def test_branch_one_shot_waits_then_forks(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("POST", f"/v1/sandboxes/{SB}/branch",
              httpx.Response(201, json=snap_info("b", branched_from=SB, status="writing")))
    daemon.on("GET", "/v1/snapshots/b",
              httpx.Response(200, json=snap_info("b", status="writing")),
              httpx.Response(200, json=snap_info("b", status="ready")))
    daemon.on("POST", "/v1/sandboxes",
              httpx.Response(201, json=[sandbox_info(i, "b") for i in range(1, 4)]))
    result = run(runner, "branch", "--from-sandbox", SB, "-n", "3", "--live", "--json")
    assert result.exit_code == 0, result.output
    assert daemon.calls() == [
        ("POST", f"/v1/sandboxes/{SB}/branch"),
        ("GET", "/v1/snapshots/b"),
        ("GET", "/v1/snapshots/b"),
        ("POST", "/v1/sandboxes"),
    ]
    assert daemon.body(0) == {"mode": "live"}
    assert daemon.body() == {"snapshot_tag": "b", "n": 3}
    out = json.loads(result.stdout)
    assert out["snapshot"]["status"] == "ready"
    assert [s["id"] for s in out["sandboxes"]] == ["sb-abcdef-0001", "sb-abcdef-0002",
                                                   "sb-abcdef-0003"]


# ----------------------------------------------------------------- snapshots


def test_snapshot_create_body(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("POST", "/v1/snapshots", httpx.Response(201, json=snap_info("ml")))
    result = run(runner, "snapshot", "--tag", "ml", "--image", "ml", "--mem-mib", "1024",
                 "--boot-wait-secs", "60", "--warm", "numpy,json", "--warm", "pandas",
                 "--setup", "pip install x", "--setup", "touch /ok")
    assert result.exit_code == 0, result.output
    assert daemon.body() == {
        "tag": "ml", "image": "ml", "mem_mib": 1024, "boot_wait_secs": 60.0,
        "warm_imports": ["numpy", "json", "pandas"],
        "setup": [["/bin/sh", "-c", "pip install x"], ["/bin/sh", "-c", "touch /ok"]],
    }
    assert "snapshot ml ready" in result.stdout


def test_snapshot_create_minimal_and_empty_warm(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("POST", "/v1/snapshots", httpx.Response(201, json=snap_info()))
    assert run(runner, "snapshot", "--tag", "py").exit_code == 0
    assert daemon.body() == {"tag": "py"}
    assert run(runner, "snapshot", "--tag", "py", "--warm", "").exit_code == 0
    assert daemon.body() == {"tag": "py", "warm_imports": []}


def test_snapshot_volumes_as_the_seeds_write_them(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("POST", "/v1/snapshots", httpx.Response(201, json=snap_info("db")))
    result = run(runner, "snapshot", "--tag", "db", "--volume", "data:/mnt/data",
                 "--volume", "/srv/fixtures:/fixtures:ro")
    assert result.exit_code == 0, result.output
    assert daemon.body() == {"tag": "db", "volumes": [
        {"mount": "/mnt/data", "read_only": False, "name": "data"},
        {"mount": "/fixtures", "read_only": True, "host_path": "/srv/fixtures"}]}
    bad = run(runner, "snapshot", "--tag", "db", "--volume", "data")
    assert bad.exit_code == 2 and "SOURCE:GUEST_PATH" in bad.output
    assert run(runner, "snapshot", "--from-sandbox", SB, "--volume", "d:/m").exit_code == 2


def test_volume_commands(runner: CliRunner, daemon: FakeDaemon) -> None:
    vol = {"name": "data", "size_mib": 64, "fs": "ext4", "created_at_unix": 1, "used_mib": 1.0,
           "snapshots": ["db"]}
    daemon.on("POST", "/v1/volumes", httpx.Response(201, json=vol))
    assert run(runner, "volume", "create", "data", "--size-mib", "64", "--from", "/srv/x").exit_code == 0
    assert daemon.body() == {"name": "data", "size_mib": 64, "source": "/srv/x"}
    assert run(runner, "volume", "create", "team", "--fs", "hostdir").exit_code == 0
    assert daemon.body() == {"name": "team", "fs": "hostdir"}
    daemon.on("GET", "/v1/volumes", httpx.Response(200, json=[vol]))
    listed = run(runner, "volume", "ls")
    assert listed.exit_code == 0 and "data" in listed.stdout and "db" in listed.stdout
    daemon.on("POST", "/v1/volumes/data/export", httpx.Response(200, json={"name": "data", "to": "/o",
                                                                          "snapshot": "db"}))
    assert run(runner, "volume", "cp", "data", "/o", "--snapshot", "db").exit_code == 0
    assert daemon.body() == {"to": "/o", "snapshot": "db"}
    daemon.on("DELETE", "/v1/volumes/data", httpx.Response(409, json={"error": "volume 'data' is in use "
                                                                      "by snapshot(s) db"}))
    refused = run(runner, "volume", "rm", "data")
    assert refused.exit_code != 0 and "in use" in refused.output


def test_snapshot_info_shows_lineage(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("GET", "/v1/snapshots/c2", httpx.Response(200, json=snap_info(
        "c2", branched_from=SB, pause_ms=50, status="ready",
        ancestors=["c1", "py"], dependents=["c3"])))
    result = run(runner, "snapshot-info", "c2")
    assert result.exit_code == 0, result.output
    assert "c2 ← c1 ← py" in result.stdout
    assert "c3" in result.stdout
    assert SB in result.stdout


def test_rmi_flags_and_partial_failure(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("DELETE", "/v1/snapshots/a", httpx.Response(204))
    daemon.on("DELETE", "/v1/snapshots/b",
              httpx.Response(409, json={"error": "sandboxes still run from 'b'"}))
    result = run(runner, "rmi", "a", "b", "--cascade", "--force")
    assert result.exit_code == 1
    assert [dict(r.url.params) for r in daemon.requests] == [
        {"cascade": "true", "force": "true"}] * 2
    assert "deleted a" in result.stdout
    assert "error: b: sandboxes still run from 'b'" in result.stderr


# ----------------------------------------------------------------- sandboxes


def test_fork_json_and_body(runner: CliRunner, daemon: FakeDaemon) -> None:
    kids = [sandbox_info(i) for i in range(3)]
    daemon.on("POST", "/v1/sandboxes", httpx.Response(201, json=kids))
    result = run(runner, "fork", "--tag", "py", "-n", "3", "--per-child-netns",
                 "--memory-limit-mib", "256", "--live-fork", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == kids
    assert daemon.body() == {"snapshot_tag": "py", "n": 3, "per_child_netns": True,
                             "memory_limit_mib": 256, "live_fork": True}


def test_fork_env_and_labels(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("POST", "/v1/sandboxes", httpx.Response(201, json=[sandbox_info()]))
    result = run(runner, "fork", "--tag", "py", "-e", "A=1", "--env", "B=x=y", "-l", "team=ml")
    assert result.exit_code == 0, result.output
    assert daemon.body() == {"snapshot_tag": "py", "n": 1, "env": {"A": "1", "B": "x=y"},
                             "metadata": {"team": "ml"}}


def test_fork_mounts_hostdir_volumes(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("POST", "/v1/sandboxes", httpx.Response(201, json=[sandbox_info()]))
    result = run(runner, "fork", "--tag", "py", "--volume", "team:/mnt/team", "--volume", "docs:/docs:ro")
    assert result.exit_code == 0, result.output
    assert daemon.body() == {"snapshot_tag": "py", "n": 1, "volumes": [
        {"mount": "/mnt/team", "read_only": False, "name": "team"},
        {"mount": "/docs", "read_only": True, "name": "docs"}]}
    refused = run(runner, "fork", "--from-sandbox", SB, "--volume", "team:/mnt/team")
    assert refused.exit_code != 0 and "--volume applies to forks of a snapshot" in refused.output


def test_fork_from_sandbox_body(runner: CliRunner, daemon: FakeDaemon) -> None:
    answer = {"parent_id": SB, "snapshot_tag": "b", "children": [sandbox_info(1, "b")],
              "errors": [], "pause_ms": 48, "tree_id": "ft-0123456789ab"}
    daemon.on("POST", f"/v1/sandboxes/{SB}/fork-tree", httpx.Response(201, json=answer))
    result = run(runner, "fork", "--from-sandbox", SB, "-n", "1", "--tree", "--keep-snapshot",
                 "-e", "SEED=7", "-l", "job=x", "--memory-limit-mib", "256", "--live-fork",
                 "--per-child-netns", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == answer
    assert daemon.body() == {"count": 1, "per_child_netns": True, "memory_limit_mib": 256,
                             "live_fork": True, "env": {"SEED": "7"}, "metadata": {"job": "x"},
                             "keep_snapshot": True}


def test_fork_hostname_for_a_snapshot_and_a_running_sandbox(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("POST", "/v1/sandboxes", httpx.Response(201, json=[sandbox_info()]))
    answer = {"parent_id": SB, "snapshot_tag": "b", "children": [sandbox_info(1, "b")], "errors": []}
    daemon.on("POST", f"/v1/sandboxes/{SB}/fork", httpx.Response(201, json=answer))
    assert run(runner, "fork", "--tag", "py", "--hostname", "box-1").exit_code == 0
    assert daemon.body() == {"snapshot_tag": "py", "n": 1, "hostname": "box-1"}
    assert run(runner, "fork", "--from-sandbox", SB, "--hostname", "box-2.lab", "--json").exit_code == 0
    assert daemon.body() == {"count": 1, "hostname": "box-2.lab"}


def test_ls_filters(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("GET", "/v1/sandboxes", httpx.Response(200, json=[]))
    result = run(runner, "ls", "--tag", "py", "-l", "a=1", "-l", "b=2")
    assert result.exit_code == 0, result.output
    assert "no sandboxes match" in result.stdout
    assert daemon.calls() == [("GET", "/v1/sandboxes")]  # a filter lists sandboxes only
    assert daemon.requests[0].url.params.multi_items() == [
        ("snapshot_tag", "py"), ("metadata", "a=1"), ("metadata", "b=2")]

    page = run(runner, "ls", "--state", "hibernated", "--limit", "100", "--after", "sb-abcdef-0099")
    assert page.exit_code == 0, page.output
    assert daemon.requests[1].url.params.multi_items() == [
        ("state", "hibernated"), ("after", "sb-abcdef-0099"), ("limit", "100")]


def test_fork_table(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("POST", "/v1/sandboxes", httpx.Response(201, json=[sandbox_info(0), sandbox_info(1)]))
    result = run(runner, "fork", "--tag", "py", "-n", "2")
    assert result.exit_code == 0, result.output
    assert "sb-abcdef-0000" in result.stdout and "sb-abcdef-0001" in result.stdout
    assert "forked 2" in result.stdout


def test_ls_json_shapes(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("GET", "/v1/sandboxes", httpx.Response(200, json=[sandbox_info()]))
    daemon.on("GET", "/v1/snapshots", httpx.Response(200, json=[snap_info()]))
    both = run(runner, "ls", "--json")
    assert json.loads(both.stdout) == {"sandboxes": [sandbox_info()], "snapshots": [snap_info()]}
    only = run(runner, "--json", "ls", "--snapshots")  # the global spelling
    assert json.loads(only.stdout) == [snap_info()]
    assert daemon.calls()[-1] == ("GET", "/v1/snapshots")


def test_ls_tables(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("GET", "/v1/sandboxes", httpx.Response(200, json=[]))
    daemon.on("GET", "/v1/snapshots",
              httpx.Response(200, json=[snap_info(), snap_info("b", status="writing")]))
    result = run(runner, "ls")
    assert result.exit_code == 0, result.output
    assert "no sandboxes running" in result.stdout
    assert "writing" in result.stdout and "ready" in result.stdout


def test_kill_continues_past_failures(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("DELETE", "/v1/sandboxes/sb-abcdef-0001", httpx.Response(204))
    result = run(runner, "kill", "sb-abcdef-0009", "sb-abcdef-0001")
    assert result.exit_code == 1
    assert "killed sb-abcdef-0001" in result.stdout
    assert "error: sb-abcdef-0009" in result.stderr


def test_timeout_and_fork_timeout(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("POST", "/v1/sandboxes/sb-abcdef-0001/timeout",
              httpx.Response(200, json={**sandbox_info(1), "expires_at_unix": 1717000600.0}))
    result = run(runner, "timeout", "sb-abcdef-0001", "600")
    assert result.exit_code == 0, result.output
    assert "expires at" in result.stdout
    assert json.loads(daemon.requests[-1].content) == {"timeout_secs": 600.0}
    daemon.on("POST", "/v1/sandboxes", httpx.Response(201, json=[sandbox_info(0)]))
    result = run(runner, "fork", "--tag", "py", "--timeout", "5", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(daemon.requests[-1].content)["timeout_secs"] == 5.0
    assert run(runner, "timeout", "sb-abcdef-0001", "0").exit_code == 2


def test_hibernate(runner: CliRunner, daemon: FakeDaemon) -> None:
    saved = {"hibernated_at_unix": 1717000000.0, "pages": 300, "memory_bytes": 1 << 20,
             "devices_bytes": 16384, "disk_mib": 1.016, "pause_ms": 41.0}
    daemon.on("POST", "/v1/sandboxes/sb-abcdef-0001/hibernate",
              httpx.Response(200, json={**sandbox_info(1), "state": "hibernated", "hibernation": saved}))
    result = run(runner, "hibernate", "sb-abcdef-0001")
    assert result.exit_code == 0, result.output
    assert "hibernated: 1.016 MiB on disk, 41 ms stopped" in result.stdout
    assert not daemon.requests[-1].content  # no body: memory kept
    daemon.on("POST", "/v1/sandboxes/sb-abcdef-0002/hibernate", httpx.Response(200, json={
        **sandbox_info(2), "state": "hibernated",
        "hibernation": {**saved, "memory": False, "pages": 0, "disk_mib": 0}}))
    result = run(runner, "hibernate", "--disk-only", "sb-abcdef-0002")
    assert result.exit_code == 0, result.output
    assert json.loads(daemon.requests[-1].content) == {"memory": False}
    assert "disk only: its wake cold-boots it" in result.stdout
    daemon.on("POST", "/v1/sandboxes", httpx.Response(201, json=[sandbox_info(0)]))
    result = run(runner, "fork", "--tag", "py", "--idle-hibernate", "300", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(daemon.requests[-1].content)["idle_hibernate_secs"] == 300.0


def test_kill_all(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("GET", "/v1/sandboxes", httpx.Response(200, json=[sandbox_info(0), sandbox_info(1)]))
    daemon.on("DELETE", "/v1/sandboxes/sb-abcdef-0000", httpx.Response(204))
    daemon.on("DELETE", "/v1/sandboxes/sb-abcdef-0001", httpx.Response(204))
    result = run(runner, "kill", "--all", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"killed": ["sb-abcdef-0000", "sb-abcdef-0001"],
                                         "failed": {}}


def test_ping(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("POST", f"/v1/sandboxes/{SB}/ping",
              httpx.Response(200, json={"pong": True, "pid": 1, "numpy_version": "1.24.2"}))
    result = run(runner, "ping", SB)
    assert result.exit_code == 0
    assert "pong" in result.stdout and "1.24.2" in result.stdout


def test_memory(runner: CliRunner, daemon: FakeDaemon) -> None:
    cost = {"sandbox_id": SB, "ram_bytes": 512 << 20, "shared_bytes": 60 << 20, "private_bytes": 100 << 20,
            "untouched_bytes": 352 << 20, "disk_bytes": 8 << 20}
    daemon.on("GET", f"/v1/sandboxes/{SB}/memory", httpx.Response(200, json=cost))
    result = run(runner, "memory", SB)
    assert result.exit_code == 0, result.output
    assert "shared 60.0 MiB" in result.stdout and "private 100.0 MiB" in result.stdout
    assert "own disk layers 8.0 MiB" in result.stdout
    result = run(runner, "memory", SB, "--json")
    assert json.loads(result.stdout) == cost


# -------------------------------------------------------------- exec / eval


def exec_reply(**fields: Any) -> httpx.Response:
    body = {"stdout": "", "stderr": "", "exit_code": 0, "error": None, "timed_out": False}
    return httpx.Response(200, json=body | fields)


def test_exec_passes_output_and_exit_code(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("POST", f"/v1/sandboxes/{SB}/exec",
              exec_reply(stdout="out\n", stderr="\x1b[33mwarn\x1b[0m\n", exit_code=3))
    result = run(runner, "exec", SB, "--timeout", "5", "-e", "A=1", "--cwd", "/tmp",
                 "--", "sh", "-c", "echo out; exit 3")
    assert result.exit_code == 3
    assert result.stdout == "out\n"
    assert result.stderr == "\x1b[33mwarn\x1b[0m\n"  # passed through untouched
    assert daemon.body() == {"args": ["sh", "-c", "echo out; exit 3"], "timeout_secs": 5.0,
                             "env": {"A": "1"}, "cwd": "/tmp"}


def test_exec_as_a_guest_user(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("POST", f"/v1/sandboxes/{SB}/exec", exec_reply(stdout="1000\n"), exec_reply(stdout="0\n"))
    assert run(runner, "exec", SB, "--user", "user", "--", "id", "-u").stdout == "1000\n"
    assert daemon.body() == {"args": ["id", "-u"], "timeout_secs": 30, "user": "user"}
    run(runner, "exec", SB, "--", "id", "-u")
    assert "user" not in daemon.body()  # root, the daemon's default


def test_exec_stdin_from_own_stdin(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("POST", f"/v1/sandboxes/{SB}/exec", exec_reply(stdout="hello\n"))
    result = run(runner, "exec", SB, "--stdin", "-", "--", "cat", input="hello\n")
    assert result.exit_code == 0
    assert daemon.body()["stdin"] == "hello\n"


def test_exec_timeout_and_signal_statuses(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("POST", f"/v1/sandboxes/{SB}/exec",
              exec_reply(exit_code=124, timed_out=True, error="timed out after 1s"),
              exec_reply(exit_code=-9))
    timed_out = run(runner, "exec", SB, "--timeout", "1", "--", "sleep", "5")
    assert timed_out.exit_code == 124
    assert "timed out" in timed_out.stderr
    assert run(runner, "exec", SB, "--", "sleep", "5").exit_code == 137


def test_exec_json_keeps_exit_code(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("POST", f"/v1/sandboxes/{SB}/exec", exec_reply(stdout="x", exit_code=2))
    result = run(runner, "exec", SB, "--json", "--", "false")
    assert result.exit_code == 2
    assert json.loads(result.stdout)["stdout"] == "x"


def test_eval(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("POST", f"/v1/sandboxes/{SB}/eval",
              httpx.Response(200, json={"result": "0.0", "error": None, "exit_code": 0}),
              httpx.Response(200, json={"result": None, "error": "NameError: x", "exit_code": 1}))
    ok = run(runner, "eval", SB, "numpy.zeros(5).sum()")
    assert ok.exit_code == 0 and ok.stdout == "0.0\n"
    assert daemon.body() == {"code": "numpy.zeros(5).sum()"}
    bad = run(runner, "eval", SB, "x")
    assert bad.exit_code == 1
    assert "NameError: x" in bad.stderr


# ------------------------------------------------------------ errors, config


def test_api_error_is_printed_and_exits_1(runner: CliRunner, daemon: FakeDaemon) -> None:
    daemon.on("POST", "/v1/sandboxes",
              httpx.Response(404, json={"error": "snapshot 'nope' is not registered"}))
    result = run(runner, "fork", "--tag", "nope")
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: snapshot 'nope' is not registered"
    assert "Traceback" not in result.output


def test_daemon_down_says_how_to_start_it(runner: CliRunner) -> None:
    result = run(runner, "--url", "http://127.0.0.1:9", "ls")
    assert result.exit_code == 1
    assert "not reachable at http://127.0.0.1:9" in result.stderr
    assert "forkd daemon" in result.stderr


def test_url_and_token_options_reach_the_controller(
    runner: CliRunner, daemon: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon.on("GET", "/v1/sandboxes", httpx.Response(200, json=[]))
    assert run(runner, "--url", "http://h:1", "--token", "t0k", "ls", "--sandboxes").exit_code == 0
    monkeypatch.setenv("FORKD_URL", "http://env:2")
    monkeypatch.setenv("FORKD_TOKEN", "envtok")
    assert run(runner, "ls", "--sandboxes").exit_code == 0
    assert daemon.made == [("http://h:1", "t0k"), ("http://env:2", "envtok")]
    assert daemon.requests[0].headers["authorization"] == "Bearer t0k"


def test_version_without_daemon_still_works(runner: CliRunner) -> None:
    result = run(runner, "--url", "http://127.0.0.1:9", "version", "--json")
    assert result.exit_code == 0
    out = json.loads(result.stdout)
    assert out["client"]["version"] and out["daemon"] is None


# --------------------------------------------------------- local commands


def test_daemon_builds_settings(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import forkd.api.server as server

    seen: list[Any] = []
    monkeypatch.setattr(server, "serve", lambda settings, **_: seen.append(settings))
    monkeypatch.setenv("FORKD_BRANCH_CONCURRENCY", "7")
    result = run(runner, "daemon", "--bind", "0.0.0.0:9999", "--data-dir", str(tmp_path),
                 "--keep-sandboxes")
    assert result.exit_code == 0, result.output
    (settings,) = seen
    assert (settings.host, settings.port) == ("0.0.0.0", 9999)
    assert settings.data_dir == tmp_path
    assert settings.keep_sandboxes is True
    assert settings.branch_concurrency == 7  # env-only settings survive

    monkeypatch.setenv("FORKD_BIND", "127.0.0.1:7777")
    assert run(runner, "daemon").exit_code == 0
    assert (seen[-1].host, seen[-1].port) == ("127.0.0.1", 7777)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tls-cert", "c.pem"], "--tls-cert and --tls-key"),
        (["--bind", "nonsense"], "bad bind address"),
    ],
)
def test_daemon_usage_errors(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    import forkd.api.server as server

    monkeypatch.setattr(server, "serve", lambda *a, **k: pytest.fail("must not serve"))
    result = run(runner, "daemon", *args)
    assert result.exit_code == 2
    assert message in result.stderr


@dataclass
class FakeCheck:
    name: str
    ok: bool
    detail: str
    fix: str | None = None
    required: bool = True


@pytest.mark.parametrize(
    ("checks", "code"),
    [
        ([FakeCheck("qemu", True, "QEMU 7.2")], 0),
        ([FakeCheck("qemu", True, "QEMU 7.2"),
          FakeCheck("netns", False, "no ip", "apt-get install iproute2", required=False)], 0),
        ([FakeCheck("qemu", False, "missing", "apt-get install qemu-system-x86")], 1),
    ],
)
def test_doctor_exit_status(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    checks: list[FakeCheck], code: int,
) -> None:
    import forkd.doctor

    seen: list[Any] = []

    def run_checks(data_dir: Any = None) -> list[FakeCheck]:
        seen.append(data_dir)
        return checks

    monkeypatch.setattr(forkd.doctor, "run_checks", run_checks)
    result = run(runner, "doctor", "--data-dir", str(tmp_path))
    assert result.exit_code == code, result.output
    assert seen == [tmp_path]
    for c in checks:
        assert c.name in result.stdout
        if not c.ok:
            assert c.fix and c.fix in result.stdout
    as_json = run(runner, "doctor", "--json")
    assert as_json.exit_code == code
    assert json.loads(as_json.stdout)["checks"][0]["name"] == "qemu"


@dataclass
class FakeImage:
    name: str
    dir: Path
    meta: dict[str, Any]


def test_image_build_recipe_and_progress(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import forkd.image.builder as builder

    seen: dict[str, Any] = {}

    def fake_build(data: Any, recipe: Any, *, force: bool, progress: Any) -> FakeImage:
        seen.update(data=data, recipe=recipe, force=force)
        progress("kernel", 0.1)
        progress("done", 1.0)
        meta = {"kernel_version": "6.1.0-x", "built_at_unix": 1717000000, "build_secs": 3.2,
                "recipe": {"packages": ["python3"], "extra_packages": ["git"]}}
        return FakeImage(recipe.name, tmp_path / recipe.name, meta)

    monkeypatch.setattr(builder, "build_image", fake_build)
    rootfs = tmp_path / "tree"
    rootfs.mkdir()
    result = run(runner, "image", "build", "--name", "ml", "--packages", "git,curl",
                 "--packages", "jq", "--size-mib", "4096", "--rootfs", str(rootfs), "--force",
                 "--data-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    recipe = seen["recipe"]
    assert recipe.name == "ml"
    assert recipe.extra_packages == ("git", "curl", "jq")
    assert recipe.size_mib == 4096
    assert recipe.rootfs_source == str(rootfs)
    assert seen["force"] is True
    assert seen["data"].root == tmp_path
    assert "image ml ready" in result.stdout and "6.1.0-x" in result.stdout


def test_image_errors_are_reported(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import forkd.image.builder as builder
    from forkd.errors import PrerequisiteMissing

    def fail(*args: Any, **kwargs: Any) -> None:
        raise PrerequisiteMissing("debootstrap not found: apt-get install debootstrap")

    monkeypatch.setattr(builder, "build_image", fail)
    result = run(runner, "image", "build", "--data-dir", str(tmp_path))
    assert result.exit_code == 1
    assert "error: debootstrap not found" in result.stderr


def test_image_ls(runner: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import forkd.image.builder as builder

    images = [FakeImage("default", tmp_path / "default",
                        {"kernel_version": "6.1.0-x", "built_at_unix": 1717000000,
                         "recipe": {"packages": ["python3"], "size_mib": 2048}})]
    monkeypatch.setattr(builder, "list_images", lambda data: images)
    result = run(runner, "image", "ls")
    assert result.exit_code == 0, result.output
    assert "default" in result.stdout and "6.1.0-x" in result.stdout
    out = json.loads(run(runner, "image", "ls", "--json").stdout)
    assert out[0]["name"] == "default" and out[0]["kernel_version"] == "6.1.0-x"
