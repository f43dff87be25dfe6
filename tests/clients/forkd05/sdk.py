"""The published forkd 0.5.3 SDK, unchanged, through every Controller method.

Run with FORKD_URL / FORKD_TOKEN and the tag of a ready snapshot as argv[1];
prints one JSON object of what each call answered (the test checks it).
"""

import json
import sys
import time

from forkd import Controller, ControllerError

tag = sys.argv[1]
c = Controller()
out = {"snapshots": [s["tag"] for s in c.list_snapshots()]}

# spawn: every option the SDK has, as it sends them (prewarm, live_fork, hugepages).
[plain] = c.spawn_sandboxes(tag, n=1)
[warm] = c.spawn_sandboxes(tag, n=1, prewarm=True, live_fork=True, hugepages=True)
out["spawned"] = [plain["id"], warm["id"]]
out["listed"] = sorted(s["id"] for s in c.list_sandboxes())
out["got"] = c.get_sandbox(plain["id"])["id"]
out["ping"] = c.ping_sandbox(plain["id"])
out["exec"] = c.exec_command(plain["id"], ["sh", "-c", "echo hi; echo oops >&2; exit 3"], timeout_secs=20)
out["eval"] = c.eval_code(plain["id"], "21 * 2")

# branch: canonical mode, the legacy diff flag, the measurement hook, and a live no-wait branch.
c.exec_command(plain["id"], ["sh", "-c", "echo kept > /root/marker"])
out["branch_full"] = c.branch_sandbox(plain["id"], tag="compat-full", mode="full")
out["branch_diff"] = c.branch_sandbox(plain["id"], tag="compat-diff", diff=True)
out["branch_measured"] = c.branch_sandbox(plain["id"], tag="compat-measured", measure_diff=True)
out["branch_live"] = c.branch_sandbox(warm["id"], tag="compat-live", mode="live", wait=False)

# fork a grandchild from a branch: it has the source's state.
[grandchild] = c.spawn_sandboxes("compat-diff", n=1)
out["grandchild_marker"] = c.exec_command(grandchild["id"], ["cat", "/root/marker"])["stdout"]

# errors: the SDK raises ControllerError with the daemon's status.
errors = {}
for name, call in (("unknown_sandbox", lambda: c.get_sandbox("sb-nope-0000")),
                   ("unknown_kill", lambda: c.kill_sandbox("sb-nope-0000")),
                   ("both_modes", lambda: c.branch_sandbox(plain["id"], diff=True, measure_diff=True)),
                   ("taken_tag", lambda: c.branch_sandbox(plain["id"], tag="compat-full"))):
    try:
        call()
        errors[name] = None
    except ControllerError as exc:
        errors[name] = [exc.status, exc.body]
out["errors"] = errors

for sandbox in (grandchild, plain, warm):
    c.kill_sandbox(sandbox["id"])
out["after_kill"] = sorted(s["id"] for s in c.list_sandboxes())
# A live no-wait branch is "writing" until its memory is copied: poll, as the SDK's docs say.
deadline = time.monotonic() + 300
while {s["tag"]: s.get("status") for s in c.list_snapshots()}["compat-live"] == "writing":
    assert time.monotonic() < deadline, "the live branch never became ready"
    time.sleep(0.5)
live = {s["tag"]: s for s in c.list_snapshots()}["compat-live"]
out["live_status"] = live.get("status")
out["live_error"] = live.get("error")  # why, if it failed
# Newest first: each branch of a source is layered on its previous one.
for snap in ("compat-live", "compat-measured", "compat-diff", "compat-full"):
    c.delete_snapshot(snap)
out["snapshots_after"] = [s["tag"] for s in c.list_snapshots()]
print(json.dumps(out))
