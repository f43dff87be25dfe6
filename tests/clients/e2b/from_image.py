"""An E2B user's templates from a registry's image, unchanged: ``Template().from_image(REF)`` and
``from_dockerfile`` with a ``FROM`` of the same image, each built with ``Template.build`` and then
started with ``Sandbox.create``. REF is a Docker Hub short name; the daemon's docker.io mirror sends
it to a registry on loopback (no hub can be reached here)."""

import sys

from e2b import Sandbox, Template

ref = sys.argv[1]

built = Template.build(
    Template().from_image(ref).run_cmd("cat /srv/app/hello.txt > from-image.txt"),
    "compat-from-image", cpu_count=1, memory_mb=512)
assert built.template_id == "compat-from-image", built
sbx = Sandbox.create("compat-from-image", timeout=300)
try:
    # The run_cmd ran as E2B's user in its home, on the image's files; the image's own module imports.
    assert sbx.files.read("/home/user/from-image.txt") == "hello from the registry\n"
    out = sbx.commands.run("python3 -c 'import forkd_e2b_only; print(forkd_e2b_only.ANSWER)'")
    assert out.stdout == "only in the registry's image\n", out
finally:
    sbx.kill()

dockerfile = f"FROM {ref}\nRUN echo from the dockerfile > /srv/app/made.txt\n"
Template.build(Template().from_dockerfile(dockerfile), "compat-from-dockerfile", cpu_count=1, memory_mb=512)
sbx = Sandbox.create("compat-from-dockerfile", timeout=300)
try:
    assert sbx.files.read("/srv/app/made.txt") == "from the dockerfile\n"
    assert sbx.files.read("/srv/app/hello.txt") == "hello from the registry\n"
finally:
    sbx.kill()

for name in ("compat-from-image", "compat-from-dockerfile"):
    assert Sandbox.delete_snapshot(name) is True
print("from_image ok")
