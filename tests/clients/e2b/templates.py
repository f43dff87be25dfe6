"""An E2B user's template, unchanged: Template() from the base image with a copy, run_cmd, env
and workdir, built with Template.build (its logs followed), then sandboxes started from it.
A second build that changes only the last command reuses the cached layers."""

import os
import sys
import tempfile
import uuid

from e2b import Sandbox, Template

context = tempfile.mkdtemp(prefix="e2b-template-")
os.makedirs(os.path.join(context, "app"))
with open(os.path.join(context, "app", "hello.txt"), "w") as f:
    f.write("copied from the build context\n")
with open(os.path.join(context, "app", "tool.sh"), "w") as f:
    f.write("#!/bin/sh\necho tool ran\n")


def template(last: str) -> object:
    return (
        Template(file_context_path=context)
        .from_base_image()
        .copy("app/*", "/home/user/app/")
        .run_cmd("cat app/hello.txt > from-run.txt && whoami >> from-run.txt")
        .run_cmd("mkdir -p /opt/tools && cp app/tool.sh /opt/tools/ && chmod 755 /opt/tools/tool.sh",
                 user="root")
        .set_envs({"APP_MODE": "test", "TOOLS": "/opt/tools"})
        .run_cmd(last)
    )


run = uuid.uuid4().hex[:8]  # the last step is new in each run of this program, so it runs
logs = []
info = Template.build(template(f"echo first {run} > last.txt"), "compat-template", cpu_count=1, memory_mb=512,
                      on_build_logs=lambda entry: logs.append(entry.message))
assert info.template_id == "compat-template", info
assert any("cat app/hello.txt" in m for m in logs), logs

sbx = Sandbox.create("compat-template", timeout=300)
try:
    assert sbx.files.read("/home/user/from-run.txt") == "copied from the build context\nuser\n"
    assert sbx.files.read("/home/user/last.txt") == f"first {run}\n"
    out = sbx.commands.run('echo "$APP_MODE" && $TOOLS/tool.sh && pwd')
    assert out.stdout == "test\ntool ran\n/home/user\n", out.stdout
finally:
    sbx.kill()

logs.clear()
Template.build(template(f"echo second {run} > last.txt"), "compat-template", cpu_count=1, memory_mb=512,
               on_build_logs=lambda entry: logs.append(entry.message))
cached = [m for m in logs if m.endswith("(cached)")]
assert len(cached) == 4, logs  # FROM, the copy and two run_cmds: only the last one ran
sbx = Sandbox.create("compat-template", timeout=300)
try:
    assert sbx.files.read("/home/user/last.txt") == f"second {run}\n"
finally:
    sbx.kill()

assert Template.exists("compat-template") and not Template.exists("compat-template-missing")
assert Sandbox.delete_snapshot("compat-template") is True  # a built template is deleted as a snapshot
print("templates ok", file=sys.stdout)
