"""E2B's filesystem-only pause at the timeout, unchanged: a sandbox created with
``lifecycle={"on_timeout": {"action": "pause", "keep_memory": False}}`` keeps its disk alone at
its timeout (forkd: a disk-only hibernation). Its envd traffic does not wake it; connect
cold-boots it under the same id: files written before survive, the kernel's boot_id is new.
A second timeout pauses it the same way again."""

import time

from e2b import Sandbox

MARKER = "/home/user/auto-pause-marker.txt"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
LIFECYCLE = {"on_timeout": {"action": "pause", "keep_memory": False}}


def wait_paused(sandbox: Sandbox) -> float:
    started = time.monotonic()
    while Sandbox.get_info(sandbox.sandbox_id).state.value != "paused":
        assert time.monotonic() - started < 60, "the sandbox was not paused at its timeout"
        time.sleep(0.2)
    return time.monotonic() - started


sbx = Sandbox.create(timeout=4, lifecycle=LIFECYCLE)  # type: ignore[arg-type]
sbx.files.write(MARKER, "auto-pause-fs-only")
boot_before = sbx.files.read(BOOT_ID).strip()
waited = wait_paused(sbx)
assert not sbx.is_running()

started = time.monotonic()
resumed = sbx.connect(timeout=8)
resume_s = time.monotonic() - started
assert resumed.sandbox_id == sbx.sandbox_id and resumed.is_running()
assert resumed.files.read(MARKER).strip() == "auto-pause-fs-only"
boot_after = resumed.files.read(BOOT_ID).strip()
assert boot_after and boot_after != boot_before, (boot_before, boot_after)

# The policy outlives the wake: at its next timeout it is paused, filesystem-only, again.
wait_paused(resumed)
again = Sandbox.connect(sbx.sandbox_id, timeout=60)
assert again.files.read(MARKER).strip() == "auto-pause-fs-only"
assert again.files.read(BOOT_ID).strip() != boot_after
assert again.kill()
print(f"fs_auto_pause ok: paused {waited:.2f} s after the first reads, cold-boot connect {resume_s:.2f} s")
