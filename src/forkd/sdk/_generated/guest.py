# GENERATED from src/forkd/sdk/async_guest.py by scripts/unasync_sdk.py — do not edit.
# Edit the async source, then run: python scripts/unasync_sdk.py
"""What runs inside a sandbox, object-style: :class:`Commands` (``sb.commands``) with its
:class:`CommandHandle` for a background process, and :class:`Files` (``sb.files``)."""

from __future__ import annotations

import collections.abc
import contextlib
import io
import os
from collections.abc import Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, Literal, overload

from forkd.errors import ForkdError
from forkd.sdk import _twins
from forkd.sdk.models import FileInfo
from forkd.sdk.types import (
    CommandResult,
    JSONDict,
    OutputChunk,
    ProcessInfo,
)

if TYPE_CHECKING:
    from forkd.sdk._generated.sandbox import Sandbox


# Called with each piece of output text; here it may also be a coroutine function.
OutputCallback = Callable[[str], Any]


class CommandHandle:
    """A process running in the sandbox, from ``commands.run(..., background=True)`` or
    ``commands.connect(pid)``.

    Iterate it for its output as it comes (``for stdout, stderr, _ in
    handle``; each :class:`~forkd.sdk.types.OutputChunk` has one of the two set),
    or :meth:`wait` for it to end. Each iteration starts with the oldest output
    the guest still keeps for it (up to 1 MiB), so output written before you
    looked is not lost. ``on_stdout``/``on_stderr`` are called with each piece,
    while it is iterated or waited for.
    """

    def __init__(self, sandbox: Sandbox, pid: int, *, on_stdout: OutputCallback | None = None,
                 on_stderr: OutputCallback | None = None) -> None:
        self._sandbox = sandbox
        self.pid = pid
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self._result: CommandResult | None = None

    def __repr__(self) -> str:
        return f"CommandHandle(pid={self.pid}, sandbox={self._sandbox.id!r})"

    @property
    def stdout(self) -> str:
        """The stdout read so far."""
        return "".join(self._stdout)

    @property
    def stderr(self) -> str:
        """The stderr read so far."""
        return "".join(self._stderr)

    @property
    def exit_code(self) -> int | None:
        """None until the process has ended (and been seen to, by iterating or :meth:`wait`)."""
        return self._result.exit_code if self._result is not None else None

    def __iter__(self) -> collections.abc.Iterator[OutputChunk]:
        return self._chunks()

    def _chunks(self) -> collections.abc.Iterator[OutputChunk]:
        self._stdout.clear()
        self._stderr.clear()
        events = self._sandbox.controller.stream_process(self._sandbox.id, self.pid)
        with contextlib.closing(events):
            for event in events:
                chunk = self.record(event)
                if chunk is not None:
                    yield chunk

    def record(self, event: JSONDict) -> OutputChunk | None:
        """Record one event of its stream (output, exit); the output chunk it carries, if any."""
        kind = event.get("type")
        if kind == "stdout":
            self._stdout.append(str(event["data"]))
            if self._on_stdout is not None:
                _twins.settle(self._on_stdout(str(event["data"])))
            return OutputChunk(stdout=str(event["data"]))
        if kind == "stderr":
            self._stderr.append(str(event["data"]))
            if self._on_stderr is not None:
                _twins.settle(self._on_stderr(str(event["data"])))
            return OutputChunk(stderr=str(event["data"]))
        if kind == "exit":
            self._result = CommandResult.from_json(
                {**event, "stdout": self.stdout, "stderr": self.stderr})
        return None

    def wait(self) -> CommandResult:
        """Wait for the process to end; its output (what the guest kept) and exit code.

        A non-zero exit is reported, not raised (see :attr:`CommandResult.ok`)."""
        if self._result is None:
            for _ in self:
                pass
        if self._result is None:
            raise ForkdError(f"the stream of process {self.pid} ended without its exit")
        return self._result

    def send_stdin(self, data: str | bytes) -> None:
        """Write to its stdin (it must have been started with ``stdin_open=True``)."""
        self._sandbox.controller.send_stdin(self._sandbox.id, self.pid, data)

    def close_stdin(self) -> None:
        self._sandbox.controller.close_stdin(self._sandbox.id, self.pid)

    def signal(self, signal: str | int = "SIGTERM") -> None:
        self._sandbox.controller.signal_process(self._sandbox.id, self.pid, signal)

    def kill(self) -> bool:
        """SIGKILL its process group; False if it was no longer running."""
        return self._sandbox.controller.kill_process(self._sandbox.id, self.pid)


class Commands:
    """``sb.commands``: subprocesses inside the sandbox."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    @overload
    def run(
        self, cmd: str | Sequence[str], timeout: float | None = 30, env: Mapping[str, str] | None = None,
        cwd: str | None = None, stdin: str | None = None, *, background: Literal[False] = False,
        on_stdout: OutputCallback | None = None, on_stderr: OutputCallback | None = None,
        stdin_open: bool = False, tag: str | None = None, user: str | None = None,
    ) -> CommandResult: ...

    @overload
    def run(
        self, cmd: str | Sequence[str], timeout: float | None = 30, env: Mapping[str, str] | None = None,
        cwd: str | None = None, stdin: str | None = None, *, background: Literal[True],
        on_stdout: OutputCallback | None = None, on_stderr: OutputCallback | None = None,
        stdin_open: bool = False, tag: str | None = None, user: str | None = None,
    ) -> CommandHandle: ...

    def run(
        self,
        cmd: str | Sequence[str],
        timeout: float | None = 30,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
        *,
        background: bool = False,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        stdin_open: bool = False,
        tag: str | None = None,
        user: str | None = None,
    ) -> CommandResult | CommandHandle:
        """Run ``cmd``: a string runs via ``/bin/sh -c``, a list is argv.

        Without ``background`` it waits and returns a
        :class:`~forkd.sdk.types.CommandResult` (a non-zero exit is reported,
        not raised); with ``on_stdout``/``on_stderr`` the output is streamed to
        them as the command writes it. ``timeout`` is enforced in the guest
        (the process group is killed and ``timed_out`` set); ``None`` or 0: no
        limit (streamed and background commands only).

        With ``background=True`` it returns an :class:`CommandHandle` as
        soon as the process has started (``stdin_open`` keeps its stdin open
        for ``handle.send_stdin``; ``tag`` labels it in :meth:`list`).

        ``user`` runs it as that guest user (``"user"``: uid 1000, its HOME, and
        ``/home/user`` as the default ``cwd``); None: root.
        """
        limit = timeout or None
        if background:
            info = self._sandbox.controller.start_process(
                self._sandbox.id, cmd, timeout_secs=limit, env=env, cwd=cwd, stdin=stdin,
                stdin_open=stdin_open, tag=tag, user=user)
            return CommandHandle(self._sandbox, int(info["pid"]), on_stdout=on_stdout,
                                      on_stderr=on_stderr)
        if on_stdout is None and on_stderr is None and not stdin_open and limit is not None:
            body = self._sandbox.controller.exec(
                self._sandbox.id, cmd, timeout_secs=limit, env=env, cwd=cwd, stdin=stdin, user=user
            )
            return CommandResult.from_json(body)
        events = self._sandbox.controller.exec_stream(
            self._sandbox.id, cmd, timeout_secs=limit, env=env, cwd=cwd, stdin=stdin,
            stdin_open=stdin_open, tag=tag, user=user)
        handle: CommandHandle | None = None
        with contextlib.closing(events):
            for event in events:
                if event.get("type") == "start":
                    handle = CommandHandle(self._sandbox, int(event["pid"]), on_stdout=on_stdout,
                                                on_stderr=on_stderr)
                elif handle is not None:
                    handle.record(event)
        if handle is None:
            raise ForkdError("the command's stream ended before it started")
        return handle.wait()

    def connect(self, pid: int, on_stdout: OutputCallback | None = None,
                      on_stderr: OutputCallback | None = None) -> CommandHandle:
        """A handle on a process already running (see :meth:`list`)."""
        self._sandbox.controller.get_process(self._sandbox.id, pid)  # 404 if there is none
        return CommandHandle(self._sandbox, pid, on_stdout=on_stdout, on_stderr=on_stderr)

    def list(self) -> list[ProcessInfo]:
        """The running processes forkd started in the sandbox (``pid``, ``args``, ``tag``, ...)."""
        return self._sandbox.controller.list_processes(self._sandbox.id)

    def kill(self, pid: int) -> bool:
        """SIGKILL the process (its group); False if it was not running."""
        return self._sandbox.controller.kill_process(self._sandbox.id, pid)

    def send_stdin(self, pid: int, data: str | bytes) -> None:
        self._sandbox.controller.send_stdin(self._sandbox.id, pid, data)

    def close_stdin(self, pid: int) -> None:
        self._sandbox.controller.close_stdin(self._sandbox.id, pid)


class Files:
    """``sb.files``: files inside the sandbox, moved as streams (never held whole).

    Every method takes ``user``: the guest user it acts as (permissions are
    checked as theirs, and what it creates is theirs); None: root."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def write(self, path: str, data: bytes | str | IO[bytes], mode: int | None = None,
                    user: str | None = None) -> FileInfo:
        """Write ``data`` (bytes, text or a binary file object, streamed) to ``path``.

        Returns the new file's FileInfo."""
        return self._sandbox.controller.write_file(self._sandbox.id, path, data, mode=mode, user=user)

    def upload(self, local_path: str | os.PathLike[str], path: str,
                     user: str | None = None) -> FileInfo:
        """Copy the local file ``local_path`` to ``path`` in the sandbox, streamed."""
        with open(local_path, "rb") as source:
            return self.write(path, source, user=user)

    def read(self, path: str, user: str | None = None) -> bytes:
        """The whole contents of ``path`` (use :meth:`download` for large files)."""
        sink = io.BytesIO()
        self._sandbox.controller.read_file_into(self._sandbox.id, path, sink, user=user)
        return sink.getvalue()

    def download(self, path: str, local_path: str | os.PathLike[str], user: str | None = None) -> int:
        """Stream ``path`` into the local file ``local_path``; returns its size."""
        with open(local_path, "wb") as sink:
            return self._sandbox.controller.read_file_into(self._sandbox.id, path, sink, user=user)

    def list(self, path: str, user: str | None = None) -> list[FileInfo]:
        """The entries (FileInfo dicts, sorted by name) of the directory ``path``."""
        listing = self._sandbox.controller.file_list(self._sandbox.id, path, user=user)
        return list(listing["entries"])

    def stat(self, path: str, user: str | None = None) -> FileInfo:
        """``{"path", "name", "type", "size", "mode", "mtime", "owner", "group"}`` of ``path``."""
        return self._sandbox.controller.file_stat(self._sandbox.id, path, user=user)

    def exists(self, path: str, user: str | None = None) -> bool:
        return self._sandbox.controller.file_exists(self._sandbox.id, path, user=user)

    def mkdir(self, path: str, parents: bool = False, user: str | None = None) -> bool:
        """Create the directory ``path``; False if ``parents`` and it already existed."""
        made = self._sandbox.controller.file_mkdir(self._sandbox.id, path, parents=parents, user=user)
        return bool(made["created"])

    def remove(self, path: str, recursive: bool = False, user: str | None = None) -> None:
        """Remove a file, or a directory (``recursive=True`` for a non-empty one)."""
        self._sandbox.controller.file_remove(self._sandbox.id, path, recursive=recursive, user=user)


__all__ = ["CommandHandle", "Commands", "Files", "OutputCallback"]
