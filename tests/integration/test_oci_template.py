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
from forkd.image import oci

from .conftest import Loop, images_dir
from .oci_material import debian_layout, registry, set_config

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
            # Five forks of the running child carry its file and answer on their own.
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
