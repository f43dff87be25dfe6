"""The accelerator this host boots guests with, probed once per daemon."""

from __future__ import annotations

from forkd.config import DataDir
from forkd.errors import NotFound
from forkd.host import probe
from forkd.host.accel import Accel
from forkd.image.builder import Image, load_image
from forkd.store.layout import SnapshotDir


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
