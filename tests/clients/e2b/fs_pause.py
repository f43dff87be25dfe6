"""E2B's filesystem-only pause, unchanged: ``pause(keep_memory=False)`` keeps the disk alone
(forkd: a disk-only hibernation). The sandbox is not running, and its envd traffic does not wake
it; connect cold-boots it under the same id and access token: files written before survive, the
kernel's boot_id is new, and commands and files work again."""

import time

from e2b import Sandbox

MARKER = "/home/user/fs-only-marker.txt"
BOOT_ID = "/proc/sys/kernel/random/boot_id"

sbx = Sandbox.create(timeout=300)
sbx.files.write(MARKER, "persisted")
sbx.commands.run("echo ran > /home/user/ran.txt")
boot_before = sbx.files.read(BOOT_ID).strip()

started = time.monotonic()
assert sbx.pause(keep_memory=False)
paused_s = time.monotonic() - started
assert not sbx.is_running()
assert Sandbox.get_info(sbx.sandbox_id).state.value == "paused"

started = time.monotonic()
resumed = sbx.connect(timeout=300)
resume_s = time.monotonic() - started
assert resumed.sandbox_id == sbx.sandbox_id and resumed.is_running()
assert resumed.files.read(MARKER).strip() == "persisted"
assert sbx.files.read(MARKER).strip() == "persisted"  # the first handle's token is still good
boot_after = resumed.files.read(BOOT_ID).strip()
assert boot_after and boot_after != boot_before, (boot_before, boot_after)
assert resumed.commands.run("cat /home/user/ran.txt").stdout.strip() == "ran"
assert resumed.commands.run("echo $((6 * 7))").stdout.strip() == "42"
assert Sandbox.get_info(sbx.sandbox_id).state.value == "running"

# A memory pause of the cold-booted sandbox works as for any other.
assert resumed.pause()
again = Sandbox.connect(sbx.sandbox_id, timeout=120)
assert again.files.read(BOOT_ID).strip() == boot_after  # memory kept: the same boot
assert again.kill()
print(f"fs_pause ok: pause {paused_s:.2f} s, cold-boot resume {resume_s:.2f} s")
