"""The egress flags shared by ``forkd fork``, ``forkd branch``, ``forkd pool`` and ``forkd snapshot``.

They map one to one onto the API's (E2B's) names: ``--allow-internet-access``,
``--allow-out DEST`` and ``--deny-out DEST`` (repeatable). The daemon checks the
entries and says what is wrong with a bad one.
"""

from __future__ import annotations

from typing import Annotated

import typer

from forkd.sdk.models import NetworkPolicy

AllowInternet = Annotated[
    bool,
    typer.Option("--allow-internet-access", "--internet",
                 help="Open outbound traffic to the public internet (denied by default; the snapshot "
                 "needs a NIC: forkd snapshot --nic)."),
]
AllowOut = Annotated[
    list[str] | None,
    typer.Option("--allow-out", metavar="DEST",
                 help="Always allow traffic to DEST: an IPv4 address or CIDR, or a DNS name (*.NAME: "
                 "the names below it), optionally :PORT or :FIRST-LAST, e.g. 10.201.0.1:8080, "
                 "192.0.2.0/24 or *.pythonhosted.org:443 (repeatable)."),
]
DenyOut = Annotated[
    list[str] | None,
    typer.Option("--deny-out", metavar="DEST",
                 help="Close DEST even with --allow-internet-access (repeatable)."),
]


def network_policy(allow_out: list[str] | None, deny_out: list[str] | None) -> NetworkPolicy | None:
    """The API's ``network`` object; None when neither list was given."""
    if not allow_out and not deny_out:
        return None
    return {"allow_out": list(allow_out or []), "deny_out": list(deny_out or [])}
