"""An E2B user's volumes, unchanged: create one, put a file in it from outside, mount it in two
sandboxes, and each sees what the other writes; then the files from outside again, and the
volume destroyed once no sandbox uses it. Needs ``E2B_VOLUME_API_URL`` (the daemon) beside the
usual three variables."""

import time

from e2b import Sandbox, Volume
from e2b.exceptions import VolumeException

vol = Volume.create("compat-vol")
assert vol.volume_id == "compat-vol" and vol.token, vol
assert "compat-vol" in [v.name for v in Volume.list()]
vol.write_file("/seed.txt", "from outside\n")

a = Sandbox.create(timeout=600, volume_mounts={"/mnt/shared": vol})
b = Sandbox.create(timeout=600, volume_mounts={"/mnt/shared": "compat-vol"})  # by name, as E2B takes too
assert b.files.read("/mnt/shared/seed.txt") == "from outside\n"
assert a.get_info().volume_mounts == [{"name": "compat-vol", "path": "/mnt/shared"}]

a.commands.run("echo 'from a' > /mnt/shared/a.txt")
deadline = time.monotonic() + 10
while not b.files.exists("/mnt/shared/a.txt") and time.monotonic() < deadline:
    time.sleep(0.1)
assert b.files.read("/mnt/shared/a.txt") == "from a\n"
b.commands.run("echo 'from b' >> /mnt/shared/a.txt")
assert a.files.read("/mnt/shared/a.txt") == "from a\nfrom b\n"
assert vol.read_file("/a.txt") == "from a\nfrom b\n"  # the content API sees the sandboxes' writes
assert sorted(e.name for e in vol.list("/")) == ["a.txt", "seed.txt"]

try:
    Volume.destroy("compat-vol")
    raise AssertionError("a volume two sandboxes mount was destroyed")
except VolumeException as exc:
    assert "409" in str(exc), exc
for sbx in (a, b):
    assert sbx.kill()
assert Volume.destroy("compat-vol") is True
assert "compat-vol" not in [v.name for v in Volume.list()]
print("volumes ok")
