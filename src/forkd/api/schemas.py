"""Request and response bodies of the REST API v1 (pydantic v2).

Request models are strict (no "5" for 5, no "true" for true) and forbid
unknown fields, so a typo such as ``{"snapshot-tag": ...}`` is a 400 instead
of a silently ignored option. Response models allow extra fields: the runtime
may report more than the seeds list (e.g. exec timings) and the API should
pass that through rather than drop it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, model_validator

from forkd import bounds
from forkd.config import DEFAULT_IMAGE, DEFAULT_MEM_MIB, DEFAULT_VCPUS

# One definition of each name and bound (forkd.bounds), shared with the runtime's checks.
TAG_PATTERN = bounds.TAG_RE.pattern
SANDBOX_ID_PATTERN = bounds.SANDBOX_ID_RE.pattern
TAP_PATTERN = bounds.TAP_RE.pattern
MODULE_PATTERN = bounds.MODULE_RE.pattern
# execve() cannot carry NUL bytes. Saying so in the schema (rather than in a
# validator) keeps the OpenAPI document honest about what is accepted.
NO_NUL_PATTERN = r"^[^\x00]*$"
NON_EMPTY_NO_NUL_PATTERN = r"^[^\x00]+$"
ENV_NAME_PATTERN = r"^[^=\x00]+$"

Tag = Annotated[str, StringConstraints(pattern=TAG_PATTERN)]
SandboxId = Annotated[str, StringConstraints(pattern=SANDBOX_ID_PATTERN)]
BranchMode = Literal["full", "diff", "live"]
CString = Annotated[str, StringConstraints(pattern=NO_NUL_PATTERN)]
NonEmptyCString = Annotated[str, StringConstraints(pattern=NON_EMPTY_NO_NUL_PATTERN)]
EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME_PATTERN)]


def _integral_float_to_int(value: Any) -> Any:
    # JSON has one number type and JSON Schema's "integer" admits 31.0; some
    # clients (JavaScript) cannot tell 31 from 31.0. Accept integral floats,
    # still reject 2.5, "5" and booleans.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JSONInt = Annotated[int, BeforeValidator(_integral_float_to_int)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow")


# --------------------------------------------------------------------- requests


class CreateSnapshotRequest(_Request):
    tag: Tag = Field(description="Name of the new snapshot.", examples=["py"])
    image: Tag = Field(
        DEFAULT_IMAGE, description="Guest image to boot; build it first with `forkd image build`."
    )
    kernel: NonEmptyCString | None = Field(
        None, description="Host path of an uncompressed ELF vmlinux; default: the image's."
    )
    rootfs: NonEmptyCString | None = Field(
        None, description="Host path of an ext4 root filesystem; default: the image's."
    )
    rw: bool = Field(
        True,
        description="Accepted for compatibility with the seeds and ignored: the root disk is always "
        "attached read-write (children's overlays must be writable and their device config must match).",
    )
    tap: Annotated[str, StringConstraints(pattern=TAP_PATTERN)] | None = Field(
        None, description="Host tap device for the template's network interface."
    )
    boot_wait_secs: float = Field(
        120,
        **bounds.BOOT_WAIT_SECS.field_kwargs(),
        description="Upper bound on waiting for the warm guest agent to answer after boot.",
    )
    mem_mib: JSONInt = Field(
        DEFAULT_MEM_MIB, **bounds.MEM_MIB.field_kwargs(), description="Guest RAM in MiB."
    )
    vcpus: JSONInt = Field(DEFAULT_VCPUS, **bounds.VCPUS.field_kwargs(), description="Guest vCPUs.")
    warm_imports: list[Annotated[str, StringConstraints(pattern=MODULE_PATTERN)]] | None = Field(
        None,
        max_length=bounds.MAX_WARM_IMPORTS,
        description="Python modules PID 1 imports before the snapshot; default: numpy.",
    )
    setup: list[Annotated[list[CString], Field(min_length=1)]] = Field(
        default_factory=list,
        max_length=bounds.MAX_SETUP_STEPS,
        description="argv lists run in the guest, in order, before the snapshot is taken.",
    )
    setup_eval: list[CString] = Field(
        default_factory=list,
        max_length=bounds.MAX_SETUP_STEPS,
        description="Python code run in the warm PID 1 interpreter before the snapshot "
        "(e.g. load a dataset); children inherit the result in memory.",
    )
    setup_timeout_secs: float = Field(
        600, **bounds.SETUP_TIMEOUT_SECS.field_kwargs(),
        description="Timeout of each setup command and each setup_eval step.",
    )


class SpawnRequest(_Request):
    snapshot_tag: Tag = Field(description="Registered snapshot to fork from.", examples=["py"])
    n: JSONInt = Field(1, **bounds.SPAWN_N.field_kwargs(), description="Number of children to fork.")
    per_child_netns: bool = Field(
        False, description="Place child i in the pre-provisioned network namespace forkd-child-<i>."
    )
    # Bounds before the BeforeValidator: the other way round pydantic renders
    # them as unknown keywords ("ge") instead of minimum/maximum.
    memory_limit_mib: (
        Annotated[
            int, Field(**bounds.MEMORY_LIMIT_MIB.field_kwargs()), BeforeValidator(_integral_float_to_int)
        ]
        | None
    ) = Field(None, description="cgroup memory limit per child, in MiB.")
    live_fork: bool = Field(
        False, description="Boot children so that they can later take mode=live branches."
    )


class ExecRequest(_Request):
    args: list[CString] = Field(
        min_length=1,
        description="argv of the subprocess.",
        examples=[["python3", "-c", "print(2+2)"]],
    )
    timeout_secs: float = Field(
        30, **bounds.EXEC_TIMEOUT_SECS.field_kwargs(), description="Kill the subprocess after this."
    )
    env: dict[EnvName, CString] | None = Field(
        None,
        description="Extra environment variables.",
        # pydantic renders key constraints as patternProperties, which leaves
        # non-matching names unconstrained; propertyNames states the real rule.
        json_schema_extra={"propertyNames": {"pattern": ENV_NAME_PATTERN}},
    )
    cwd: NonEmptyCString | None = Field(None, description="Working directory in the guest.")
    stdin: str | None = Field(None, description="Text fed to the subprocess's standard input.")


class EvalRequest(_Request):
    code: str = Field(
        min_length=1,
        description="Python code run in the warm PID 1 interpreter, like the REPL: the value of a "
        "trailing expression is the result.",
        examples=["numpy.zeros(5).sum()"],
    )


class BranchRequest(_Request):
    # The two cross-field rules, also stated in the JSON Schema so that
    # clients and generated tests know them: not both mode and diff, and
    # wait=false only together with mode=live.
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {
                    "not": {
                        "required": ["mode", "diff"],
                        "properties": {"mode": {"type": "string"}, "diff": {"type": "boolean"}},
                    }
                },
                {
                    "if": {"required": ["wait"], "properties": {"wait": {"const": False}}},
                    "then": {"required": ["mode"], "properties": {"mode": {"const": "live"}}},
                },
            ]
        }
    )

    tag: Tag | None = Field(
        None, description="Tag of the new snapshot; default branch-<source-id>-<seq> (seq counts per source)."
    )
    mode: BranchMode | None = Field(None, description="full (default), diff or live.")
    diff: bool | None = Field(
        None, description="Legacy v0.3 spelling of mode=diff; mutually exclusive with mode."
    )
    wait: bool = Field(True, description="mode=live only: false returns as soon as the source resumes.")

    @model_validator(mode="after")
    def _mode_rules(self) -> Self:
        if self.mode is not None and self.diff is not None:
            raise ValueError("'mode' and the legacy 'diff' are mutually exclusive; send only 'mode'")
        if not self.wait and self.effective_mode != "live":
            raise ValueError("'wait': false is only meaningful with 'mode': 'live'")
        return self

    @property
    def effective_mode(self) -> BranchMode:
        if self.mode is not None:
            return self.mode
        return "diff" if self.diff else "full"


# -------------------------------------------------------------------- responses


class SnapshotInfo(_Response):
    tag: str
    dir: str
    created_at_unix: int
    branched_from: str | None = Field(
        None, description="Source sandbox id; present only for snapshots made by BRANCH."
    )
    pause_ms: int | float | None = Field(
        None, description="Measured source pause window in ms; present only for BRANCH snapshots."
    )
    status: Literal["ready", "writing", "failed"] | None = Field(
        None, description="writing while a live no-wait branch copies memory; then ready or failed."
    )
    error: str | None = Field(None, description="Why the snapshot failed (status=failed).")


class SnapshotDetail(SnapshotInfo):
    ancestors: list[str] = Field(
        default_factory=list, description="Snapshot tags this one descends from, nearest first."
    )
    dependents: list[str] = Field(
        default_factory=list,
        description="Snapshot tags descending from this one (all generations), which depend on its files.",
    )
    parent_tag: str | None = Field(None, description="The snapshot this one was branched from, if any.")
    sandboxes: list[str] = Field(default_factory=list, description="Ids of alive sandboxes forked from it.")


class SandboxInfo(_Response):
    id: str = Field(examples=["sb-67a1b3-0000"])
    snapshot_tag: str
    netns: str | None = Field(None, description="Network namespace; null without per_child_netns.")
    guest_addr: str = Field(
        description="How the host reaches the guest agent; here unix:<path> (virtio-serial).",
        examples=["unix:/var/lib/forkd/sandboxes/sb-67a1b3-0000/agent.sock"],
    )
    created_at_unix: int
    pid: int | None = Field(None, description="Host PID of the sandbox's QEMU process.")
    memory_limit_mib: int | None = None
    live_fork: bool | None = None
    timings: dict[str, float] | None = Field(
        None,
        description="Where the fork's time went: seconds from the start of the restore until QEMU was up "
        "(qemu_up_s), the guest ran from the loaded state (restored_s) and its agent answered (ready_s).",
    )


class PingResponse(_Response):
    pong: bool
    numpy_version: str | None = None
    pid: int | None = None


class ExecResponse(_Response):
    stdout: str
    stderr: str
    exit_code: int | None = Field(description="Exit status; null if the process did not exit.")
    error: str | None = None
    timed_out: bool | None = None
    stdout_truncated: bool | None = None
    stderr_truncated: bool | None = None


class EvalResponse(_Response):
    result: str | None
    error: str | None
    exit_code: int


class ErrorBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    error: str = Field(description="Human-readable message.", examples=["snapshot 'py' is not registered"])


class Health(BaseModel):
    ok: bool


class Version(BaseModel):
    version: str = Field(examples=["0.1.0"])
    api: str = Field(examples=["v1"])
