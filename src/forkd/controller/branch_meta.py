"""The ``snapshot.json`` of a branch, made in one place for every way a branch is taken: of a
running sandbox (controller/branch.py) and of a hibernated one (controller/hibernated_branch.py).
"""

from __future__ import annotations

from typing import Any

from forkd.store.layout import SnapshotDir
from forkd.store.records import SandboxRecord, SnapshotRecord


def branch_meta(record: SnapshotRecord, source: SandboxRecord, parent: SnapshotDir,
                convert_s: float) -> dict[str, Any]:
    """The ``snapshot.json`` of a branch of ``source`` (``record``: its registry row), whose disk
    is layered on ``parent``: the source's config, and what the guest carries from the parent."""
    parent_meta = parent.read_meta() if parent.meta_path.exists() else {}
    return {
        "tag": record.tag, "created_at_unix": record.created_at_unix,
        "config": source.config.to_json(), "image": parent_meta.get("image"),
        "warm_imports": parent_meta.get("warm_imports"),
        "numpy_version": parent_meta.get("numpy_version"),
        "parent_tag": record.parent_tag, "branched_from": source.id,
        "mode": record.mode, "pause_ms": record.pause_ms, "convert_secs": round(convert_s, 3),
        # Same device config as the source: a NIC on this tap, if it had one.
        "tap": source.tap,
        # The resolvers baked into the guest (its children's DNS, for allow_internet_access).
        "dns": list(source.network.dns) if source.network is not None else [],
        # Inherited unchanged (the seeds' design decision 4), their layers cut with the disk's.
        "volumes": source.volumes,
    }


__all__ = ["branch_meta"]
