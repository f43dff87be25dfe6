"""forkd's own Python for images that have none: the agent runs on it in any userland.

The agent is Python, and PID 1 of every guest. An image with a usable python3 runs it on that
one, and ``eval`` and the code interpreter run in the image's own, warm interpreter. An image
without one (busybox, Alpine's musl userland, distroless, a static Go binary) gets this runtime
at ``/.forkd/runtime`` in its root filesystem instead:

- ``bin/python3``: Debian's interpreter, from the tree forkd's default image is built from
  (the debootstrap cache), so it is the build of Python the agent is tested on;
- ``lib/python3.X``: its standard library (its tests and IDE left out);
- ``so/``: every shared library the interpreter and its extension modules load, glibc and its
  loader included, found by that tree's own loader (``ld.so --list``), so nothing of the image's
  libc (or its absence) matters.

The initramfs starts it through its own loader, ``so/ld-linux-x86-64.so.2 --library-path so``
(image/files/init.sh): the library path holds for the agent's process only, not for the
commands it runs, which see the image as it is. The agent then reports no ``python``
capability, and the host answers ``eval`` and Python cells with a 400 that says why.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from forkd.errors import ImageError
from forkd.guest.agent import RUNTIME_PREFIX

RUNTIME_DIR = RUNTIME_PREFIX.lstrip("/")  # where it lives in a guest's tree
LOADER = "ld-linux-x86-64.so.2"
LAYOUT_VERSION = 1  # bumped when what is copied changes: the cached runtime is made again
# Not needed to run the agent: the stdlib's own tests, its IDE and GUI, pip's bootstrap, 2to3.
LEFT_OUT = ("test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data",
            "config-*", "_test*.so", "_xxtestfuzz*.so", "_ctypes_test*.so", "__phello__")
LIST_TIMEOUT_SECS = 60
# "\tlibssl.so.3 => /tree/usr/lib/x86_64-linux-gnu/libssl.so.3 (0x...)": what ld.so --list prints.
_RESOLVED = re.compile(r"^\s*(\S+) => (\S+) \(0x[0-9a-f]+\)$")


def python_of(source: Path) -> str:
    """The ``python3.X`` name of the source tree's interpreter."""
    found = sorted(p.parent.name for p in (source / "usr/lib").glob("python3.*/os.py"))
    if not found or not (source / "usr/bin" / found[-1]).is_file():
        raise ImageError(f"{source} has no python3 to make forkd's guest runtime from")
    return found[-1]


def _libraries(source: Path, objects: list[Path]) -> set[Path]:
    """Every shared library ``objects`` load, resolved by the source tree's own loader in its own
    library folders; one found outside the tree, or not at all, is an error."""
    loader = source / "lib64" / LOADER
    path = f"{source / 'lib/x86_64-linux-gnu'}:{source / 'usr/lib/x86_64-linux-gnu'}"
    libs: set[Path] = set()
    for obj in objects:
        listed = subprocess.run([str(loader), "--library-path", path, "--list", str(obj)],
                                capture_output=True, text=True, timeout=LIST_TIMEOUT_SECS, check=False)
        if listed.returncode != 0 or "not found" in listed.stdout:
            raise ImageError(f"cannot list the libraries of {obj}: {(listed.stdout + listed.stderr)[-500:]}")
        for line in listed.stdout.splitlines():
            match = _RESOLVED.match(line)
            if match is None or match[1].startswith("/lib64/ld-linux"):
                continue  # the vDSO, and the loader (copied on its own)
            lib = Path(match[2])
            if not lib.resolve().is_relative_to(source.resolve()):
                raise ImageError(f"{obj} loads {lib}, which is not in {source}")
            libs.add(lib)
    return libs


def _make(source: Path, out: Path) -> None:
    python = python_of(source)
    (out / "bin").mkdir(parents=True)
    shutil.copy2(source / "usr/bin" / python, out / "bin/python3")
    shutil.copytree(source / "usr/lib" / python, out / "lib" / python, symlinks=True,
                    ignore=shutil.ignore_patterns(*LEFT_OUT))
    modules = sorted((out / "lib" / python / "lib-dynload").glob("*.so"))
    libs = out / "so"
    libs.mkdir()
    for lib in sorted(_libraries(source, [out / "bin/python3", *modules])):
        shutil.copy2(lib.resolve(), libs / lib.name)
    shutil.copy2((source / "lib64" / LOADER).resolve(), libs / LOADER)
    for dirpath, dirs, files in os.walk(out):
        for name in dirs:
            os.chmod(os.path.join(dirpath, name), 0o755)
        for name in files:
            file = os.path.join(dirpath, name)
            os.chmod(file, 0o755 if os.access(file, os.X_OK) or name.endswith(".so") or ".so." in name
                     else 0o644)


def cached_runtime(cache: Path, source: Path) -> Path:
    """The runtime made from ``source`` (a debootstrap tree of the image cache), made once."""
    target = cache / f"runtime-{source.name.removeprefix('rootfs-')}-{LAYOUT_VERSION}"
    if (target / ".complete").exists():
        return target
    tmp = cache / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _make(source, tmp)
        (tmp / ".complete").write_text(f"{python_of(source)}\n")
        shutil.rmtree(target, ignore_errors=True)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def install_runtime(tree: Path, runtime: Path) -> None:
    """The runtime into a guest's tree, as hard links to the cache (the tree is packed into an ext4
    image and removed; nothing writes these files)."""
    target = tree / RUNTIME_DIR
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.parent.chmod(0o755)
    shutil.copytree(runtime, target, symlinks=True, copy_function=os.link,
                    ignore=shutil.ignore_patterns(".complete"))


__all__ = ["LOADER", "RUNTIME_DIR", "cached_runtime", "install_runtime", "python_of"]
