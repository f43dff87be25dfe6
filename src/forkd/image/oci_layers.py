"""An OCI image's layers onto a root filesystem tree: each layer's tar headers walked and checked
before umoci applies them (``check_layer``), then ``umoci unpack`` (``unpack``).

umoci applies whiteouts, opaque directories, hard links, owners, modes and xattrs, and keeps
writes inside the tree; it does not refuse device nodes, paths that climb out, or a layer that
lies about its size, and it does not bound what a layer unpacks to. Those checks are here.
"""

from __future__ import annotations

import gzip
import os
import posixpath
import shutil
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

from forkd.errors import InvalidRequest, TooLarge
from forkd.host import prereqs
from forkd.image.oci import UMOCI, Progress, PulledImage, run_tool

MAX_UNPACKED_BYTES = 32 << 30  # the sum of every layer's entries, uncompressed
MAX_ENTRIES = 2_000_000  # tar entries over all layers

_WHITEOUT = ".wh."


def _open_layer(blob: Path, media: str) -> BinaryIO:
    if media.endswith("+zstd"):
        raise InvalidRequest("zstd-compressed layers are not supported; push the image with gzip layers")
    with open(blob, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return cast(BinaryIO, gzip.GzipFile(blob, "rb"))
    return open(blob, "rb")


def _inside(name: str) -> str:
    """``name`` as a path in the root, or the InvalidRequest that says it climbs out of it."""
    norm = posixpath.normpath("/" + name)
    if ".." in name.split("/") or name.startswith("/"):
        # tar strips a leading / and umoci would confine a "..", but a layer that has either was
        # not made by a build tool: refused rather than guessed at.
        raise InvalidRequest(f"a layer's entry {name[:200]!r} points outside the root filesystem")
    return norm


@dataclass
class _Totals:
    bytes: int = 0
    entries: int = 0


def check_layer(blob: Path, descriptor: Mapping[str, Any], totals: _Totals) -> None:
    """Refuse a layer that lies about its size, holds device nodes or leaves the root; count its bytes."""
    declared = descriptor.get("size")
    actual = blob.stat().st_size
    if actual != declared:
        raise InvalidRequest(f"layer {str(descriptor.get('digest'))[:80]} is {actual} bytes, not the "
                             f"{declared} its manifest declares")
    symlinks: set[str] = set()
    with _open_layer(blob, str(descriptor.get("mediaType", ""))) as raw, \
            tarfile.open(fileobj=raw, mode="r|") as tar:
        try:
            for member in tar:
                totals.entries += 1
                totals.bytes += max(member.size, 0)
                if totals.entries > MAX_ENTRIES:
                    raise TooLarge(f"the image has over {MAX_ENTRIES} files")
                if totals.bytes > MAX_UNPACKED_BYTES:
                    raise TooLarge(f"the image unpacks to over {MAX_UNPACKED_BYTES} bytes")
                path = _inside(member.name)
                if member.ischr() or member.isblk():
                    raise InvalidRequest(f"a layer holds the device node {member.name[:200]!r}; images may "
                                         "not carry devices (the guest's /dev is its own)")
                parent = posixpath.dirname(path)
                while parent != "/":
                    if parent in symlinks:
                        raise InvalidRequest(f"a layer's entry {member.name[:200]!r} goes through the "
                                             f"symlink {parent} of the same layer")
                    parent = posixpath.dirname(parent)
                if member.islnk():
                    _inside(member.linkname)
                if member.issym():
                    symlinks.add(path)
                elif path in symlinks and not posixpath.basename(path).startswith(_WHITEOUT):
                    symlinks.discard(path)
        except tarfile.ReadError as exc:
            # umoci's (Go's) layers may end without tar's closing blocks, as Go's reader allows.
            if str(exc) != "unexpected end of data":
                raise InvalidRequest(f"layer {str(descriptor.get('digest'))[:80]} is not a valid tar: "
                                     f"{exc}") from None
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise InvalidRequest(f"layer {str(descriptor.get('digest'))[:80]} is not a valid tar: "
                                 f"{exc}") from None


def unpack(image: PulledImage, tree: Path, progress: Progress = lambda _s, _f: None) -> None:
    """Apply the image's layers, in order, onto ``tree`` (made here; it must not exist)."""
    totals = _Totals()
    for i, layer in enumerate(image.layers):
        progress(f"checking layer {i + 1}/{len(image.layers)}", 0.10 + 0.10 * i / max(1, len(image.layers)))
        check_layer(image.blob(str(layer.get("digest", ""))), layer, totals)
    umoci = prereqs.require(UMOCI)["umoci"]
    bundle = tree.parent / f".{tree.name}.bundle"
    shutil.rmtree(bundle, ignore_errors=True)
    progress(f"unpacking {len(image.layers)} layers ({totals.bytes >> 20} MiB)", 0.25)
    try:
        args = [umoci, "unpack", "--image", f"{image.layout}:{image.tag}", str(bundle)]
        if os.geteuid() != 0:
            args.insert(2, "--rootless")
        run_tool(args, f"unpacking {image.ref}")
        os.rename(bundle / "rootfs", tree)
    finally:
        shutil.rmtree(bundle, ignore_errors=True)


__all__ = ["check_layer", "unpack"]
