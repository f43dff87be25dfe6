"""An E2B user's snapshots, unchanged: snapshot a running sandbox (it carries on), list the
snapshots (all, by sandbox, by name), start sandboxes from one, delete it."""

from e2b import Sandbox

sbx = Sandbox.create(timeout=600)
sbx.files.write("/home/user/state.txt", "written before the snapshot")
# A running process and the memory it holds are in a full snapshot too.
sleeper = sbx.commands.run("sleep 900", background=True)

snap = sbx.create_snapshot(name="compat-snap")
assert snap.snapshot_id == "compat-snap" and snap.names == ["compat-snap"], snap
unnamed = Sandbox.create_snapshot(sbx.sandbox_id)
assert unnamed.snapshot_id and unnamed.snapshot_id != snap.snapshot_id, unnamed

# The source carries on, and what it does next is not in the snapshot.
assert sbx.is_running()
sbx.files.write("/home/user/state.txt", "written after the snapshot")

ids = [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]
assert ids == [unnamed.snapshot_id, snap.snapshot_id] or sorted(ids) == sorted(
    [unnamed.snapshot_id, snap.snapshot_id]), ids  # newest first; same-second ones in either order
assert "base" not in ids  # templates are not snapshots of a sandbox
mine = {s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items()}
assert mine == {snap.snapshot_id, unnamed.snapshot_id}, mine
assert [s.snapshot_id for s in Sandbox.list_snapshots(name="compat-snap").next_items()] == ["compat-snap"]
assert Sandbox.list_snapshots(name="compat-snap-missing").next_items() == []

first, second = Sandbox.create(snap.snapshot_id, timeout=600), Sandbox.create(snap.snapshot_id, timeout=600)
for child in (first, second):
    assert child.sandbox_id != sbx.sandbox_id
    assert child.get_info().template_id == "compat-snap"
    assert child.files.read("/home/user/state.txt") == "written before the snapshot"
    running = [p.pid for p in child.commands.list()]
    assert sleeper.pid in running, (sleeper.pid, running)
first.files.write("/home/user/state.txt", "changed in the first")
assert second.files.read("/home/user/state.txt") == "written before the snapshot"  # copies
assert sbx.files.read("/home/user/state.txt") == "written after the snapshot"

assert Sandbox.delete_snapshot(unnamed.snapshot_id) is True
assert Sandbox.delete_snapshot(unnamed.snapshot_id) is False
assert unnamed.snapshot_id not in {s.snapshot_id for s in Sandbox.list_snapshots().next_items()}
for each in (first, second, sbx):
    assert each.kill()
assert Sandbox.delete_snapshot(snap.snapshot_id) is True
assert Sandbox.list_snapshots().next_items() == []
print("snapshots ok")
