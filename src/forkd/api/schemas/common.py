"""What the request and response models of the REST API v1 share: the patterns and bounds
of names, paths and ids (one definition each, ``forkd.bounds``), the strict request base and
the lenient response base, and the egress policy both sides speak."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)
from pydantic_core import PydanticCustomError

from forkd import bounds
from forkd.errors import InvalidRequest
from forkd.host.egress import (
    ENTRY_PATTERN,
    HEADER_NAME_PATTERN,
    MASK_HOST_PATTERN,
    MAX_HEADER_VALUE_CHARS,
    MAX_RULE_HEADERS,
    MAX_RULE_HOSTS,
    MAX_RULES_PER_HOST,
    RULE_HOST_PATTERN,
    parse_entry,
)

# One definition of each name and bound (forkd.bounds), shared with the runtime's checks.
TAG_PATTERN = bounds.TAG_RE.pattern
# A Dockerfile ARG's name (controller/dockerfile.py's rule).
VAR_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
DIGEST_PATTERN = r"^[0-9a-f]{64}$"  # a sha256 in hex: a build context (controller/build_contexts.py)
TREE_ID_PATTERN = r"^ft-[0-9a-f]{12}$"  # controller/forks.py: f"ft-{secrets.token_hex(6)}"
SANDBOX_ID_PATTERN = bounds.SANDBOX_ID_RE.pattern
TAP_PATTERN = bounds.TAP_RE.pattern
MODULE_PATTERN = bounds.MODULE_RE.pattern
# execve() cannot carry NUL bytes. Saying so in the schema (rather than in a
# validator) keeps the OpenAPI document honest about what is accepted.
NO_NUL_PATTERN = r"^[^\x00]*$"
NON_EMPTY_NO_NUL_PATTERN = r"^[^\x00]+$"
ENV_NAME_PATTERN = r"^[^=\x00]+$"
GUEST_PATH_PATTERN = r"^/[^\x00]*$"  # absolute, no NUL (forkd.guest.protocol.check_path)

Tag = Annotated[str, StringConstraints(pattern=TAG_PATTERN)]
SandboxId = Annotated[str, StringConstraints(pattern=SANDBOX_ID_PATTERN)]
BranchMode = Literal["full", "diff", "live"]
CString = Annotated[str, StringConstraints(pattern=NO_NUL_PATTERN)]
NonEmptyCString = Annotated[str, StringConstraints(pattern=NON_EMPTY_NO_NUL_PATTERN)]
# A path on the daemon's host: absolute, no NUL, at most PATH_MAX.
HostPath = Annotated[str, StringConstraints(pattern=GUEST_PATH_PATTERN, max_length=4096)]
EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME_PATTERN)]
# Who runs a command or a file operation in the guest: one definition for every body that takes
# it (exec, processes, mkdir) and the file routes' ``user`` query parameter.
GUEST_USER_PATTERN = bounds.GUEST_USER_RE.pattern
GUEST_USER_HELP = (
    "The guest user to act as, by name from the guest's /etc/passwd (every image has \"user\", "
    "uid 1000, home /home/user): its uid, gid and groups, HOME/USER/LOGNAME, its home as the default "
    "working directory, and files it writes are its own. Omitted: root, in the agent's own "
    "environment (working directory /root), as before. A name the guest does not know is a 400."
)
GuestUserName = Annotated[str, StringConstraints(pattern=GUEST_USER_PATTERN)]
RunAs = Annotated[GuestUserName | None, Field(None, description=GUEST_USER_HELP, examples=["user"])]


def _integral_float_to_int(value: Any) -> Any:
    # JSON has one number type and JSON Schema's "integer" admits 31.0; some
    # clients (JavaScript) cannot tell 31 from 31.0. Accept integral floats,
    # still reject 2.5, "5" and booleans.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JSONInt = Annotated[int, BeforeValidator(_integral_float_to_int)]
# pydantic renders key constraints as patternProperties, which leaves
# non-matching names unconstrained; propertyNames states the real rule.
EnvMap = Annotated[
    dict[Annotated[str, StringConstraints(pattern=ENV_NAME_PATTERN, max_length=bounds.ENV.max_key)],
         Annotated[str, StringConstraints(pattern=NO_NUL_PATTERN, max_length=bounds.ENV.max_value)]],
    Field(max_length=bounds.ENV.max_entries, json_schema_extra={
        "propertyNames": {"pattern": ENV_NAME_PATTERN, "maxLength": bounds.ENV.max_key}}),
]
BuildArgs = Annotated[
    dict[Annotated[str, StringConstraints(pattern=VAR_NAME_PATTERN)],
         Annotated[str, StringConstraints(pattern=NO_NUL_PATTERN, max_length=bounds.ENV.max_value)]],
    Field(max_length=bounds.MAX_BUILD_ARGS,
          json_schema_extra={"propertyNames": {"pattern": VAR_NAME_PATTERN}}),
]
Labels = Annotated[
    dict[Annotated[str, StringConstraints(min_length=1, max_length=bounds.METADATA.max_key)],
         Annotated[str, StringConstraints(max_length=bounds.METADATA.max_value)]],
    Field(max_length=bounds.METADATA.max_entries),
]
# Bounds before the BeforeValidator: the other way round pydantic renders
# them as unknown keywords ("ge") instead of minimum/maximum.
VolumeSizeMib = Annotated[
    int, Field(**bounds.VOLUME_SIZE_MIB.field_kwargs()), BeforeValidator(_integral_float_to_int)
]
MemoryLimitMib = Annotated[
    int, Field(**bounds.MEMORY_LIMIT_MIB.field_kwargs()), BeforeValidator(_integral_float_to_int)
]
SandboxTimeout = Annotated[float, Field(**bounds.SANDBOX_TIMEOUT_SECS.field_kwargs())]
IdlePause = Annotated[float, Field(**bounds.IDLE_PAUSE_SECS.field_kwargs())]
IdleHibernate = Annotated[float, Field(**bounds.IDLE_HIBERNATE_SECS.field_kwargs())]
CpuLimit = Annotated[float, Field(**bounds.CPU_LIMIT.field_kwargs())]
PidsLimit = Annotated[int, Field(**bounds.PIDS_LIMIT.field_kwargs()), BeforeValidator(_integral_float_to_int)]
DiskQuotaMib = Annotated[
    int, Field(**bounds.DISK_QUOTA_MIB.field_kwargs()), BeforeValidator(_integral_float_to_int)
]


def _first_bad_text(value: Any, where: str) -> tuple[str, str] | None:
    """The first string in a request (keys too, however nested) that is not UTF-8 text, and why."""
    if isinstance(value, str):
        problem = bounds.text_problem(value, nul=False)
        return (where, problem) if problem else None
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{where}.{key}" if where else str(key)
            found = _first_bad_text(key, f"{here} (its name)") or _first_bad_text(item, here)
            if found:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _first_bad_text(item, f"{where}[{index}]")
            if found:
                return found
    return None


class RequestModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _utf8_text(cls, data: Any) -> Any:
        # Every string of a request may reach the guest (args, env, stdin, paths, metadata): one
        # check for them all, before any field's. NUL is refused per field (the C-string patterns):
        # stdin may carry it.
        found = _first_bad_text(data, "")
        if found is not None:
            where, problem = found
            # repr() of the field name: a surrogate in a key would not survive the JSON answer.
            raise PydanticCustomError("not_utf8", "field {where} {problem}",
                                      {"where": ascii(where)[1:-1], "problem": problem})
        return data


class ResponseModel(BaseModel):
    model_config = ConfigDict(extra="allow")


def _egress_entry(value: str) -> str:
    """The entry's own 400 message (bad names, IPv6, ports) rather than a bare pattern mismatch."""
    try:
        parse_entry(value, "entry")
    except InvalidRequest as exc:
        raise ValueError(str(exc)) from None
    return value


# The pattern is documented, not enforced by pydantic: _egress_entry says what is wrong.
EgressEntry = Annotated[str, StringConstraints(min_length=1, max_length=bounds.MAX_EGRESS_ENTRY_CHARS),
                        AfterValidator(_egress_entry), Field(json_schema_extra={"pattern": ENTRY_PATTERN})]
EGRESS_ENTRY_HELP = ("an IPv4 address or CIDR, or a DNS name (`*.` for every name below one), "
                     "optionally with :PORT or :FIRST-LAST (TCP and UDP), e.g. \"10.0.0.0/8\", "
                     "\"192.0.2.7:443\", \"198.51.100.0/24:8000-8100\", \"pypi.org\", "
                     "\"*.pythonhosted.org:443\"")


HeaderName = Annotated[str, StringConstraints(pattern=HEADER_NAME_PATTERN)]
HeaderValue = Annotated[str, StringConstraints(max_length=MAX_HEADER_VALUE_CHARS, pattern=r"^[^\r\n\x00]*$")]
def _rule_host(value: str) -> str:
    if not re.fullmatch(RULE_HOST_PATTERN, value):
        raise ValueError(f"a rule's host is a DNS name or *.name without a port, not {value[:64]!r}")
    return value


# As EgressEntry: the pattern (with a look-ahead pydantic's regex lacks) documented, checked here.
RuleHost = Annotated[str, StringConstraints(min_length=1, max_length=bounds.MAX_EGRESS_ENTRY_CHARS),
                     AfterValidator(_rule_host), Field(json_schema_extra={"pattern": RULE_HOST_PATTERN})]
# A dict whose keys have a pattern is drawn with patternProperties: closed to other keys, as validated.
_ONLY_PATTERNED_KEYS: dict[str, Any] = {"additionalProperties": False}


class NetworkTransform(RequestModel):
    headers: dict[HeaderName, HeaderValue] = Field(
        default_factory=dict, max_length=MAX_RULE_HEADERS, json_schema_extra=_ONLY_PATTERNED_KEYS,
        description="Headers set on every HTTPS request to the rule's host (replacing the guest's of the "
        "same name). `${secrets.NAME}` in a value is the secret's value, put in at egress: the sandbox "
        "never holds it.",
    )


class NetworkRule(RequestModel):
    transform: NetworkTransform | None = Field(None, description="What is done to the host's requests.")


class NetworkPolicy(RequestModel):
    """Fine-grained egress (E2B's ``network``): allow-list and deny-list of destinations."""

    allow_out: list[EgressEntry] = Field(
        default_factory=list, max_length=bounds.MAX_EGRESS_ENTRIES,
        description=f"Destinations always open (allow wins over deny); each {EGRESS_ENTRY_HELP}. "
        "Opens private ranges and the host too (the host is the sandboxes' gateway, e.g. 10.201.0.1).",
    )
    deny_out: list[EgressEntry] = Field(
        default_factory=list, max_length=bounds.MAX_EGRESS_ENTRIES,
        description=f"Destinations closed even with allow_internet_access; each {EGRESS_ENTRY_HELP}.",
    )
    allow_public_traffic: bool = Field(
        False, description="Whether anyone who reaches the daemon may reach the sandbox's ports through its "
        "port proxy (`{port}-{sandbox id}.<domain>` as the Host; docs/API.md). Off: a request needs "
        "the daemon's bearer token or the sandbox's traffic token (`E2B-Traffic-Access-Token`).",
    )
    mask_request_host: str | None = Field(
        None, max_length=260, pattern=MASK_HOST_PATTERN,
        description="The Host header the sandbox's ports get from the port proxy instead of the client's; "
        "`${PORT}` stands for the port, e.g. `localhost:${PORT}`.",
    )
    rules: dict[RuleHost, Annotated[list[NetworkRule], Field(max_length=MAX_RULES_PER_HOST)]] = Field(
        default_factory=dict, max_length=MAX_RULE_HOSTS, json_schema_extra=_ONLY_PATTERNED_KEYS,
        description="Header transforms (E2B's `rules`), by host: a DNS name or `*.name` that is also in "
        "allow_out. HTTPS to such a host is intercepted with the sandbox's own CA (which its guest is "
        "given to trust) so that its requests get the headers and `${secrets.NAME}` placeholders are "
        "resolved; every other connection passes untouched. E.g. "
        '`{"api.example.com": [{"transform": {"headers": {"Authorization": "Bearer ${secrets.TOKEN}"}}}]}`.',
    )


INTERNET_HELP = ("Open outbound traffic to the public internet (denied by default): every destination "
                 "but private, link-local, loopback and multicast ranges, the host and other sandboxes. "
                 "Needs a snapshot with a NIC, and net.ipv4.ip_forward=1 on the host.")
NETWORK_HELP = "Finer egress: allow_out / deny_out lists of destinations. Needs a snapshot with a NIC."
