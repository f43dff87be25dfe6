"""``forkd template build`` on real VMs: a Dockerfile becomes a snapshot whose children
see what RUN wrote, what COPY brought from the build context, ENV and WORKDIR; a rebuild
that changes only the last step runs only that step (the build's own cache report)."""

from __future__ import annotations

import io
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from forkd.controller.runtime import Runtime
from forkd.controller.template_build import BuildRequest

from .conftest import Loop

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
