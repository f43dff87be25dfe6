"""A template from a registry's image: ``FROM REF`` of a Dockerfile build, pulled from a real
docker-registry on loopback through the docker.io mirror setting, converted, booted, forked.

The image is the debootstrap tree (docs and numpy left out) plus a layer with a module that
exists only in it and an ENV/WORKDIR in its config; one template boot (~the VM time of this file).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from forkd.controller.runtime import BuildRequest, Runtime
from forkd.errors import InvalidRequest
from forkd.image import oci

from .conftest import Loop, images_dir
from .oci_material import busybox_layout, debian_layout, registry, set_config

pytestmark = pytest.mark.vm

MODULE = b"ANSWER = 'only in this image'\n"


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


def test_a_template_from_a_registry_image_answers_and_forks(loop: Loop, runtime: Runtime,
                                                            tmp_path: Path) -> None:
    layout = debian_layout(images_dir(), tmp_path, {
        "usr/lib/python3/dist-packages/forkd_oci_only.py": MODULE, "srv/app/hello.txt": b"hello\n"})
    set_config(layout, "--config.env=GREETING=from the image", "--config.workingdir=/srv/app",
               "--config.cmd=python3")
    before = runtime.images.registries
    tags: list[str] = []
    with registry(tmp_path / "registry") as reg:
        reg.push(layout, "t", "forkd-test/oci-debian:1")
        runtime.images.registries = oci.Registries(mirrors={"docker.io": f"http://{reg.host}"})
        try:
            # A Hub short name, as a user writes it: the mirror sends it to the loopback registry.
            dockerfile = ("FROM forkd-test/oci-debian:1\n"
                          "RUN python3 -c 'import forkd_oci_only' > /srv/app/ran\n")
            report = loop.run(runtime.builds.build(BuildRequest(tag="oci-debian", dockerfile=dockerfile)))
            tags = [*report.layers, "oci-debian"]
            assert report.image is not None and report.image["ref"] == "docker.io/forkd-test/oci-debian:1"
            assert report.image["defaults"]["cmd"] == ["python3"]
            assert report.env["GREETING"] == "from the image" and report.workdir == "/srv/app"

            [child] = loop.run(runtime.spawn("oci-debian", 1))
            # exec starts in the image's WORKDIR with its ENV; the RUN step's file is there.
            script = 'pwd; echo "$GREETING"; cat hello.txt; ls ran'
            res = loop.run(runtime.exec(child.id, ["/bin/sh", "-c", script]))
            assert res["stdout"].split("\n")[:4] == ["/srv/app", "from the image", "hello", "ran"], res
            # eval runs on the image's own Python: a module of this image imports.
            ev = loop.run(runtime.eval(child.id, "import forkd_oci_only; forkd_oci_only.ANSWER"))
            assert "only in this image" in str(ev.get("result", ev)), ev
            loop.run(runtime.files.write(child.id, "/srv/app/note.txt", _chunks(b"written"),
                                         max_bytes=1 << 20))
            assert _terminal(loop, runtime, child.id) == (3, True)
            # A branch of it, and five forks of the running child: each carries its file.
            branch = loop.run(runtime.branch(child.id, "oci-debian-branch", mode="diff"))
            tags.append(branch.tag)
            [from_branch] = loop.run(runtime.spawn(branch.tag, 1))
            assert loop.run(runtime.exec(from_branch.id, ["cat", "/srv/app/note.txt"]))["stdout"] == "written"
            loop.run(runtime.kill(from_branch.id))
            fork = loop.run(runtime.fork(child.id, 5))
            assert len(fork.children) == 5 and not fork.errors, fork.errors
            tags.append(fork.snapshot_tag)
            for grandchild in fork.children:
                out = loop.run(runtime.exec(grandchild.id, ["cat", "/srv/app/note.txt"]))
                assert out["stdout"] == "written", out
            for sandbox in [child, *fork.children]:
                loop.run(runtime.kill(sandbox.id))
        finally:
            runtime.images.registries = before
            for tag in reversed(tags):
                with contextlib.suppress(Exception):
                    loop.run(runtime.delete_snapshot(tag, cascade=True, force=True))
            shutil.rmtree(images_dir() / "oci-debian-1", ignore_errors=True)
            shutil.rmtree(images_dir() / ".cache" / "oci", ignore_errors=True)


def test_an_image_without_python_runs_its_agent_on_forkds_runtime(loop: Loop, runtime: Runtime,
                                                                   tmp_path: Path) -> None:
    """busybox's static binary and nothing else, in two layers (a whiteout, an opaque directory, a
    setuid file and a hard link to it): the agent runs on forkd's own runtime (no libc or Python
    of the image's), and the child serves exec, files and a terminal, forks, branches and
    hibernates; eval is a 400 that says the image has no Python."""
    layout = busybox_layout(tmp_path)
    set_config(layout, "--config.cmd=sh", "--config.workingdir=/tmp")
    before = runtime.images.registries
    tags: list[str] = []
    sandboxes: list[str] = []
    with registry(tmp_path / "registry") as reg:
        reg.push(layout, "t", "forkd-test/busybox:1")
        runtime.images.registries = oci.Registries(mirrors={"docker.io": f"http://{reg.host}"})
        try:
            dockerfile = "FROM forkd-test/busybox:1\nRUN echo built > /built\n"
            report = loop.run(runtime.builds.build(BuildRequest(tag="oci-busybox", dockerfile=dockerfile)))
            tags = [*report.layers, "oci-busybox"]
            [child] = loop.run(runtime.spawn("oci-busybox", 1))
            sandboxes.append(child.id)
            script = "cat /built; pwd; ls /usr/bin/python3 /lib 2>&1"
            res = loop.run(runtime.exec(child.id, ["sh", "-c", script]))
            assert res["stdout"].split("\n")[:2] == ["built", "/tmp"], res
            assert "No such file" in res["stdout"], res  # neither a Python nor a libc of the image's own
            # The second layer, applied: whiteout, opaque dir, setuid bit, one inode for the link.
            script = ("ls /etc/gone 2>&1; ls /srv; stat -c '%a %i' /srv/tool; stat -c '%i' /srv/tool-link; "
                      "/srv/tool")
            lines = loop.run(runtime.exec(child.id, ["sh", "-c", script]))["stdout"].split("\n")
            assert "No such file" in lines[0] and lines[1:4] == ["new", "tool", "tool-link"], lines
            mode, inode = lines[4].split()
            assert mode == "4755" and lines[5] == inode and lines[6] == "tool", lines
            with pytest.raises(InvalidRequest, match="its image has no Python of its own"):
                loop.run(runtime.eval(child.id, "1 + 1"))

            loop.run(runtime.files.write(child.id, "/tmp/note.txt", _chunks(b"written"), max_bytes=1 << 20))
            assert _terminal(loop, runtime, child.id) == (3, True)

            fork = loop.run(runtime.fork(child.id, 5))
            assert len(fork.children) == 5 and not fork.errors, fork.errors
            tags.append(fork.snapshot_tag)
            sandboxes += [c.id for c in fork.children]
            for grandchild in fork.children:
                out = loop.run(runtime.exec(grandchild.id, ["cat", "/tmp/note.txt"]))
                assert out["stdout"] == "written", out

            branch = loop.run(runtime.branch(child.id, "oci-busybox-branch", mode="diff"))
            tags.append(branch.tag)
            [from_branch] = loop.run(runtime.spawn(branch.tag, 1))
            sandboxes.append(from_branch.id)
            assert loop.run(runtime.exec(from_branch.id, ["cat", "/tmp/note.txt"]))["stdout"] == "written"

            loop.run(runtime.hibernation.hibernate(from_branch.id))
            assert loop.run(runtime.hibernation.wake(from_branch.id))
            assert loop.run(runtime.exec(from_branch.id, ["cat", "/built"]))["stdout"] == "built\n"
        finally:
            runtime.images.registries = before
            for sandbox in sandboxes:
                with contextlib.suppress(Exception):
                    loop.run(runtime.kill(sandbox))
            for tag in reversed(tags):
                with contextlib.suppress(Exception):
                    loop.run(runtime.delete_snapshot(tag, cascade=True, force=True))
            shutil.rmtree(images_dir() / "busybox-1", ignore_errors=True)
            shutil.rmtree(images_dir() / ".cache" / "oci", ignore_errors=True)


def _terminal(loop: Loop, runtime: Runtime, sandbox: str) -> tuple[int | None, bool]:
    """A shell on a 80x24 pty: ``stty size`` answers its size, and ``exit 3`` its exit code."""
    async def session() -> tuple[int | None, bool]:
        events = await runtime.processes.run(sandbox, ["sh"], pty=(80, 24))
        out, code = b"", None
        async with contextlib.aclosing(events):
            async for event in events:
                if event.type == "start":
                    await runtime.processes.write_stdin(sandbox, event.pid, b"stty size; exit 3\n")
                elif event.type == "stdout":
                    out += event.data
                elif event.type == "exit":
                    code = event.exit_code
        return code, b"24 80" in out
    return loop.run(session())
