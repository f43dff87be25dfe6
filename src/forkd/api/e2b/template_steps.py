"""E2B's template build steps as a forkd Dockerfile: the translation, apart from running it.

``plan`` turns the body of ``POST /v2/templates/{id}/builds/{buildID}`` into a Dockerfile that
forkd's builder parses (controller/dockerfile.py): exec-form ``RUN ["/bin/bash", "-c", cmd]`` (as
the step's user where it names one), ``COPY`` of the uploaded files (globs matched against what was
uploaded), ``ENV``, ``WORKDIR`` and ``USER``, over the base E2B named. The build starts as E2B's
templates do: ``USER user`` and ``WORKDIR /home/user``. The body is a client's: every field is
checked and bounded before it becomes a Dockerfile line.
"""

from __future__ import annotations

import fnmatch
import json
import tarfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from forkd import bounds
from forkd.api.schemas.builds import RegistryAuth
from forkd.errors import InvalidRequest
from forkd.image.oci import Credentials, ImageRef

BASE_IMAGES = {"e2bdev/base", "e2bdev/base:latest"}  # E2B's default: forkd's default image
DEFAULT_USER, DEFAULT_WORKDIR = "user", "/home/user"
STEP_TYPES = {"RUN", "COPY", "ENV", "WORKDIR", "USER"}
MAX_STEPS = bounds.MAX_TEMPLATE_STEPS


class TemplateError(Exception):
    """An answer in the SDK's REST error shape (the control app's handler turns it into one)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class StepPlan:
    """A build's Dockerfile, the uploads it copies from, and each RUN/COPY's E2B step number."""

    dockerfile: str
    uploads: list[str]
    step_names: dict[int, str]  # a RUN/COPY of the plan (1-based) -> its E2B step number


def _quote_env(value: str) -> str:
    if "\n" in value or "\r" in value:
        raise TemplateError(400, "an environment variable's value cannot hold a line break here")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def _word(value: str, what: str) -> str:
    if not value or any(c.isspace() for c in value) or "\0" in value:
        raise TemplateError(400, f"{what} {value[:80]!r} must be one word")
    return value


def _matches(pattern: str, name: str) -> bool:
    """A glob over whole path segments (``folder/*`` matches ``folder/a``, not ``folder/a/b``)."""
    want, have = pattern.strip("/").split("/"), name.split("/")
    return len(want) == len(have) and all(fnmatch.fnmatchcase(h, w) for h, w in zip(have, want, strict=True))


def registry_credentials(body: dict[str, Any]) -> Credentials | None:
    """``fromImageRegistry``: E2B's ``{"type": "registry", "username", "password"}``; the cloud
    registries' own types (``aws``, ``gcp``) need their SDKs' token exchange, which forkd lacks."""
    registry = body.get("fromImageRegistry")
    if registry is None:
        return None
    if not isinstance(registry, dict) or registry.get("type") != "registry":
        raise TemplateError(400, "fromImageRegistry: only type \"registry\" (a user name and password) "
                            "is supported")
    try:  # the same bounds as forkd's own registry_auth
        auth = RegistryAuth.model_validate({"username": registry.get("username"),
                                            "password": registry.get("password")})
    except ValidationError:
        raise TemplateError(400, "fromImageRegistry needs a username and a password") from None
    return auth.credentials()

def plan(body: dict[str, Any], files: Mapping[str, Path], has_snapshot: Callable[[str], bool]) -> StepPlan:
    """The Dockerfile of a build's E2B steps, over its base (``fromTemplate``/``fromImage``).

    ``files`` are the copy steps' uploads by hash; ``has_snapshot`` says whether a forkd snapshot
    tag exists (a ``fromTemplate``).
    """
    steps = body.get("steps") or []
    if not isinstance(steps, list) or len(steps) > MAX_STEPS:
        raise TemplateError(400, f"steps must be a list of at most {MAX_STEPS}")
    lines = [f"FROM {_base(body, has_snapshot)}", f"USER {DEFAULT_USER}", f"WORKDIR {DEFAULT_WORKDIR}"]
    user, uploads = DEFAULT_USER, []
    names: dict[int, str] = {}  # a RUN/COPY of the plan (1-based) -> its E2B step number
    for number, step in enumerate(steps, 1):
        if not isinstance(step, dict):
            raise TemplateError(400, "each step must be an object")
        kind, args = step.get("type"), step.get("args") or []
        if kind not in STEP_TYPES or not isinstance(args, list) or not all(isinstance(a, str)
                                                                             for a in args):
            raise TemplateError(400, f"step {number}: type {str(kind)[:20]!r} is not supported "
                                f"(forkd builds {', '.join(sorted(STEP_TYPES))})")
        if kind == "RUN":
            if not args:
                raise TemplateError(400, f"step {number}: RUN needs a command")
            run = "RUN " + json.dumps(["/bin/bash", "-c", args[0]])
            names[len(names) + 1] = str(number)
            if len(args) > 1 and args[1] and args[1] != user:
                lines += [f"USER {_word(args[1], 'user')}", run, f"USER {user}"]
            else:
                lines.append(run)
        elif kind == "COPY":
            src, dest, owner, mode = [*args, "", "", "", ""][:4]
            files_hash = step.get("filesHash")
            if not isinstance(files_hash, str) or files_hash not in files:
                raise TemplateError(400, f"step {number}: the files of {src[:80]!r} were not uploaded")
            uploads.append(files_hash)
            sources = _sources(files[files_hash], src)
            flags = (f"--chown={_word(owner, 'owner')} " if owner else "") + (
                f"--chmod={_word(mode, 'mode')} " if mode else "")
            if not dest:
                raise TemplateError(400, f"step {number}: COPY needs a destination")
            into_dir = dest.endswith("/") or len(sources) > 1 or any(c in src for c in "*?[")
            target = dest.rstrip("/") + "/" if into_dir else dest
            lines.append(f"COPY {flags}{json.dumps([*sources, target])}")
            names[len(names) + 1] = str(number)
        elif kind == "ENV":
            pairs = [f"{_word(args[i], 'name')}={_quote_env(args[i + 1])}"
                     for i in range(0, len(args) - 1, 2)]
            if pairs:
                lines.append("ENV " + " ".join(pairs))
        elif kind == "WORKDIR":
            lines.append(f"WORKDIR {_word(args[0] if args else '', 'workdir')}")
        else:  # USER
            user = _word(args[0] if args else "", "user")
            lines.append(f"USER {user}")
    return StepPlan(dockerfile="\n".join(lines) + "\n", uploads=uploads, step_names=names)

def _sources(upload: Path, src: str) -> list[str]:
    """The context paths a copy step names: its globs matched against what was uploaded."""
    if not any(c in src for c in "*?["):
        return [src.strip("/") or "."]
    names: set[str] = set()
    with tarfile.open(upload) as tar:
        for member in tar:
            parts = member.name.strip("/").split("/")
            names.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))  # and its directories
    found = sorted(n for n in names if _matches(src, n))
    if not found:
        raise TemplateError(400, f"{src[:80]!r} matches no uploaded file")
    return found


def _base(body: dict[str, Any], has_snapshot: Callable[[str], bool]) -> str:
    template = body.get("fromTemplate")
    if template is not None:
        if not isinstance(template, str) or not bounds.TAG_RE.match(template):
            raise TemplateError(400, f"fromTemplate {str(template)[:80]!r} is not a forkd snapshot tag")
        if not has_snapshot(template):
            raise TemplateError(404, f"template {template!r} was not found")
        return f"snapshot:{template}"
    image = body.get("fromImage")
    if image is None or image in BASE_IMAGES:
        return "default"
    if isinstance(image, str) and bounds.TAG_RE.match(image.removeprefix("forkd/")):
        return image.removeprefix("forkd/")
    if isinstance(image, str):
        try:
            ImageRef.parse(image)  # a registry's image: the build pulls it (controller/images.py)
        except InvalidRequest as exc:
            raise TemplateError(400, f"fromImage: {exc}") from None
        return image
    raise TemplateError(400, "fromImage must be a string")
