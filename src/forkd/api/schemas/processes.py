"""Request bodies of the process routes: start, stream, stdin and signal (REST API v1).

Strict and closed to unknown fields, as every request model (``RequestModel``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from forkd import bounds
from forkd.api.schemas.common import (
    ENV_NAME_PATTERN,
    CString,
    EnvName,
    NonEmptyCString,
    RequestModel,
    RunAs,
)
from forkd.guest.protocol import TAG_MAX

OutputEncoding = Literal["text", "base64"]
ProcessArgs = Annotated[list[CString], Field(min_length=1, description="argv of the process.",
                                             examples=[["python3", "-u", "train.py"]])]
ProcessEnv = Annotated[dict[EnvName, CString] | None, Field(
    None, description="Extra environment variables.",
    json_schema_extra={"propertyNames": {"pattern": ENV_NAME_PATTERN}})]
ProcessTag = Annotated[str | None, Field(None, max_length=TAG_MAX,
                                         description="Any label of yours, shown in the process list.")]


class ProcessStartRequest(RequestModel):
    args: ProcessArgs
    timeout_secs: float | None = Field(
        None, **bounds.EXEC_TIMEOUT_SECS.field_kwargs(),
        description="Kill the process group after this long; default: no limit.")
    env: ProcessEnv = None
    cwd: NonEmptyCString | None = Field(None, description="Working directory in the guest.")
    stdin: str | None = Field(None, description="Text written to standard input first.")
    stdin_open: bool = Field(False, description="Keep standard input open after stdin, for "
                             "POST .../processes/{pid}/stdin; else it is closed.")
    tag: ProcessTag = None
    user: RunAs = None


class ExecStreamRequest(ProcessStartRequest):
    """A process started and streamed at once; a client that leaves kills it."""

    encoding: OutputEncoding = Field("text", description="How output events carry the bytes: text "
                                     "(UTF-8, invalid bytes as U+FFFD) or base64 (exact).")


# What base64.b64decode(..., validate=True) accepts.
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


class StdinRequest(RequestModel):
    # Stated in the JSON Schema too: with encoding=base64, data must be base64.
    model_config = ConfigDict(json_schema_extra={"allOf": [{
        "if": {"required": ["encoding"], "properties": {"encoding": {"const": "base64"}}},
        "then": {"properties": {"data": {"pattern": BASE64_PATTERN}}},
    }]})

    data: str = Field("", description="What to write (text, or base64 with encoding=base64).")
    encoding: OutputEncoding = Field("text", description="How data is given: text (UTF-8) or base64.")
    eof: bool = Field(False, description="Close standard input after data.")


# The signals a process may be sent (by name, as E2B's SDK sends them).
SignalName = Literal["SIGHUP", "SIGINT", "SIGQUIT", "SIGKILL", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGTERM",
                     "SIGCONT", "SIGSTOP", "SIGTSTP", "SIGWINCH"]


class SignalRequest(RequestModel):
    signal: SignalName = Field(description="The signal, by name.", examples=["SIGTERM"])
    group: bool = Field(True, description="Signal the process's whole process group (it is a session "
                        "leader); false: the process alone.")
