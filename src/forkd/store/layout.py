"""On-disk layout of a snapshot and of a sandbox's run directory.

``<data>/snapshots/<tag>/``
    ``mem``            guest RAM (children map it MAP_PRIVATE: copy-on-write)
    ``state``          device + vCPU state (a QEMU migration stream without RAM)
    ``disk.qcow2``     the guest disk, frozen at snapshot time (children get overlays on it)
    ``disk.vol<i>.qcow2``  attached volume ``i``, frozen likewise (store/volume_spec.py)
    ``snapshot.json``  metadata: VM config (accel, CPU model), image, lineage
    ``restore-chunks.json``  the chunks of ``mem`` its first restore here touched (optional;
                       store/restore_chunks.py)
``<data>/sandboxes/<id>/``
    ``disk.qcow2`` (overlay), ``qmp.sock``, ``agent.sock``, ``pid``, ``qemu.log``, ``console.log``

Snapshots are written into ``.<tag>.tmp-*`` and renamed into place only when
complete, so a crash never leaves a half-written snapshot that looks real.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forkd import bounds, jsondepth
from forkd.bounds import HOST_ID_RE, HOSTED_SANDBOX_ID_RE, SANDBOX_ID_RE, SANDBOX_ID_RULE, TAG_RE
from forkd.errors import InvalidRequest
from forkd.store import snapshot_meta

# A snapshot.json is a few KiB (setup steps included); anything far larger was not written by forkd.
MAX_META_BYTES = 4 << 20


def check_tag(tag: str) -> str:
    if not isinstance(tag, str) or not TAG_RE.match(tag):
        raise InvalidRequest(
            f"invalid tag {tag!r}: must match {TAG_RE.pattern} "
            "(letters, digits, '.', '_', '-'; at most 64; not starting with '.' or '-')"
        )
    return tag


def check_sandbox_id(sandbox_id: str) -> str:
    """Validated before any path is built from it: no traversal through an id."""
    if not isinstance(sandbox_id, str) or not SANDBOX_ID_RE.match(sandbox_id):
        raise InvalidRequest(f"invalid sandbox id {sandbox_id!r}: {SANDBOX_ID_RULE}")
    return sandbox_id


def check_host_id(host_id: str) -> str:
    if not isinstance(host_id, str) or not HOST_ID_RE.match(host_id):
        raise InvalidRequest(f"invalid host id {host_id!r}: 1 to 16 lower-case letters and digits")
    return host_id


def new_batch_prefix(host_id: str | None = None) -> str:
    """``sb-<6 hex>``, or ``sb-<host>-<6 hex>`` on a fleet host; children append ``-<4 digits>``."""
    return f"sb-{check_host_id(host_id)}-{secrets.token_hex(3)}" if host_id else f"sb-{secrets.token_hex(3)}"


def host_of(sandbox_id: str) -> str | None:
    """The host a sandbox id names (``sb-<host>-…``), or None for an id without one."""
    m = HOSTED_SANDBOX_ID_RE.match(sandbox_id)
    return m.group(1) if m else None


def volume_file(disk: Path, index: int) -> Path:
    """The file of volume ``index`` that goes with the root disk layer ``disk``.

    Every layer of a volume mirrors one of the root disk's (``disk.qcow2`` and
    ``disk.vol0.qcow2``, ``disk-3.qcow2`` and ``disk-3.vol0.qcow2``, ``layer-0.qcow2`` and
    ``layer-0.vol0.qcow2``): the volume is cut, copied, published and deleted with its root disk,
    by the same lineage, without a chain of its own to keep.
    """
    return disk.with_name(f"{disk.stem}.vol{index}.qcow2")


def volume_node(node: str, index: int) -> str:
    """The QEMU block node of volume ``index`` beside the root disk's node ``node``."""
    return f"{node}v{index}"


@dataclass(frozen=True)
class SnapshotDir:
    path: Path

    @property
    def mem(self) -> Path:
        return self.path / "mem"

    @property
    def state(self) -> Path:
        return self.path / "state"

    @property
    def disk(self) -> Path:
        return self.path / "disk.qcow2"

    def volume(self, index: int) -> Path:
        """Volume ``index``'s layer (store/volume_spec.py), beside the root disk."""
        return volume_file(self.disk, index)

    @property
    def meta_path(self) -> Path:
        return self.path / "snapshot.json"

    def read_meta(self) -> dict[str, Any]:
        """Its snapshot.json, each field checked (store/snapshot_meta.py): whoever wrote the file,
        nothing out of bounds reaches a command line. ``BadMeta`` (a 400) names the bad field."""
        text = self.meta_path.read_bytes()
        if len(text) > MAX_META_BYTES or jsondepth.too_deep(text, bounds.MAX_JSON_DEPTH):
            raise snapshot_meta.BadMeta(f"{self.meta_path} is larger than {MAX_META_BYTES} bytes or "
                                        "nested too deeply")
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise snapshot_meta.BadMeta(f"{self.meta_path} is not JSON: {exc}") from None
        return snapshot_meta.check(raw, str(self.meta_path))

    def write_meta(self, meta: dict[str, Any]) -> None:
        tmp = self.meta_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta, indent=2))
        os.replace(tmp, self.meta_path)

    def complete(self) -> bool:
        return all(p.exists() for p in (self.mem, self.state, self.disk, self.meta_path))



# A staging folder's name holds at most this much of its tag. A boot's or a branch helper's
# unix sockets live below it, and a socket's path holds at most 107 bytes: with a whole
# 64-character tag, /var/lib/forkd/snapshots/.<tag>.tmp-xxxxxxxx/helper/qmp.sock is 124.
STAGING_TAG_CHARS = 24


def staging_dir(snapshots: Path, tag: str) -> SnapshotDir:
    path = snapshots / f".{tag[:STAGING_TAG_CHARS]}.tmp-{secrets.token_hex(4)}"
    path.mkdir(parents=True)
    return SnapshotDir(path)


def publish(staging: SnapshotDir, snapshots: Path, tag: str) -> SnapshotDir:
    final = snapshots / tag
    os.rename(staging.path, final)  # fails if it exists: never overwrite a snapshot
    return SnapshotDir(final)


def discard(snapshot_dir: Path) -> None:
    """Remove an unregistered snapshot's directory so that nothing can bring it back.

    It is first renamed aside (one atomic step, to a staging-style name that the next start's
    ``remove_stale_staging`` clears if this is cut short), then removed: a writer that still
    names the old path (the first child's restore-chunks record, say) finds no directory rather
    than recreating one after a plain rmtree, which would leave an unregistered directory that
    refuses the next import of the tag."""
    aside = snapshot_dir.with_name(f".{snapshot_dir.name}.tmp-gone-{secrets.token_hex(4)}")
    try:
        os.rename(snapshot_dir, aside)
    except FileNotFoundError:
        return
    shutil.rmtree(aside, ignore_errors=True)


def remove_stale_staging(snapshots: Path) -> list[str]:
    """Leftovers of snapshot writes interrupted by a crash."""
    removed = []
    if snapshots.is_dir():
        for p in snapshots.iterdir():
            if p.name.startswith(".") and ".tmp-" in p.name:
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p.name)
    return removed
