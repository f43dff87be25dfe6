"""Guest images from OCI/Docker images: ``POST /v1/images`` and a template's ``FROM REF``.

A pull runs skopeo and umoci (forkd.image.oci) and packs the tree as a guest
image (forkd.image.oci_build.build_oci_image), in a thread: it is host CPU and
disk, seconds to minutes. One conversion at a time: two builds of the same
image would race for its directory, and a host converts faster one by one.
The daemon's registry settings (mirrors, an auth file) apply to every pull;
credentials given with one request apply to it alone and are never stored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from forkd.bounds import TAG_RE
from forkd.config import DataDir
from forkd.errors import Conflict, InvalidRequest
from forkd.image import oci
from forkd.image.builder import Image, list_images, load_image
from forkd.image.oci_build import build_oci_image
from forkd.store.layout import discard

Emit = Callable[[dict[str, Any]], None]


def _ignore(_event: dict[str, Any]) -> None:
    pass


@dataclass(frozen=True)
class PullRequest:
    ref: str
    name: str | None = None  # the image's name here (default: from the reference, e.g. python-3.12)
    credentials: oci.Credentials | None = None
    force: bool = False  # convert again even if this image was converted from the same digest


def image_info(image: Image) -> dict[str, Any]:
    """What the API says about an image: its name, key, and where a pulled one came from."""
    info: dict[str, Any] = {"name": image.name, "key": image.key,
                            "kernel_version": image.meta.get("kernel_version"),
                            "built_at_unix": image.meta.get("built_at_unix")}
    if "oci" in image.meta:
        info["oci"] = image.meta["oci"]
    return info


def image_defaults(image: Image) -> oci.ImageDefaults | None:
    """A pulled image's ENV, WORKDIR, USER, ENTRYPOINT and CMD (None for forkd's own images)."""
    defaults = image.meta.get("oci", {}).get("defaults")
    if not isinstance(defaults, dict):
        return None
    return oci.ImageDefaults(env=dict(defaults.get("env") or {}), workdir=str(defaults.get("workdir") or "/"),
                             user=defaults.get("user"), entrypoint=list(defaults.get("entrypoint") or []),
                             cmd=list(defaults.get("cmd") or []))


class OciImages:
    """Pulls and converts OCI images into this daemon's images directory, and removes images.

    ``users(name)``: the snapshots whose disks stand on image ``name`` (their root filesystem's
    backing file is its rootfs), which the snapshot store answers.
    """

    def __init__(self, data: DataDir, users: Callable[[str], list[str]],
                 registries: oci.Registries | None = None) -> None:
        self._data = data
        self._users = users
        self.registries = registries or oci.Registries()
        self._lock = asyncio.Lock()

    def list(self) -> list[dict[str, Any]]:
        return [image_info(image) for image in list_images(self._data)]

    async def remove(self, name: str) -> None:
        """Delete guest image ``name`` (forkd's own or a pulled one); 409 naming the snapshots that
        stand on it. Its pulled layers stay in the OCI cache, shared by digest with other images."""
        if not TAG_RE.match(name):
            raise InvalidRequest(f"invalid image name {name!r}")
        if self._data.images_override is not None:
            # Other daemons may boot from it (FORKD_IMAGES_DIR): this one knows only its own snapshots.
            raise Conflict(f"this daemon's images directory {self._data.images} is shared "
                           "(FORKD_IMAGES_DIR), and other daemons' snapshots may stand on its images: "
                           "remove images from it by hand once none does")
        async with self._lock:  # not while a pull converts into it
            load_image(self._data, name)  # 404 if there is none
            users = self._users(name)
            if users:
                shown = ", ".join(users[:20]) + (f" and {len(users) - 20} more" if len(users) > 20 else "")
                raise Conflict(f"image {name!r} is the base of snapshot(s) {shown}: delete them first "
                               "(forkd snapshot rm TAG --cascade)")
            await asyncio.to_thread(discard, self._data.images / name)

    async def pull(self, req: PullRequest, emit: Emit = _ignore) -> Image:
        oci.ImageRef.parse(req.ref)  # a bad reference is refused before anything starts
        loop = asyncio.get_running_loop()

        def progress(step: str, fraction: float) -> None:
            event = {"type": "progress", "step": step, "fraction": round(fraction, 3)}
            loop.call_soon_threadsafe(emit, event)

        def run() -> Image:
            pulled = oci.pull(self._data.images, req.ref, self.registries, req.credentials, progress)
            return build_oci_image(self._data, pulled, req.name, force=req.force, progress=progress)

        emit({"type": "progress", "step": f"resolving {req.ref}", "fraction": 0.0})
        async with self._lock:
            image = await asyncio.to_thread(run)
        emit({"type": "done", "image": image_info(image)})
        return image
