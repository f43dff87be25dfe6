"""The ``forkd`` command: a thin typer/rich front end over the SDK.

Commands that talk to the daemon build a :class:`forkd.sdk.Controller` from
``--url``/``--token`` (or ``FORKD_URL``/``FORKD_TOKEN``/``FORKD_TOKEN_FILE``).
``forkd daemon``, ``forkd gateway``, ``forkd image``, ``forkd pack``/``unpack`` and ``forkd doctor``
run locally.

Exit status: 0 success, 1 an error (printed as ``error: ...`` on stderr),
2 a usage error; ``forkd exec`` exits with the command's own status.
"""

from __future__ import annotations

from typing import Annotated

import typer

from forkd.api import command as daemon_cmd
from forkd.cli import (
    bench,
    changes,
    files,
    fleet,
    forks,
    info,
    pools,
    processes,
    run,
    sandboxes,
    snapshots,
    travel,
)
from forkd.cli.context import CliState
from forkd.cli.image import image_app
from forkd.cli.mcp import mcp as mcp_cmd
from forkd.cli.netlog import network_app
from forkd.cli.secrets import secret_app
from forkd.cli.templates import template_app
from forkd.cli.volumes import volume_app
from forkd.cli.workspaces import workspace_app

app = typer.Typer(
    name="forkd",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_show_locals=False,
)


@app.callback()
def main(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option(
            "--url", envvar="FORKD_URL", metavar="URL",
            help="Daemon address (default http://127.0.0.1:8889).",
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            "--token", envvar="FORKD_TOKEN", metavar="TOKEN",
            help="Bearer token (else read from FORKD_TOKEN_FILE).",
        ),
    ] = None,
    ca_cert: Annotated[
        str | None,
        typer.Option(
            "--ca-cert", envvar="FORKD_CA_CERT", metavar="PEM",
            help="CA certificate to trust for an https:// daemon with a self-signed --tls-cert.",
        ),
    ] = None,
    json_: Annotated[
        bool, typer.Option("--json", help="Print raw JSON for every command (for scripts).")
    ] = False,
) -> None:
    """forkd: fork warm microVMs copy-on-write, branch running ones.

    Commands other than daemon, image and doctor talk to the daemon at --url
    (FORKD_URL), authenticating with --token (FORKD_TOKEN or FORKD_TOKEN_FILE).

    Quick start:
      sudo forkd image build         # once: build the guest image
      sudo forkd daemon &            # the API on 127.0.0.1:8889
      forkd snapshot --tag py        # boot + warm a template VM, snapshot it
      forkd fork --tag py -n 5       # fork 5 sandboxes from it
      forkd exec SANDBOX_ID -- python3 -c 'print(2+2)'
      forkd snapshot --from-sandbox SANDBOX_ID --tag checkpoint-1 --diff
      forkd fork --from-sandbox SANDBOX_ID -n 3 --tree   # then: forkd promote CHILD_ID
    """
    ctx.obj = CliState(url=url, token=token, json=json_, ca_cert=ca_cert)


app.command("daemon")(daemon_cmd.daemon)
app.add_typer(image_app, name="image")
app.command("snapshot")(snapshots.snapshot)
app.command("snapshot-info")(snapshots.snapshot_info)
app.command("rmi")(snapshots.rmi)
app.command("compact")(snapshots.compact)
app.command("fork")(sandboxes.fork)
app.command("branch")(sandboxes.branch)
app.command("promote")(forks.promote)
app.command("cp")(files.cp)
app.command("checkpoints")(forks.checkpoints)
app.command("ls")(sandboxes.ls)
app.command("kill")(sandboxes.kill)
app.command("timeout")(sandboxes.timeout)
app.command("hibernate")(sandboxes.hibernate)
app.command("ping")(sandboxes.ping)
app.command("memory")(sandboxes.memory)
app.command("diff")(changes.diff)
app.command("apply")(changes.apply)
app.command("exec")(run.exec_)
app.command("eval")(run.eval_)
app.command("cancel-eval")(processes.cancel_eval)
app.command("ps")(processes.ps)
app.command("attach")(processes.attach)
app.command("send-stdin")(processes.send_stdin)
app.command("kill-proc")(processes.kill_proc)
app.command("pool")(pools.pool)
app.add_typer(workspace_app, name="workspace")
app.add_typer(volume_app, name="volume")
app.add_typer(secret_app, name="secret")
app.add_typer(template_app, name="template")
app.add_typer(network_app, name="network")
app.command("pack")(travel.pack)
app.command("unpack")(travel.unpack)
app.command("push")(travel.push)
app.command("pull")(travel.pull)
app.command("gateway")(fleet.gateway)
app.command("mcp")(mcp_cmd)
app.command("version")(info.version)
app.command("doctor")(info.doctor)
app.command("bench")(bench.bench)


if __name__ == "__main__":
    app()
