"""The agent's shared volumes by slot: the ``vol_mount``, ``vol_poll`` and ``vol_reply`` actions.

Its own module so that the serve loop hands the three actions to one object, which checks each
request's slot and mount path before a ``VolumeFs`` (``volfs``) sees it, and tells every mount
when the host it answered goes away (``host_gone``: the agent lost its host, or was restored).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from forkd.guest import volume_messages as vm
from forkd.guest.agent.channel import Channel
from forkd.guest.agent.volfs import VolumeFs
from forkd.guest.protocol import CONFLICT, INVALID, NOT_FOUND, RequestError
from forkd.guest.volume_messages import VolPollReply


class VolumeMounts:
    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._slots: dict[int, VolumeFs] = {}
        self._lock = threading.Lock()

    def mount(self, req: dict[str, Any]) -> vm.VolMountReply:
        slot = self._slot(req)
        mount = req["mount"]
        if not isinstance(mount, str) or not mount.startswith("/") or "\0" in mount or len(mount) > 4096 \
                or any(part in (".", "..") for part in mount.split("/")):
            raise RequestError("mount must be an absolute guest path without '.' or '..'", INVALID)
        with self._lock:
            existing = self._slots.get(slot)
            if existing is not None:
                if existing.mount != mount:
                    raise RequestError(f"slot {slot} is mounted at {existing.mount}, not {mount}", CONFLICT)
                return {"mounted": True, "already": True}
            fs = VolumeFs(slot, mount, bool(req["read_only"]), self._channel)
            fs.start()
            self._slots[slot] = fs
        return {"mounted": True, "already": False}

    def poll(self, req: dict[str, Any]) -> VolPollReply | None:
        wait = min(max(float(req.get("wait_secs", vm.MAX_POLL_WAIT_SECS)), 0.0), vm.MAX_POLL_WAIT_SECS)
        return self._mounted(self._slot(req)).host.poll(req.get("id"), bool(req.get("resend")), wait)

    def reply(self, req: dict[str, Any]) -> None:
        with contextlib.suppress(RequestError):  # a notification: nobody to tell
            self._mounted(self._slot(req)).host.answer(req)  # type: ignore[arg-type]  # a VolReplyNotice

    def host_gone(self) -> None:
        with self._lock:
            mounted = list(self._slots.values())
        for fs in mounted:
            fs.host.host_gone()

    @staticmethod
    def _slot(req: dict[str, Any]) -> int:
        slot = req.get("slot")
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < vm.MAX_SLOTS:
            raise RequestError(f"slot must be an integer in [0, {vm.MAX_SLOTS})", INVALID)
        return slot

    def _mounted(self, slot: int) -> VolumeFs:
        with self._lock:
            fs = self._slots.get(slot)
        if fs is None:
            raise RequestError(f"no shared volume is mounted in slot {slot}", NOT_FOUND)
        return fs


__all__ = ["VolumeMounts"]
