"""OCI and Docker images from a registry or an archive, fetched and unpacked by Debian's tools.

The registry protocol and the layer format are left to two well-kept tools, not
written here: ``skopeo`` (containers/image: the distribution protocol, auth,
manifest lists, docker-archive and OCI layouts; it checks every blob's digest)
copies an image into one OCI layout under ``<images>/.cache/oci``, tagged by the
manifest's digest (so a second pull of the same image fetches nothing, and
images share layers by digest); ``umoci`` applies the layers in order onto a
tree (whiteouts, opaque dirs, hard links, symlinks, owners, modes, xattrs and
file capabilities), resolving every path inside the tree.

What this module adds is the part neither tool bounds: the manifest and config
are read with a size limit before they are parsed, each layer's blob must be
the size its descriptor declares, and each layer's tar is walked (Python's
``tarfile``, headers only) before umoci sees it: the sum of its entries and
their number are bounded, and device nodes, paths that climb out of the root
(``..``, or through a symlink of the same layer) and hard links that point out
of it are refused.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import re
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forkd.errors import ImageError, InvalidRequest, NotFound, TooLarge
from forkd.host import prereqs

SKOPEO = prereqs.Tool("skopeo", "skopeo", "pulls OCI and Docker images from registries and archives")
UMOCI = prereqs.Tool("umoci", "umoci", "applies an OCI image's layers onto a root filesystem tree")
OCI_TOOLS = (SKOPEO, UMOCI)

MAX_MANIFEST_BYTES = 4 << 20  # a manifest, manifest list or config: JSON, read with this limit
MAX_LAYERS = 256
MAX_COMPRESSED_BYTES = 16 << 30  # the sum of the layers' declared sizes
MAX_REF_CHARS = 512
DEFAULT_REGISTRY = "docker.io"
# What skopeo picks from a manifest list: the guest is x86-64 Linux.
PLATFORM = ("linux", "amd64")

Progress = Callable[[str, float], None]

# registry[:port]/path[:tag][@sha256:hex]: the grammar of distribution/reference, in short.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_PATH = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_REF = re.compile(
    r"^(?:(?P<registry>[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"(?::[0-9]{1,5})?|\[[0-9A-Fa-f:]+\](?::[0-9]{1,5})?)/)?"
    rf"(?P<path>{_PATH.pattern})"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)
_MANIFEST_LIST_TYPES = {"application/vnd.oci.image.index.v1+json",
                        "application/vnd.docker.distribution.manifest.list.v2+json"}
_MANIFEST_TYPES = {"application/vnd.oci.image.manifest.v1+json",
                   "application/vnd.docker.distribution.manifest.v2+json"}


@dataclass(frozen=True)
class ImageRef:
    """A registry reference, Docker Hub's short names spelled out."""

    registry: str
    path: str
    tag: str | None
    digest: str | None

    @classmethod
    def parse(cls, ref: str) -> ImageRef:
        if len(ref) > MAX_REF_CHARS:
            raise InvalidRequest(f"an image reference is at most {MAX_REF_CHARS} characters")
        ref = ref.removeprefix("docker://")
        match = _REF.match(ref)
        if match is None:
            raise InvalidRequest(f"{ref[:200]!r} is not an image reference (registry/name:tag or "
                                 "name@sha256:…)")
        registry = match["registry"]
        path = match["path"]
        # As Docker reads it: a first component with no '.' or ':' (and not localhost) is a
        # path on Docker Hub, not a registry; a one-component Hub name is under library/.
        if registry is not None and "." not in registry and ":" not in registry and registry != "localhost":
            path, registry = f"{registry}/{path}", None
        if not _PATH.fullmatch(path):
            raise InvalidRequest(f"{ref[:200]!r}: a repository name is lower-case letters, digits, . _ - /")
        registry = registry or DEFAULT_REGISTRY
        if registry in ("index.docker.io", "registry-1.docker.io"):
            registry = DEFAULT_REGISTRY
        if registry == DEFAULT_REGISTRY and "/" not in path:
            path = f"library/{path}"
        tag = match["tag"]
        if tag is None and match["digest"] is None:
            tag = "latest"
        return cls(registry, path, tag, match["digest"])

    def __str__(self) -> str:
        return (f"{self.registry}/{self.path}" + (f":{self.tag}" if self.tag else "")
                + (f"@{self.digest}" if self.digest else ""))

    def at(self, digest: str) -> ImageRef:
        return ImageRef(self.registry, self.path, None, digest)


@dataclass
class Registries:
    """How a daemon reaches registries: mirrors per registry, and an auth file (Docker's config.json).

    A mirror ``docker.io=http://127.0.0.1:5000`` sends every pull of a docker.io name to
    that host instead (the same path, tag and digest); an ``http://`` mirror is spoken to
    without TLS, and only it.
    """

    mirrors: dict[str, str] = field(default_factory=dict)
    authfile: Path | None = None

    def source(self, ref: ImageRef) -> tuple[str, bool]:
        """The ``docker://`` reference skopeo fetches, and whether TLS is verified for it."""
        mirror = self.mirrors.get(ref.registry)
        if mirror is None:
            return f"docker://{ref}", True
        scheme, _, host = mirror.partition("://")
        mirrored = ImageRef(host, ref.path, ref.tag, ref.digest)
        return f"docker://{mirrored}", scheme == "https"


@dataclass(frozen=True)
class Credentials:
    """A username and password (or token) for one pull; never put on a command line."""

    username: str
    password: str

    def authfile(self, registry: str, folder: Path) -> Path:
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        path = folder / "auth.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"auths": {registry: {"auth": token}}}, f)
        return path


@dataclass(frozen=True)
class ImageDefaults:
    """What an image's config says a container starts with: ENV, WORKDIR, USER, ENTRYPOINT, CMD."""

    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str | None = None
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ImageDefaults:
        c = config.get("config") or {}
        env: dict[str, str] = {}
        for item in c.get("Env") or []:
            if isinstance(item, str) and "=" in item:
                key, _, value = item.partition("=")
                env[key] = value
        user = c.get("User") or None
        if isinstance(user, str):
            user = user.partition(":")[0] or None
            if user in ("root", "0"):
                user = None
        workdir = c.get("WorkingDir") or "/"
        return cls(env=env, workdir=workdir if isinstance(workdir, str) else "/",
                    user=user if isinstance(user, str) else None,
                    entrypoint=[str(a) for a in c.get("Entrypoint") or []],
                    cmd=[str(a) for a in c.get("Cmd") or []])

    def info(self) -> dict[str, Any]:
        return {"env": self.env, "workdir": self.workdir, "user": self.user, "entrypoint": self.entrypoint,
                "cmd": self.cmd}


@dataclass(frozen=True)
class PulledImage:
    """An image in the local OCI layout, under the tag ``digest``'s hex."""

    layout: Path
    ref: str  # what was asked for (a registry reference, or the archive)
    digest: str  # sha256:… of its manifest
    layers: tuple[dict[str, Any], ...]  # the manifest's layer descriptors
    config: dict[str, Any]

    @property
    def tag(self) -> str:
        return self.digest.removeprefix("sha256:")

    @property
    def defaults(self) -> ImageDefaults:
        return ImageDefaults.from_config(self.config)

    def blob(self, digest: str) -> Path:
        algo, _, hexa = digest.partition(":")
        if algo != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", hexa):
            raise InvalidRequest(f"image {self.ref}: unsupported digest {digest[:80]!r}")
        return self.layout / "blobs" / "sha256" / hexa


def run_tool(args: list[str], what: str, env: Mapping[str, str] | None = None) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, env=None if env is None else dict(env))
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-1200:]
        raise ImageError(f"{what} failed (exit {proc.returncode}): {tail}")
    return proc.stdout


def _read_bounded(args: list[str], what: str, limit: int = MAX_MANIFEST_BYTES) -> bytes:
    """stdout of ``args``, refused beyond ``limit`` bytes (the process is stopped there)."""
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        data = proc.stdout.read(limit + 1)
        if len(data) > limit:
            proc.kill()
            raise TooLarge(f"{what}: over {limit} bytes")
        err = proc.stderr.read(64 * 1024)
        if proc.wait() != 0:
            message = err.decode(errors="replace").strip()[-1200:]
            if "manifest unknown" in message or "name unknown" in message or "not found" in message:
                raise NotFound(f"{what}: {message}")
            raise ImageError(f"{what} failed (exit {proc.returncode}): {message}")
    return data


def _json(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        raise ImageError(f"{what} is not JSON") from None
    if not isinstance(value, dict):
        raise ImageError(f"{what} is not a JSON object")
    return value


class _Source:
    """One place skopeo reads an image from, with the flags that reach it."""

    def __init__(self, transport_ref: str, flags: list[str], label: str, repo: str | None = None) -> None:
        # ``flags`` as ``skopeo inspect`` spells them (--authfile=…); ``skopeo copy`` wants them --src-.
        self.ref = transport_ref
        self.flags = flags
        self.label = label
        self.repo = repo  # a registry's repository (transport and name, no tag): a list's entries are in it

    def inspect_raw(self, ref: str) -> bytes:
        skopeo = prereqs.require(SKOPEO)["skopeo"]
        return _read_bounded([skopeo, "inspect", "--raw", *self.flags, ref],
                             f"reading the manifest of {self.label}")


def _check_manifest(raw: bytes, label: str) -> dict[str, Any]:
    manifest = _json(raw, f"the manifest of {label}")
    media = manifest.get("mediaType") or ("application/vnd.oci.image.manifest.v1+json"
                                          if "config" in manifest else "")
    if media not in _MANIFEST_TYPES or manifest.get("schemaVersion") != 2:
        raise InvalidRequest(f"{label}: unsupported manifest type {str(media)[:100]!r}")
    layers = manifest.get("layers")
    config = manifest.get("config")
    if not isinstance(layers, list) or not isinstance(config, dict):
        raise ImageError(f"the manifest of {label} has no layers or config")
    if len(layers) > MAX_LAYERS:
        raise TooLarge(f"{label} has {len(layers)} layers; at most {MAX_LAYERS}")
    total = 0
    for layer in layers:
        size = layer.get("size") if isinstance(layer, dict) else None
        if not isinstance(size, int) or size < 0:
            raise ImageError(f"{label}: a layer without a size")
        total += size
    if total > MAX_COMPRESSED_BYTES:
        raise TooLarge(f"{label}'s layers are {total} bytes; at most {MAX_COMPRESSED_BYTES}")
    if not isinstance(config.get("size"), int) or config["size"] > MAX_MANIFEST_BYTES:
        raise TooLarge(f"{label}'s config is over {MAX_MANIFEST_BYTES} bytes")
    return manifest


def _pick_platform(index: dict[str, Any], label: str) -> str:
    for entry in index.get("manifests") or []:
        plat = entry.get("platform") or {} if isinstance(entry, dict) else {}
        if (plat.get("os"), plat.get("architecture")) == PLATFORM and isinstance(entry.get("digest"), str):
            return str(entry["digest"])
    raise InvalidRequest(f"{label} has no {'/'.join(PLATFORM)} image")


@contextlib.contextmanager
def _locked(layout: Path) -> Iterator[None]:
    """One writer of the shared layout at a time (skopeo rewrites its index.json)."""
    layout.parent.mkdir(parents=True, exist_ok=True)
    with open(layout.parent / "oci.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _tags(layout: Path) -> set[str]:
    try:
        index = json.loads((layout / "index.json").read_text())
    except (OSError, ValueError):
        return set()
    return {str((m.get("annotations") or {}).get("org.opencontainers.image.ref.name"))
            for m in index.get("manifests", [])}


def _fetch(layout: Path, source: _Source, progress: Progress) -> PulledImage:
    """Resolve ``source`` to one manifest (bounded), then copy it into ``layout`` unless it is there.

    The cache's tag is the digest of the manifest as the source serves it (for a pinned
    ``@sha256:`` reference, that digest); what is stored may be its OCI conversion, so the
    layers and config are read back from the layout, not from the source's manifest.
    """
    ref = source.ref
    raw = source.inspect_raw(ref)
    top = _json(raw, f"the manifest of {source.label}")
    if top.get("mediaType") in _MANIFEST_LIST_TYPES or "manifests" in top:
        if source.repo is None:
            raise InvalidRequest(f"{source.label} holds a manifest list; give one image of it")
        ref = f"{source.repo}@{_pick_platform(top, source.label)}"
        raw = source.inspect_raw(ref)
    _check_manifest(raw, source.label)
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    tag = digest.removeprefix("sha256:")
    skopeo = prereqs.require(SKOPEO)["skopeo"]
    with _locked(layout):
        if tag not in _tags(layout):
            progress(f"pulling {source.label}", 0.05)
            flags = [f"--src-{flag.removeprefix('--')}" for flag in source.flags]
            run_tool([skopeo, "copy", "-q", *flags, ref, f"oci:{layout}:{tag}"], f"copying {source.label}")
        else:
            progress("cached", 0.05)
        stored = _stored_manifest(layout, tag, source.label)
    image = PulledImage(layout, source.label, digest, tuple(stored["layers"]), {})
    config_blob = image.blob(str(stored["config"].get("digest", "")))
    config = _json(_read_file_bounded(config_blob, f"the config of {source.label}"), "the image config")
    return PulledImage(layout, source.label, digest, image.layers, config)


def _stored_manifest(layout: Path, tag: str, label: str) -> dict[str, Any]:
    what = "the image cache's index.json"
    index = _json(_read_file_bounded(layout / "index.json", what), what)
    for entry in index.get("manifests", []):
        if (entry.get("annotations") or {}).get("org.opencontainers.image.ref.name") == tag:
            blob = PulledImage(layout, label, "", (), {}).blob(str(entry.get("digest", "")))
            return _check_manifest(_read_file_bounded(blob, f"the manifest of {label}"), label)
    raise ImageError(f"{label} is not in the image cache after copying it")


def _read_file_bounded(path: Path, what: str) -> bytes:
    with open(path, "rb") as f:
        data = f.read(MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        raise TooLarge(f"{what} is over {MAX_MANIFEST_BYTES} bytes")
    return data


def layout_dir(images: Path) -> Path:
    return images / ".cache" / "oci" / "layout"


def pull(images: Path, ref: str, registries: Registries | None = None, credentials: Credentials | None = None,
         progress: Progress = lambda _s, _f: None) -> PulledImage:
    """Copy ``ref`` from its registry (or its mirror) into the image cache's OCI layout."""
    registries = registries or Registries()
    parsed = ImageRef.parse(ref)
    transport_ref, tls = registries.source(parsed)
    # The request's auth file is written beside the cache (0600, removed after), not in /tmp.
    scratch = layout_dir(images).parent / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pull-", dir=scratch) as tmp:
        flags = [f"--tls-verify={'true' if tls else 'false'}"]
        if credentials is not None:
            registry = transport_ref.removeprefix("docker://").split("/", 1)[0]
            flags.append(f"--authfile={credentials.authfile(registry, Path(tmp))}")
        elif registries.authfile is not None:
            flags.append(f"--authfile={registries.authfile}")
        else:
            flags.append("--no-creds")
        repo = transport_ref.removeprefix("docker://")
        repo = repo.split("@", 1)[0]
        if ":" in repo.rsplit("/", 1)[-1]:
            repo = repo.rsplit(":", 1)[0]
        source = _Source(transport_ref, flags, str(parsed), repo=f"docker://{repo}")
        return _fetch(layout_dir(images), source, progress)


def import_archive(images: Path, path: Path, progress: Progress = lambda _s, _f: None) -> PulledImage:
    """A ``docker save`` tarball or an OCI layout directory (holding one image) into the cache."""
    if path.is_dir():
        if not (path / "oci-layout").is_file():
            raise InvalidRequest(f"{path} is not an OCI layout (it has no oci-layout file)")
        index = _json(_read_file_bounded(path / "index.json", f"{path}/index.json"), f"{path}/index.json")
        manifests = index.get("manifests") or []
        if len(manifests) != 1:
            raise InvalidRequest(f"{path} holds {len(manifests)} images; import a layout with one")
        return _fetch(layout_dir(images), _Source(f"oci:{path}", [], str(path)), progress)
    if path.is_file() and tarfile.is_tarfile(path):
        return _fetch(layout_dir(images), _Source(f"docker-archive:{path}", [], str(path)), progress)
    raise InvalidRequest(f"{path} is neither a docker save tarball nor an OCI layout directory")
