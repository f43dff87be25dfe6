"""``forkd template build``: a Dockerfile turned into a snapshot, one cached layer per step.

The plan (controller/dockerfile.py) is a base image and a list of RUN and COPY
steps. Each step has a key: the sha256 of its parent's key and the step's
canonical text (its command with the environment, working directory and user
it runs with; for COPY, the digest of the files it copies). The base's key
covers the image (its content key), memory, vCPUs and NIC.

Layers are snapshots tagged ``layer-<key>`` (its first 20 hex digits):

* the base layer is a template booted from the image (``TemplateBuilder``:
  booted, warm imports done, Jupyter kernel warmed where the image has one),
  or, for ``FROM snapshot:TAG``, that snapshot itself (keyed by its tag and
  when it was made; its memory, vCPUs and NIC are its own);
* a step's layer is a BRANCH of a build sandbox (a child of the layer before)
  right after the step ran in it.

A build starts from the deepest layer whose key already exists, so a rebuild
that changes only the last step runs only that step. It ends with a child of
the last layer in which the template's defaults are applied (below), branched
under the requested tag. Layers stay registered as snapshots: they are the
cache (``forkd rmi`` removes them, once no template builds on them).

The defaults the last ENV, WORKDIR and USER leave: ENV is set in PID 1's
environment (every exec in a child inherits it) and exported from
``/etc/profile.d/forkd-template.sh`` (login shells: E2B's commands); WORKDIR
is PID 1's working directory (an exec without ``cwd`` and without a user starts
there); USER is recorded in the build's report only: execs still run as root
unless they name a user.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shlex
import tempfile
from collections.abc import AsyncIterable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from forkd import bounds
from forkd.config import DataDir
from forkd.controller.agent_gateway import AgentGateway
from forkd.controller.build_contexts import BuildContexts
from forkd.controller.dockerfile import (
    REGISTRY_BASE,
    SNAPSHOT_BASE,
    BuildPlan,
    Copy,
    Run,
    Step,
    parse,
    step_canonical,
)
from forkd.controller.images import OciImages, PullRequest, image_defaults
from forkd.controller.options import SpawnOptions
from forkd.controller.processes import ProcessEvents
from forkd.controller.results import ContextReport, EvalResult, ExecResult
from forkd.controller.templates import SnapshotSpec, TemplateBuilder
from forkd.errors import Conflict, InvalidRequest, NotFound
from forkd.guest import capabilities
from forkd.host.egress import EgressPolicy
from forkd.image.builder import Image, load_image
from forkd.image.oci import Credentials
from forkd.store.records import SandboxRecord, SnapshotRecord

KEY_VERSION = "forkd-template-layer-1"
LAYER_PREFIX = bounds.TEMPLATE_LAYER_PREFIX
PROFILE = "/etc/profile.d/forkd-template.sh"
MAX_COMMAND_CHARS = 64 * 1024
# A build sandbox outlives a daemon that crashed mid-build by at most this (the reaper kills it).
BUILD_SANDBOX_SECS = 6 * 3600.0
# The COPY step's shell: unpack the step's own tar, apply --chown/--chmod there (so only copied
# entries get them), copy with cp -a as Docker's rules say (a directory's contents; a destination
# ending in / is a directory), and leave nothing behind in /tmp (it would be in the layer).
_COPY_SH = r"""set -e
tar_=$1 dest=$2 owner=$3 mode=$4; shift 4
t=$(mktemp -d /tmp/.forkd-copy.XXXXXX)
trap 'rm -rf "$t" "$tar_"' EXIT
tar -xf "$tar_" -C "$t" --no-same-owner
[ -z "$owner" ] || chown -R "$owner" "$t"
[ -z "$mode" ] || chmod -R "$mode" "$t"
for s in "$@"; do
  p="$t/$s"
  case "$dest" in
    */) mkdir -p "$dest"
        if [ -d "$p" ] && [ ! -L "$p" ]; then cp -a "$p/." "$dest"; else cp -a "$p" "$dest"; fi ;;
    *) if [ -d "$p" ] && [ ! -L "$p" ]; then mkdir -p "$dest"; cp -a "$p/." "$dest/"
       else mkdir -p "$(dirname "$dest")"; cp -a "$p" "$dest"; fi ;;
  esac
done
"""

Emit = Callable[[dict[str, Any]], None]


def _ignore(_event: dict[str, Any]) -> None:
    pass


class BuildHost(Protocol):
    """What a build needs of the Runtime (it is one): sandboxes, their processes and files, BRANCH."""

    @property
    def processes(self) -> Any: ...
    @property
    def files(self) -> Any: ...
    @property
    def agents(self) -> AgentGateway: ...
    def get_snapshot(self, tag: str) -> SnapshotRecord: ...
    async def spawn(self, tag: str, n: int = 1,
                    options: SpawnOptions | None = None) -> list[SandboxRecord]: ...
    async def exec(self, sandbox_id: str, args: list[str], timeout_secs: float = 30,
                   env: dict[str, str] | None = None, cwd: str | None = None, stdin: str | None = None,
                   max_output_bytes: int | None = None, user: str | None = None) -> ExecResult: ...
    async def eval(self, sandbox_id: str, code: str, timeout_secs: float = ...) -> EvalResult: ...
    async def branch(self, sandbox_id: str, tag: str | None = None, mode: str = "full",
                     wait: bool = True, *, measure_diff: bool = False,
                     parent_tag: str | None = None) -> SnapshotRecord: ...
    async def kill(self, sandbox_id: str) -> None: ...
    async def delete_snapshot(self, tag: str, *, cascade: bool = False, force: bool = False) -> None: ...


@dataclass
class BuildRequest:
    tag: str
    dockerfile: str
    build_args: dict[str, str] = field(default_factory=dict)
    context: str | None = None  # a build context's digest (BuildContexts)
    mem_mib: int | None = None
    vcpus: int | None = None
    nic: bool = False
    # The build's own egress (RUN steps that install packages); the template's children get their own.
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    replace: bool = False  # an existing snapshot under ``tag`` is deleted once the build has succeeded
    step_timeout_secs: float = 1800.0
    boot_wait_secs: float = 180.0
    # Steps from this index (0-based) on neither come from nor go to the layer cache (a forced
    # rebuild: 0); None: every step is cached. The base layer is always reused.
    cache_from: int | None = None
    # Started in the background (``bash -l -c``, as the last USER, in the last WORKDIR) before the
    # snapshot, so every child starts with it running; ``ready_cmd`` is retried until it exits 0.
    start_cmd: str | None = None
    ready_cmd: str | None = None
    ready_timeout_secs: float = 300.0
    # For a FROM of a private registry's image: used for this build's pull only, never stored.
    registry_credentials: Credentials | None = None


@dataclass
class BuildReport:
    snapshot: SnapshotRecord
    cache_hits: int  # steps whose layer already existed (not run)
    steps_run: int
    layers: list[str]  # the layer tags, base first
    env: dict[str, str]
    workdir: str
    user: str | None
    image: dict[str, Any] | None = None  # a pulled FROM image: its reference, digest and config

    def info(self) -> dict[str, Any]:
        info = {"snapshot": self.snapshot.info(), "cache_hits": self.cache_hits, "steps_run": self.steps_run,
                "layers": self.layers, "env": self.env, "workdir": self.workdir, "user": self.user or "root"}
        if self.image is not None:
            info["image"] = self.image
        return info


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


def base_key(image_key: str, spec: SnapshotSpec) -> str:
    return _digest(KEY_VERSION, "from", image_key, str(spec.mem_mib), str(spec.vcpus), str(spec.nic_tap))


def step_key(parent: str, step: Step, files_digest: str = "") -> str:
    """A layer's key: its parent's, the step's canonical text, and (COPY) its files' digest."""
    return _digest(parent, step_canonical(step), files_digest)


def layer_tag(key: str) -> str:
    return f"{LAYER_PREFIX}{key[:20]}"  # short: QEMU's socket paths live under the tag's dir


@dataclass
class _Layer:
    step: Step
    key: str
    copy_tar: Path | None = None  # COPY: the tar of the step's sources, made before the build


class TemplateBuilds:
    """Dockerfile builds on top of ``TemplateBuilder`` and the Runtime's sandboxes; one at a time."""

    def __init__(self, data: DataDir, templates: TemplateBuilder, host: BuildHost, images: OciImages) -> None:
        self._data = data
        self._templates = templates
        self._host = host
        self._images = images
        self.contexts = BuildContexts(data.root / "build-contexts")
        self._lock = asyncio.Lock()  # builds share layers: one at a time keeps that simple

    async def put_context(self, chunks: AsyncIterable[bytes]) -> ContextReport:
        """Store a build context (a tar); its digest and size (see BuildContexts)."""
        digest = await self.contexts.put(chunks)
        return {"context": digest, "bytes": self.contexts.path(digest).stat().st_size}

    async def build(self, req: BuildRequest, emit: Emit = _ignore) -> BuildReport:
        if not bounds.TAG_RE.match(req.tag):
            raise InvalidRequest(f"invalid tag {req.tag[:80]!r}")
        bounds.EXEC_TIMEOUT_SECS.check(req.step_timeout_secs)
        bounds.EXEC_TIMEOUT_SECS.check(req.ready_timeout_secs)
        for cmd in (req.start_cmd, req.ready_cmd):
            if cmd is not None and (len(cmd) > MAX_COMMAND_CHARS or "\0" in cmd):
                raise InvalidRequest(f"a start or ready command is at most {MAX_COMMAND_CHARS} characters, "
                                     "without NUL")
        plan = parse(req.dockerfile, req.build_args)
        on_snapshot = plan.base.startswith(SNAPSHOT_BASE)  # its machine is its own: no spec applies
        spec = SnapshotSpec(tag="", image="" if on_snapshot else plan.base, nic=req.nic,
                            egress=EgressPolicy(), boot_wait_secs=req.boot_wait_secs)
        if req.mem_mib is not None:
            spec.mem_mib = req.mem_mib
        if req.vcpus is not None:
            spec.vcpus = req.vcpus
        spec.validate()
        if not req.egress.is_default and spec.nic_tap is None and not on_snapshot:
            raise InvalidRequest("a build's allow_internet_access and network need \"nic\": true")
        if not req.replace and self._exists(req.tag):
            raise Conflict(f"snapshot {req.tag!r} already exists (pass replace to rebuild it)")
        async with self._lock:
            pulled: Image | None = None
            if plan.base.startswith(REGISTRY_BASE):
                pulled, plan = await self._pull_base(req, plan, emit)
                spec.image = plan.base
            with tempfile.TemporaryDirectory(prefix="build-", dir=self._data.tmp) as tmp:
                report = await self._build(req, plan, spec, Path(tmp), emit, pulled)
            return report

    async def _pull_base(self, req: BuildRequest, plan: BuildPlan, emit: Emit) -> tuple[Image, BuildPlan]:
        """Pull and convert a registry FROM (cached by digest), then plan again from its config."""
        ref = plan.base.removeprefix(REGISTRY_BASE)

        def progress(event: dict[str, Any]) -> None:
            if event["type"] == "progress":
                emit({"type": "log", "index": 0, "stream": "status", "data": f"{ref}: {event['step']}"})

        image = await self._images.pull(PullRequest(ref, credentials=req.registry_credentials), progress)
        plan = parse(req.dockerfile, req.build_args, image_defaults(image))
        plan.base = image.name
        return image, plan

    def _exists(self, tag: str) -> bool:
        try:
            return self._host.get_snapshot(tag).status == "ready"
        except NotFound:
            return False

    def _plan_layers(self, req: BuildRequest, plan: BuildPlan, spec: SnapshotSpec,
                     tmp: Path) -> tuple[str, list[_Layer]]:
        if plan.base.startswith(SNAPSHOT_BASE):
            # Built on a snapshot as it is now: its tag and its making are the key.
            record = self._host.get_snapshot(plan.base.removeprefix(SNAPSHOT_BASE))
            key = _digest(KEY_VERSION, "snapshot", record.tag, str(record.created_at_unix), record.dir)
        else:
            key = base_key(load_image(self._data, plan.base).key, spec)
        base = key
        layers: list[_Layer] = []
        for i, step in enumerate(plan.steps):
            copy_tar: Path | None = None
            files = ""
            if isinstance(step, Copy):
                if req.context is None:
                    raise InvalidRequest(f"{step.text[:80]}: COPY needs a build context")
                copy_tar = tmp / f"copy-{i}.tar"
                files = self.contexts.select(req.context, step.sources, copy_tar)
            key = step_key(key, step, files)
            layers.append(_Layer(step, key, copy_tar))
        return base, layers

    async def _build(self, req: BuildRequest, plan: BuildPlan, spec: SnapshotSpec, tmp: Path,
                     emit: Emit, pulled: Image | None = None) -> BuildReport:
        base, layers = await asyncio.to_thread(self._plan_layers, req, plan, spec, tmp)
        emit({"type": "plan", "base": plan.base, "steps": len(layers), "warnings": plan.warnings})
        # The deepest layer that exists already: everything up to it is a cache hit.
        start = len(layers)
        cache_from = len(layers) if req.cache_from is None else max(0, min(req.cache_from, len(layers)))
        start = cache_from
        while start > 0 and not self._exists(layer_tag(layers[start - 1].key)):
            start -= 1
        snapshot_base = plan.base.startswith(SNAPSHOT_BASE)
        base_tag = plan.base.removeprefix(SNAPSHOT_BASE) if snapshot_base else layer_tag(base)
        if start == 0 and not self._exists(base_tag):
            emit({"type": "step", "index": 0, "of": len(layers), "text": f"FROM {plan.base}",
                  "cached": False})
            spec.tag = base_tag

            def progress(message: str, fraction: float) -> None:
                emit({"type": "log", "index": 0, "stream": "status", "data": message})

            await self._templates.create(spec, progress)
        else:
            emit({"type": "step", "index": 0, "of": len(layers), "text": f"FROM {plan.base}", "cached": True})
        for i in range(start):
            emit({"type": "step", "index": i + 1, "of": len(layers), "text": layers[i].step.text,
                  "cached": True})
        parent = layer_tag(layers[start - 1].key) if start else base_tag
        options = SpawnOptions(egress=req.egress, timeout_secs=BUILD_SANDBOX_SECS,
                               metadata={"forkd.build": req.tag})
        sandbox = (await self._host.spawn(parent, 1, options))[0].id
        try:
            for i in range(start, len(layers)):
                layer = layers[i]
                emit({"type": "step", "index": i + 1, "of": len(layers), "text": layer.step.text,
                      "cached": False})
                if isinstance(layer.step, Run):
                    await self._run(sandbox, i + 1, layer.step, req.step_timeout_secs, emit)
                else:
                    assert layer.copy_tar is not None
                    await self._copy(sandbox, i + 1, layer.step, layer.copy_tar, req.step_timeout_secs)
                if i < cache_from:
                    await self._host.branch(sandbox, layer_tag(layer.key))
            await self._apply_defaults(sandbox, plan)
            if req.start_cmd:
                await self._start(sandbox, req, plan, emit)
            if req.replace and self._exists(req.tag):
                emit({"type": "log", "index": len(layers), "stream": "status",
                      "data": f"replacing snapshot {req.tag}"})
                await self._host.delete_snapshot(req.tag)
            record = await self._host.branch(sandbox, req.tag)
        finally:
            await self._host.kill(sandbox)
        report = BuildReport(record, cache_hits=start, steps_run=len(layers) - start,
                             layers=[base_tag] + [layer_tag(layer.key) for layer in layers], env=plan.env,
                             workdir=plan.workdir, user=plan.user,
                             image=None if pulled is None else pulled.meta.get("oci"))
        emit({"type": "done", **report.info()})
        return report

    async def _run(self, sandbox: str, index: int, step: Run, timeout: float, emit: Emit) -> None:
        if step.workdir != "/":  # made as root, as Docker makes WORKDIR; then the step as its user
            await self._checked(sandbox, ["mkdir", "-p", "--", step.workdir], timeout, step.text)
        events: ProcessEvents = await self._host.processes.run(
            sandbox, list(step.argv), env=dict(step.env), cwd=step.workdir, timeout_secs=timeout,
            user=step.user)
        exit_code: int | None = None
        tail = b""
        try:
            async for event in events:
                if event.type in ("stdout", "stderr"):
                    tail = (tail + event.data)[-2000:]
                    emit({"type": "log", "index": index, "stream": event.type,
                          "data": event.data.decode(errors="replace")})
                elif event.type == "exit":
                    exit_code = event.exit_code
                    if event.error:
                        tail += event.error.encode()
        finally:
            await events.aclose()
        if exit_code != 0:
            raise InvalidRequest(f"{step.text[:200]} failed with exit code {exit_code}: "
                                 f"{tail.decode(errors='replace')[-1000:]}")

    async def _copy(self, sandbox: str, index: int, step: Copy, tar: Path, timeout: float) -> None:
        guest_tar = f"/tmp/.forkd-copy-{index}.tar"

        async def chunks() -> Any:
            with tar.open("rb") as f:
                while piece := await asyncio.to_thread(f.read, 1 << 20):
                    yield piece

        await self._host.files.write(sandbox, guest_tar, chunks(), max_bytes=bounds.MAX_BUILD_CONTEXT_BYTES)
        await self._checked(sandbox, ["/bin/sh", "-c", _COPY_SH, "copy", guest_tar, step.dest,
                                      step.chown or "", step.chmod or "", *step.sources], timeout, step.text)

    async def _start(self, sandbox: str, req: BuildRequest, plan: BuildPlan, emit: Emit) -> None:
        """The start command, left running in the snapshot, once its ready command succeeds."""
        assert req.start_cmd is not None
        index = len(plan.steps) + 1
        emit({"type": "log", "index": index, "stream": "status", "data": f"starting: {req.start_cmd[:200]}"})
        await self._host.processes.start(sandbox, ["/bin/bash", "-l", "-c", req.start_cmd], cwd=plan.workdir,
                                         user=plan.user, tag="start_cmd")
        if not req.ready_cmd:
            return
        deadline = asyncio.get_running_loop().time() + req.ready_timeout_secs
        while True:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise InvalidRequest(f"ready command {req.ready_cmd[:200]!r} did not succeed within "
                                     f"{req.ready_timeout_secs:g} s")
            res = await self._host.exec(sandbox, ["/bin/bash", "-l", "-c", req.ready_cmd],
                                        timeout_secs=max(1.0, left), cwd=plan.workdir, user=plan.user,
                                        max_output_bytes=64 * 1024)
            if res.get("exit_code") == 0:
                emit({"type": "log", "index": index, "stream": "status", "data": "ready"})
                return
            await asyncio.sleep(1.0)

    async def _checked(self, sandbox: str, argv: list[str], timeout: float, what: str) -> None:
        res = await self._host.exec(sandbox, argv, timeout_secs=timeout, max_output_bytes=64 * 1024)
        if res.get("exit_code") != 0:
            out = str(res.get("error") or res.get("stderr") or res.get("stdout") or "")
            raise InvalidRequest(f"{what[:200]} failed with exit code {res.get('exit_code')}: {out[-1000:]}")

    async def _apply_defaults(self, sandbox: str, plan: BuildPlan) -> None:
        """ENV and WORKDIR as the defaults of the template's sandboxes (see the module's note)."""
        profile = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(plan.env.items()))
        script = (f"mkdir -p -- {shlex.quote(plan.workdir)} && "
                  f"printf %s {shlex.quote(profile)} > {PROFILE} && chmod 644 {PROFILE}")
        if not plan.env:
            script = f"mkdir -p -- {shlex.quote(plan.workdir)} && rm -f {PROFILE}"
        await self._checked(sandbox, ["/bin/sh", "-c", script], 60, "applying ENV and WORKDIR")
        agents = self._host.agents
        if not (await agents.capabilities(sandbox)).lacks(capabilities.CAP_PID1_DEFAULTS):
            # An action of its own: an image without Python has no eval to do it with.
            await agents.call(sandbox, lambda agent: agent.pid1_defaults(
                {"env": plan.env, "cwd": plan.workdir}, 30))
            return
        code = (f"__import__('os').environ.update({json.dumps(plan.env)}); "  # an older agent's base
                f"__import__('os').chdir({json.dumps(plan.workdir)})")
        res = await self._host.eval(sandbox, code, timeout_secs=30)
        if res.get("exit_code") != 0:
            raise InvalidRequest(f"applying ENV and WORKDIR in PID 1 failed: {res.get('error')}")

