"""``forkd template build`` on real VMs: a Dockerfile becomes a snapshot whose children
see what RUN wrote, what COPY brought from the build context, ENV and WORKDIR; a rebuild
that changes only the last step runs only that step (the build's own cache report)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from forkd.controller.runtime import Runtime
from forkd.controller.template_build import BuildRequest
from forkd.sdk import Controller

from .conftest import Loop
from .daemon_fixture import FORKD, SharedDaemons

pytestmark = pytest.mark.vm

DOCKERFILE = """\
FROM forkd/default
ARG GREETING=hello
ENV APP_MODE=production GREETING_SEEN=${{GREETING}}
RUN echo "built by RUN" > /opt/from-run.txt
COPY app/ /srv/app/
WORKDIR /srv/app
RUN {last}
"""


def context_tar(root: Path) -> bytes:
    (root / "app" / "sub").mkdir(parents=True)
    (root / "app" / "main.py").write_text("print('copied')\n")
    (root / "app" / "sub" / "data.txt").write_text("nested\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:") as tar:
        tar.add(root / "app", arcname="app")
    return buf.getvalue()


async def one(data: bytes) -> AsyncIterator[bytes]:
    yield data


def build(loop: Loop, runtime: Runtime, tag: str, context: str, last: str,
          replace: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    req = BuildRequest(tag=tag, dockerfile=DOCKERFILE.format(last=last), context=context, replace=replace)
    report = loop.run(runtime.builds.build(req, events.append), timeout=900)
    return report.info(), events


def test_dockerfile_build_then_rebuild_of_the_last_step(loop: Loop, runtime: Runtime, tmp_path: Path) -> None:
    context = loop.run(runtime.builds.contexts.put(one(context_tar(tmp_path))))
    first, events = build(loop, runtime, "tpl-a", context, "echo one > last.txt")
    assert first["cache_hits"] == 0 and first["steps_run"] == 3, first
    assert first["env"] == {"APP_MODE": "production", "GREETING_SEEN": "hello"}
    assert first["workdir"] == "/srv/app"
    assert any(e["type"] == "step" and not e["cached"] for e in events)
    assert events[-1]["type"] == "done"

    [child] = loop.run(runtime.spawn("tpl-a", 1))
    try:
        def sh(cmd: str, **kw: Any) -> str:
            res = loop.run(runtime.exec(child.id, ["/bin/sh", "-c", cmd], **kw))
            assert res["exit_code"] == 0, res
            return str(res["stdout"])

        assert sh("cat /opt/from-run.txt") == "built by RUN\n"
        assert sh("cat /srv/app/main.py /srv/app/sub/data.txt") == "print('copied')\nnested\n"
        assert sh("cat /srv/app/last.txt") == "one\n"  # RUN ran in WORKDIR
        assert sh('echo "$APP_MODE $GREETING_SEEN"') == "production hello\n"  # ENV: every exec
        assert sh("pwd") == "/srv/app\n"  # WORKDIR: an exec's default cwd
        assert sh('bash -lc \'echo "$APP_MODE"\'') == "production\n"  # login shells too
        assert sh("ls -A /tmp | grep -c forkd-copy || true") == "0\n"  # COPY left nothing behind
    finally:
        loop.run(runtime.kill(child.id))

    # Only the last RUN changed: FROM, the first RUN and COPY come from the layer cache.
    second, events = build(loop, runtime, "tpl-a", context, "echo two > last.txt", replace=True)
    assert second["cache_hits"] == 2 and second["steps_run"] == 1, second
    ran = [e["index"] for e in events if e["type"] == "step" and not e["cached"]]
    assert ran == [3], events
    assert second["layers"][:3] == first["layers"][:3] and second["layers"][3] != first["layers"][3]
    [child] = loop.run(runtime.spawn("tpl-a", 1))
    try:
        res = loop.run(runtime.exec(child.id, ["cat", "/srv/app/last.txt", "/opt/from-run.txt"]))
        assert res["stdout"] == "two\nbuilt by RUN\n", res
    finally:
        loop.run(runtime.kill(child.id))

    # The same Dockerfile again: every step is a cache hit.
    third, _ = build(loop, runtime, "tpl-b", context, "echo two > last.txt")
    assert third["cache_hits"] == 3 and third["steps_run"] == 0, third


def test_forkd_template_build_through_a_daemon(shared_daemons: SharedDaemons, tmp_path: Path) -> None:
    """The CLI end to end: the context directory sent as a tar (``.dockerignore`` applied), the
    build's NDJSON, and a child of the new snapshot seeing what COPY and RUN made."""
    ctx = tmp_path / "ctx"
    (ctx / "site").mkdir(parents=True)
    (ctx / "site" / "index.html").write_text("<h1>hi</h1>\n")
    (ctx / "secret.key").write_text("not sent\n")
    (ctx / ".dockerignore").write_text("*.key\n")
    (ctx / "Dockerfile").write_text("FROM default\nCOPY site /srv/www/\nENV PORT=8080\n"
                                    "RUN ls /srv/www > /srv/listing.txt\nCMD [\"serve\"]\n")
    with shared_daemons.lend() as daemon:
        env = {**os.environ, "FORKD_URL": daemon.url, "FORKD_TOKEN": daemon.token}
        env.pop("FORKD_TOKEN_FILE", None)
        out = subprocess.run([str(FORKD), "template", "build", "-t", "www", "--json", str(ctx)], env=env,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr + out.stdout
        events = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
        assert events[0]["type"] == "plan" and "CMD is skipped" in events[0]["warnings"][0]
        assert events[-1]["type"] == "done" and events[-1]["steps_run"] == 2
        ctl = Controller(daemon.url, daemon.token)
        [child] = ctl.spawn_sandboxes("www")
        res = ctl.exec(child["id"], "cat /srv/listing.txt; echo $PORT; ls /srv/www")
        assert res["stdout"] == "index.html\n8080\nindex.html\n", res  # secret.key was never sent
        ctl.kill_sandbox(child["id"])
        failed = subprocess.run([str(FORKD), "template", "build", "-t", "www", str(ctx)], env=env,
                                capture_output=True, text=True, timeout=120)
        assert failed.returncode != 0 and "already exists" in failed.stderr + failed.stdout
