"""An E2B user's directory watching, unchanged: the sync SDK's polled watcher and the async
SDK's event stream, both recursive, both stopped by the user."""

import asyncio
import time

from e2b import AsyncSandbox, FilesystemEventType, Sandbox, SandboxException


def wait_for(handle, wanted):
    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not wanted <= {(e.name, e.type) for e in seen}:
        seen += handle.get_new_events()
        time.sleep(0.2)
    return seen


with Sandbox.create() as sbx:
    sbx.files.make_dir("/tmp/watched/sub")
    handle = sbx.files.watch_dir("/tmp/watched", recursive=True)
    sbx.files.write("/tmp/watched/sub/a.txt", "hello")
    sbx.commands.run("mv /tmp/watched/sub/a.txt /tmp/watched/b.txt && rm /tmp/watched/b.txt")
    wanted = {("sub/a.txt", FilesystemEventType.CREATE), ("sub/a.txt", FilesystemEventType.RENAME),
              ("b.txt", FilesystemEventType.CREATE), ("b.txt", FilesystemEventType.REMOVE)}
    seen = wait_for(handle, wanted)
    assert wanted <= {(e.name, e.type) for e in seen}, seen
    handle.stop()
    try:
        handle.get_new_events()
        raise AssertionError("a stopped watcher still answered")
    except SandboxException:
        pass

    async def stream(sandbox_id):
        asbx = await AsyncSandbox.connect(sandbox_id)
        got = []
        done = asyncio.Event()

        def on_event(event):
            got.append((event.name, event.type))
            if event.name == "sub/deeper/done.txt":
                done.set()

        watch = await asbx.files.watch_dir("/tmp/watched", on_event, recursive=True, timeout=120)
        await asbx.files.make_dir("/tmp/watched/sub/deeper")
        await asbx.files.write("/tmp/watched/sub/deeper/done.txt", "done")
        await asyncio.wait_for(done.wait(), 60)
        await watch.stop()
        assert ("sub/deeper", FilesystemEventType.CREATE) in got, got
        assert ("sub/deeper/done.txt", FilesystemEventType.CREATE) in got, got

    asyncio.run(stream(sbx.sandbox_id))
print("watch ok")
