"""E2B's autoPause, unchanged: a sandbox created with ``lifecycle={"on_timeout": "pause"}`` is
paused at its timeout instead of killed (forkd hibernates it); connect wakes it, its files and
memory as they were, and with ``auto_resume: True`` so does any envd request. Without it (or
with ``auto_resume: False``) its traffic does not wake it (``is_running()`` is False) until
connect does."""

import time

from e2b import Sandbox


def wait_paused(sandbox: Sandbox) -> None:
    deadline = time.monotonic() + 60
    while Sandbox.get_info(sandbox.sandbox_id).state.value != "paused":
        assert time.monotonic() < deadline, "the sandbox was not paused at its timeout"
        time.sleep(0.5)


sbx = Sandbox.create(timeout=4, lifecycle={"on_timeout": "pause"})
other = Sandbox.create(timeout=4, lifecycle={"on_timeout": "pause", "auto_resume": True})
asleep = Sandbox.create(timeout=4, lifecycle={"on_timeout": "pause", "auto_resume": False})
asleep.commands.run("echo mine > /tmp/mine")
sbx.files.write("/home/user/state.txt", "written before the timeout")
sbx.commands.run("echo $((6 * 7)) > /tmp/answer")
other.commands.run("echo kept > /tmp/kept")
wait_paused(sbx)
wait_paused(other)
wait_paused(asleep)

# auto_resume off: its envd answers "not running" instead of waking it; connect resumes it.
assert not asleep.is_running()
assert Sandbox.get_info(asleep.sandbox_id).state.value == "paused"
resumed = Sandbox.connect(asleep.sandbox_id, timeout=60)
assert resumed.is_running() and resumed.commands.run("cat /tmp/mine").stdout.strip() == "mine"
assert resumed.kill()

# envd traffic to a paused sandbox wakes it (no connect first).
assert other.commands.run("cat /tmp/kept").stdout.strip() == "kept"
assert Sandbox.get_info(other.sandbox_id).state.value == "running"
assert other.kill()

woken = Sandbox.connect(sbx.sandbox_id, timeout=120)
assert woken.sandbox_id == sbx.sandbox_id
assert woken.files.read("/home/user/state.txt") == "written before the timeout"
assert woken.commands.run("cat /tmp/answer").stdout.strip() == "42"
assert Sandbox.get_info(sbx.sandbox_id).state.value == "running"

# autoPause outlives an explicit pause and resume: at its next timeout it is paused again.
assert woken.pause()
again = Sandbox.connect(sbx.sandbox_id, timeout=4)
wait_paused(again)
assert Sandbox.connect(sbx.sandbox_id, timeout=60).commands.run("cat /tmp/answer").stdout.strip() == "42"
assert woken.kill()
print("auto_pause ok")
