"""A volume attached to a snapshot: what a request asks for, and what ``snapshot.json`` records.

Each attached volume is a virtio-blk disk of its own, after the root disk, in the order given:
volume ``i`` is ``disk.vol<i>.qcow2`` in the snapshot's directory (a layer over the named
volume's disk, or the image made of a host directory), and the guest finds it by its serial
``forkd-vol<i>``. The device list is part of the snapshot's device configuration, so every
child of the snapshot gets the same list back.

``fork`` says what a child of the snapshot sees: ``copy`` (an ext4 volume's, and a host_path's),
its own copy-on-write layer over the volume as it was at the snapshot; ``shared`` (a hostdir
volume's), the one set of files every sandbox that mounts it reads and writes at once, served by
the daemon through FUSE (guest/volume_messages.py). A shared entry has no disk: its index is its
slot in the guest, and the disk indices skip it. ``read_only`` ext4 volumes are opened read-only
by the template and every child (one file, shared); a read-only hostdir volume is served read-only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from forkd import bounds
from forkd.errors import InvalidRequest

FORK_MODES = ("copy", "shared")
NAME_RE = bounds.TAG_RE  # a volume's name is a directory under <data>/volumes
MOUNT_RE = re.compile(r"^(/[A-Za-z0-9._+@-]{1,128}){1,16}$")
# Where a volume may not be mounted: over the guest's own system (its agent runs from there).
RESERVED_MOUNTS = ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/run", "/sbin",
                   "/sys", "/usr", "/var", "/tmp", "/home", "/home/user", "/root", "/opt/forkd")
MAX_HOST_PATH = 4096


def serial(index: int) -> str:
    """The virtio-blk serial of volume ``index``: how the guest tells its disks apart."""
    return f"forkd-vol{index}"


def check_mount(mount: object, what: str = "mount") -> str:
    if not isinstance(mount, str) or not MOUNT_RE.match(mount) \
            or any(part in (".", "..") for part in mount.split("/")):
        raise InvalidRequest(f"{what} must be an absolute guest path without '.' or '..' "
                             f"segments (letters, digits, '._+@-'), not {mount!r}")
    clean = mount.rstrip("/")
    if clean in RESERVED_MOUNTS or clean.startswith(("/proc/", "/sys/", "/dev/")):
        raise InvalidRequest(f"{what} {mount!r} would cover the guest's own files: choose another "
                             "directory (e.g. /mnt/data)")
    return clean


@dataclass(frozen=True)
class VolumeMount:
    """One volume to attach: a named volume (``name``) or a host directory copied into a new
    volume of ``size_mib`` (``host_path``), mounted at ``mount``."""

    mount: str
    name: str | None = None
    host_path: str | None = None
    read_only: bool = False
    fork: str | None = None  # None: by the volume's kind (Volumes.resolve): copy, or shared for hostdir
    size_mib: int | None = None  # host_path only: the new volume's size (its quota)

    def check(self) -> VolumeMount:
        """400 naming the first field out of bounds. Called where the volume is used (the template
        builder, snapshot.json's schema), not as the request is parsed: the API's schema cannot say
        all of it (exactly one source, the reserved mount paths)."""
        if (self.name is None) == (self.host_path is None):
            raise InvalidRequest("a volume names exactly one of name (a volume of /v1/volumes) and "
                                 "host_path (a host directory copied into a new volume)")
        if self.name is not None and (not isinstance(self.name, str) or not NAME_RE.match(self.name)):
            raise InvalidRequest(f"volume name {self.name!r} must match {NAME_RE.pattern}")
        if self.host_path is not None and (not isinstance(self.host_path, str)
                                           or not self.host_path.startswith("/")
                                           or len(self.host_path) > MAX_HOST_PATH
                                           or "\x00" in self.host_path):
            raise InvalidRequest(f"host_path must be an absolute host path, not {self.host_path!r}")
        check_mount(self.mount)
        if self.fork is not None and self.fork not in FORK_MODES:
            raise InvalidRequest(f"fork must be one of {', '.join(FORK_MODES)}, not {self.fork!r}")
        if self.fork == "shared" and self.host_path is not None:
            raise InvalidRequest('fork "shared" takes a named hostdir volume (POST /v1/volumes with fs '
                                 '"hostdir"); a host_path is copied into the snapshot')
        if self.size_mib is not None:
            if self.name is not None:
                raise InvalidRequest("size_mib is for a host_path volume; a named volume has its own size")
            bounds.VOLUME_SIZE_MIB.check(self.size_mib)
        return self

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mount": self.mount, "read_only": self.read_only, "fork": self.fork or "copy"}
        for key in ("name", "host_path", "size_mib"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


def check_meta_entry(v: Any, what: str) -> dict[str, Any]:
    """One entry of ``snapshot.json``'s ``volumes``: the attach request, and the disk's size."""
    if not isinstance(v, dict):
        raise InvalidRequest(f"{what} must be an object")
    size = v.get("size_bytes")
    if isinstance(size, bool) or not isinstance(size, int) \
            or not bounds.VOLUME_SIZE_MIB.low * (1 << 20) <= size <= bounds.VOLUME_SIZE_MIB.high * (1 << 20):
        raise InvalidRequest(f"{what}.size_bytes must be a volume size in bytes")
    try:
        mount = VolumeMount(mount=v.get("mount"), name=v.get("name"),  # type: ignore[arg-type]
                            host_path=v.get("host_path"), read_only=v.get("read_only") is True,
                            fork=v.get("fork", "copy")).check()
    except InvalidRequest as exc:
        raise InvalidRequest(f"{what}: {exc}") from None
    return {**mount.to_wire(), "size_bytes": size}


def is_shared(entry: dict[str, Any]) -> bool:
    """Whether a recorded volume is a shared one (files served by the daemon, no disk)."""
    return entry.get("fork") == "shared"


def disk_indices(entries: Any) -> list[int]:
    """The indices of the entries that are disks (virtio-blk, disk.vol<i>.qcow2)."""
    return [i for i, e in enumerate(entries) if not is_shared(e)]


__all__ = ["FORK_MODES", "VolumeMount", "check_meta_entry", "check_mount", "disk_indices", "is_shared",
           "serial"]
