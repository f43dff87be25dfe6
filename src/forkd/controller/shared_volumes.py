"""``SharedVolumes``: the daemon's side of shared volumes: each mount's FUSE ops answered from its files.

A sandbox (or a template being built) with ``fork: "shared"`` entries among its volumes has each
mounted by its agent (``vol_mount``, in the entry's slot), and one task per mount here that keeps a
``vol_poll`` waiting on the agent, performs the ops it hands out on the volume's ``HostFiles`` (in a
thread: they are file system calls) and answers each with a ``vol_reply``. Why the guest asks
through its agent and not through a device: guest/volume_messages.py.

The tasks ask for the sandbox's VM by id each time, so a hibernated sandbox (no VM) is simply not
served until its wake, and a woken one (a new VM) is asked to hand its unanswered ops out again
(``resend``); a cold-booted one (disk-only wake) has lost its mount, and gets it again. Polls go to
the VM directly, not through the ``AgentGateway``: they are not activity (an idle sandbox must
still pause) and must never wake a hibernated one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from forkd.controller.sandbox_events import SandboxEvents
from forkd.controller.volumes import Volumes
from forkd.errors import ForkdError, GuestError, NotFound
from forkd.guest import capabilities
from forkd.guest import volume_messages as vm_msgs
from forkd.guest.client import require
from forkd.store.records import SandboxRecord
from forkd.store.volume_spec import VolumeMount, is_shared
from forkd.vmm.machine import VM
from forkd.vmm.volume_files import HostFiles

log = logging.getLogger("forkd.shared_volumes")

POLL_WAIT_SECS = 20.0  # how long the agent holds a poll with nothing to hand out
RETRY_SECS = 0.5  # after a failed poll (the VM restarting, paused, gone for a moment)
MOUNT_TIMEOUT_SECS = 60.0
MAX_IN_FLIGHT = 16  # ops of one mount handed to the threads at once
# The threads that perform ops on the host's files: their own, so that guests flooding their volumes
# with ops (an fsync of a large file each) never take the threads the rest of the daemon runs on.
THREADS = 8

VmOf = Callable[[], VM | None]


@dataclass(frozen=True)
class SharedMount:
    """One shared volume of a sandbox: the agent's slot (its index among the sandbox's volumes)."""

    slot: int
    name: str
    mount: str
    read_only: bool


def shared_mounts(entries: Sequence[dict[str, Any]]) -> list[SharedMount]:
    return [SharedMount(i, str(e["name"]), str(e["mount"]), bool(e.get("read_only")))
            for i, e in enumerate(entries) if is_shared(e)]


class SharedVolumes:
    def __init__(self, volumes: Volumes, vm_of: Callable[[str], VM | None], events: SandboxEvents) -> None:
        self._volumes = volumes
        self._vm_of = vm_of
        self._tasks: dict[str, list[asyncio.Task[None]]] = {}  # owner (a sandbox id) -> its mounts' tasks
        self._threads = concurrent.futures.ThreadPoolExecutor(THREADS, thread_name_prefix="volume-ops")
        events.on_removed(self._removed)

    def spawn_entries(self, mounts: Sequence[VolumeMount], snapshot: Sequence[dict[str, Any]]
                      ) -> list[dict[str, Any]]:
        """A spawn's ``volumes`` checked (400 before any VM starts) and recorded after its snapshot's."""
        return self._volumes.spawn_entries(mounts, snapshot)

    async def attach(self, owner: str, vm: VM, entries: Sequence[dict[str, Any]], *,
                     vm_of: VmOf | None = None) -> None:
        """Mount each shared entry in ``vm``'s guest and serve it (``owner``: the sandbox's id, whose VM
        each poll looks up; ``vm_of``: another way to find it, for a template). 409 if its agent
        predates shared volumes. Idempotent: a mount already there (a restored child's) is kept."""
        mounts = shared_mounts(entries)
        if not mounts:
            return
        agent = await vm.call(lambda client: client.capabilities(30))
        require(agent, capabilities.CAP_SHARED_VOLUMES, subject=f"sandbox {owner!r}")
        for m in mounts:
            self._volumes.files(m.name)  # a volume deleted meanwhile fails here, before the guest mounts it
            await self._mount(vm, m)
        self.detach(owner)
        self._serve_all(owner, mounts, vm_of)

    def resume(self, record: SandboxRecord) -> None:
        """Serve a sandbox whose guest already has its mounts (a daemon's re-adoption)."""
        mounts = shared_mounts(record.volumes)
        # A hibernated one has no guest to serve: its wake attaches it again.
        if mounts and record.id not in self._tasks and record.hibernation is None:
            self._serve_all(record.id, mounts)

    def _serve_all(self, owner: str, mounts: Sequence[SharedMount], vm_of: VmOf | None = None) -> None:
        """One serving task per mount; each finds ``owner``'s VM by its id unless ``vm_of`` says how."""
        finder = vm_of if vm_of is not None else (lambda: self._vm_of(owner))
        self._tasks[owner] = [asyncio.create_task(self._serve(owner, m, finder), name=f"vol-{owner}-{m.slot}")
                              for m in mounts]

    def detach(self, owner: str) -> None:
        """Stop serving ``owner``: its guest's ops wait (a copy restored elsewhere hands them out again)."""
        for task in self._tasks.pop(owner, []):
            task.cancel()

    async def close(self) -> None:
        tasks = [t for ts in self._tasks.values() for t in ts]
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def _removed(self, record: SandboxRecord) -> None:
        self.detach(record.id)

    @staticmethod
    async def _mount(vm: VM, m: SharedMount) -> None:
        req: vm_msgs.VolMountRequest = {"slot": m.slot, "mount": m.mount, "read_only": m.read_only}
        await vm.call(lambda client: client.vol_mount(req, MOUNT_TIMEOUT_SECS))

    async def _serve(self, owner: str, m: SharedMount, vm_of: VmOf) -> None:
        """Keep one poll waiting on ``owner``'s agent for mount ``m``, and answer what it hands out."""
        in_flight: set[asyncio.Task[None]] = set()
        last: VM | None = None
        try:  # its files looked up once: a volume is not deleted while a sandbox mounts it
            files: HostFiles | None = self._volumes.files(m.name)
        except ForkdError as exc:  # its files are gone (by hand): every op is an I/O error
            log.warning("shared volume %s (slot %d): %s", m.name, m.slot, exc)
            files = None
        try:
            while True:
                vm = vm_of()
                if vm is None or not vm.process.alive():
                    await asyncio.sleep(RETRY_SECS)
                    continue
                resend = vm is not last  # a new VM (or a new daemon): the ops an older poll took are lost
                req: vm_msgs.VolPollRequest = {"slot": m.slot, "resend": resend, "wait_secs": POLL_WAIT_SECS}
                try:
                    got = await vm.agent.vol_poll(req, POLL_WAIT_SECS + 15)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the VM paused, restarting or gone: ask again shortly
                    if isinstance(exc, NotFound):  # a cold boot (disk-only wake) lost its mount
                        with contextlib.suppress(Exception):
                            await self._mount(vm, m)
                    last = None
                    await asyncio.sleep(RETRY_SECS)
                    continue
                last = vm
                for op in got["ops"][:vm_msgs.MAX_POLL_OPS]:
                    while len(in_flight) >= MAX_IN_FLIGHT:
                        await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                    task = asyncio.create_task(self._perform(vm, m, files, op))
                    in_flight.add(task)
                    task.add_done_callback(in_flight.discard)
        finally:
            for task in in_flight:
                task.cancel()

    async def _perform(self, vm: VM, m: SharedMount, files: HostFiles | None, op: vm_msgs.VolOp) -> None:
        notice: vm_msgs.VolReplyNotice = {"slot": m.slot, "seq": op["seq"], "errno": errno.EIO}
        if files is not None:  # apply never raises: a hostile op gets an errno
            notice = await asyncio.get_running_loop().run_in_executor(
                self._threads, functools.partial(files.apply, op, m.slot, read_only=m.read_only))
        with contextlib.suppress(GuestError, ConnectionError, OSError):
            vm.agent.vol_reply(notice)


__all__ = ["SharedMount", "SharedVolumes", "shared_mounts"]
