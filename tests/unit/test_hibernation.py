"""Hibernation's control flow without VMs: one wake for concurrent requests, a failed wake kept
for a retry, no hibernation under a request, and the idle policy's timing. A real
SandboxTable, agent gateway and registry; stand-ins for QEMU (tests/unit/test_idle.py's). The mechanics
(pages, device state, a new QEMU) are checked with real VMs in tests/integration/test_hibernate.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from forkd.config import DataDir
from forkd.controller.hibernation import Hibernator
from forkd.controller.snapshots import Forkable
from forkd.controller.templates import TemplateBuilder
from forkd.errors import Conflict, CorruptState, NotFound, VMError
from forkd.host.accel import Accel, VMConfig
from forkd.store.layout import SnapshotDir
from forkd.store.records import Hibernation, SandboxRecord, SnapshotRecord
from tests.unit.test_idle import Harness, StubVM, h, run

SB = "sb-000000-0000"


class NoDisks:
    async def limit(self, record: SandboxRecord) -> None:
        return None

    async def after_removed(self, record: SandboxRecord) -> None:
        return None




def hibernator(h: Harness) -> Hibernator:
    return Hibernator(h.table, h.agents, h.events, None, None, h.pauser, NoDisks(), None)  # type: ignore[arg-type]


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
        return await asyncio.gather(*(h.agents.call(SB, lambda agent: agent.ping(5)) for _ in range(3)))

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
        failed = await asyncio.gather(*(h.agents.call(SB, lambda agent: agent.ping(5)) for _ in range(2)),
                                      return_exceptions=True)
        assert all(isinstance(f, VMError) for f in failed), failed
        assert hib.hibernated(SB) and h.registry.sandboxes.get(SB).hibernation is not None
        assert hib.wake_failures == 1
        await h.agents.call(SB, lambda agent: agent.ping(5))  # the next request tries again

    run(main())
    assert len(attempts) == 2 and hib.wakes == 1


def test_a_request_to_a_sandbox_that_is_neither_running_nor_hibernated_is_404(h: Harness) -> None:
    hibernator(h)
    with pytest.raises(NotFound):
        run(h.agents.call("sb-000000-0009", lambda agent: agent.ping(5)))


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
        call = asyncio.create_task(h.agents.call(SB, lambda agent: agent.exec({"args": ["true"]}, 5)))
        await asyncio.sleep(0.01)
        assert h.agents.busy(SB)
        with pytest.raises(Conflict, match=r"requests .* under way"):
            await hib.hibernate(SB)
        assert vm.gate is not None
        vm.gate.set()
        await call
        assert not h.agents.busy(SB)

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
        call = asyncio.create_task(h.agents.call(SB, lambda agent: agent.exec({"args": ["true"]}, 5)))
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
        call = asyncio.create_task(h.agents.call(SB, lambda agent: agent.ping(5)))
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


def test_a_disk_only_hibernation_is_kept_in_its_row_and_old_rows_kept_memory(h: Harness) -> None:
    """The row says which kind it is (a restart wakes a disk-only one by a cold boot); rows written
    before disk-only hibernations existed read as memory-keeping ones."""
    h.add(SB)
    record = h.registry.sandboxes.get(SB)
    record.hibernation = Hibernation(at_unix=1.0, pages=0, memory_bytes=0, devices_bytes=0, pause_ms=3,
                                     memory=False)
    h.table.park(record)
    again = h.registry.sandboxes.get(SB)
    assert again.hibernation is not None and again.hibernation.memory is False
    assert again.info()["hibernation"]["memory"] is False and again.info()["state"] == "hibernated"
    old = {k: v for k, v in dataclasses.asdict(again.hibernation).items() if k != "memory"}
    assert Hibernation(**old).memory is True


def test_hibernation_files_are_checked_against_the_digests_taken_as_they_were_written(
        tmp_path: Path) -> None:
    """The file format's integrity: a flipped byte, a missing file or a missing digest is refused,
    naming the file; the untouched files pass."""
    from forkd.vmm import hibernation as mechanics

    (tmp_path / mechanics.DEVICES).write_bytes(b"QEVM" + bytes(range(256)) * 40)
    (tmp_path / mechanics.MEMORY).write_bytes(bytes(range(256)) * 4000)
    digests = {name: mechanics.digest(tmp_path / name) for name in (mechanics.DEVICES, mechanics.MEMORY)}
    mechanics.verify(tmp_path, digests)
    with open(tmp_path / mechanics.MEMORY, "r+b") as f:  # one bit, deep inside
        f.seek(500_000)
        byte = f.read(1)[0]
        f.seek(500_000)
        f.write(bytes([byte ^ 0x10]))
    with pytest.raises(CorruptState, match=f"{tmp_path / mechanics.MEMORY} does not match") as exc:
        mechanics.verify(tmp_path, digests)
    assert exc.value.status == 500
    with pytest.raises(CorruptState, match=f"{tmp_path / mechanics.DEVICES}: no digest"):
        mechanics.verify(tmp_path, {mechanics.MEMORY: digests[mechanics.MEMORY]})
    (tmp_path / mechanics.DEVICES).unlink()
    with pytest.raises(CorruptState, match=f"{tmp_path / mechanics.DEVICES}: cannot be read"):
        mechanics.verify(tmp_path, digests)


def test_a_wake_from_a_changed_file_is_refused_and_it_stays_hibernated(h: Harness, tmp_path: Path) -> None:
    """The controller checks before it makes anything (cgroup, network, QEMU): the request gets the
    500 naming the file, and the row and the files stay for a retry or a kill."""
    from forkd.controller.hibernation import SAVED_DIR
    from forkd.vmm import hibernation as mechanics

    hib = hibernator(h)
    hib._store = SimpleNamespace(forkable=lambda tag: SimpleNamespace(dir=None))  # type: ignore[assignment]
    put_to_sleep(h, hib)
    record = h.registry.sandboxes.get(SB)
    record.dir = str(tmp_path)  # the harness's run dirs are not on disk
    saved = tmp_path / SAVED_DIR
    saved.mkdir()
    for name in (mechanics.DEVICES, mechanics.MEMORY):
        (saved / name).write_bytes(name.encode() * 1000)
    assert record.hibernation is not None
    names = (mechanics.DEVICES, mechanics.MEMORY)
    record.hibernation.digests = {n: mechanics.digest(saved / n) for n in names}
    h.registry.sandboxes.save(record)
    assert h.registry.sandboxes.get(SB).hibernation == record.hibernation  # the digests are kept
    (saved / mechanics.DEVICES).write_bytes(b"X" + (saved / mechanics.DEVICES).read_bytes()[1:])

    with pytest.raises(CorruptState, match=f"{saved / mechanics.DEVICES} does not match"):
        run(h.agents.call(SB, lambda agent: agent.ping(5)))
    assert hib.hibernated(SB) and h.registry.sandboxes.get(SB).hibernation is not None
    assert hib.wake_failures == 1 and SB not in h.table
    assert sorted(p.name for p in saved.iterdir()) == sorted(names)


def make_image(data: DataDir, name: str, key: str) -> None:
    d = data.images / name
    d.mkdir(parents=True)
    (d / "image.json").write_text(json.dumps({"key": key}))
    for f in ("vmlinux", "initramfs.img", "rootfs.ext4"):
        (d / f).write_bytes(b"x")


def make_snapshot(data: DataDir, tag: str, meta: dict[str, Any]) -> Forkable:
    sdir = SnapshotDir(data.snapshots / tag)
    sdir.path.mkdir(parents=True)
    sdir.write_meta({"tag": tag, **meta})
    config = VMConfig(512, 1, Accel.tcg())
    return Forkable(SnapshotRecord(tag=tag, dir=str(sdir.path), created_at_unix=1), sdir, config,
                    meta.get("tap"), tuple(meta.get("dns") or ()))


def test_a_cold_boot_uses_what_the_template_booted_through_its_branches(tmp_path: Path) -> None:
    """A disk-only wake boots the kernel its template booted (found through the branches, which
    name only the image), the image's initramfs, the same warm imports and guest network; a
    rebuilt or missing image is a 409 (checked before the sandbox is stopped)."""
    data = DataDir(tmp_path)
    make_image(data, "default", "k1")
    custom = tmp_path / "custom-vmlinux"
    custom.write_bytes(b"x")
    make_snapshot(data, "base", {"image": {"name": "default", "key": "k1"}, "kernel": str(custom),
                                 "warm_imports": ["json"], "parent_tag": None, "tap": "forkd-tap0",
                                 "dns": ["9.9.9.9"]})
    fork = make_snapshot(data, "fork-1", {"image": {"name": "default", "key": "k1"}, "parent_tag": "base",
                                          "warm_imports": ["json"], "tap": "forkd-tap0", "dns": ["9.9.9.9"]})
    store = SimpleNamespace(dir=lambda tag: SnapshotDir(data.snapshots / tag))
    builder = TemplateBuilder(data, store, None, None, None, None)  # type: ignore[arg-type]
    boot = builder.cold_boot(fork)
    assert boot.kernel == custom and boot.initrd == data.images / "default" / "initramfs.img"
    assert "forkd.warm=json" in boot.append and "forkd.net=" in boot.append and "9.9.9.9" in boot.append
    # No kernel named anywhere: the image's own.
    plain = make_snapshot(data, "plain", {"image": {"name": "default", "key": "k1"}, "warm_imports": []})
    assert builder.cold_boot(plain).kernel == data.images / "default" / "vmlinux"
    assert "forkd.net=" not in builder.cold_boot(plain).append
    rebuilt = make_snapshot(data, "old", {"image": {"name": "default", "key": "k0"}})
    with pytest.raises(Conflict, match="rebuilt"):
        builder.cold_boot(rebuilt)
    gone = make_snapshot(data, "gone", {"image": {"name": "nosuch", "key": "k1"}})
    with pytest.raises(Conflict, match="gone"):
        builder.cold_boot(gone)
    with pytest.raises(Conflict, match="names no guest image"):
        builder.cold_boot(make_snapshot(data, "bare", {}))
