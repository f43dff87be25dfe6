"""qcow2 disk layers: overlays for children, blank scratch disks, branch layer copies.

Everything here runs ``qemu-img`` through one helper, so a missing tool or a
failed call reads the same wherever it happens.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from forkd.errors import VMError
from forkd.host import prereqs


def qemu_img(*args: str) -> str:
    tool = prereqs.require(prereqs.QEMU_IMG)["qemu-img"]
    proc = subprocess.run([tool, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise VMError(f"qemu-img {args[0]} {args[-1]} failed: {proc.stderr.strip()}")
    return proc.stdout


def backing_chain(path: Path) -> list[tuple[Path, str]]:
    """``path`` and every image below it, top first, with its format (``-U``: children may hold them)."""
    chain = json.loads(qemu_img("info", "-U", "--backing-chain", "--output=json", str(path)))
    return [(Path(link["filename"]), str(link["format"])) for link in chain]


def set_backing(path: Path, backing: str, backing_format: str) -> None:
    """Rewrite only the header's backing name of ``path`` (the data below is the same)."""
    qemu_img("rebase", "-u", "-f", "qcow2", "-b", backing, "-F", backing_format, str(path))


def create_overlay(backing: Path, path: Path, backing_format: str) -> None:
    """A qcow2 copy-on-write overlay over ``backing``: O(1) on any filesystem."""
    qemu_img("create", "-q", "-f", "qcow2", "-o", "cluster_size=65536",
             "-b", str(backing), "-F", backing_format, str(path))


def clone_overlay(backing: Path, path: Path, template: Path) -> None:
    """A fresh empty overlay over ``backing``, copied from a cached empty one.

    Every child of a snapshot gets an identical empty overlay (same backing
    path), so one ``qemu-img create`` per snapshot replaces one per child: a
    few KB copied instead of a process spawned on the fork's critical path.
    """
    if not template.exists():
        tmp = template.with_name(f"{template.name}.tmp-{os.getpid()}-{id(path)}")
        create_overlay(backing, tmp, "qcow2")
        os.replace(tmp, template)
    shutil.copyfile(template, path)


def create_blank(path: Path, size: int) -> None:
    """A qcow2 disk of ``size`` bytes with no backing chain."""
    qemu_img("create", "-q", "-f", "qcow2", str(path), str(size))


def qcow2_virtual_size(path: Path) -> int:
    """The disk size a qcow2 image presents (header: magic, version, …, size at byte 24)."""
    with open(path, "rb") as f:
        header = f.read(32)
    if header[:4] != b"QFI\xfb":
        raise VMError(f"{path} is not a qcow2 image")
    return int.from_bytes(header[24:32], "big")


def copy_layers(layers: list[Path], base: Path, disk: Path, final_dir: Path,
                suffix: str = "") -> list[Path]:
    """Copy frozen overlays (oldest first) into a branch, chained onto ``base``.

    The newest becomes ``disk``; older ones (left by branches that failed after
    their capture) become ``layer-<i><suffix>.qcow2`` beside it (a volume's
    suffix: ``.vol<n>``). Copies, not links: the branch must not depend on the
    source's directory, and rewriting the backing path of a file QEMU holds open
    as a backing image is not possible. A frozen overlay holds only what the
    guest wrote since the previous branch, so the copy is small, and it happens
    after the source has resumed. Backing paths name ``final_dir``, where the
    staging directory will be renamed to.
    """
    written: list[Path] = []
    prev = base
    for i, layer in enumerate(layers):
        target = disk if i == len(layers) - 1 else disk.with_name(f"layer-{i}{suffix}.qcow2")
        shutil.copyfile(layer, target)
        written.append(target)
        # -u: only the header's backing path changes; the content below is identical.
        qemu_img("rebase", "-u", "-f", "qcow2", "-b", str(prev), "-F", "qcow2", str(target))
        prev = final_dir / target.name
    return written


def chain_bottom(top: Path) -> tuple[Path, str]:
    """The image at the bottom of ``top``'s backing chain, and its format (e.g. the raw rootfs)."""
    tool = prereqs.require(prereqs.QEMU_IMG)["qemu-img"]
    proc = subprocess.run([tool, "info", "-U", "--backing-chain", "--output=json", str(top)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise VMError(f"qemu-img info {top} failed: {proc.stderr.strip()}")
    bottom = json.loads(proc.stdout)[-1]
    return Path(bottom["filename"]), str(bottom["format"])


def flatten_onto(top: Path, base: Path, out: Path, base_format: str = "qcow2") -> None:
    """``out``: one overlay on ``base`` with the content of ``top``'s whole chain.

    For a branch that must not depend on any other branch (an auto-checkpoint,
    deleted when it falls out of its window): ``top`` and its older layers are
    the source's frozen overlays, and ``base`` is a published disk holding the
    same content as the bottom of that chain. A copy of ``top`` is rebased in
    safe mode, which writes into it every cluster the layers between ``top``
    and ``base`` changed; when ``base`` is in ``top``'s chain (the usual case)
    only those clusters are compared. ``-U``: the source's QEMU still holds the
    old layers open (read-only for it; they are frozen). A compaction
    (controller/compaction.py) flattens a snapshot's whole chain onto the image
    at its bottom (the guest image's raw rootfs, ``base_format="raw"``).
    """
    shutil.copyfile(top, out)
    try:
        qemu_img("rebase", "-q", "-U", "-f", "qcow2", "-b", str(base), "-F", base_format, str(out))
    except BaseException:
        out.unlink(missing_ok=True)
        raise
