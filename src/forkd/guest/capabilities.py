"""What a guest agent can do beyond the base protocol, and which version brought it.

An agent lists its capabilities in ping's (and restored's) answer; the host refuses a request that
needs one the agent lacks, in one place (``forkd.guest.client.require``), rather than have an old
agent ignore a field it does not know. A new capability is one ``CAP_`` name and one entry of
``CAPABILITIES`` here (its version constant stays in guest/protocol.py beside its feature), and a
new ``RestoreInputs`` field that older agents would ignore is one entry of ``RESTORE_INPUTS``.

Installed into the guest beside the protocol, so stdlib only (``MIN_GUEST_PYTHON``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from forkd.guest.protocol import (
    FREEZE_MOUNTS_AGENT_VERSION,
    HOSTNAME_AGENT_VERSION,
    LANGUAGE_AGENT_VERSION,
    METADATA_AGENT_VERSION,
    PTY_AGENT_VERSION,
    RUNTIME_AGENT_VERSION,
    SHARED_VOLUMES_AGENT_VERSION,
    TRUST_AGENT_VERSION,
    USER_AGENT_VERSION,
    WATCH_AGENT_VERSION,
    WATCH_ENTRY_AGENT_VERSION,
    RestoreInputs,
    agent_version_of,
)

# The agent's version (what ping and restored report): bumped when the protocol grows, here beside
# the capabilities so that a new one and its version are one edit. History: "2" eval's timeout_secs,
# "3" file actions, "4" streamed exec, processes, eval_cancel, notifications, "5" file_move, code
# contexts, "6" IPython kernels, "7" a request's user, "8" watchers, "9" terminals, "10" file
# metadata, watch entries, "11" bash/JavaScript kernels, "12" a hostname at restore (and restored's
# version), "13" capabilities listed, "14" fsfreeze's mounts, "15" runs on forkd's runtime where an
# image has no Python, lists "python" (older agents had it unlisted) and serves pid1_defaults,
# "16" a certificate to trust at restore, "17" shared volumes (vol_mount, vol_poll, vol_reply).
# The *_AGENT_VERSION constants above name where each came in.
AGENT_VERSION = "17"


# What an agent can do beyond the base protocol, by name. An agent lists its own in ping's (and
# restored's) answer, "capabilities"; the host refuses a request that needs one the agent lacks, in
# one place (forkd.guest.client.require), rather than have an old agent ignore a field it does not know.
CAP_USER = "user"  # a request's "user" (exec, proc_start, the file actions)
CAP_WATCH = "watch"  # the watch action
CAP_PTY = "pty"  # proc_start's "pty", proc_resize
CAP_METADATA = "metadata"  # file metadata (file_write_open's, a FileInfo's)
CAP_WATCH_ENTRIES = "watch_entries"  # a watcher's "entries"
CAP_KERNEL_LANGUAGE = "kernel_language"  # a context's and a kernel run's "language"
CAP_RESTORE_HOSTNAME = "restore_hostname"  # a RestoreInputs' hostname
CAP_FREEZE_MOUNTS = "freeze_mounts"  # fsfreeze's "mounts"
CAP_PYTHON = "python"  # eval and Python contexts: the image's own Python (none on forkd's runtime)
CAP_PID1_DEFAULTS = "pid1_defaults"  # the pid1_defaults action
CAP_RESTORE_TRUST = "restore_trust"  # a RestoreInputs' trust
CAP_SHARED_VOLUMES = "shared_volumes"  # vol_mount, vol_poll, vol_reply (guest/volume_messages.py)


@dataclass(frozen=True)
class Capability:
    """One capability: the agent version that brought it (agents older than "capabilities" report
    only their agent_version, and the agent derives its own list from its version), and what it
    lets a request do, as the host's refusal names it."""

    since: int
    feature: str
    # Why an agent of a version that has it may still lack it, where that is the image's doing
    # rather than its age: the host's refusal then says this (a 400), not "create it again".
    lacking: str | None = None
    # The version from which agents list it: older ones that list capabilities had it unlisted.
    listed_since: int = 0


# A new capability is one entry here (and its CAP_ name): the agent lists it, the host refuses without it.
CAPABILITIES: dict[str, Capability] = {
    CAP_USER: Capability(USER_AGENT_VERSION, "acting as a user"),
    CAP_WATCH: Capability(WATCH_AGENT_VERSION, "directory watching"),
    CAP_PTY: Capability(PTY_AGENT_VERSION, "terminals (pty)"),
    CAP_METADATA: Capability(METADATA_AGENT_VERSION, "file metadata"),
    CAP_WATCH_ENTRIES: Capability(WATCH_ENTRY_AGENT_VERSION, "watch events with their entry"),
    CAP_KERNEL_LANGUAGE: Capability(LANGUAGE_AGENT_VERSION, "bash, JavaScript and R kernels"),
    CAP_RESTORE_HOSTNAME: Capability(HOSTNAME_AGENT_VERSION, "a hostname at restore"),
    CAP_FREEZE_MOUNTS: Capability(FREEZE_MOUNTS_AGENT_VERSION, "freezing volumes for a live branch"),
    CAP_PID1_DEFAULTS: Capability(RUNTIME_AGENT_VERSION, "PID 1's defaults without eval"),
    CAP_RESTORE_TRUST: Capability(TRUST_AGENT_VERSION, "trusting the sandbox's egress CA (header rules)"),
    CAP_SHARED_VOLUMES: Capability(SHARED_VOLUMES_AGENT_VERSION, "shared volumes (fork: shared)"),
    CAP_PYTHON: Capability(1, "Python code", listed_since=RUNTIME_AGENT_VERSION, lacking=(
        "its image has no Python of its own (its agent runs on forkd's runtime): use exec, or build "
        "the template from an image with python3 3.11 or newer")),
}
CAPABILITIES_MAX = 256  # names read from one answer; more is a hostile agent's


def capabilities_since(agent_version: int, lacking: Collection[str] = ()) -> list[str]:
    """The capabilities of an agent of ``agent_version``, sorted, but for those its image
    ``lacking`` (only ones with ``Capability.lacking``)."""
    return sorted(name for name, cap in CAPABILITIES.items()
                  if agent_version >= cap.since and not (name in lacking and cap.lacking))


@dataclass(frozen=True)
class Capabilities:
    """What an agent says it can do (ping's or restored's answer), read defensively: the guest is
    not trusted, so anything malformed counts as nothing."""

    agent_version: int
    names: frozenset[str]

    @classmethod
    def of(cls, reply: Mapping[str, object]) -> Capabilities:
        """From an answer; one without a list of names (an agent older than "capabilities") is
        mapped from its agent_version."""
        version = agent_version_of(reply)
        listed = reply.get("capabilities")
        if isinstance(listed, list) and len(listed) <= CAPABILITIES_MAX:
            unlisted = {name for name, cap in CAPABILITIES.items() if cap.since <= version < cap.listed_since}
            return cls(version, frozenset(name for name in listed if isinstance(name, str)) | unlisted)
        return cls(version, frozenset(capabilities_since(version)))

    def lacks(self, *names: str) -> list[str]:
        """Those of ``names`` this agent cannot do."""
        return [name for name in names if name not in self.names]


# The capability an agent needs to apply a RestoreInputs field (others ignore it): refused on one
# without it.
RESTORE_INPUTS: dict[str, str] = {"hostname": CAP_RESTORE_HOSTNAME, "trust": CAP_RESTORE_TRUST}


def needed_by(inputs: RestoreInputs) -> list[str]:
    """The capabilities the fields ``inputs`` sets need (an agent without one would ignore its field)."""
    given = inputs.to_wire()
    return [cap for name, cap in RESTORE_INPUTS.items() if name in given]
