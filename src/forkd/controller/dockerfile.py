"""A Dockerfile as a build plan: a base image and resolved RUN and COPY steps.

The text is parsed by ``e2b-dockerfile-utils`` (BuildKit's parser and shell
lexer, as E2B's own SDK uses them). Every variable is resolved here, once:
ENV, ARG, WORKDIR and USER change no VM, they only change the state the
following RUN and COPY steps carry (their environment, working directory and
user). A step is therefore complete on its own, and its canonical form is what
the layer cache hashes (controller/template_build.py).

Supported: one ``FROM`` (a forkd image name, ``forkd/`` prefix allowed; ``snapshot:TAG``,
a registered snapshot; or a registry's image, ``python:3.12`` or ``registry/name:tag`` or
``…@sha256:``, pulled and converted, whose ENV, WORKDIR and USER the steps then start
from, as in Docker), ``RUN``
(shell and exec forms), ``COPY``/``ADD`` (from the build context, ``--chown``,
``--chmod``), ``ENV``, ``ARG``, ``WORKDIR`` and ``USER``. Instructions that only
describe how a container starts (``CMD``, ``ENTRYPOINT``, ``EXPOSE``, ``LABEL``,
``VOLUME``, ``STOPSIGNAL``, ``HEALTHCHECK``, ``MAINTAINER``) are skipped with a
warning; the rest are refused.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from e2b_dockerfile_utils import DockerfileInstruction, ShellLex, parse_dockerfile_ast

from forkd import bounds
from forkd.errors import InvalidRequest
from forkd.image.oci import ImageDefaults, ImageRef

SKIPPED = frozenset({"CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "VOLUME", "STOPSIGNAL", "HEALTHCHECK",
                     "MAINTAINER"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_CHOWN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})?")
_GLOB = re.compile(r"[*?\[]")
# The guest agent's PATH (guest/agent/setup.py), which every exec inherits: what ``$PATH`` in an
# ENV means, as an image's own PATH does in Docker.
GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# RUN's working directory is made first, as Docker makes WORKDIR's; the agent
# would refuse a cwd that does not exist yet.
_IN_WORKDIR = 'mkdir -p -- "$1" && cd -- "$1" && shift && exec "$@"'


@dataclass(frozen=True)
class Run:
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # sorted: ENV and ARG values in effect
    workdir: str
    user: str | None  # None: root (the agent's own user)
    text: str  # the instruction as written, for logs

    def canonical(self) -> dict[str, Any]:
        return {"run": list(self.argv), "env": [list(p) for p in self.env], "workdir": self.workdir,
                "user": self.user}

    def exec_argv(self) -> list[str]:
        return ["/bin/sh", "-c", _IN_WORKDIR, "sh", self.workdir, *self.argv]


@dataclass(frozen=True)
class Copy:
    sources: tuple[str, ...]  # relative paths inside the build context, normalised
    dest: str  # absolute; a trailing "/" means "into this directory"
    chown: str | None
    chmod: str | None
    text: str

    def canonical(self) -> dict[str, Any]:
        return {"copy": list(self.sources), "dest": self.dest, "chown": self.chown, "chmod": self.chmod}


Step = Run | Copy


@dataclass
class BuildPlan:
    base: str  # a forkd image name, or with ``snapshot:`` a registered snapshot's tag
    steps: list[Step] = field(default_factory=list)
    # What the last instruction left: the defaults the template's sandboxes start with.
    env: dict[str, str] = field(default_factory=dict)  # ENV only (ARG values are build-time)
    workdir: str = "/"
    user: str | None = None
    warnings: list[str] = field(default_factory=list)


def step_canonical(step: Step) -> str:
    """The step's text for hashing: stable JSON of everything that decides what it does."""
    return json.dumps(step.canonical(), sort_keys=True, separators=(",", ":"))


SNAPSHOT_BASE = "snapshot:"


# A base pulled from a registry: ``registry:`` and the reference as written (``python:3.12``,
# ``ghcr.io/org/img@sha256:…``); controller/images.py pulls it and converts it to a forkd image.
REGISTRY_BASE = "registry:"


def _image_name(ref: str) -> str:
    if ref.startswith(SNAPSHOT_BASE) and bounds.TAG_RE.match(ref.removeprefix(SNAPSHOT_BASE)):
        return ref  # an existing snapshot: the build starts from a child of it, no boot
    if ref.startswith(SNAPSHOT_BASE):
        raise InvalidRequest(f"FROM {ref[:200]!r}: snapshot:TAG takes a snapshot tag (and a registry's image "
                             "or a forkd image name takes no snapshot: prefix)")
    name = ref.removeprefix("forkd/")
    if ":" not in name and "@" not in name and "/" not in name and bounds.TAG_RE.match(name):
        return name  # a forkd image's name (a Docker Hub name needs its tag here: python:latest)
    ImageRef.parse(ref)  # a reference that is not one is refused here, before any pull
    return REGISTRY_BASE + ref


class _State:
    def __init__(self, build_args: Mapping[str, str]) -> None:
        self.build_args = dict(build_args)
        self.args: dict[str, str] = {}
        self.env: dict[str, str] = {}
        self.workdir = "/"
        self.user: str | None = None

    def variables(self) -> dict[str, str]:
        return {**self.args, **self.env}  # ENV wins over ARG, as in Docker

    def expansions(self) -> dict[str, str]:
        return {"PATH": GUEST_PATH, **self.variables()}

    def expand(self, word: str, escape: str) -> str:
        try:
            return ShellLex(escape, env=self.expansions(), skip_unset_env=False).process_word(word)
        except ValueError as exc:
            raise InvalidRequest(f"cannot expand {word[:200]!r}: {exc}") from None


def _check_name(name: str, what: str, line: int) -> str:
    if not _ENV_NAME.match(name):
        raise InvalidRequest(f"line {line}: {what} name {name[:64]!r} is not a variable name")
    return name


def _flags(inst: DockerfileInstruction, allowed: set[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for flag in inst.flags:
        key, _, value = flag.removeprefix("--").partition("=")
        if key not in allowed:
            raise InvalidRequest(f"line {inst.start_line}: {inst.name} --{key} is not supported")
        out[key] = value
    return out


def _context_path(src: str, line: int) -> str:
    if _GLOB.search(src):
        raise InvalidRequest(f"line {line}: COPY source {src!r}: wildcards are not supported")
    if "://" in src:
        raise InvalidRequest(f"line {line}: ADD of a URL is not supported (nothing is downloaded)")
    norm = posixpath.normpath("/" + src).lstrip("/")  # "/.." cannot climb out of the context
    return norm or "."


def parse(text: str, build_args: Mapping[str, str] | None = None,
          image: ImageDefaults | None = None) -> BuildPlan:
    """The plan for ``text``; ``InvalidRequest`` names the line of anything not supported.

    ``image``: the FROM image's own ENV, WORKDIR and USER (a pulled image's config), the
    state its first step starts in.
    """
    if len(text.encode()) > bounds.MAX_DOCKERFILE_BYTES:
        raise InvalidRequest(f"the Dockerfile is over {bounds.MAX_DOCKERFILE_BYTES} bytes")
    build_args = dict(build_args or {})
    if len(build_args) > bounds.MAX_BUILD_ARGS:
        raise InvalidRequest(f"at most {bounds.MAX_BUILD_ARGS} build args")
    for name in build_args:
        _check_name(name, "build arg", 0)
    try:
        ast = parse_dockerfile_ast(text)
    except ValueError as exc:  # DockerfileSyntaxError is one
        raise InvalidRequest(f"Dockerfile: {exc}") from None
    if len(ast.instructions) > bounds.MAX_TEMPLATE_STEPS:
        raise InvalidRequest(f"the Dockerfile has over {bounds.MAX_TEMPLATE_STEPS} instructions")
    state = _State(build_args)
    plan: BuildPlan | None = None
    warnings = [f"line {w.line}: {w.message}" for w in ast.warnings]
    for inst in ast.instructions:
        line, name = inst.start_line, inst.name
        if inst.heredocs:
            raise InvalidRequest(f"line {line}: heredocs are not supported")
        if name == "ARG":
            _arg(inst, state, ast.escape_token)
            continue
        if name == "FROM":
            if plan is not None:
                raise InvalidRequest(f"line {line}: multi-stage builds (a second FROM) are not supported")
            _flags(inst, set())
            if not inst.args or (len(inst.args) not in (1, 3)) or (
                    len(inst.args) == 3 and inst.args[1].upper() != "AS"):
                raise InvalidRequest(f"line {line}: FROM takes one image name")
            plan = BuildPlan(base=_image_name(state.expand(inst.args[0], ast.escape_token)))
            state.args = {}  # an ARG before FROM is only in scope for FROM, as in Docker
            if image is not None:
                _start_from(state, image, warnings)
            continue
        if plan is None:
            raise InvalidRequest(f"line {line}: {name} before FROM")
        if name in SKIPPED:
            warnings.append(f"line {line}: {name} is skipped (a template has no container start "
                            "command, ports or labels)")
        elif name == "RUN":
            _flags(inst, set())
            argv = tuple(inst.args) if inst.json else (inst.args[0] if inst.args else "",)
            if not argv or not argv[0].strip():
                raise InvalidRequest(f"line {line}: RUN needs a command")
            if not inst.json:
                argv = ("/bin/sh", "-c", argv[0])
            plan.steps.append(Run(argv, tuple(sorted(state.variables().items())), state.workdir,
                                  state.user, inst.original[:500]))
        elif name in ("COPY", "ADD"):
            plan.steps.append(_copy(inst, state, ast.escape_token))
        elif name == "ENV":
            for i in range(0, len(inst.args) - 2, 3):
                key = _check_name(inst.args[i], "ENV", line)
                state.env[key] = state.expand(inst.args[i + 1], ast.escape_token)
        elif name == "WORKDIR":
            if len(inst.args) != 1:
                raise InvalidRequest(f"line {line}: WORKDIR takes one path")
            state.workdir = posixpath.normpath(posixpath.join(state.workdir,
                                                              state.expand(inst.args[0], ast.escape_token)))
        elif name == "USER":
            if len(inst.args) != 1:
                raise InvalidRequest(f"line {line}: USER takes one name")
            user = state.expand(inst.args[0], ast.escape_token).partition(":")[0]
            state.user = None if user in ("root", "0") else bounds.check_guest_user(user)
        else:
            raise InvalidRequest(f"line {line}: {name} is not supported")
    if plan is None:
        raise InvalidRequest("the Dockerfile has no FROM")
    plan.env, plan.workdir, plan.user, plan.warnings = dict(state.env), state.workdir, state.user, warnings
    return plan


def _start_from(state: _State, image: ImageDefaults, warnings: list[str]) -> None:
    state.env = {k: v for k, v in image.env.items() if _ENV_NAME.match(k)}
    state.workdir = posixpath.normpath(posixpath.join("/", image.workdir))
    if image.user is not None:
        try:
            state.user = bounds.check_guest_user(image.user)
        except InvalidRequest:
            warnings.append(f"the image's USER {image.user[:64]!r} is not an account name: steps run as root")


def _arg(inst: DockerfileInstruction, state: _State, escape: str) -> None:
    for spec in inst.args:
        key, eq, default = spec.partition("=")
        _check_name(key, "ARG", inst.start_line)
        if key in state.build_args:
            state.args[key] = state.build_args[key]
        elif eq:
            state.args[key] = state.expand(default, escape)


def _copy(inst: DockerfileInstruction, state: _State, escape: str) -> Copy:
    line = inst.start_line
    flags = _flags(inst, {"chown", "chmod"})
    words = [state.expand(w, escape) for w in inst.args]
    if len(words) < 2:
        raise InvalidRequest(f"line {line}: {inst.name} needs a source and a destination")
    *sources, dest = words
    if flags.get("chmod") and not re.fullmatch(r"[0-7]{3,4}", flags["chmod"]):
        raise InvalidRequest(f"line {line}: --chmod takes an octal mode")
    chown = flags.get("chown") or None
    if chown is not None and not _CHOWN.fullmatch(chown):
        raise InvalidRequest(f"line {line}: --chown takes user[:group]")
    into_dir = dest.endswith("/") or len(sources) > 1
    absolute = posixpath.normpath(posixpath.join(state.workdir, dest))
    dest = absolute + "/" if into_dir and absolute != "/" else absolute
    return Copy(tuple(_context_path(s, line) for s in sources), dest, chown, flags.get("chmod") or None,
                inst.original[:500])
