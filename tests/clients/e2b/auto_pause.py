"""E2B's autoPause, unchanged: a sandbox created with ``lifecycle={"on_timeout": "pause"}`` is
paused at its timeout instead of killed (forkd hibernates it), and connect wakes it, its
files and memory as they were."""

import time

from e2b import Sandbox

sbx = Sandbox.create(timeout=4, lifecycle={"on_timeout": "pause"})
sbx.files.write("/home/user/state.txt", "written before the timeout")
sbx.commands.run("echo $((6 * 7)) > /tmp/answer")

deadline = time.monotonic() + 60
while Sandbox.get_info(sbx.sandbox_id).state.value != "paused":
    assert time.monotonic() < deadline, "the sandbox was not paused at its timeout"
    time.sleep(0.5)

woken = Sandbox.connect(sbx.sandbox_id, timeout=120)
assert woken.sandbox_id == sbx.sandbox_id
assert woken.files.read("/home/user/state.txt") == "written before the timeout"
assert woken.commands.run("cat /tmp/answer").stdout.strip() == "42"
assert Sandbox.get_info(sbx.sandbox_id).state.value == "running"
assert woken.kill()
print("auto_pause ok")
