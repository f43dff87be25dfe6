"""Volumes: named ext4 disks (``/v1/volumes``), and the volumes a snapshot attaches.

The one owner of the ``volumes`` table and of ``<data>/volumes/<name>/disk.qcow2``.

A snapshot attaches volumes at its creation (``SnapshotSpec.volumes``): each is a virtio-blk
disk after the root disk, and its layer in the snapshot's directory is ``disk.vol<i>.qcow2``
(store/layout.py ``volume_file``): a qcow2 overlay over the named volume's disk, or an image
made of a host directory. The template mounts it (as root, through ``exec``) before its setup
runs, so the mount lives in the memory every child restores, and the snapshot's layer holds what
the template wrote to it.

From there a volume's layers mirror the root disk's, file for file: a child gets its own
overlay ``disk.vol<i>.qcow2`` beside its ``disk.qcow2`` (``fork: "copy"``: its own
copy-on-write view as of the snapshot); a BRANCH cuts the volume's node as it cuts the root
disk's and copies its frozen layers into the branch beside the root disk's, chained onto the
parent's layer, so grandchildren see what was written before the branch. A read-only volume
is opened read-only from the snapshot's file by every child: nothing is copied.

A named volume's disk is the bottom of every such chain: it is not deleted while a snapshot
attaches it (409, naming them), and never written once attached.

A ``hostdir`` volume is files instead (``<data>/volumes/<name>/files``, one ``HostFiles`` per
volume here, so its quota is counted once for every sandbox): attached ``fork: "shared"``, at a
snapshot or at a spawn, it has no disk and no layer; ``SharedVolumes`` serves it to each sandbox
that mounts it (controller/shared_volumes.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from forkd import bounds
from forkd.config import DataDir
from forkd.controller.results import VolumeExportReport, VolumeReport
from forkd.errors import Conflict, GuestError, InvalidRequest, NotFound
from forkd.guest import capabilities, volume_messages
from forkd.guest.client import AgentClient, require
from forkd.guest.messages import ExecRequest
from forkd.store import layout
from forkd.store.records import SnapshotRecord, VolumeRecord, now_unix
from forkd.store.rows.sandboxes import SandboxReader
from forkd.store.rows.snapshots import SnapshotReader
from forkd.store.rows.volumes import VolumeRows
from forkd.store.volume_spec import VolumeMount, disk_indices, serial
from forkd.vmm import disk as disk_mod
from forkd.vmm import volume_image
from forkd.vmm.cmdline import VolumeDrive
from forkd.vmm.machine import VM
from forkd.vmm.volume_files import HostFiles

ROOT_NODE = "disk0"  # the root disk's block node in a freshly launched QEMU (vmm/cmdline.py)
MOUNT_TIMEOUT_SECS = 120.0
# Run as root in the guest: find the disk by its serial, mount it, and give a writable one to
# ``user`` (the sandbox's user). Arguments: serial, mount path, mount options.
MOUNT_SCRIPT = r"""
set -e
dev=
for b in /sys/block/vd*; do
  if [ "$(cat "$b/serial" 2>/dev/null)" = "$1" ]; then dev="/dev/${b##*/}"; fi
done
if [ -z "$dev" ]; then echo "no disk with serial $1" >&2; exit 1; fi
mkdir -p "$2"
mount -t ext4 -o "$3" "$dev" "$2"
if [ "$3" = "rw,noatime" ]; then chown -R user:user "$2"; fi
"""
FS_KINDS = ("ext4", "hostdir")


class Volumes:
    def __init__(self, rows: VolumeRows, data: DataDir, snapshots: SnapshotReader,
                 sandboxes: SandboxReader) -> None:
        self._rows = rows  # the volumes table: only this owner writes it
        self._dir = data.volumes
        self._scratch = data.tmp
        self._snapshots = snapshots
        self._sandboxes = sandboxes
        self._creating: set[str] = set()
        self._files: dict[str, HostFiles] = {}  # each hostdir volume's one HostFiles (its quota's count)

    def disk(self, name: str) -> Path:
        return self._dir / layout.check_tag(name) / "disk.qcow2"

    def files_dir(self, name: str) -> Path:
        return self._dir / layout.check_tag(name) / "files"

    def files(self, name: str) -> HostFiles:
        """The files of hostdir volume ``name``, as every sandbox that mounts it is served them."""
        vol = self.get(name)
        if vol.fs != "hostdir":
            raise InvalidRequest(f"volume {vol.name!r} is an ext4 disk: its files are not served live "
                                 "(export it, or attach it to a snapshot)")
        files = self._files.get(vol.name)
        if files is None:
            files = self._files[vol.name] = HostFiles(self.files_dir(vol.name), vol.size_bytes)
        return files

    # ---------------------------------------------------------------- the resource

    async def create(self, name: str, *, size_mib: int = bounds.DEFAULT_VOLUME_SIZE_MIB, fs: str = "ext4",
                     source: str | None = None) -> VolumeRecord:
        """A new volume of ``size_mib`` (its quota), empty or filled from ``source`` (a host
        directory or tarball). 409 if the name is taken."""
        layout.check_tag(name)
        bounds.VOLUME_SIZE_MIB.check(size_mib)
        if fs not in FS_KINDS:
            raise InvalidRequest(f"fs must be one of {', '.join(FS_KINDS)}, not {fs!r}")
        if source is not None and (not source.startswith("/") or "\x00" in source):
            raise InvalidRequest(f"source must be an absolute host path, not {source!r}")
        if name in self._creating or any(v.name == name for v in self._rows.all()):
            raise Conflict(f"volume {name!r} already exists; delete it first")
        self._creating.add(name)
        folder = self._dir / name
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if fs == "hostdir":
                await asyncio.to_thread(HostFiles.make, folder / "files", Path(source) if source else None,
                                        size_mib << 20, self._scratch)
            else:
                await asyncio.to_thread(volume_image.build, folder / "disk.qcow2", size_mib << 20,
                                        Path(source) if source else None, self._scratch, fs)
            record = VolumeRecord(name=name, size_bytes=size_mib << 20, fs=fs, created_at_unix=now_unix())
            self._rows.insert(record)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)  # nothing half-made is left
            raise
        finally:
            self._creating.discard(name)
        return record

    def get(self, name: str) -> VolumeRecord:
        return self._rows.get(layout.check_tag(name))

    def all(self) -> list[VolumeRecord]:
        return self._rows.all()

    def users(self, name: str) -> list[str]:
        """The snapshots that attach volume ``name`` (their layers sit on its disk)."""
        return sorted(s.tag for s in self._snapshots.all()
                      if any(v.get("name") == name for v in s.volumes))

    def sandbox_users(self, name: str) -> list[str]:
        """The sandboxes (running or hibernated) that mount volume ``name``."""
        return sorted(sb.id for sb in self._sandboxes.all() if any(v.get("name") == name for v in sb.volumes))

    def info(self, vol: VolumeRecord) -> VolumeReport:
        if vol.fs == "hostdir":
            used = self.files(vol.name).usage()[0]
        else:
            disk = self.disk(vol.name)
            used = disk.stat().st_blocks * 512 if disk.exists() else 0
        return {"name": vol.name, "size_mib": vol.size_bytes >> 20, "fs": vol.fs,
                "created_at_unix": vol.created_at_unix, "used_mib": round(used / (1 << 20), 2),
                "snapshots": self.users(vol.name), "sandboxes": self.sandbox_users(vol.name)}

    def delete(self, name: str) -> None:
        """Remove it; 409 while a snapshot attaches it (children of those run on its disk) or a
        sandbox mounts it."""
        vol = self.get(name)
        users = [f"snapshot {tag}" for tag in self.users(vol.name)]
        users += [f"sandbox {sb}" for sb in self.sandbox_users(vol.name)]
        if users:
            raise Conflict(f"volume {vol.name!r} is in use by {', '.join(users)}: "
                           "delete (or kill) them first")
        self._rows.delete(vol.name)
        files = self._files.pop(vol.name, None)
        if files is not None:
            files.close()
        shutil.rmtree(self._dir / vol.name, ignore_errors=True)

    async def export(self, name: str, to: str, snapshot: str | None = None) -> VolumeExportReport:
        """Copy the volume's files into ``to``, a new directory on the daemon's host: the named
        volume as it was made, or, with ``snapshot``, as that snapshot holds it (what its template
        or its branch source wrote). 409 if ``to`` exists; 404 if the snapshot does not attach it."""
        vol = self.get(name)
        if not to.startswith("/") or "\x00" in to or len(to) > 4096:
            raise InvalidRequest(f"to must be an absolute host path, not {to!r}")
        target = Path(to)
        if target.exists() or target.is_symlink():
            raise Conflict(f"{to} already exists: export into a new directory")
        if not target.parent.is_dir():
            raise InvalidRequest(f"{target.parent} is not a directory on the daemon's host")
        if vol.fs == "hostdir":
            if snapshot is not None:
                raise InvalidRequest(f"volume {vol.name!r} is a hostdir volume: its files are shared live, "
                                     "with no copy per snapshot (export it without snapshot)")
            await asyncio.to_thread(self.files(vol.name).export_to, target)
            return {"name": vol.name, "to": str(target)}
        image = self.disk(vol.name)
        if snapshot is not None:
            snap = self._snapshots.get(layout.check_tag(snapshot))
            index = next((i for i, v in enumerate(snap.volumes) if v.get("name") == vol.name), None)
            if index is None:
                raise NotFound(f"snapshot {snapshot!r} does not attach volume {vol.name!r}")
            image = layout.SnapshotDir(Path(snap.dir)).volume(index)
        await asyncio.to_thread(volume_image.export, image, target, self._scratch)
        out: VolumeExportReport = {"name": vol.name, "to": str(target)}
        if snapshot is not None:
            out["snapshot"] = snapshot
        return out

    # ---------------------------------------------------------------- attached to a snapshot

    def resolve(self, mounts: Sequence[VolumeMount], *, taken: Sequence[dict[str, Any]] = (),
                at_spawn: bool = False) -> list[VolumeMount]:
        """Checked before any VM starts, each with its ``fork`` settled by its volume's kind: a bound
        on their number, distinct mount paths (``taken``: a snapshot's, for a spawn's), named volumes
        that exist and host paths that are directories. At a spawn, only hostdir volumes (a disk is
        part of a snapshot's device configuration)."""
        for m in mounts:
            m.check()
        most = volume_messages.MAX_SLOTS - len(taken) if at_spawn else bounds.MAX_VOLUMES
        if len(mounts) > most:
            raise InvalidRequest(f"at most {bounds.MAX_VOLUMES} volumes per snapshot and "
                                 f"{volume_messages.MAX_SLOTS} per sandbox (got {len(mounts)} more)")
        paths = [m.mount for m in mounts] + [str(e.get("mount")) for e in taken]
        if len(set(paths)) != len(paths):
            raise InvalidRequest(f"two volumes are mounted at the same path: {paths}")
        out: list[VolumeMount] = []
        for m in mounts:
            fork = "copy"
            if m.name is not None:
                vol = self.get(m.name)
                if vol.fs == "hostdir":
                    if m.fork == "copy":
                        raise InvalidRequest(
                            f'volume {vol.name!r} is a hostdir volume, whose files are shared live (fork '
                            '"shared"); for a copy per child, attach an ext4 volume or a host_path')
                    fork = "shared"
                elif m.fork == "shared":
                    raise InvalidRequest(
                        f"volume {vol.name!r} is an ext4 disk, which each child copies; to share one set of "
                        'files across running sandboxes, create one with fs "hostdir"')
            elif m.host_path is not None and not Path(m.host_path).is_dir():
                raise InvalidRequest(f"host_path {m.host_path} is not a directory on the daemon's host")
            if at_spawn and fork != "shared":
                raise InvalidRequest("a volume attached at spawn is a hostdir volume (shared): an ext4 "
                                     "volume or a host_path is a disk, attached when a snapshot is made "
                                     "(POST /v1/snapshots volumes)")
            out.append(dataclasses.replace(m, fork=fork))
        return out

    def spawn_entries(self, mounts: Sequence[VolumeMount], snapshot: Sequence[dict[str, Any]]
                      ) -> list[dict[str, Any]]:
        """The recorded entries of a spawn's volumes, after the snapshot's (their slots follow)."""
        return [self._shared_entry(m) for m in self.resolve(mounts, taken=snapshot, at_spawn=True)]

    def _shared_entry(self, m: VolumeMount) -> dict[str, Any]:
        """A shared volume's recorded entry: no disk, its volume's size."""
        return {**m.to_wire(), "size_bytes": self.get(str(m.name)).size_bytes}

    async def attach_template(self, mounts: Sequence[VolumeMount], staging: layout.SnapshotDir
                              ) -> tuple[list[VolumeDrive], list[dict[str, Any]]]:
        """Each volume's layer in the staging snapshot, its drive, and its ``snapshot.json`` entry."""
        drives: list[VolumeDrive] = []
        entries: list[dict[str, Any]] = []
        for i, m in enumerate(mounts):
            target = staging.volume(i)
            if m.fork == "shared":  # no disk: its files are served (SharedVolumes)
                entries.append(self._shared_entry(m))
                continue
            if m.name is not None:
                vol = self.get(m.name)
                await asyncio.to_thread(disk_mod.create_overlay, self.disk(vol.name), target, "qcow2")
                size = vol.size_bytes
            else:
                size = (m.size_mib or bounds.DEFAULT_VOLUME_SIZE_MIB) << 20
                await asyncio.to_thread(volume_image.build, target, size, Path(str(m.host_path)),
                                        self._scratch)
            drives.append(VolumeDrive(target, layout.volume_node(ROOT_NODE, i), serial(i), m.read_only))
            entries.append({**m.to_wire(), "size_bytes": size})
        return drives, entries


def drives_for(entries: Sequence[dict[str, Any]], disk: Path, node: str, snapshot: layout.SnapshotDir
               ) -> list[VolumeDrive]:
    """The volume drives of a VM whose root disk is ``disk`` (node ``node``), restored from
    ``snapshot``: a writable volume's file mirrors ``disk``; a read-only one is the snapshot's."""
    drives = []
    for i in disk_indices(entries):
        read_only = bool(entries[i].get("read_only"))
        drives.append(VolumeDrive(snapshot.volume(i) if read_only else layout.volume_file(disk, i),
                                  layout.volume_node(node, i), serial(i), read_only))
    return drives


def child_overlays(entries: Sequence[dict[str, Any]], snapshot: layout.SnapshotDir, disk: Path) -> None:
    """A new child's own overlay of each writable volume, beside its root disk ``disk``."""
    for i in writable(entries):
        disk_mod.clone_overlay(snapshot.volume(i), layout.volume_file(disk, i),
                               snapshot.path / f".child-overlay.vol{i}.qcow2")


def writable(entries: Sequence[dict[str, Any]]) -> list[int]:
    """The indices of the writable disks (a shared volume has none)."""
    return [i for i in disk_indices(entries) if not entries[i].get("read_only")]


async def require_live_cut(vm: VM, entries: Sequence[dict[str, Any]], sandbox_id: str) -> None:
    """Refuse (409) a live branch of a sandbox with writable volumes whose agent cannot freeze them:
    the guest freezes them with its root filesystem around a live cut, and an agent older than that
    would freeze only the root, so the volumes' copies would not be crash-free."""
    if writable(entries):
        agent = await vm.call(lambda client: client.capabilities(30))
        require(agent, capabilities.CAP_FREEZE_MOUNTS, subject=f"sandbox {sandbox_id!r}")


async def mount_in_guest(vm: VM, entries: Sequence[dict[str, Any]]) -> None:
    """Mount each volume at its path in a booted template (as root), writable ones owned by ``user``."""
    for i in disk_indices(entries):
        e = entries[i]
        opts = "ro,noload" if e.get("read_only") else "rw,noatime"
        req: ExecRequest = {"args": ["sh", "-c", MOUNT_SCRIPT, "mount-volume", serial(i), e["mount"], opts],
                            "timeout_secs": MOUNT_TIMEOUT_SECS}
        res = await vm.call(functools.partial(AgentClient.exec, req=req, timeout=MOUNT_TIMEOUT_SECS + 30))
        if res.get("exit_code") != 0:
            raise GuestError(f"mounting volume {i} at {e['mount']} in the guest failed: "
                             f"{(res.get('stderr') or res.get('error') or '')[-500:]}")


def branch_layers(entries: Sequence[dict[str, Any]], parent: layout.SnapshotDir, staging: layout.SnapshotDir,
                  layers: Sequence[Path], final_dir: Path, *, standalone: bool) -> None:
    """A branch's volume layers, beside its root disk's: each writable volume's frozen layers
    (mirrors of the root disk's ``layers``) copied and chained onto the parent's; a read-only
    volume gets an empty overlay on the parent's (nothing wrote it)."""
    for i in disk_indices(entries):
        e = entries[i]
        base = parent.volume(i)
        if e.get("read_only"):
            disk_mod.create_overlay(base, staging.volume(i), "qcow2")
        elif standalone:
            disk_mod.flatten_onto(layout.volume_file(layers[-1], i), base, staging.volume(i))
        else:
            disk_mod.copy_layers([layout.volume_file(p, i) for p in layers], base, staging.volume(i),
                                 final_dir, suffix=f".vol{i}")


def require_none(snap: SnapshotRecord, what: str) -> None:
    """409: ``what`` does not handle a snapshot with volumes yet."""
    if snap.volumes:
        raise Conflict(f"snapshot {snap.tag!r} has volumes, and {what} does not carry volumes yet")


__all__ = ["Volumes", "branch_layers", "child_overlays", "drives_for", "mount_in_guest", "require_live_cut",
           "require_none", "writable"]
