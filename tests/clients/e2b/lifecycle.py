"""An E2B user's sandbox lifecycle, unchanged: create with metadata, list, connect by id,
set_timeout, fork, pause and resume through connect, kill."""

import datetime

from e2b import Sandbox, SandboxQuery

sbx = Sandbox.create(metadata={"team": "compat", "run": "lifecycle"}, timeout=600)
assert sbx.is_running()
info = sbx.get_info()
assert info.metadata == {"team": "compat", "run": "lifecycle"}, info.metadata
assert info.state.value == "running"

mine = Sandbox.list(query=SandboxQuery(metadata={"run": "lifecycle"})).next_items()
assert [s.sandbox_id for s in mine] == [sbx.sandbox_id], mine

same = Sandbox.connect(sbx.sandbox_id)
same.files.write("/home/user/state.txt", "written before the fork")

before = sbx.get_info().end_at
sbx.set_timeout(3000)
after = sbx.get_info().end_at
assert after - before > datetime.timedelta(seconds=2000), (before, after)

forks = sbx.fork(count=2, timeout=600)
assert len(forks) == 2 and not any(isinstance(f, Exception) for f in forks), forks
for child in forks:
    assert child.sandbox_id != sbx.sandbox_id
    assert child.files.read("/home/user/state.txt") == "written before the fork"
    child.files.write("/home/user/state.txt", f"changed in {child.sandbox_id}")
assert sbx.files.read("/home/user/state.txt") == "written before the fork"  # the forks are copies

assert sbx.pause()
assert not sbx.pause()  # already paused
assert Sandbox.get_info(sbx.sandbox_id).state.value == "paused"
assert not sbx.is_running()
resumed = Sandbox.connect(sbx.sandbox_id)
assert resumed.sandbox_id == sbx.sandbox_id
assert resumed.files.read("/home/user/state.txt") == "written before the fork"

for child in forks:
    assert child.kill()
assert resumed.kill()
assert not Sandbox.kill(sbx.sandbox_id)  # it is gone
assert not resumed.is_running()
print("lifecycle ok")
