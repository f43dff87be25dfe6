"""The agent gateway: the one typed path from a sandbox id to its guest agent.

Every request to a guest (exec, eval, files, processes, code cells, watches,
ping, and the relays of api/port_proxy.py) goes through ``AgentGateway``,
which does the bookkeeping around it, in this order:

* the id is resolved through the table (``SandboxTable.resolve``: a promote's
  alias, 404 for a pool member or a sandbox being killed);
* the request counts as under way from before its VM lookup until it ends
  (``busy``: hibernation must not cut it off);
* a hibernated sandbox is woken first (``SandboxEvents.wake``), and the request
  waits out a branch's pause window or a kill (the sandbox's lock, not held while
  the guest works, so a long exec never delays a branch or a kill);
* it runs inside the activity watcher (``SandboxEvents.during``: a sandbox paused
  for being idle resumes first, and its idle clock waits);
* a guest error is explained: a reset agent connection of a QEMU that died or was
  killed becomes that death or kill, by id (``explain``).

It keeps no sandbox state of its own beyond requests in flight and each VM's
agent capabilities (asked once per VM).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TypeVar

from forkd.controller.sandbox_events import SandboxEvents
from forkd.controller.sandboxes import SandboxTable
from forkd.errors import GuestError, NotFound, SandboxGone
from forkd.guest.capabilities import CAP_USER, Capabilities
from forkd.guest.client import AgentClient, AgentStream, require
from forkd.store.records import SandboxRecord
from forkd.vmm.machine import VM
from forkd.vmm.process import pid_is_qemu

T = TypeVar("T")

# How often a request wakes a sandbox that is hibernated again before the request gets to it.
WAKE_ROUNDS = 3


class AgentGateway:
    def __init__(self, table: SandboxTable, events: SandboxEvents) -> None:
        self._table = table
        self._events = events
        # Agent requests under way per sandbox, from before their VM lookup (``busy``).
        self._requests: dict[str, int] = {}
        # Each VM's agent capabilities, asked once (``require_agent``), with (a weak reference to)
        # its VM: a new VM (a wake, a restart) asks again, and a VM gone keeps nothing alive.
        self._capabilities: dict[str, tuple[weakref.ref[VM], Capabilities]] = {}
        events.on_removed(self._forget)

    async def _forget(self, record: SandboxRecord) -> None:
        self._capabilities.pop(record.id, None)

    def resolve(self, sandbox_id: str) -> str:
        """The id ``sandbox_id`` stands for now (``SandboxTable.resolve``)."""
        return self._table.resolve(sandbox_id)

    # --------------------------------------------------------------- the VM

    async def for_call(self, sandbox_id: str) -> VM:
        """The VM, woken if hibernated, once no branch pause or kill of it is in progress."""
        sandbox_id = self._table.resolve(sandbox_id)
        for _ in range(WAKE_ROUNDS):
            if sandbox_id not in self._table:
                await self._events.wake(sandbox_id)  # a hibernated sandbox runs again first
            if sandbox_id not in self._table:
                raise NotFound(f"sandbox {sandbox_id!r} is not alive")
            async with self._table.lock(sandbox_id):
                if sandbox_id in self._table:
                    return self._table.get(sandbox_id)
            # Hibernated (or killed) while we waited for its lock: wake it (or say 404).
        return self._table.get(sandbox_id)

    @contextlib.asynccontextmanager
    async def relaying(self, sandbox_id: str) -> AsyncIterator[SandboxRecord]:
        """Around traffic the daemon relays to one of the sandbox's ports (api/port_proxy.py): it is
        woken or resumed first, and until the relay ends it counts as busy (no idle hibernation cuts
        the stream) and as in use (its idle clock waits)."""
        sandbox_id = self._table.resolve(sandbox_id)
        with self._request(sandbox_id):
            await self.for_call(sandbox_id)
            async with self._events.during(sandbox_id):
                yield self._table.records.get(sandbox_id)

    def busy(self, sandbox_id: str) -> bool:
        """Whether a request to ``sandbox_id`` is under way (looking its VM up, awaiting an answer
        or streaming): a hibernation now would cut it off."""
        vm = self._table.vm(sandbox_id)
        return self._requests.get(sandbox_id, 0) > 0 or (vm is not None and vm.agent.in_flight > 0)

    @contextlib.contextmanager
    def _request(self, sandbox_id: str) -> Iterator[None]:
        self._requests[sandbox_id] = self._requests.get(sandbox_id, 0) + 1
        try:
            yield
        finally:
            left = self._requests[sandbox_id] - 1
            if left:
                self._requests[sandbox_id] = left
            else:
                del self._requests[sandbox_id]

    # ----------------------------------------------------------------- calls

    async def call(self, sandbox_id: str, ask: Callable[[AgentClient], Awaitable[T]]) -> T:
        """One typed agent request: ``ask`` is one of ``AgentClient``'s calls, e.g.
        ``lambda agent: agent.proc_info({"pid": pid}, 30)``, and its reply has been checked against
        its type (a malformed one is a GuestError). A QEMU that died before the event loop reaped
        it shows up as a reset agent connection; report that as the sandbox's death, by id. A
        sandbox paused because it was idle is resumed first (``SandboxEvents.during``)."""
        sandbox_id = self._table.resolve(sandbox_id)
        with self._request(sandbox_id):
            vm = await self.for_call(sandbox_id)  # a dead QEMU: its GuestError says so already
            try:
                async with self._events.during(sandbox_id):
                    return await vm.call(ask)
            except GuestError as exc:
                explained = self.explain(sandbox_id, exc, vm)
                if explained is exc:
                    raise
                raise explained from exc

    async def require_agent(self, sandbox_id: str, *features: str) -> None:
        """Refuse (409) a request that needs capabilities (guest/capabilities.py's ``CAP_*``) its guest agent
        lacks, which would ignore the request's new fields (a snapshot made by an older forkd): the
        agent is asked once per VM (ping), and ``forkd.guest.client.require`` refuses."""
        sandbox_id = self._table.resolve(sandbox_id)
        require(await self.capabilities(sandbox_id), *features, subject=f"sandbox {sandbox_id!r}")

    async def capabilities(self, sandbox_id: str) -> Capabilities:
        """What the sandbox's guest agent can do, asked once per VM (ping)."""
        sandbox_id = self._table.resolve(sandbox_id)
        vm = await self.for_call(sandbox_id)
        known = self._capabilities.get(sandbox_id)
        if known is None or known[0]() is not vm:
            agent = await self.call(sandbox_id, lambda client: client.capabilities(30))
            known = (weakref.ref(vm), agent)
            self._capabilities[sandbox_id] = known
        return known[1]

    async def require_user_support(self, sandbox_id: str, user: str | None) -> None:
        """``require_agent`` for a request that acts as ``user`` (None: as root, any agent will do)."""
        if user is not None:
            await self.require_agent(sandbox_id, CAP_USER)

    async def stream(self, sandbox_id: str,
                     open_: Callable[[AgentClient], Awaitable[AgentStream]]) -> AgentStream:
        """A typed streaming agent request (``open_``: one of ``AgentClient``'s streaming calls,
        e.g. ``lambda agent: agent.proc_attach({"pid": pid})``); its events are read from the stream."""
        sandbox_id = self._table.resolve(sandbox_id)
        with self._request(sandbox_id):  # then the agent counts it, until it ends (``busy``)
            vm = await self.for_call(sandbox_id)
            try:
                return await open_(vm.agent)
            except GuestError as exc:
                explained = self.explain(sandbox_id, exc, vm)
                if explained is exc:
                    raise
                raise explained from exc

    def notify(self, sandbox_id: str, send: Callable[[AgentClient], None]) -> None:
        """A fire-and-forget agent request (``send``: one of ``AgentClient``'s notifications); no
        answer, no wait; dropped if the VM is gone."""
        vm = self._table.vm(sandbox_id)
        if vm is not None:
            send(vm.agent)

    def explain(self, sandbox_id: str, exc: GuestError, vm: VM | None = None) -> GuestError:
        """``exc`` as it is, or as the sandbox's death or kill if that is what broke the call (or
        stream) to ``vm`` (None: the sandbox's VM now; none at all, it was killed)."""
        if vm is None:
            vm = self._table.vm(sandbox_id)
            if vm is None:
                return SandboxGone(f"sandbox {sandbox_id!r} was killed")
        name = vm.process.dir.name
        if name not in self._table:
            return SandboxGone(f"sandbox {sandbox_id!r} was killed")
        if vm.process.alive() and pid_is_qemu(vm.pid, vm.process.dir):
            return exc
        return SandboxGone(f"sandbox {sandbox_id!r} has died ({self._table.death_cause(name)}); "
                           "kill it to clean up")


__all__ = ["WAKE_ROUNDS", "AgentGateway"]
