"""The guest protocol's typed messages for processes (``proc_*``, ``forkd.guest.agent.processes``).

One request and one reply type per action, beside the envelope's id and action; see ``messages``
for how both ends use them (``schema.check`` reads them at run time). ``NotRequired`` marks what an
older agent may leave out, or the host may omit. Stdlib only: the guest image carries it.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from forkd.guest.schema import Seconds


class TerminalSize(TypedDict):
    cols: int  # 1..protocol.PTY_MAX_SIZE
    rows: int


class ProcStartRequest(TypedDict):
    """A process. With ``pty`` it runs on a pseudo-terminal of that size, its controlling terminal
    (stdin, stdout and stderr; its output is the stream's "stdout", its input proc_input); its
    ProcessInfo then has "pty", and proc_resize sets the size (the process gets SIGWINCH). Older
    agents ignore "pty" and answer proc_resize "unknown action": the host asks for
    protocol.PTY_AGENT_VERSION first."""

    args: list[str]
    stdin: NotRequired[bool]  # keep its stdin open
    env: NotRequired[dict[str, str]]
    cwd: NotRequired[str]
    input: NotRequired[str]  # base64, written to stdin first
    tag: NotRequired[str]
    timeout_secs: NotRequired[Seconds]
    user: NotRequired[str]  # CAP_USER
    pty: NotRequired[TerminalSize]  # CAP_PTY
    stream: NotRequired[bool]  # answer with a process stream instead of its ProcessInfo


class ProcessInfo(TypedDict):
    """A process, running or recently exited (proc_start's, proc_info's and proc_list's answer)."""

    pid: int
    args: list[str]
    tag: NotRequired[str | None]
    env: NotRequired[dict[str, str]]
    cwd: NotRequired[str | None]
    user: NotRequired[str | None]
    running: NotRequired[bool]
    exit_code: NotRequired[int | None]
    signal: NotRequired[int | None]
    timed_out: NotRequired[bool]
    stdin_open: NotRequired[bool]
    pty: NotRequired[TerminalSize | None]
    started_at: NotRequired[float | None]
    ended_at: NotRequired[float | None]


class ProcExit(TypedDict):
    """The reply that ends a process stream (proc_start with stream, proc_attach)."""

    type: Literal["exit"]
    pid: NotRequired[int]
    exit_code: NotRequired[int | None]
    signal: NotRequired[int | None]
    timed_out: NotRequired[bool]
    error: NotRequired[str | None]


class ProcAttachRequest(TypedDict):
    pid: int
    from_start: NotRequired[bool]


class ProcStreamNotice(TypedDict):
    """proc_detach (a notification): stop sending this stream (the id of its request)."""

    stream: int


class ProcAckNotice(TypedDict):
    """proc_ack (a notification): the host has consumed this many more bytes of the stream."""

    stream: int
    bytes: int


class ProcListReply(TypedDict):
    processes: list[ProcessInfo]


class ProcInfoRequest(TypedDict):
    pid: int


class ProcInputRequest(TypedDict):
    pid: int
    data: NotRequired[str]  # base64
    eof: NotRequired[bool]


class ProcInputReply(TypedDict):
    written: int


class ProcSignalRequest(TypedDict):
    pid: int
    signal: int
    group: NotRequired[bool]
    wait_ms: NotRequired[int]  # answer once it has ended (or this long passed)


class ProcSignalReply(TypedDict):
    signalled: bool
    ended: NotRequired[bool]


class ProcResizeRequest(TypedDict):
    pid: int
    cols: int
    rows: int


class ProcResizeReply(TypedDict):
    resized: bool
