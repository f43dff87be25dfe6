"""Builds and caches guest images: kernel + initramfs + ext4 root filesystem.

An image lives in ``<images>/<name>/`` with ``image.json`` recording the
recipe's key. Building again with the same recipe is instant; a changed recipe
(packages, suite, agent code, init script…) rebuilds. The slow step, the
debootstrap tree, is cached separately by its own key, so editing the agent
only re-packs the ext4 image (seconds).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from forkd.bounds import TAG_RE
from forkd.config import DEFAULT_IMAGE, DataDir
from forkd.errors import ImageError, InvalidRequest, NotFound
from forkd.host import prereqs
from forkd.host.accel import ProbeGuest
from forkd.image import initramfs, kernel, rootfs

BUILDER_VERSION = 1
NAME_RE_HELP = "letters, digits, '.', '_' and '-' (max 64), not starting with '.'"

Progress = Callable[[str, float], None]  # (what is happening, fraction done 0..1)


def no_progress(_step: str, _fraction: float) -> None:
    pass


def _debian_mirror() -> str:
    """The host's own Debian mirror, so the build uses the registry this machine reaches."""
    for source in ("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"):
        try:
            text = Path(source).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            words = line.split()
            if line.startswith("URIs:") and len(words) > 1 and words[1].rstrip("/").endswith("/debian"):
                return words[1]
            if words[:1] == ["deb"] and len(words) > 2 and words[-3:-2] and "/debian" in line:
                url = next((w for w in words[1:] if "://" in w), None)
                if url and url.rstrip("/").endswith("/debian"):
                    return url
    return "http://deb.debian.org/debian"


# The packages every image has; the default image is exactly these. sudo (about 2 MB) lets the
# account ``user`` (rootfs.add_user) do what E2B's sandboxes allow it: ``sudo`` without a password.
# python-is-python3 (a symlink): E2B's images answer to ``python``, and programs written for them call it.
# git, curl and ca-certificates: E2B's base template has them, and E2B programs clone repositories
# (``sbx.git``) and call HTTP APIs with them (about 40 MB with what git needs).
BASE_PACKAGES: tuple[str, ...] = ("python3", "python-is-python3", "python3-numpy", "sudo", "git", "curl",
                                  "ca-certificates")

@dataclass(frozen=True)
class NamedRecipe:
    """A built-in recipe's packages: Debian's (apt-get) and PyPI's (pip, exact pins)."""

    apt: tuple[str, ...]
    pip: tuple[str, ...] = ()


# Built-in named recipes: ``forkd image build --name NAME`` installs these Debian
# packages with apt-get on top of the base tree (debootstrap's --include cannot
# configure a tree this large: python3-zmq fails), then these wheels with pip.
# ``code-interpreter`` carries IPython's kernel, which the agent's kernel runner
# (guest/agent/kernel_runner.py) drives, Node.js for forkd's JavaScript kernel
# (guest/agent/kernel_js.py; bash is in every image), and R with IRkernel, R's
# Jupyter kernel (Debian's r-base-core without its recommends: no compilers, no
# r-recommended packages, no HTML docs). Its data libraries are
# PyPI's wheels, not Debian's: ``e2b-charts`` (the chart data of a matplotlib
# figure, E2B's ``Result.chart``) needs matplotlib >= 3.10, numpy >= 2.2 and
# pydantic 2, newer than Debian 12's; pandas comes as a wheel too, as Debian's is
# built against numpy 1.24 (and pulls in scipy, sympy and a compiler). The pip
# list is the whole set, dependencies included (installed without resolving).
NAMED_RECIPES: dict[str, NamedRecipe] = {
    "code-interpreter": NamedRecipe(
        apt=(
            "nodejs",
            "python3-ipykernel",
            "python3-jupyter-client",
            "r-base-core",
            "r-cran-irkernel",
        ),
        pip=(
            "e2b-charts==1.0.0",
            "matplotlib==3.10.9",
            "numpy==2.3.5",
            "pandas==2.2.3",
            "pydantic==2.14.4",
            # their dependencies
            "annotated-types==0.8.0",
            "contourpy==1.3.3",
            "cycler==0.12.1",
            "fonttools==4.68.0",
            "kiwisolver==1.5.1",
            "packaging==26.4",
            "pillow==13.0.0",
            "pydantic-core==2.50.5",
            "pyparsing==3.3.3",
            "python-dateutil==2.9.0.post0",
            "pytz==2026.6",
            "six==1.17.0",
            "typing-extensions==4.16.0",
            "typing-inspection==0.4.5",
            "tzdata==2026.6",
        ),
    ),
}

# A pip package of a recipe: an exact pin, NAME==VERSION.
PIP_PIN_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*")


@dataclass(frozen=True)
class ImageRecipe:
    """Everything that determines an image's content."""

    name: str = DEFAULT_IMAGE
    suite: str = "bookworm"
    mirror: str = field(default_factory=_debian_mirror)
    packages: tuple[str, ...] = BASE_PACKAGES
    extra_packages: tuple[str, ...] = ()
    apt_packages: tuple[str, ...] = ()  # apt-get install'ed on the debootstrap tree (a named recipe's)
    pip_packages: tuple[str, ...] = ()  # exact pins, pip-installed after apt (rootfs.install_pip_packages)
    rootfs_source: str | None = None  # a directory or tarball instead of debootstrap
    size_mib: int = 2048
    kernel_package: str = kernel.KERNEL_PACKAGE

    def validate(self) -> None:
        if not TAG_RE.match(self.name):  # image names follow the snapshot tag rules
            raise InvalidRequest(f"invalid image name {self.name!r}: use {NAME_RE_HELP}")
        for pkg in (*self.packages, *self.extra_packages, *self.apt_packages):
            if not re.fullmatch(r"[a-z0-9][a-z0-9+.:=~-]*", pkg):
                raise InvalidRequest(f"invalid Debian package name {pkg!r}")
        for pin in self.pip_packages:
            if not PIP_PIN_RE.fullmatch(pin):
                raise InvalidRequest(f"invalid pip package {pin!r}: pin it exactly, NAME==VERSION")
        if not 256 <= self.size_mib <= 1 << 20:
            raise InvalidRequest("image size must be between 256 MiB and 1 TiB")
        if self.rootfs_source and not Path(self.rootfs_source).exists():
            raise InvalidRequest(f"rootfs source {self.rootfs_source} does not exist")

    def base_key(self) -> str:
        """Key of the debootstrap tree (the slow, rarely-changing part)."""
        parts = {"suite": self.suite, "mirror": self.mirror,
                 "packages": sorted({*self.packages, *self.extra_packages})}
        return digest_of(parts)[:16]

    def key(self) -> str:
        source_stamp = None
        if self.rootfs_source:
            st = os.stat(self.rootfs_source)
            source_stamp = [os.path.abspath(self.rootfs_source), st.st_size, st.st_mtime_ns]
        parts = {
            "builder": BUILDER_VERSION,
            "recipe": asdict(self),
            "source": source_stamp,
            "agent": rootfs.agent_digest(),  # every file of the agent package and its protocol
            "init": hashlib.sha256(initramfs.init_script()).hexdigest(),
            "modules": list(initramfs.WANTED_MODULES),
        }
        return digest_of(parts)[:16]


def recipe_for(name: str = DEFAULT_IMAGE, **fields: Any) -> ImageRecipe:
    """The recipe for image ``name``: a built-in named recipe's packages when it has one."""
    named = NAMED_RECIPES.get(name)
    if named is not None and not fields.get("rootfs_source"):
        fields.setdefault("apt_packages", named.apt)
        fields.setdefault("pip_packages", named.pip)
    return ImageRecipe(name=name, **fields)


def digest_of(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Image:
    """A built image on disk."""

    name: str
    dir: Path
    meta: dict[str, Any]

    @property
    def kernel(self) -> Path:
        return self.dir / "vmlinux"

    @property
    def initrd(self) -> Path:
        return self.dir / "initramfs.img"

    @property
    def rootfs(self) -> Path:
        return self.dir / "rootfs.ext4"

    @property
    def base(self) -> Path:
        """What a snapshot's disk stands on: this build's root filesystem under a name of its own
        (a hard link of ``rootfs`` named by its ``build`` id), which a rebuild keeps (``publish_image``)
        so that the snapshots made from this build never find another build's disk under their
        layers. ``rootfs`` for an image published before there were such names."""
        build = str(self.meta.get("build", ""))
        keyed = self.dir / base_name(build)
        return keyed if build and keyed.exists() else self.rootfs

    @property
    def key(self) -> str:
        return str(self.meta.get("key", ""))

    def probe_guest(self) -> ProbeGuest:
        """What the accelerator probe boots from this image."""
        return ProbeGuest(self.kernel, self.initrd, self.meta.get("kernel_version", ""))


KEPT_BUILDS = 2  # earlier builds' root filesystems a rebuild keeps for the snapshots made from them


def load_image(data: DataDir, name: str = DEFAULT_IMAGE) -> Image:
    d = data.images / name
    try:
        meta = json.loads((d / "image.json").read_text())
    except (OSError, ValueError):
        raise NotFound(
            f"guest image {name!r} is not built; build it with: forkd image build"
            + ("" if name == DEFAULT_IMAGE else f" --name {name}")
        ) from None
    image = Image(name=name, dir=d, meta=meta)
    for path in (image.kernel, image.initrd, image.rootfs):
        if not path.exists():
            raise NotFound(f"guest image {name!r} is incomplete ({path.name} missing); rebuild it")
    return image


def list_images(data: DataDir) -> list[Image]:
    images = []
    if data.images.is_dir():
        for d in sorted(data.images.iterdir()):
            if d.is_dir() and not d.name.startswith("."):
                try:
                    images.append(load_image(data, d.name))
                except NotFound:
                    continue
    return images


def build_image(
    data: DataDir,
    recipe: ImageRecipe | None = None,
    *,
    force: bool = False,
    progress: Progress = no_progress,
) -> Image:
    """Build (or reuse from cache) the image ``recipe`` describes."""
    recipe = recipe or ImageRecipe()
    recipe.validate()
    prereqs.require(*prereqs.IMAGE_TOOLS)
    data.images.mkdir(parents=True, exist_ok=True)
    key = recipe.key()
    if not force:
        try:
            cached = load_image(data, recipe.name)
            if cached.key == key:
                publish_seed_paths(data, cached)
                progress("cached", 1.0)
                return cached
        except NotFound:
            pass

    started = time.monotonic()
    cache = data.images / ".cache"
    staging = data.images / f".{recipe.name}.build-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    log = staging / "build.log"
    try:
        progress("kernel", 0.02)
        kfiles = cached_kernel(cache, recipe.kernel_package)
        progress("initramfs", 0.10)
        modules = initramfs.build_initramfs(kfiles.modules, staging / "initramfs.img")
        os.link(kfiles.vmlinux, staging / "vmlinux")

        progress("root filesystem", 0.15)
        if recipe.rootfs_source:
            tree = staging / "tree"
            tree.mkdir()
            rootfs.unpack_user_rootfs(Path(recipe.rootfs_source), tree)
            progress("installing packages", 0.4)
            rootfs.install_packages(tree, [*recipe.extra_packages, *recipe.apt_packages], log)
            rootfs.install_pip_packages(tree, list(recipe.pip_packages), log)
        else:
            tree = cached_debootstrap(cache, recipe, log, progress)
            if recipe.apt_packages or recipe.pip_packages:
                tree = _cached_apt_tree(cache, tree, recipe, log, progress)
        rootfs.install_agent(tree)
        progress("ext4 image", 0.85)
        rootfs.make_ext4(tree, staging / "rootfs.ext4", recipe.size_mib)
        if recipe.rootfs_source:
            shutil.rmtree(tree)

        meta = {
            "name": recipe.name,
            "key": key,
            "recipe": asdict(recipe),
            "kernel_version": kfiles.version,
            "modules": modules,
            "built_at_unix": int(time.time()),
            "build_secs": round(time.monotonic() - started, 1),
        }
        image = publish_image(data, recipe.name, staging, meta)
        progress("done", 1.0)
        publish_seed_paths(data, image)
        return image
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def base_name(build: str) -> str:
    """The name of a build's root filesystem: by the build, not the recipe's key (a forced rebuild
    of the same recipe makes another disk: new filesystem UUIDs and times)."""
    return f"rootfs-{build}.ext4"


def publish_image(data: DataDir, name: str, staging: Path, meta: dict[str, Any]) -> Image:
    """Write ``image.json`` and swap the staged image in for the one under ``name``.

    The root filesystem is also published under its build's own name (``Image.base``), and the
    ``KEPT_BUILDS`` newest such files of the image it replaces move along with it: snapshots made
    from an earlier build stand on theirs by that name (their disks' backing file), so a rebuild,
    even under running sandboxes, never slides a different disk under their layers. (Which
    snapshots stand on an older build is not known here: images may be shared by several data
    dirs, FORKD_IMAGES_DIR. One older than that is gone, and its snapshots fail to start, saying
    so, rather than boot on the wrong disk.)"""
    build = meta["build"] = f"{meta.get('key', '')}-{secrets.token_hex(4)}".lstrip("-")
    (staging / "image.json").write_text(json.dumps(meta, indent=2))
    os.link(staging / "rootfs.ext4", staging / base_name(build))
    final = data.images / name
    old = data.images / f".{name}.old-{os.getpid()}"
    if final.exists():
        earlier = sorted((p for p in final.glob("rootfs-*.ext4") if p.name != base_name(build)),
                         key=lambda p: p.stat().st_mtime, reverse=True)
        for kept in earlier[:KEPT_BUILDS]:
            os.link(kept, staging / kept.name)
        os.rename(final, old)
    os.rename(staging, final)
    shutil.rmtree(old, ignore_errors=True)
    return load_image(data, name)


def seed_paths(data: DataDir, image: Image) -> tuple[Path, Path]:
    """Where the seeds' examples expect the kernel and root filesystem.

    The seeds run ``POST /v1/snapshots`` with ``kernel: /var/lib/forkd/kernels/
    vmlinux-6.1`` and ``rootfs: /var/lib/forkd/rootfs/python.ext4``; with
    ``--data-dir /var/lib/forkd`` those names point at this image.
    """
    major_minor = ".".join(image.meta.get("kernel_version", "0.0").split(".")[:2])
    name = "python" if image.name == DEFAULT_IMAGE else image.name
    return (data.root / "kernels" / f"vmlinux-{major_minor}", data.root / "rootfs" / f"{name}.ext4")


def publish_seed_paths(data: DataDir, image: Image) -> None:
    for link, target in zip(seed_paths(data, image), (image.kernel, image.rootfs), strict=True):
        link.parent.mkdir(parents=True, exist_ok=True)
        tmp = link.with_name(f".{link.name}.tmp-{os.getpid()}")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target)
        os.replace(tmp, link)


def cached_kernel(cache: Path, package: str) -> kernel.KernelFiles:
    target = cache / f"kernel-{package}"
    marker = target / "version"
    if marker.exists():
        version = marker.read_text().strip()
        return kernel.KernelFiles(target / "vmlinux", target / "pkg/lib/modules" / version, version)
    tmp = cache / f".kernel-{package}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        files = kernel.fetch_kernel(tmp, package)
        (tmp / "version").write_text(files.version)
        shutil.rmtree(target, ignore_errors=True)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return kernel.KernelFiles(target / "vmlinux", target / "pkg/lib/modules" / files.version,
                              files.version)


def _cached_apt_tree(cache: Path, base: Path, recipe: ImageRecipe, log: Path, progress: Progress) -> Path:
    """The debootstrap tree plus the recipe's ``apt_packages`` and then its ``pip_packages``, cached
    by all three (a recipe without pip packages keeps the key it had before they existed)."""
    parts: dict[str, object] = {"base": recipe.base_key(), "apt": sorted(recipe.apt_packages)}
    if recipe.pip_packages:
        parts["pip"] = sorted(recipe.pip_packages)
    key = digest_of(parts)[:16]
    target = cache / f"rootfs-{key}"
    complete = cache / f"rootfs-{key}.complete"
    if complete.exists() and target.is_dir():
        return target
    tmp = cache / f".rootfs-{key}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    progress("apt-get install (a few minutes)", 0.5)
    try:
        tmp.mkdir(parents=True)
        rootfs.unpack_user_rootfs(base, tmp)  # cp -a: device nodes, owners and links as they are
        rootfs.install_packages(tmp, list(recipe.apt_packages), log)
        if recipe.pip_packages:
            progress("pip install", 0.7)
            rootfs.install_pip_packages(tmp, list(recipe.pip_packages), log)
        shutil.rmtree(tmp / "var/lib/apt/lists", ignore_errors=True)
        (tmp / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
        shutil.rmtree(target, ignore_errors=True)
        os.rename(tmp, target)
        complete.write_text(recipe.suite + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def cached_debootstrap(cache: Path, recipe: ImageRecipe, log: Path, progress: Progress) -> Path:
    target = cache / f"rootfs-{recipe.base_key()}"
    complete = cache / f"rootfs-{recipe.base_key()}.complete"
    if complete.exists() and target.is_dir():
        return target
    tmp = cache / f".rootfs-{recipe.base_key()}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    progress("debootstrap (about a minute)", 0.2)
    try:
        rootfs.debootstrap(tmp, recipe.suite, recipe.mirror,
                           [*recipe.packages, *recipe.extra_packages], log)
        # Package caches only cost space in every snapshot's disk.
        shutil.rmtree(tmp / "var/cache/apt/archives", ignore_errors=True)
        (tmp / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
        shutil.rmtree(target, ignore_errors=True)
        os.rename(tmp, target)
        complete.write_text(recipe.suite + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not (target / "usr/bin/python3").exists():
        raise ImageError("debootstrap finished but the tree has no python3")
    return target


__all__ = [
    "BUILDER_VERSION",
    "NAMED_RECIPES",
    "NAME_RE_HELP",
    "Image",
    "ImageRecipe",
    "NamedRecipe",
    "Progress",
    "base_name",
    "build_image",
    "cached_debootstrap",
    "cached_kernel",
    "digest_of",
    "list_images",
    "load_image",
    "no_progress",
    "prereqs",
    "publish_image",
    "recipe_for",
]
