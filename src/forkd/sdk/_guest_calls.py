"""The REST v1 calls that act inside a sandbox's guest: processes and files (request builders,
as :mod:`forkd.sdk._calls`, which re-exports them)."""

from __future__ import annotations

import base64
import signal as signals
from collections.abc import Mapping, Sequence
from typing import Any, cast

from forkd.sdk._build import command_args
from forkd.sdk._build import put as _put
from forkd.sdk._build import seg as _seg
from forkd.sdk._http import Call
from forkd.sdk.models import CodeRequest

# --------------------------------------------------------------- processes

def _processes(sandbox_id: str, what: str = "") -> str:
    return f"/v1/sandboxes/{_seg(sandbox_id)}/processes{what}"


def _process_body(
    args: str | Sequence[str], *, timeout_secs: float | None, env: Mapping[str, str] | None,
    cwd: str | None, stdin: str | None, stdin_open: bool, tag: str | None, user: str | None,
) -> dict[str, Any]:
    body = _put({"args": command_args(args)}, timeout_secs=timeout_secs,
                env=dict(env) if env is not None else None, cwd=cwd, stdin=stdin, tag=tag, user=user)
    if stdin_open:
        body["stdin_open"] = True
    return body


def exec_stream(
    sandbox_id: str, args: str | Sequence[str], *, timeout_secs: float | None,
    env: Mapping[str, str] | None, cwd: str | None, stdin: str | None, stdin_open: bool,
    tag: str | None, encoding: str, user: str | None = None,
) -> Call:
    body = _process_body(args, timeout_secs=timeout_secs, env=env, cwd=cwd, stdin=stdin,
                         stdin_open=stdin_open, tag=tag, user=user)
    if encoding != "text":
        body["encoding"] = encoding
    # The stream lasts as long as the process: no read timeout between its lines.
    return Call("POST", f"/v1/sandboxes/{_seg(sandbox_id)}/exec/stream", json=body, read_timeout=None)


def code(
    sandbox_id: str, code: str, *, language: str | None, context: str | None, timeout: float | None,
    env: Mapping[str, str] | None, cwd: str | None,
) -> Call:
    body = cast(CodeRequest, _put({"code": code}, language=language, context=context, timeout=timeout,
                                  env=dict(env) if env is not None else None, cwd=cwd))
    # The stream lasts as long as the cell; its error events are the cell's exceptions.
    return Call("POST", f"/v1/sandboxes/{_seg(sandbox_id)}/code", json=body, read_timeout=None,
                error_events=True)


def start_process(
    sandbox_id: str, args: str | Sequence[str], *, timeout_secs: float | None,
    env: Mapping[str, str] | None, cwd: str | None, stdin: str | None, stdin_open: bool,
    tag: str | None, user: str | None = None,
) -> Call:
    body = _process_body(args, timeout_secs=timeout_secs, env=env, cwd=cwd, stdin=stdin,
                         stdin_open=stdin_open, tag=tag, user=user)
    return Call("POST", _processes(sandbox_id), json=body)


def list_processes(sandbox_id: str) -> Call:
    return Call("GET", _processes(sandbox_id))


def get_process(sandbox_id: str, pid: int) -> Call:
    return Call("GET", _processes(sandbox_id, f"/{int(pid)}"))


def stream_process(sandbox_id: str, pid: int, *, from_start: bool, encoding: str) -> Call:
    params = {"from": "start" if from_start else "now"}
    if encoding != "text":
        params["encoding"] = encoding
    return Call("GET", _processes(sandbox_id, f"/{int(pid)}/stream"), params=params, read_timeout=None)


def send_stdin(sandbox_id: str, pid: int, data: str | bytes, *, eof: bool) -> Call:
    if isinstance(data, str):
        body: dict[str, Any] = {"data": data}
    else:
        body = {"data": base64.b64encode(data).decode("ascii"), "encoding": "base64"}
    if eof:
        body["eof"] = True
    return Call("POST", _processes(sandbox_id, f"/{int(pid)}/stdin"), json=body)


def signal_name(signal: str | int) -> str:
    """``15``, ``"TERM"``, ``"sigterm"`` or ``"SIGTERM"`` -> ``"SIGTERM"`` (the API's spelling)."""
    if isinstance(signal, int) or str(signal).isdigit():
        try:
            return signals.Signals(int(signal)).name
        except ValueError:
            raise ValueError(f"no signal number {signal}") from None
    name = str(signal).upper()
    return name if name.startswith("SIG") else f"SIG{name}"


def signal_process(sandbox_id: str, pid: int, signal: str | int, *, group: bool) -> Call:
    body: dict[str, Any] = {"signal": signal_name(signal)}
    if not group:
        body["group"] = False
    return Call("POST", _processes(sandbox_id, f"/{int(pid)}/signal"), json=body)


def kill_process(sandbox_id: str, pid: int) -> Call:
    return Call("DELETE", _processes(sandbox_id, f"/{int(pid)}"))


# ------------------------------------------------------------------- files

# Transfers wait as long as the daemon takes (it bounds each piece it moves).
def _files(sandbox_id: str, what: str = "") -> str:
    return f"/v1/sandboxes/{_seg(sandbox_id)}/files{what}"


def _file_params(path: str, user: str | None, **more: str | None) -> dict[str, str]:
    """A file route's query: the path, and the guest user it acts as when one is given."""
    return {k: v for k, v in {"path": path, **more, "user": user}.items() if v is not None}


def file_stat(sandbox_id: str, path: str, *, user: str | None = None) -> Call:
    return Call("GET", _files(sandbox_id, "/stat"), params=_file_params(path, user))


def file_list(sandbox_id: str, path: str, *, user: str | None = None) -> Call:
    return Call("GET", _files(sandbox_id, "/list"), params=_file_params(path, user))


def file_mkdir(sandbox_id: str, path: str, *, parents: bool, user: str | None = None) -> Call:
    body = _put({"path": path, "parents": parents}, user=user)
    return Call("POST", _files(sandbox_id, "/mkdir"), json=body)


def file_remove(sandbox_id: str, path: str, *, recursive: bool, user: str | None = None) -> Call:
    params = _file_params(path, user, recursive="true" if recursive else None)
    return Call("DELETE", _files(sandbox_id), params=params)


def file_write(sandbox_id: str, path: str, *, mode: int | None, user: str | None = None) -> Call:
    params = _file_params(path, user, mode=str(mode) if mode is not None else None)
    return Call("PUT", _files(sandbox_id), params=params, read_timeout=None)


def file_read(sandbox_id: str, path: str, *, user: str | None = None) -> Call:
    return Call("GET", _files(sandbox_id), params=_file_params(path, user), read_timeout=None)
