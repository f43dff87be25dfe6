"""The forkd container image (deploy/Dockerfile), built with Debian's podman for test_container.py.

Nothing can be pulled from a registry on these machines, so the base is made here: the Debian
tree the default guest image was built from (the image builder's debootstrap cache), imported as
``localhost/forkd-base:<tree key>``. The build's apt and pip steps take a minute or two, so the
session starts it in the background as soon as it has collected the container test
(conftest.py), and the test waits for it: it overlaps the other VM tests, and the container
test runs last.

This host's quirks, handled rather than hidden:

* ``crun`` (podman's default runtime) refuses hosts whose cgroups are in hybrid mode ("cgroups in
  hybrid mode not supported"), as ours are: ``runc`` runs the build and the container;
* podman asks for more open files than this host's hard limit allows, and a container's
  ``setrlimit(RLIMIT_NPROC)`` to the host's own value is refused: the container gets the
  host's open-file limit and a lower process limit, explicitly;
* pip in the build reaches PyPI through a TLS-intercepting proxy whose CA only the host's bundle
  has: the bundle is mounted into the build and named by the Dockerfile's ``PIP_CERT``.
"""

from __future__ import annotations

import os
import resource
import shlex
import shutil
import subprocess
import time
from pathlib import Path

from forkd.config import VERSION
from forkd.image.builder import recipe_for

ROOT = Path(__file__).resolve().parents[2]
PODMAN = shutil.which("podman")
RUNTIME = ["--runtime", "runc"] if shutil.which("runc") else []
BASE = "localhost/forkd-base"  # tagged with the tree's key: imported once per Debian tree
IMAGE = f"localhost/forkd:{VERSION}-test"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
BUILD_TIMEOUT_SECS = 1200


def podman(*args: str) -> list[str]:
    assert PODMAN is not None
    return [PODMAN, *RUNTIME, *args]


def base_tree(images: Path) -> Path:
    """The default guest image's Debian tree (the image builder's debootstrap cache)."""
    return images / ".cache" / f"rootfs-{recipe_for('default').base_key()}"


def ulimits() -> list[str]:
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    procs = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 8192)
    return ["--ulimit", f"nofile={files}:{files}", "--ulimit", f"nproc={procs}:{procs}"]


class ImageBuild:
    """``podman import`` of the base, then ``podman build`` of deploy/Dockerfile, in a subprocess."""

    def __init__(self, images: Path, log: Path) -> None:
        self.images = images
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def start(self) -> None:
        tree = base_tree(self.images)
        if not tree.is_dir():
            return  # no guest image built yet: wait() says so
        base = f"{BASE}:{tree.name.removeprefix('rootfs-')}"
        build = podman("build", "-q", "--network=host", "--build-arg", f"BASE={base}",
                       "-f", "deploy/Dockerfile", "-t", IMAGE)
        if CA_BUNDLE.exists():
            build += ["--build-arg", f"PIP_CERT={CA_BUNDLE}", "-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"]
        # A rebuild moves IMAGE's tag: the image it named before is removed after (its layers the
        # new one shares stay), so reruns do not pile up 800 MB each.
        script = (f"set -euo pipefail; {shlex.join(podman('image', 'exists', base))} || "
                  f"tar -C {shlex.quote(str(tree))} -c . | {shlex.join(podman('import', '-q', '-', base))}; "
                  f"old=$({shlex.join(podman('image', 'inspect', '--format', '{{.Id}}', IMAGE))} "
                  f"2>/dev/null || true); {shlex.join([*build, '.'])}; "
                  f"new=$({shlex.join(podman('image', 'inspect', '--format', '{{.Id}}', IMAGE))}); "
                  f'if [ -n "$old" ] && [ "$old" != "$new" ]; then '
                  f'{shlex.join(podman("rmi", "-i"))} "$old" >/dev/null 2>&1 || true; fi')
        self.started = time.monotonic()
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(["bash", "-c", script], cwd=ROOT, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self) -> float:
        """Seconds the build took (from its start); an AssertionError with its log if it failed."""
        if self.proc is None:
            raise AssertionError(f"the container build did not start: no Debian tree at "
                                 f"{base_tree(self.images)} (the default guest image is built first)")
        try:
            code = self.proc.wait(timeout=max(1.0, BUILD_TIMEOUT_SECS - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            raise AssertionError(f"podman build took over {BUILD_TIMEOUT_SECS}s") from None
        if code != 0:
            raise AssertionError(f"podman build failed ({code}):\n{self.log.read_text()[-4000:]}")
        return time.monotonic() - self.started

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


BUILD: ImageBuild | None = None  # the session's, started by conftest.py
