"""Hibernation's control flow without VMs: one wake for concurrent requests, a failed wake kept
for a retry, no hibernation under a request, and the idle policy's timing. A real
SandboxTable and registry; stand-ins for QEMU (tests/unit/test_idle.py's). The mechanics
(pages, device state, a new QEMU) are checked with real VMs in tests/integration/test_hibernate.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from forkd.controller.hibernation import Hibernator
from forkd.errors import Conflict, NotFound, VMError
from forkd.store.records import Hibernation, SandboxRecord
from tests.unit.test_idle import Harness, StubVM, h, run

SB = "sb-000000-0000"


class NoDisks:
    async def limit(self, record: SandboxRecord) -> None:
        return None

    async def after_removed(self, record: SandboxRecord) -> None:
        return None




def hibernator(h: Harness) -> Hibernator:
    hib = Hibernator(h.table, None, None, h.pauser, NoDisks())  # type: ignore[arg-type]
    h.table.wake_with(hib)
    h.table.on_removed(hib.after_removed)
    return hib


def put_to_sleep(h: Harness, hib: Hibernator, sb_id: str = SB) -> StubVM:
    """What a hibernation leaves: the row hibernated, no VM in the table."""
    vm = h.add(sb_id)
    record = h.registry.sandboxes.get(sb_id)
    record.hibernation = Hibernation(at_unix=1.0, pages=10, memory_bytes=4096, devices_bytes=100, pause_ms=5)
    record.pid = None
    assert h.table.park(record) is vm
    hib._asleep[sb_id] = 4196  # as hibernate() records it
    return StubVM(vm.dir, log=vm.log)


def test_concurrent_requests_share_one_wake_and_then_proceed(h: Harness) -> None:
    hib = hibernator(h)
    woken = put_to_sleep(h, hib)
    restarts: list[str] = []

    async def restart(record: SandboxRecord) -> SandboxRecord:
        restarts.append(record.id)
        await asyncio.sleep(0.05)  # the others arrive meanwhile
        record.hibernation = None
        h.table.unpark(record, woken)  # type: ignore[arg-type]
        hib._asleep.pop(record.id, None)
        return record

    hib._restart = restart  # type: ignore[method-assign]

    async def main() -> list[Any]:
        assert hib.counts()["hibernated"] == 1
        with pytest.raises(Conflict, match="hibernated"):
            h.table.get(SB)  # a direct lookup says so rather than "not alive"
        return await asyncio.gather(*(h.table.call(SB, "ping", 5) for _ in range(3)))

    assert len(run(main())) == 3
    assert restarts == [SB] and hib.wakes == 1
    assert woken.log.count("agent:ping") == 3
    assert h.registry.sandboxes.get(SB).hibernation is None and hib.counts()["hibernated"] == 0


def test_a_failed_wake_fails_its_requests_and_leaves_it_hibernated_for_the_next(h: Harness) -> None:
    hib = hibernator(h)
    woken = put_to_sleep(h, hib)
    attempts: list[int] = []

    async def restart(record: SandboxRecord) -> SandboxRecord:
        attempts.append(1)
        if len(attempts) == 1:
            raise VMError("QEMU exited while loading the hibernated device state")
        record.hibernation = None
        h.table.unpark(record, woken)  # type: ignore[arg-type]
        hib._asleep.pop(record.id, None)
        return record

    hib._restart = restart  # type: ignore[method-assign]

    async def main() -> None:
        failed = await asyncio.gather(*(h.table.call(SB, "ping", 5) for _ in range(2)),
                                      return_exceptions=True)
        assert all(isinstance(f, VMError) for f in failed), failed
        assert hib.hibernated(SB) and h.registry.sandboxes.get(SB).hibernation is not None
        assert hib.wake_failures == 1
        await h.table.call(SB, "ping", 5)  # the next request tries again

    run(main())
    assert len(attempts) == 2 and hib.wakes == 1


def test_a_request_to_a_sandbox_that_is_neither_running_nor_hibernated_is_404(h: Harness) -> None:
    hibernator(h)
    with pytest.raises(NotFound):
        run(h.table.call("sb-000000-0009", "ping", 5))


def test_killing_a_hibernated_sandbox_forgets_it(h: Harness) -> None:
    hib = hibernator(h)
    put_to_sleep(h, hib)
    run(h.table.kill(SB))
    assert not hib.hibernated(SB) and not h.registry.sandboxes.has(SB)


def test_no_hibernation_while_a_request_is_under_way(h: Harness) -> None:
    hib = hibernator(h)
    vm = h.add(SB)
    vm.gate = asyncio.Event()
    vm.agent = SimpleNamespace(in_flight=0)  # type: ignore[attr-defined]  # nothing else on its connection

    async def main() -> None:
        call = asyncio.create_task(h.table.call(SB, "exec", 5))
        await asyncio.sleep(0.01)
        assert h.table.busy(SB)
        with pytest.raises(Conflict, match=r"requests .* under way"):
            await hib.hibernate(SB)
        assert vm.gate is not None
        vm.gate.set()
        await call
        assert not h.table.busy(SB)

    run(main())
    assert "stop" not in vm.log


def test_a_live_fork_sandbox_is_refused_with_the_reason(h: Harness) -> None:
    hib = hibernator(h)
    h.add(SB)
    record = h.registry.sandboxes.get(SB)
    record.live_fork = True
    h.registry.sandboxes.save(record)
    with pytest.raises(Conflict, match=r"live_fork .* shared memory"):
        run(hib.hibernate(SB))


def test_the_idle_policy_hibernates_after_its_limit_and_never_under_a_request(h: Harness) -> None:
    asked: list[str] = []

    async def hibernate(sb_id: str) -> None:
        asked.append(sb_id)

    h.pauser.hibernate_with(hibernate)
    vm = h.add(SB)
    h.add("sb-000000-0001")  # no policy
    h.pauser.apply_hibernate([h.registry.sandboxes.get(SB)], 60)
    assert h.registry.sandboxes.get(SB).idle_hibernate_secs == 60  # kept for a restart

    async def main() -> None:
        h.clock.now += 59
        assert await h.pauser.hibernate_due() == [] and h.pauser.next_sleep() == pytest.approx(1)
        vm.gate = asyncio.Event()
        call = asyncio.create_task(h.table.call(SB, "exec", 5))
        await asyncio.sleep(0.01)
        h.clock.now += 5
        assert await h.pauser.hibernate_due() == []  # a request is in flight
        vm.gate.set()
        await call
        h.clock.now += 59
        assert await h.pauser.hibernate_due() == []  # idle from the end of that request
        h.clock.now += 1
        assert await h.pauser.hibernate_due() == [SB]

    run(main())
    assert asked == [SB]


def test_an_idle_hibernation_that_fails_is_tried_one_period_later(h: Harness) -> None:
    async def hibernate(sb_id: str) -> None:
        raise Conflict("busy")

    h.pauser.hibernate_with(hibernate)
    h.add(SB)
    h.pauser.apply_hibernate([h.registry.sandboxes.get(SB)], 10)

    async def main() -> None:
        h.clock.now += 10
        assert await h.pauser.hibernate_due() == []
        assert h.pauser.next_sleep() == pytest.approx(10)

    run(main())


def test_pause_and_hibernate_policies_together(h: Harness) -> None:
    asked: list[str] = []

    async def hibernate(sb_id: str) -> None:
        asked.append(sb_id)

    h.pauser.hibernate_with(hibernate)
    vm = h.add(SB)
    record = h.registry.sandboxes.get(SB)
    h.pauser.apply([record], 5)
    h.pauser.apply_hibernate([record], 30)

    async def main() -> None:
        h.clock.now += 5
        assert await h.pauser.pause_due() == [SB] and "stop" in vm.log
        assert h.pauser.next_sleep() == pytest.approx(25)  # paused, and due for hibernation later
        h.clock.now += 25
        assert await h.pauser.hibernate_due() == [SB]

    run(main())
    assert asked == [SB]


def test_a_request_that_waited_out_a_hibernation_wakes_the_sandbox(h: Harness) -> None:
    hib = hibernator(h)
    vm = h.add(SB)
    woken = StubVM(vm.dir)

    async def restart(record: SandboxRecord) -> SandboxRecord:
        record.hibernation = None
        h.table.unpark(record, woken)  # type: ignore[arg-type]
        hib._asleep.pop(record.id, None)
        return record

    hib._restart = restart  # type: ignore[method-assign]

    async def main() -> None:
        lock = h.table.lock(SB)
        await lock.acquire()  # a hibernation holds the lock...
        call = asyncio.create_task(h.table.call(SB, "ping", 5))
        await asyncio.sleep(0.01)  # ...while the request waits for it
        record = h.registry.sandboxes.get(SB)
        record.hibernation = Hibernation(at_unix=1.0, pages=1, memory_bytes=1, devices_bytes=1, pause_ms=1)
        h.table.park(record)
        hib._asleep[SB] = 2
        lock.release()
        await call

    run(main())
    assert "agent:ping" not in vm.log and woken.log == ["agent:ping"] and hib.wakes == 1


__all__ = ["h"]  # the idle tests' harness fixture, shared
