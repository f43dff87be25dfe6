# GENERATED from src/forkd/sdk/async_routes/processes.py by scripts/unasync_sdk.py — do not edit.
# Edit the async source, then run: python scripts/unasync_sdk.py
"""Process routes: streamed exec, background processes, their stdin and signals."""

from __future__ import annotations

import collections.abc
from collections.abc import Mapping, Sequence
from typing import cast

from forkd.sdk import _guest_calls
from forkd.sdk.errors import NotFoundError
from forkd.sdk.models import (
    SignalResponse,
    StdinResponse,
)
from forkd.sdk.terminal import Terminal, terminal_url
from forkd.sdk.types import (
    JSONDict,
    ProcessInfo,
)

from .transport import Transport


class ProcessRoutes(Transport):
    """``/v1/sandboxes/{id}/exec/stream`` and ``/v1/sandboxes/{id}/processes``."""

    def exec_stream(
        self,
        sandbox_id: str,
        args: str | Sequence[str],
        timeout_secs: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
        *,
        stdin_open: bool = False,
        tag: str | None = None,
        encoding: str = "text",
        user: str | None = None,
    ) -> collections.abc.Generator[JSONDict, None, None]:
        """``POST /v1/sandboxes/{id}/exec/stream``: run a command and stream its events.

        Yields ``{"type": "start", "pid"}``, then ``{"type": "stdout"|"stderr",
        "data"}`` as the command writes (``data`` is text, or base64 with
        ``encoding="base64"``), and last ``{"type": "exit", "exit_code",
        "signal", "timed_out", "error"}``. Leaving the iteration early (close
        it: ``contextlib.closing``) kills the command. With ``stdin_open``,
        write to it with :meth:`send_stdin` (the pid is in the start event).
        ``user``: a guest user to run as; None: root.
        """
        return self._stream(_guest_calls.exec_stream(
            sandbox_id, args, timeout_secs=timeout_secs, env=env, cwd=cwd, stdin=stdin,
            stdin_open=stdin_open, tag=tag, encoding=encoding, user=user))

    def code_stream(
        self,
        sandbox_id: str,
        code: str,
        *,
        language: str | None = None,
        context: str | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> collections.abc.Generator[JSONDict, None, None]:
        """``POST /v1/sandboxes/{id}/code``: run a cell on a Jupyter kernel and stream its events.

        Yields ``{"type": "stdout"|"stderr", "text"}`` as the cell writes, ``{"type": "result",
        "data": {MIME: value}, "is_main_result"}``, ``{"type": "error", "name", "value",
        "traceback"}`` if it raised (an event here, not a broken stream), and last ``{"type":
        "end", "execution_count", "timed_out", "restarted"}`` (with ``error`` if the stream
        broke). ``language``: ``python``, ``bash``, ``javascript`` (``js``), ``r``; None: the
        context's. ``context``: the kernel (None: the language's default). ``timeout``: seconds
        before the kernel is interrupted (None: the daemon's 300). Leaving the iteration early
        interrupts the cell. :meth:`~forkd.sdk._generated.sandbox.Sandbox.run_code` folds these
        into an :class:`~forkd.sdk.execution.Execution`.
        """
        return self._stream(_guest_calls.code(sandbox_id, code, language=language, context=context,
                                              timeout=timeout, env=env, cwd=cwd))

    def start_process(
        self,
        sandbox_id: str,
        args: str | Sequence[str],
        timeout_secs: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
        *,
        stdin_open: bool = False,
        tag: str | None = None,
        user: str | None = None,
    ) -> ProcessInfo:
        """``POST /v1/sandboxes/{id}/processes``: start a background process → its ProcessInfo.

        It runs until it exits, is killed, or ``timeout_secs`` pass (default:
        no limit), as ``user`` (None: root). Watch it with :meth:`stream_process`.
        """
        call = _guest_calls.start_process(sandbox_id, args, timeout_secs=timeout_secs, env=env, cwd=cwd,
                                    stdin=stdin, stdin_open=stdin_open, tag=tag, user=user)
        return cast(ProcessInfo, self._send(call))

    def list_processes(self, sandbox_id: str) -> list[ProcessInfo]:
        """``GET /v1/sandboxes/{id}/processes``: the running processes forkd started there."""
        return cast(list[ProcessInfo], self._send(_guest_calls.list_processes(sandbox_id)))

    def get_process(self, sandbox_id: str, pid: int) -> ProcessInfo:
        """``GET /v1/sandboxes/{id}/processes/{pid}``: running or recently exited."""
        return cast(ProcessInfo, self._send(_guest_calls.get_process(sandbox_id, pid)))

    def stream_process(
        self, sandbox_id: str, pid: int, from_start: bool = True, encoding: str = "text"
    ) -> collections.abc.Generator[JSONDict, None, None]:
        """``GET /v1/sandboxes/{id}/processes/{pid}/stream``: a process's events, as for
        :meth:`exec_stream`; from the oldest output the guest still keeps (up to
        1 MiB, ``from_start``) or from now. A ``{"type": "dropped", "bytes"}``
        event says output was lost before it could be sent. Leaving the
        iteration leaves the process running."""
        return self._stream(_guest_calls.stream_process(sandbox_id, pid, from_start=from_start,
                                                  encoding=encoding))

    def send_stdin(
        self, sandbox_id: str, pid: int, data: str | bytes, eof: bool = False
    ) -> StdinResponse:
        """``POST /v1/sandboxes/{id}/processes/{pid}/stdin``: write ``data`` (and close with ``eof``)."""
        return cast(StdinResponse, self._send(_guest_calls.send_stdin(sandbox_id, pid, data, eof=eof)))

    def close_stdin(self, sandbox_id: str, pid: int) -> StdinResponse:
        """Close a process's stdin (it reads end-of-file)."""
        return self.send_stdin(sandbox_id, pid, "", eof=True)

    def signal_process(
        self, sandbox_id: str, pid: int, signal: str | int = "SIGTERM", group: bool = True
    ) -> SignalResponse:
        """``POST /v1/sandboxes/{id}/processes/{pid}/signal``: ``SIGTERM``, ``"INT"``, ``9``, ..."""
        call = _guest_calls.signal_process(sandbox_id, pid, signal, group=group)
        return cast(SignalResponse, self._send(call))

    def open_terminal(self, sandbox_id: str, *, cols: int = 80, rows: int = 24,
                            user: str | None = None) -> Terminal:
        """``GET /v1/sandboxes/{id}/terminal`` (a WebSocket): a login shell on a ``cols`` x ``rows``
        pty, as ``user`` (None: root). Send keys, read output, resize; closing it kills the shell
        (:class:`forkd.sdk.terminal.Terminal`)."""
        url = terminal_url(self.url, sandbox_id, cols, rows, user)
        return Terminal.open(url, self._token, self._verify)

    def kill_process(self, sandbox_id: str, pid: int) -> bool:
        """``DELETE /v1/sandboxes/{id}/processes/{pid}``: SIGKILL its group; False if it was not running."""
        try:
            self._send(_guest_calls.kill_process(sandbox_id, pid))
        except NotFoundError:
            return False
        return True
