"""Request bodies of volumes: making one (``POST /v1/volumes``), exporting it, and attaching one
to a snapshot (``VolumeSpec``, an entry of ``POST /v1/snapshots``' ``volumes``).
Strict and closed to unknown fields, as every request model (``RequestModel``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints

from forkd import bounds
from forkd.api.schemas.common import HostPath, JSONInt, RequestModel, Tag, VolumeSizeMib
from forkd.store.volume_spec import MOUNT_RE


class VolumeSpec(RequestModel):
    """One volume to attach (store/volume_spec.py): exactly one of name and host_path."""

    # What the schema says of it, as the daemon checks it: a source, and only one.
    model_config = ConfigDict(json_schema_extra={"oneOf": [
        {"properties": {"name": {"type": "string"}}, "required": ["name"]},
        {"properties": {"host_path": {"type": "string"}}, "required": ["host_path"]},
    ]})

    name: Tag | None = Field(None, description="A volume of POST /v1/volumes.", examples=["data"])
    host_path: HostPath | None = Field(
        None, description="A directory on the daemon's host, copied into a new volume "
        "kept with the snapshot (the host directory is not written back).")
    mount: Annotated[str, StringConstraints(max_length=2048, pattern=MOUNT_RE.pattern)] = Field(
        description="Where the guest mounts it (an absolute path, e.g. /mnt/data).", examples=["/mnt/data"])
    read_only: bool = Field(False, description="Attached read-only to the template and every child "
                            "(one file, shared); writes fail in the guest.")
    fork: Literal["copy", "shared"] | None = Field(
        None, description="copy (an ext4 volume's, a host_path's): each child (and each branch) gets its "
        "own copy-on-write view of the volume as it was at the snapshot. shared (a hostdir volume's): "
        "every sandbox that mounts it reads and writes the one set of files. Default: the volume's kind "
        "says; the other is 400.")
    size_mib: VolumeSizeMib | None = Field(
        None, description="host_path only: the new volume's size (its quota); "
        f"default {bounds.DEFAULT_VOLUME_SIZE_MIB}.")


class CreateVolumeRequest(RequestModel):
    name: Tag = Field(description="The volume's name, unique on this daemon.", examples=["data"])
    size_mib: JSONInt = Field(bounds.DEFAULT_VOLUME_SIZE_MIB, **bounds.VOLUME_SIZE_MIB.field_kwargs(),
                              description="Its size: the most a guest can write to it, on the host too.")
    fs: Literal["ext4", "hostdir"] = Field(
        "ext4", description="ext4: a disk of its own, attached to a snapshot, which each child copies "
        "(copy-on-write). hostdir: files on the daemon's host, mounted live by running sandboxes at once "
        "(fork shared), at a snapshot or at a spawn.")
    source: HostPath | None = Field(
        None, description="A host directory or tarball (tar, tar.gz, ...) on the daemon's "
        "host to fill it from; archive members that would leave it (absolute, '..', links out, devices) "
        "are refused, and so is more content than fits.")


class ExportVolumeRequest(RequestModel):
    to: HostPath = Field(description="A new directory on the daemon's host to "
                                "copy the volume's files into (its parent must exist).",
                                examples=["/srv/export/data"])
    snapshot: Tag | None = Field(None, description="Copy the volume as this snapshot holds it (what "
                                 "its template or branch source wrote); default: the volume as made.")


__all__ = ["CreateVolumeRequest", "ExportVolumeRequest", "VolumeSpec"]
