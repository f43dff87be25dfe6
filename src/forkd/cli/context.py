"""State shared by all commands: how to reach the daemon, output mode, error handling."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, NoReturn, ParamSpec, TypeVar

import typer

from forkd.cli import output
from forkd.errors import ForkdError
from forkd.sdk import Controller

P = ParamSpec("P")
R = TypeVar("R")

# Per-command spelling of the global flag, so both `forkd --json ls` and
# `forkd ls --json` work.
JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print the daemon's raw JSON (for scripts).")
]


def make_controller(url: str | None, token: str | None, ca_cert: str | None = None) -> Controller:
    """Build the SDK client; a seam that tests replace to use a mock transport."""
    return Controller(url=url, token=token, verify=ca_cert)


@dataclass
class CliState:
    url: str | None = None
    token: str | None = None
    json: bool = False
    ca_cert: str | None = None
    _controller: Controller | None = field(default=None, repr=False)

    def controller(self) -> Controller:
        if self._controller is None:
            self._controller = make_controller(self.url, self.token, self.ca_cert)
        return self._controller


def state(ctx: typer.Context) -> CliState:
    obj = ctx.find_root().obj
    if not isinstance(obj, CliState):
        obj = ctx.find_root().obj = CliState()
    return obj


def want_json(ctx: typer.Context, flag: bool) -> bool:
    return flag or state(ctx).json


def show_details(ctx: typer.Context, info: Mapping[str, Any], json_: bool) -> None:
    """One object: its JSON for scripts, else a key/value table for people."""
    if want_json(ctx, json_):
        output.emit_json(info)
    else:
        output.console.print(output.details_table(info))


def usage_error(ctx: typer.Context, message: str) -> NoReturn:
    """Report a wrong combination of flags like click does: usage line, exit 2."""
    output.err_console.print(ctx.get_usage(), highlight=False, markup=False)
    output.err_console.print(
        f"Try '{ctx.command_path} --help' for help.\n", highlight=False, markup=False
    )
    output.fail(message, code=2)


def parse_pairs(ctx: typer.Context, pairs: list[str] | None, flag: str) -> dict[str, str] | None:
    """``KEY=VALUE`` options (``--env``, ``--label``) as a dict; None when none was given."""
    if not pairs:
        return None
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            usage_error(ctx, f"{flag} expects KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn SDK/core errors into ``error: <message>`` on stderr and exit status 1.

    A traceback is noise for "daemon not running" or "tag already exists"; the
    message from the daemon already says what went wrong and what to do.
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except ForkdError as exc:
            output.fail(str(exc))
        except KeyboardInterrupt:
            output.fail("interrupted", code=130)

    return wrapper
