"""The agent's fsfreeze of the root filesystem and of the mounts a live branch names (its writable
volumes): every one is frozen, a refusal leaves nothing held, and a thaw (the source's after the
cut, a restored child's) releases them all, in reverse order. The ioctls are recorded, not made:
FIFREEZE needs root and a real filesystem, which the VM test (test_volumes.py) has."""

from __future__ import annotations

import errno

import pytest

from forkd.guest import capabilities, protocol
from forkd.guest.agent.freeze import (
    FIFREEZE,
    FITHAW,
    FREEZE_MOUNTS_MAX,
    MOUNT_PATH_MAX,
    RootFreezer,
    check_freeze_mounts,
)


class RecordingFreezer(RootFreezer):
    def __init__(self, refuse: str | None = None) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []
        self.refuse = refuse

    def _ioctl(self, path: str, request: int) -> None:  # type: ignore[override]
        if request == FIFREEZE and path == self.refuse:
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")
        self.calls.append(("freeze" if request == FIFREEZE else "thaw" if request == FITHAW else "?", path))


def test_the_root_and_the_named_mounts_are_frozen_and_thawed_in_reverse() -> None:
    fs = RecordingFreezer()
    assert fs.freeze(["/mnt/data", "/srv/v"]) is True
    assert fs.freeze(["/other"]) is True  # already frozen: nothing more is done
    assert fs.thaw() is True and fs.thaw() is False
    assert fs.calls == [("freeze", "/"), ("freeze", "/mnt/data"), ("freeze", "/srv/v"),
                        ("thaw", "/srv/v"), ("thaw", "/mnt/data"), ("thaw", "/")]


def test_a_mount_that_cannot_be_frozen_leaves_nothing_frozen() -> None:
    fs = RecordingFreezer(refuse="/srv/v")
    with pytest.raises(protocol.RequestError, match="cannot freeze the filesystem at /srv/v"):
        fs.freeze(["/mnt/data", "/srv/v"])
    assert fs.calls == [("freeze", "/"), ("freeze", "/mnt/data"), ("thaw", "/mnt/data"), ("thaw", "/")]
    assert fs.frozen == [] and fs.thaw() is False


@pytest.mark.parametrize(("mounts", "message"), [
    ("/mnt/data", "must be a list"),
    (["relative/path"], "not an absolute path"),
    (["/a\0b"], "not an absolute path"),
    (["/" + "a" * MOUNT_PATH_MAX], "not an absolute path"),
    ([f"/m{i}" for i in range(FREEZE_MOUNTS_MAX + 1)], "at most"),
])
def test_hostile_mounts_are_refused(mounts: object, message: str) -> None:
    with pytest.raises(protocol.RequestError, match=message) as refused:
        check_freeze_mounts(mounts)
    assert refused.value.kind == protocol.INVALID


def test_a_live_cut_of_volumes_needs_an_agent_that_freezes_them() -> None:
    old = capabilities.Capabilities.of({"pong": True, "agent_version": "13"})
    assert old.lacks(capabilities.CAP_FREEZE_MOUNTS) == [capabilities.CAP_FREEZE_MOUNTS]
    new = capabilities.Capabilities.of({"pong": True, "agent_version": capabilities.AGENT_VERSION})
    assert new.lacks(capabilities.CAP_FREEZE_MOUNTS) == []
