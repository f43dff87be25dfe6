"""Structured outputs of the MCP tools that the REST API has no single schema for.

The others return the API's response models (:mod:`forkd.api.schemas`) as they are.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from forkd.api.schemas import ProcessInfo, SandboxInfo, SnapshotInfo


class SnapshotList(BaseModel):
    snapshots: list[SnapshotInfo] = Field(description="Every registered snapshot.")


class SandboxList(BaseModel):
    sandboxes: list[SandboxInfo] = Field(description="The sandboxes, each with its id.")


class Deleted(BaseModel):
    deleted: str = Field(description="The snapshot tag or sandbox id that is gone.")


class FileContent(BaseModel):
    path: str
    size: int = Field(description="Size of the file in bytes.")
    encoding: str = Field(description="'utf-8' (content is the text) or 'base64' (content is binary data).")
    content: str = Field(description="The first `returned` bytes of the file.")
    returned: int = Field(description="Bytes in `content` (decoded).")
    truncated: bool = Field(
        description="True if the file is larger than max_bytes and only its start is here.")


class SandboxPatch(BaseModel):
    sandbox_id: str
    against: str = Field(description="What it was compared with: parent, snapshot:TAG or sandbox:ID.")
    patch: str = Field(description="The change as a unified diff (patch -p1 applies it from /); binary "
                       "files are flagged, not shown.")


class ProcessList(BaseModel):
    processes: list[ProcessInfo] = Field(
        description="The running processes forkd started, each with its pid.")


class ProcessOutput(BaseModel):
    """A stretch of a process's output (stdout and stderr kept apart), and how it stands."""

    pid: int = Field(description="The process's pid in the sandbox: what the other process tools take.")
    running: bool = Field(description="False once it has ended (then exit_code says how).")
    stdout: str = Field(description="Its standard output from `offset` on (UTF-8; invalid bytes as U+FFFD).")
    stderr: str = Field(description="Its standard error from `offset` on.")
    offset: int = Field(description="Where this output starts, in bytes of stdout and stderr together.")
    next_offset: int = Field(description="Pass this as `offset` to read_process_output for what comes next.")
    lost_bytes: int = Field(description="Output after `offset` the sandbox no longer kept (it keeps "
                            "the newest 1 MiB of each process), skipped here.")
    more: bool = Field(description="True if max_bytes cut this reply short: more output is already there.")
    exit_code: int | None = Field(None, description="Once ended: its exit status (negative: killed by that "
                                  "signal; 124: its timeout_secs passed).")
    timed_out: bool = Field(False, description="True if it was killed because its timeout_secs passed.")
    error: str | None = Field(None, description="Why it failed, when the sandbox says.")


class CellError(BaseModel):
    name: str = Field(description="The exception's class, e.g. 'ZeroDivisionError'.")
    value: str = Field(description="Its message.")
    traceback: list[str] = Field(description="The traceback, a line each (may carry ANSI colours).")


class CellOutput(BaseModel):
    """What a cell on a Jupyter kernel wrote and returned; its images are the tool result's image blocks."""

    stdout: str = Field(description="What it printed.")
    stderr: str = Field(description="What it wrote to standard error.")
    text: str | None = Field(None, description="The main result's text/plain (the value of a trailing "
                             "expression), if any.")
    results: list[str] = Field(default_factory=list, description="The text/plain of every result, main "
                               "or displayed (a plot's is e.g. '<Figure size 640x480 with 1 Axes>').")
    images: int = Field(0, description="How many PNG images it displayed (each an image block).")
    error: CellError | None = Field(None, description="The exception the cell raised, if it did.")
    execution_count: int | None = Field(None, description="The kernel's execution count for this cell.")
    timed_out: bool = Field(False, description="True if its timeout passed and the kernel was interrupted.")
