"""The live-sandbox table: every running VM this daemon drives, one lock each.

It is the only owner of the ``sandbox id → VM`` map and of tearing a sandbox
down. Each sandbox has one ``asyncio.Lock``:

* BRANCH holds it for the source's pause window and disk cut;
* kill holds it while it tears the sandbox down, so a kill that arrives
  during a branch waits for the pause window to end and never leaves a paused
  or orphaned QEMU behind;
* exec/eval/ping and process streams take it only to look the VM up
  (``AgentGateway.for_call``, controller/agent_gateway.py): they wait out a pause
  or a kill in progress, but do not hold it while the guest works, so a long
  exec never delays a branch or a kill.

Ids go through ``resolve`` first: after a promote with ``replace_parent`` the
source's id names the winner in every lookup. The table tells ``SandboxEvents``
(controller/sandbox_events.py) when a sandbox goes away and before a kill;
whoever must react (the fork collector, the pool keeper, ...) subscribes there.
Requests to the guest agents are the ``AgentGateway``'s, not the table's.

Warm-pool members (``SandboxRecord.pooled``) are live VMs like any other, so
teardown, shutdown and recovery treat them alike, but they are *hidden*: every
lookup by id (``resolve``) says 404 for them until the pool keeper ``reveal``s
one to the spawn that claimed it. Only the keeper tears them down (``discard``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from pathlib import Path

from forkd.controller.sandbox_events import SandboxEvents
from forkd.errors import Conflict, GuestError, NotFound
from forkd.host import cgroups
from forkd.store import layout
from forkd.store.layout import check_sandbox_id
from forkd.store.records import SandboxRecord
from forkd.store.rows.aliases import AliasReader
from forkd.store.rows.prefixes import PrefixRows
from forkd.store.rows.sandboxes import SandboxReader, SandboxRows
from forkd.vmm import console
from forkd.vmm.machine import VM
from forkd.vmm.process import kill_pid_now

log = logging.getLogger("forkd.sandboxes")

# In a run directory: why forkd itself stopped the sandbox's QEMU (``SandboxTable.stop``).
STOPPED_FILE = "stopped-reason"


async def remove_cgroup(path: str | None, extra: list[str] | None = None) -> None:
    """Remove a sandbox's cgroup: ``path`` and, on v1, its other hierarchies' directories."""
    if path:
        await asyncio.to_thread(cgroups.handle_for(path, tuple(extra or ())).remove)


class SandboxTable:
    def __init__(self, rows: SandboxRows, aliases: AliasReader, prefixes: PrefixRows,
                 sandboxes_dir: Path, events: SandboxEvents) -> None:
        self._rows = rows  # the sandboxes table: only this owner inserts, rewrites or deletes rows
        self._aliases = aliases
        self._prefixes = prefixes
        self._dir = sandboxes_dir
        self._vms: dict[str, VM] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._hidden: set[str] = set()  # pool members nobody has claimed yet
        # Sandboxes being killed: gone to every lookup before their QEMU (and so their streams)
        # ends, so a client that asks after its stream broke hears "not found", not "healthy".
        self._dying: set[str] = set()
        self._events = events  # told of every teardown, and before every kill

    def new_batch_prefix(self, host_id: str | None = None) -> str:
        """A prefix for a spawn batch's ids that this data dir never issued before."""
        for _ in range(64):
            prefix = layout.new_batch_prefix(host_id)
            if self._prefixes.claim(prefix):
                return prefix
        # 64 draws of 24 bits all taken: the data dir has issued millions of batches.
        raise Conflict("could not find a sandbox id prefix this data dir has not used: "
                       "start a new data dir")

    # ----------------------------------------------------------------- lookups

    @property
    def records(self) -> SandboxReader:
        """Every sandbox's row, read-only (pool members included)."""
        return self._rows

    def __contains__(self, sandbox_id: object) -> bool:
        return sandbox_id in self._vms

    def resolve(self, sandbox_id: str) -> str:
        """The id ``sandbox_id`` stands for now (itself unless a promote replaced it)."""
        check_sandbox_id(sandbox_id)
        if sandbox_id in self._hidden or sandbox_id in self._dying:
            raise NotFound(f"sandbox {sandbox_id!r} is not alive")
        if sandbox_id in self._vms:
            return sandbox_id
        return self._aliases.resolve(sandbox_id)

    def hidden(self, sandbox_id: str) -> bool:
        """Whether ``sandbox_id`` is an unclaimed pool member."""
        return sandbox_id in self._hidden

    def ids(self) -> list[str]:
        return list(self._vms)

    def vm(self, sandbox_id: str) -> VM | None:
        """The VM of ``sandbox_id`` as it is, alive or not (None if unknown)."""
        return self._vms.get(sandbox_id)

    def get(self, sandbox_id: str) -> VM:
        """The live VM of ``sandbox_id``: 404 if unknown, 502 if its QEMU died."""
        sandbox_id = self.resolve(sandbox_id)
        vm = self._vms.get(sandbox_id)
        if vm is None:
            record = self._rows.get(sandbox_id)  # 404 if there is no such sandbox
            if record.hibernation is not None:
                raise Conflict(f"sandbox {sandbox_id!r} is hibernated; a request to it (exec, eval, "
                               "files, processes, ping) wakes it")
            raise NotFound(f"sandbox {sandbox_id!r} is not alive")
        if not vm.process.alive():
            raise GuestError(f"sandbox {sandbox_id!r} has died ({self.death_cause(sandbox_id)}); "
                             "kill it to clean up")
        return vm

    def death_cause(self, sandbox_id: str) -> str:
        """Why a dead sandbox's QEMU exited, as far as its cgroup tells (it still exists:
        only teardown removes it)."""
        try:
            record = self._rows.get(sandbox_id)
        except NotFound:
            record = None
        if record is not None:
            with contextlib.suppress(OSError):
                return (Path(record.dir) / STOPPED_FILE).read_text().strip()
        if record is not None and record.cgroup:
            handle = cgroups.handle_for(record.cgroup, tuple(record.cgroup_extra))
            if handle.oom_kills() > 0:
                return (f"killed by its memory limit (OOM) of {record.memory_limit_mib} MiB"
                        if record.memory_limit_mib else "killed by a memory limit (OOM)")
        return "its QEMU exited"

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    # --------------------------------------------------------------- changes

    def add(self, record: SandboxRecord, vm: VM) -> None:
        """A restored child: in the table and the registry, in that order (hidden if pooled)."""
        if record.pooled:
            self._hidden.add(record.id)
        self._vms[record.id] = vm
        self._rows.insert(record)

    def adopt(self, sandbox_id: str, vm: VM, *, pooled: bool = False) -> None:
        """A VM a previous daemon left running (already in the registry)."""
        if pooled:
            self._hidden.add(sandbox_id)
        self._vms[sandbox_id] = vm

    def park(self, record: SandboxRecord) -> VM | None:
        """A sandbox goes to disk (controller/hibernation.py; the caller holds its lock): its
        row rewritten (hibernated, no pid), then its VM out of the table, returned to be killed.
        The row is the commit: a daemon that dies after it keeps the sandbox hibernated."""
        self._rows.save(record)
        return self._vms.pop(record.id, None)

    def unpark(self, record: SandboxRecord, vm: VM) -> None:
        """A hibernated sandbox runs again in ``vm`` (the caller holds its lock): row, then table."""
        self._rows.save(record)
        self._vms[record.id] = vm

    def forget(self, sandbox_id: str) -> None:
        """Drop the row of a sandbox that did not survive a restart (recovery reaped it)."""
        self._rows.delete(sandbox_id)

    def reveal(self, record: SandboxRecord) -> None:
        """A claimed pool member becomes an ordinary sandbox: its row rewritten, then visible."""
        record.pooled = False
        self._rows.save(record)
        self._hidden.discard(record.id)

    async def stop(self, sandbox_id: str, reason: str) -> None:
        """Kill a sandbox's QEMU but keep the sandbox, dead, until someone kills it: every
        call then answers 502 with ``reason`` (as an OOM kill by its memory limit does)."""
        vm = self._vms.get(sandbox_id)
        if vm is None:
            return
        vm.process.freeze()  # before waiting for the lock: a disk over its quota stops growing now
        async with self.lock(sandbox_id):
            if self._vms.get(sandbox_id) is not vm:
                return  # killed meanwhile
            with contextlib.suppress(OSError):  # first: a daemon that dies now still knows why
                (vm.process.dir / STOPPED_FILE).write_text(reason + "\n")
            log.warning("stopping sandbox %s: %s", sandbox_id, reason)
            await vm.process.kill()  # first: calls in flight then fail as the death, with the reason
            await vm.destroy()

    async def detach_all(self) -> None:
        """Forget every VM but leave it running, for the next daemon to re-adopt."""
        for vm in self._vms.values():
            await vm.disconnect()
        self._vms.clear()
        self._hidden.clear()

    async def kill(self, sandbox_id: str) -> None:
        """Tear a sandbox down; waits for a branch of it to finish its pause window."""
        sandbox_id = self.resolve(sandbox_id)
        if sandbox_id not in self._vms and not self._rows.has(sandbox_id):
            raise NotFound(f"sandbox {sandbox_id!r} is not alive")
        await self._events.killing(sandbox_id)
        async with self.lock(sandbox_id):
            await self.kill_locked(sandbox_id)

    async def discard(self, sandbox_id: str) -> None:
        """Tear down a pool member (hidden, so ``kill``'s lookup would not find it)."""
        async with self.lock(sandbox_id):
            await self.kill_locked(sandbox_id)

    async def kill_locked(self, sandbox_id: str) -> None:
        """Tear down a sandbox whose lock the caller holds (or that no one else knows)."""
        self._dying.add(sandbox_id)  # first: gone before its QEMU's streams end
        try:
            vm = self._vms.pop(sandbox_id, None)
            self._hidden.discard(sandbox_id)
            try:
                record: SandboxRecord | None = self._rows.get(sandbox_id)
            except NotFound:
                record = None
            if vm is not None:
                await vm.destroy()
            elif record is not None:
                kill_pid_now(record.pid or 0, Path(record.dir))
            if record is not None:
                await remove_cgroup(record.cgroup, record.cgroup_extra)
            self._rows.delete(sandbox_id)
            console.keep_for_debugging(self._dir / sandbox_id)
        finally:
            self._dying.discard(sandbox_id)
        shutil.rmtree(self._dir / sandbox_id, ignore_errors=True)
        # Whoever holds or waits for the lock keeps their reference; a later
        # lookup finds no sandbox, so no new lock is ever needed for this id.
        self._locks.pop(sandbox_id, None)
        if record is not None:
            await self._events.removed(record)

    async def kill_all(self) -> None:
        # discard, not kill: pool members are hidden from kill's lookup but must go too.
        await asyncio.gather(*(self.discard(i) for i in self.ids()), return_exceptions=True)
