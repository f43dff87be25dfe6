"""The accelerator this host boots guests with, probed once per daemon."""

from __future__ import annotations

import os

from forkd.config import DataDir
from forkd.errors import NotFound
from forkd.host.accel import Accel
from forkd.image.builder import Image, load_image
from forkd.store.layout import SnapshotDir
from forkd.vmm import probe


class HostAccelerator:
    def __init__(self, data: DataDir) -> None:
        self._data = data
        self._accel: Accel | None = None

    async def for_image(self, image: Image) -> Accel:
        if self._accel is None:
            self._accel = await probe.select_accel(self._data, image.probe_guest())
        return self._accel

    async def for_snapshot(self, sdir: SnapshotDir) -> Accel:
        """The host's accelerator, probed with the snapshot's image if not known yet."""
        if self._accel is None:
            try:
                image = load_image(self._data, sdir.read_meta()["image"]["name"])
            except NotFound:
                cached = probe.cached_probe(self._data)
                if not cached:
                    raise
                self._accel = Accel(cached["accel"], cached["cpu"])
            else:
                await self.for_image(image)
        assert self._accel is not None
        return self._accel

    async def current(self) -> Accel:
        """The host's accelerator for a snapshot that arrives from elsewhere (no local image needed
        when ``FORKD_ACCEL`` forces one or an earlier probe is cached)."""
        if self._accel is None:
            forced = os.environ.get("FORKD_ACCEL", "auto").lower()
            cached = probe.cached_probe(self._data)
            if forced in ("kvm", "tcg"):
                self._accel = Accel.kvm() if forced == "kvm" else Accel.tcg()
            elif cached and cached.get("accel"):
                self._accel = Accel(cached["accel"], cached["cpu"])
            else:
                try:
                    await self.for_image(load_image(self._data))
                except NotFound as exc:
                    raise NotFound(f"cannot tell which accelerator this host runs guests with: {exc} "
                                   "(or set FORKD_ACCEL=kvm|tcg)") from None
        assert self._accel is not None
        return self._accel
