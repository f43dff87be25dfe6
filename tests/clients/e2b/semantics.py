"""E2B's semantics where its own SDK tests caught forkd out (issue 20), as an E2B user meets them:
newest-first listing, removing what is not there, a symbolic link's target and the owner of a
file, metrics, a command's timeout (sync and async), and a sandbox killed while a command runs."""

import asyncio
import time

from e2b import AsyncSandbox, FileType, Sandbox, SandboxNotRunningException, TimeoutException


def sleepers(sbx: Sandbox) -> list[str]:
    """The `sleep 8` commands still running, once the server has had a moment to kill them (the
    SDK's own deadline may fire a little before the server's)."""
    deadline = time.monotonic() + 3
    while True:
        left = [" ".join([p.cmd, *p.args]) for p in sbx.commands.list() if "sleep 8" in " ".join(p.args)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


with Sandbox.create() as older, Sandbox.create() as newer:
    # Newest first, as E2B's API lists; asc on request.
    listed = [s.sandbox_id for s in Sandbox.list().next_items()]
    assert listed.index(newer.sandbox_id) < listed.index(older.sandbox_id), listed
    ascending = [s.sandbox_id for s in Sandbox.list(order="asc").next_items()]
    assert ascending.index(older.sandbox_id) < ascending.index(newer.sandbox_id), ascending

    # Removing what is not there is done.
    older.files.remove("/tmp/never/there.txt")

    # A symbolic link says where it leads (envd marks it is_symlink, which this SDK shows as the
    # SYMLINK type; its size is the target's); entries have owners: E2B's default user wrote them.
    older.files.write("/tmp/links/target.txt", "abc")
    older.commands.run("ln -s target.txt link.txt", cwd="/tmp/links")
    info = older.files.get_info("/tmp/links/link.txt")
    assert info.type == FileType.SYMLINK and info.symlink_target == "/tmp/links/target.txt", info
    assert info.size == 3, info
    assert (info.owner, info.group) == ("user", "user"), info
    entries = {e.name: e for e in older.files.list("/tmp/links")}
    assert entries["link.txt"].symlink_target == "/tmp/links/target.txt", entries
    assert entries["target.txt"].symlink_target is None and entries["target.txt"].owner == "user", entries

    # Metrics: a sample taken in the guest.
    [metric] = older.get_metrics()
    assert metric.cpu_count >= 1 and 0 <= metric.cpu_used_pct <= 100, metric
    assert 0 < metric.mem_used < metric.mem_total and 0 < metric.disk_used < metric.disk_total, metric

    # A command's timeout ends the call then, and the command with it.
    started = time.monotonic()
    try:
        older.commands.run("sleep 8", timeout=2)
        raise AssertionError("commands.run(timeout=2) of sleep 8 did not raise")
    except TimeoutException:
        pass
    took = time.monotonic() - started
    assert took < 6, took
    assert sleepers(older) == []

    async def async_timeout() -> float:
        sbx = await AsyncSandbox.connect(older.sandbox_id)
        started = time.monotonic()
        try:
            await sbx.commands.run("sleep 8", timeout=2)
            raise AssertionError("the async commands.run(timeout=2) of sleep 8 did not raise")
        except TimeoutException:
            pass
        return time.monotonic() - started

    took = asyncio.run(async_timeout())
    assert took < 6, took
    assert sleepers(older) == []

    # A sandbox killed while a command runs: the SDK says the sandbox is not running.
    handle = newer.commands.run("sleep 60", background=True)
    newer.kill()
    try:
        handle.wait()
        raise AssertionError("waiting on a command of a killed sandbox did not raise")
    except SandboxNotRunningException as exc:
        assert "killed or reached its end of life" in str(exc), exc

print("semantics ok")
