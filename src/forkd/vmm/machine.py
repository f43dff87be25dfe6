"""A running microVM: boot a template, snapshot it, restore children from it.

The fork mechanism (docs/FIELD-NOTES.md §5): the template's RAM *is* the snapshot's
``mem`` file (``share=on``), so its snapshot is just the device state, written
with ``x-ignore-shared`` (tens of KB, milliseconds). A child maps the same file
``share=off`` (MAP_PRIVATE): the kernel shares every page until the child
writes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from qemu.qmp import EventListener

from forkd.errors import BootTimeout, GuestError, VMError
from forkd.guest import capabilities, messages
from forkd.guest.client import AgentClient, require
from forkd.guest.protocol import RestoreInputs
from forkd.host.accel import VMConfig
from forkd.vmm.cmdline import LaunchSpec, VolumeDrive
from forkd.vmm.process import AgentSockets, QemuProcess, start_qemu
from forkd.vmm.qmp import QMP, restore_phases

T = TypeVar("T")

# A restored guest answers its post-restore call in ~0.3 s under TCG; re-send it
# after this long, and give up (the spawner then retries with a fresh QEMU) after that.
POST_RESTORE_RESEND = 8.0
POST_RESTORE_TIMEOUT = 30.0
# A guest sets the time it was sent, however long it took to read it (its first request after
# a restore is slow under TCG, slower under load): when its clock, as it reports it in the
# answer, is behind the host's by more than this on arrival, it is stepped again.
CLOCK_TOLERANCE_SECS = 0.5
CLOCK_STEPS = 3
# QEMU's event for a node written past the offset block-set-write-threshold set (it then disarms).
WRITE_THRESHOLD_EVENT = "BLOCK_WRITE_THRESHOLD"


# QEMU migration states during which the VM is still being copied (a live branch).
MIGRATION_ACTIVE = ("setup", "active", "pre-switchover", "device", "postcopy-active")


def clock_lag(reply: Mapping[str, object], sent: float) -> float:
    """How far the guest's clock (the answer's ``time_ns``) is behind the host's, now, in seconds.

    Without ``time_ns`` (an older agent), the round trip since ``sent`` bounds it.
    """
    guest_ns = reply.get("time_ns")
    if isinstance(guest_ns, int) and guest_ns > 0:
        return time.time() - guest_ns / 1e9
    return time.monotonic() - sent


def exec_uri(command: str, path: Path) -> str:
    return f"exec:{command} {shlex.quote(str(path))}"


@dataclass
class VM:
    process: QemuProcess
    config: VMConfig
    qmp: QMP
    agent: AgentClient
    timings: dict[str, float] = field(default_factory=dict)
    # The guest's own timing of its last post-restore call, per step (see guest/agent/restore.py).
    guest_steps_us: dict[str, int] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.process.pid

    # ------------------------------------------------------------ lifecycle

    @classmethod
    async def launch(cls, run_dir: Path, spec: LaunchSpec, sockets: AgentSockets,
                     launcher: Sequence[str] = (), inherit_fds: Sequence[int] = ()) -> VM:
        """Start QEMU for ``spec`` (whose fds are ``sockets``') and connect to its QMP."""
        config = spec.config
        process = await start_qemu(run_dir, spec, sockets, launcher, inherit_fds)
        vm = cls(process, config, QMP(process.qmp_path, run_dir.name), AgentClient(process.agent_path))
        try:
            await vm.await_or_exit(vm.qmp.connect(), 15, "QMP")
        except BaseException:
            await vm.destroy()
            raise
        return vm

    @classmethod
    async def launch_incoming(cls, run_dir: Path, spec: LaunchSpec, sockets: AgentSockets, source: Path,
                              launcher: Sequence[str] = ()) -> tuple[VM, str]:
        """Start a QEMU that will load ``source`` (``-incoming defer``); its ``migrate-incoming`` URI.

        QEMU reads the file through a descriptor it inherits (``fd:N``): no shell
        and no ``cat`` per VM, as ``exec:cat`` needed.
        """
        fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
        try:
            vm = await cls.launch(run_dir, spec, sockets, launcher, inherit_fds=(fd,))
        finally:
            os.close(fd)  # QEMU has its own copy
        return vm, f"fd:{fd}"

    async def await_or_exit(self, aw: Awaitable[T], timeout: float, what: str) -> T:
        """Await ``aw`` but fail fast, with QEMU's last words, if QEMU exits meanwhile."""
        task = asyncio.ensure_future(aw)
        exit_task = asyncio.ensure_future(self.process.wait_exit())
        try:
            done, _ = await asyncio.wait({task, exit_task}, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
            if task in done:
                if task.exception() is None:
                    return task.result()
                # A failed wait (e.g. the agent socket reset) usually means QEMU is
                # exiting: report its last words rather than the symptom.
                with contextlib.suppress(asyncio.TimeoutError):
                    code = await asyncio.wait_for(asyncio.shield(exit_task), 2)
                    raise VMError(f"QEMU exited (code {code}) while waiting for {what}:\n"
                                  f"{self.process.tail()}") from task.exception()
                return task.result()
            if exit_task in done:
                raise VMError(f"QEMU exited (code {exit_task.result()}) while waiting for {what}:\n"
                              f"{self.process.tail()}")
            raise BootTimeout(f"timed out after {timeout:.0f}s waiting for {what}:\n{self.process.tail()}")
        finally:
            for t in (task, exit_task):
                if not t.done():
                    t.cancel()
                    with contextlib.suppress(BaseException):
                        await t

    @classmethod
    async def boot(
        cls, run_dir: Path, config: VMConfig, *, mem_path: Path, disk: Path,
        kernel: Path, initrd: Path, append: str, timeout: float, tap: str | None = None,
        launcher: Sequence[str] = (), volumes: Sequence[VolumeDrive] = (),
    ) -> tuple[VM, messages.PingReply]:
        """Cold-boot a template VM whose RAM is ``mem_path``; return it once its agent is warm.

        ``launcher``: an argv prefix that execs QEMU in the same process (its network namespace).
        """
        started = time.monotonic()
        with open(mem_path, "wb") as f:
            f.truncate(config.mem_mib << 20)  # sparse: only touched pages take disk space

        sockets = AgentSockets.bind(run_dir)
        spec = LaunchSpec(config=config, mem_path=mem_path, share_ram=True, disk=disk,
                          qmp_fd=sockets.qmp_fd, agent_fd=sockets.agent_fd,
                          console_log=run_dir / "console.log",
                          kernel=kernel, initrd=initrd, append=append, tap=tap, volumes=list(volumes))
        vm = await cls.launch(run_dir, spec, sockets, launcher)
        try:
            ping = await vm.await_or_exit(vm.agent.ping(timeout=None), timeout,
                                           "the guest agent to boot and warm up")
        except BaseException:
            await vm.destroy()
            raise
        vm.timings["boot_s"] = time.monotonic() - started
        return vm, ping

    @classmethod
    async def restore(
        cls, run_dir: Path, config: VMConfig, *, mem_path: Path, state_path: Path, disk: Path,
        share_ram: bool = False, timeout: float = 60, tap: str | None = None,
        launcher: Sequence[str] = (), inputs: RestoreInputs | None = None,
        volumes: Sequence[VolumeDrive] = (),
    ) -> VM:
        """Start a child from a snapshot: private CoW RAM over ``mem_path`` + the device state.

        ``tap`` must be the snapshot's (same devices); ``launcher`` is an argv prefix
        that execs QEMU in the same process (cgroup, network namespace); ``inputs``
        (its ``RestoreInputs``: env, ...) go to the guest with the post-restore call.
        """
        started, started_wall = time.monotonic(), time.time()

        sockets = AgentSockets.bind(run_dir)
        spec = LaunchSpec(config=config, mem_path=mem_path, share_ram=share_ram, disk=disk,
                          qmp_fd=sockets.qmp_fd, agent_fd=sockets.agent_fd,
                          console_log=run_dir / "console.log", incoming=True, tap=tap,
                          volumes=list(volumes))
        vm, incoming = await cls.launch_incoming(run_dir, spec, sockets, state_path, launcher)
        try:
            vm.timings["qemu_up_s"] = time.monotonic() - started
            # QEMU reports when the state is loaded (MIGRATION completed) and when the
            # guest runs (RESUME: without -S it starts the guest itself). Waiting for
            # those events replaces polling query-migrate and query-status.
            with vm.qmp.recording("MIGRATION", "RESUME") as events:
                # The stream says whether RAM was skipped; both ends must agree.
                await vm.qmp.start_incoming(incoming, x_ignore_shared=True)
                # The agent's port must not be connected before its device state is
                # loaded: a connection made earlier is never served.
                running = await vm.await_or_exit(vm.qmp.wait_incoming(events, timeout), timeout,
                                                 "the incoming state")
                if not running:  # saved from a stopped VM: QEMU leaves it paused
                    await vm.qmp.cmd("cont")
                vm.timings.update(restore_phases(events, started_wall))
            reply = await vm.await_or_exit(vm.post_restore(POST_RESTORE_TIMEOUT, inputs),
                                           POST_RESTORE_TIMEOUT + 5,
                                           "the restored guest agent (post-restore call)")
            vm.timings["ready_s"] = time.monotonic() - started
            vm.note_guest_steps(reply)
        except BaseException:
            await vm.destroy()
            raise
        return vm

    def note_guest_steps(self, reply: Mapping[str, object]) -> None:
        """Keep the guest's own timing of its post-restore steps (``steps_us``, bounded)."""
        steps = reply.get("steps_us")
        if not isinstance(steps, dict):
            return
        self.guest_steps_us = {str(k)[:32]: int(v) for k, v in list(steps.items())[:16]
                               if isinstance(v, int) and 0 <= v < 10**9}
        self.timings["guest_hook_s"] = sum(self.guest_steps_us.values()) / 1e6

    async def post_restore(self, timeout: float,
                           inputs: RestoreInputs | None = None) -> messages.RestoredReply:
        """Tell a freshly restored guest to reseed its RNGs, step its clock and take ``inputs``.

        The call is idempotent, so it is sent again if unanswered after
        ``POST_RESTORE_RESEND`` seconds: on a loaded host a restored child has
        been seen to leave its first post-restore call unanswered. An agent too old
        for ``inputs`` (it would have ignored some) is a 409 (``forkd.guest.client.require``).
        """
        inputs = inputs or RestoreInputs()
        deadline = time.monotonic() + timeout
        attempt = 0
        while True:
            attempt += 1
            each = max(0.5, min(POST_RESTORE_RESEND, deadline - time.monotonic()))
            sent = time.monotonic()
            try:
                reply = await self.agent.restored(inputs, timeout=each)
                if clock_lag(reply, sent) > CLOCK_TOLERANCE_SECS:
                    await self.step_clock(max(1.0, deadline - time.monotonic()))
            except GuestError as exc:
                if not self.agent.connected or time.monotonic() >= deadline:
                    raise BootTimeout(
                        f"the restored guest agent did not answer its post-restore call "
                        f"({attempt} attempts in {timeout:.0f}s): {exc}\n{self.process.tail(lines=60)}"
                    ) from exc
                continue
            require(capabilities.Capabilities.of(reply), *capabilities.needed_by(inputs),
                    subject="the restored child")
            return reply

    async def step_clock(self, timeout: float) -> messages.RestoredReply:
        """Step the guest's clock to the host's, after a pause (nothing was cloned: no reseed).

        The guest sets the time it was sent: when its clock is still behind on the answer's
        arrival (a loaded host), the step is made again (now translated, it is quick).
        """
        for _ in range(CLOCK_STEPS):
            sent = time.monotonic()
            reply = await self.agent.step_clock(timeout)
            if clock_lag(reply, sent) <= CLOCK_TOLERANCE_SECS:
                break
        return reply

    @classmethod
    async def attach(cls, process: QemuProcess, config: VMConfig) -> VM:
        """Reconnect to a VM a previous daemon started (re-adoption)."""
        vm = cls(process, config, QMP(process.qmp_path, process.dir.name), AgentClient(process.agent_path))
        await vm.qmp.connect(timeout=5)
        await vm.agent.connect()
        return vm

    # ------------------------------------------------------------- snapshot

    async def save_template_state(self, state_path: Path, timeout: float = 60) -> float:
        """Stop and write device state only (RAM already lives in the shared mem file).

        The template must not run again afterwards: its RAM is the snapshot's memory.
        Returns the time taken in ms.
        """
        started = time.monotonic()
        # No "stop" first: the migration stops the vCPUs itself when it saves the
        # devices, and a state saved from a running VM makes QEMU start its children
        # as soon as they have loaded it (one QMP round trip fewer per child).
        await self.qmp.set_capabilities(x_ignore_shared=True)
        await self.qmp.run_migration("migrate", timeout, uri=exec_uri("cat >", state_path))
        return (time.monotonic() - started) * 1000

    # ------------------------------------------------------------ run state

    async def pause(self) -> None:
        """Stop the vCPUs (QMP ``stop``); memory and devices stay as they are."""
        await self.qmp.cmd("stop")

    async def resume(self) -> None:
        """Run the vCPUs again (QMP ``cont``)."""
        await self.qmp.cmd("cont")

    async def save_devices(self, path: Path) -> None:
        """Stop the vCPUs and write the device state alone, without RAM, to ``path``.

        QEMU's ``xen-save-devices-state`` (in every build, Xen or not) is the one way
        QEMU 7.2 has to leave out RAM that is not shared: a child's is private.
        ``live=False``: the disks stay active, so a failed hibernation can ``cont``.
        (``stop`` first flushes the disks, so a kill afterwards loses no write.)
        """
        await self.qmp.cmd("stop")
        await self.qmp.cmd("xen-save-devices-state", filename=str(path), live=False)

    async def is_paused(self) -> bool:
        """Whether QEMU reports the vCPUs stopped."""
        return await self.qmp.status() == "paused"

    async def migration_status(self) -> str | None:
        """QEMU's migration status ("active", "cancelling", "completed", ...); None before any."""
        status = (await self.qmp.cmd("query-migrate")).get("status")
        return status if isinstance(status, str) else None

    async def migrating(self) -> bool:
        """Whether a migration (a live branch copying RAM) is still in progress."""
        return await self.migration_status() in MIGRATION_ACTIVE

    async def cancel_migration(self) -> None:
        """Stop a migration in progress (a live branch that failed copying its disk)."""
        await self.qmp.cmd("migrate_cancel")

    # ------------------------------------------------------------- disk writes

    async def has_block_node(self, name: str) -> bool:
        """Whether QEMU's block graph has a node of this name (a branch's new overlay, after a cut)."""
        nodes: list[dict[str, Any]] = await self.qmp.cmd("query-named-block-nodes", flat=True)
        return any(node.get("node-name") == name for node in nodes)

    async def file_node(self, disk: Path) -> str:
        """The name of the protocol (``file``) node through which QEMU writes the image ``disk``."""
        nodes: list[dict[str, Any]] = await self.qmp.cmd("query-named-block-nodes", flat=True)
        for node in nodes:
            if node.get("drv") == "file" and node.get("file") == str(disk):
                return str(node["node-name"])
        raise VMError(f"QEMU has no file node for {disk}")

    async def limit_disk_writes(self, node: str, limit_bytes: int) -> None:
        """Have QEMU send ``WRITE_THRESHOLD_EVENT`` once the block node ``node`` is written past
        offset ``limit_bytes`` (one event, then the threshold is off until set again).

        For an image's protocol node (``file_node``) the offsets are the file's, so a qcow2
        image, which grows at its end, raises it once it grows past ``limit_bytes``; the format
        node's offsets would be the guest's.
        """
        await self.qmp.cmd("block-set-write-threshold", **{"node-name": node, "write-threshold": limit_bytes})

    @contextlib.contextmanager
    def disk_write_events(self) -> Iterator[EventListener]:
        """The ``WRITE_THRESHOLD_EVENT`` events that arrive while the block runs (``await .get()``)."""
        with self.qmp.recording(WRITE_THRESHOLD_EVENT) as events:
            yield events

    # ------------------------------------------------------------- teardown

    async def shutdown(self, timeout: float = 10) -> None:
        """Quit QEMU cleanly (flushes the disk), falling back to SIGKILL."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.qmp.cmd("quit"), 5)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.process.wait_exit(), timeout)
        await self.destroy()

    async def disconnect(self) -> None:
        """Close our connections and leave QEMU running (a later daemon re-attaches)."""
        await self.agent.close()
        await self.qmp.close()

    async def destroy(self) -> None:
        """Kill QEMU and close our connections. Safe to call more than once."""
        await self.disconnect()
        await self.process.kill()

    async def call(self, ask: Callable[[AgentClient], Awaitable[T]]) -> T:
        """One typed agent call (``ask``: one of ``AgentClient``'s, e.g. ``lambda a: a.sync(60)``),
        refused at once if QEMU is no longer running."""
        if not self.process.alive():
            raise GuestError(f"sandbox VM (pid {self.pid}) is not running")
        return await ask(self.agent)
