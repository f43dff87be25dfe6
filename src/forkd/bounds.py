"""Every bound and name pattern of the API, defined once.

The API's request schemas, the controller's own checks (for callers of the
Python API that bypass HTTP) and the host code all read them from here, so the
OpenAPI document, the error messages and the runtime can never disagree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypedDict

from forkd.errors import InvalidRequest


class FieldBounds(TypedDict, total=False):
    """pydantic ``Field`` keyword arguments for a range."""

    gt: float
    ge: float
    le: float


@dataclass(frozen=True)
class Range:
    """An inclusive numeric range (``exclusive_min``: the lower end is excluded)."""

    name: str
    low: float
    high: float
    exclusive_min: bool = False
    integer: bool = False

    def check(self, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                self.integer and not isinstance(value, int)):
            kind = "an integer" if self.integer else "a number"
            raise InvalidRequest(f"{self.name} must be {kind}, not {value!r}")
        below = value <= self.low if self.exclusive_min else value < self.low
        if below or value > self.high:
            lower = f"greater than {self._fmt(self.low)}" if self.exclusive_min else (
                f"between {self._fmt(self.low)}")
            upper = f"at most {self._fmt(self.high)}" if self.exclusive_min else f"and {self._fmt(self.high)}"
            raise InvalidRequest(f"{self.name} must be {lower} {upper} (got {value!r})")

    @staticmethod
    def _fmt(x: float) -> str:
        return str(int(x)) if float(x).is_integer() else str(x)

    def field_kwargs(self) -> FieldBounds:
        """The pydantic ``Field`` constraints for this range."""
        if self.exclusive_min:
            return FieldBounds(gt=self.low, le=self.high)
        return FieldBounds(ge=self.low, le=self.high)


@dataclass(frozen=True)
class StringMap:
    """A map of short strings to strings (labels, environments): how many, how long."""

    name: str
    max_entries: int
    max_key: int
    max_value: int

    def check_map(self, value: dict[str, str]) -> None:
        if len(value) > self.max_entries:
            raise InvalidRequest(
                f"{self.name} may have at most {self.max_entries} entries (got {len(value)})")
        for k, v in value.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise InvalidRequest(f"{self.name} must map strings to strings")
            if not k or len(k) > self.max_key:
                raise InvalidRequest(
                    f"{self.name} keys must be 1 to {self.max_key} characters (got {k[:80]!r})")
            if len(v) > self.max_value:
                raise InvalidRequest(f"{self.name}[{k!r}] is longer than {self.max_value} characters")


# --- snapshots
MEM_MIB = Range("mem_mib", 128, 16384, integer=True)
VCPUS = Range("vcpus", 1, 8, integer=True)
BOOT_WAIT_SECS = Range("boot_wait_secs", 1, 3600)
SETUP_TIMEOUT_SECS = Range("setup_timeout_secs", 0, 86400, exclusive_min=True)
MAX_SETUP_STEPS = 256
MAX_WARM_IMPORTS = 256

# --- templates as code (controller/dockerfile.py, controller/template_build.py)
MAX_DOCKERFILE_BYTES = 256 * 1024
# Instructions in one Dockerfile: each RUN or COPY is a layer (a disk in the chain).
MAX_TEMPLATE_STEPS = 64
MAX_BUILD_ARGS = 64
# A build context (a tar of the files COPY may name): stored on the host, uploaded into the VM.
MAX_BUILD_CONTEXT_BYTES = 512 * 1024 * 1024
MAX_BUILD_CONTEXT_MEMBERS = 100_000
MAX_BUILD_CONTEXTS = 64  # kept on the host at once; the oldest is dropped first
# The tags of a build's cached layers (controller/template_build.py): ``layer-`` and 20 hex digits.
TEMPLATE_LAYER_PREFIX = "layer-"

# --- sandboxes
SPAWN_N = Range("n", 1, 1000, integer=True)
# QEMU alone needs tens of MiB; below this a child is OOM-killed before it answers.
MEMORY_LIMIT_MIB = Range("memory_limit_mib", 64, 1 << 20, integer=True)
# CPU bandwidth per child, in cores (cgroup cpu.max / cpu.cfs_quota_us).
CPU_LIMIT = Range("cpu_limit", 0.01, 64)
# Tasks (QEMU's threads) per child: QEMU needs a dozen or so; below this it cannot start.
PIDS_LIMIT = Range("pids_limit", 32, 1 << 22, integer=True)
EXEC_TIMEOUT_SECS = Range("timeout_secs", 0, 86400, exclusive_min=True)
# A sandbox's lifetime (spawn/fork ``timeout_secs``, POST .../timeout): up to 30 days.
SANDBOX_TIMEOUT_SECS = Range("timeout_secs", 0, 30 * 86400, exclusive_min=True)
# A sandbox idle this long is paused (controller/idle.py); under a second would pause between calls.
IDLE_PAUSE_SECS = Range("idle_pause_secs", 1, 30 * 86400)
IDLE_HIBERNATE_SECS = Range("idle_hibernate_secs", 1, 30 * 86400)
# How far a sandbox's own disk layers may grow on the host, MiB (0: no quota; controller/disk_quota.py).
DISK_QUOTA_MIB = Range("disk_quota_mib", 0, 1 << 22, integer=True)
# The quota of a spawn that gives none (the daemon's --disk-quota-mib).
DEFAULT_DISK_QUOTA_MIB = 1024
# A volume's size (its quota on the host: the qcow2's virtual size), in MiB.
VOLUME_SIZE_MIB = Range("size_mib", 16, 1 << 20, integer=True)
DEFAULT_VOLUME_SIZE_MIB = 1024
# Volumes one snapshot attaches: microvm has eight virtio-mmio slots, and the root disk, the
# RNG, the serial ports and a NIC take four.
MAX_VOLUMES = 4
# The default limit on one eval; the agent enforces it (guest/protocol.EVAL_DEFAULT_TIMEOUT_SECS).
EVAL_TIMEOUT_SECS = 60.0
# What a caller may ask for instead (an eval's timeout_secs).
EVAL_TIMEOUT = Range("timeout_secs", 0, 86400, exclusive_min=True)
METADATA = StringMap("metadata", 64, 128, 1024)
# Labels a fork-tree stamps on its children (controller/forks.py); no request may set them.
FORK_LABELS = ("fork_tree_id", "fork_parent_id", "fork_index")
# Per-child environments travel in the post-restore call: keep that line small.
ENV = StringMap("env", 256, 256, 16384)

# --- network egress: entries of allow_out / deny_out (each becomes one nftables rule per child,
# and a name one set): a DNS name of 253 characters under "*.", with ":65535-65535"
MAX_EGRESS_ENTRIES = 256
MAX_EGRESS_ENTRY_CHARS = 267

# --- warm pools: paused children per snapshot (each holds a QEMU process and its memory)
POOL_SIZE = Range("size", 0, 100, integer=True)

# --- fork of a running sandbox, checkpoints
CHECKPOINT_EVERY = Range("every", 1, 100000, integer=True)
CHECKPOINT_KEEP = Range("keep", 1, 100, integer=True)
# One page of GET /v1/sandboxes (``limit``): each listed sandbox has its disk use measured.
LIST_LIMIT_MAX = 1000

# --- JSON from outside the daemon (request bodies, Connect messages, agent lines): how deep it
# may nest. Parsers recurse once a level: deep enough, json raises RecursionError and protobuf's
# C parser overflows the stack (a segfault). forkd's own documents nest a handful of levels.
MAX_JSON_DEPTH = 64

# --- names
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$")
# Any id the daemon may hand out (its own ``sb-<6 hex>-<4 digits>``, or one with a
# prefix a fleet adds): a safe charset, so an id is never a path traversal, a
# QEMU option separator or a shell word, and short enough that the default
# branch tag ``branch-<id>-<seq>`` still fits TAG_RE's 64 characters. A
# well-formed id that names no sandbox is 404, not 400.
SANDBOX_ID_MAX = 48
SANDBOX_ID_RE = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9_.-]{{0,{SANDBOX_ID_MAX - 1}}}$")
SANDBOX_ID_RULE = (f"ids are 1 to {SANDBOX_ID_MAX} letters, digits, '.', '_' or '-', starting with a "
                   "letter or digit, e.g. sb-67a1b3-0000")
# A fleet host (``forkd daemon --host-id``) puts its id in every sandbox id it makes:
# sb-<host>-<6 hex>-<4 digits> (within SANDBOX_ID_RE); the gateway routes per-sandbox calls by it.
HOST_ID_RE = re.compile(r"^[a-z0-9]{1,16}$")
# E2B's sandbox list: the most a page holds, and its size when the client names none (one host's
# list and the fleet gateway's alike).
E2B_LIST_LIMIT = 100
HOSTED_SANDBOX_ID_RE = re.compile(r"^sb-([a-z0-9]{1,16})-[0-9a-f]{6}-[0-9]{4}$")
# IFNAMSIZ is 16 with the NUL. No commas: the name goes into a QEMU option string.
TAP_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}$")
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
# A guest user to act as (exec, processes, files), looked up in the guest's /etc/passwd: the
# names useradd makes (32 characters, a trailing "$" for machine accounts), so never a path or
# a shell word. A well-formed name the guest does not have is a 400 from the agent.
GUEST_USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,31}\$?$")
GUEST_USER_RULE = "a user name of the guest (its /etc/passwd), e.g. \"user\" or \"root\""


def check_guest_user(user: str | None) -> str | None:
    """``user`` unchanged when it may be a guest user's name (None: the agent's own, root); else 400."""
    if user is not None and (not isinstance(user, str) or not GUEST_USER_RE.match(user)):
        raise InvalidRequest(f"invalid user {str(user)[:64]!r}: {GUEST_USER_RULE}")
    return user


# A lone surrogate (a JSON "\ud800" escape decodes to one) has no UTF-8 form: on its way to the
# guest it was a UnicodeEncodeError, a 500 or 502 (issue 38).
_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def text_problem(value: str, *, nul: bool = True) -> str | None:
    """Why ``value`` cannot reach the guest as text, or None: a lone surrogate (never UTF-8), or
    (``nul``) a NUL, which no C string (argv, environment, path) can carry."""
    found = _SURROGATE_RE.search(value)
    if found is not None:
        return f"contains the lone surrogate U+{ord(found.group()):04X} at {found.start()}: it is not UTF-8"
    if nul and "\0" in value:
        return f"contains NUL at {value.index(chr(0))}: a C string (argv, environment, path) cannot"
    return None


def check_guest_text(field: str, value: str, *, nul: bool = True) -> str:
    """``value`` unchanged when it can reach the guest as text (``text_problem``); else a 400
    naming ``field``."""
    problem = text_problem(value, nul=nul)
    if problem is not None:
        raise InvalidRequest(f"field {field} {problem}")
    return value

# Secrets (controller/secrets.py): a name as ``${secrets.NAME}`` names it, a value's size, labels.
SECRET_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
MAX_SECRET_VALUE_BYTES = 64 * 1024
MAX_SECRET_METADATA = 32
