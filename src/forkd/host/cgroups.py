"""Per-sandbox memory cgroups: each child's QEMU runs in its own cgroup with a limit.

cgroup v2 first (the unified hierarchy at ``/sys/fs/cgroup`` with the ``memory``
controller: ``/sys/fs/cgroup/forkd/<sandbox-id>/memory.max``), falling back to the
v1 ``memory`` hierarchy (``memory.limit_in_bytes``) on hybrid hosts such as our CI
machines, where v1 owns the memory controller and the unified tree has none.

Where the cgroups go:

* v2: ``<v2 root>/forkd/<id>``. A v2 cgroup with processes cannot also have
  controllers enabled for children ("no internal processes"), so forkd cannot
  nest under its own cgroup and uses a ``forkd`` parent at the root, enabling
  ``+memory`` in the root's and in ``forkd``'s ``cgroup.subtree_control``.
* v1: ``<memory mount>/<the daemon's own memory cgroup>/forkd/<id>``, i.e.
  ``/sys/fs/cgroup/memory/forkd/<id>`` for a daemon in the root cgroup. v1 has
  no internal-process rule, so the children stay *inside* whatever limit the
  daemon itself runs under instead of escaping it.

What the limit covers: guest RAM is a private (copy-on-write) mapping of the
snapshot's ``mem`` file, so a child is charged for the pages it has written
(its private copies) plus QEMU's own memory (TCG code buffer, heap, ...). Pages
it only reads are page cache of the shared file, charged to whichever cgroup
first faulted them in (usually the template or the first child), and
reclaimable. A child that goes over its limit is OOM-killed by the kernel: its
QEMU exits and the sandbox reports that it has died.

The QEMU process is put into its cgroup before it is exec'd (see
:meth:`CgroupHandle.launcher`), so every page it ever allocates is charged.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from forkd.bounds import MEMORY_LIMIT_MIB
from forkd.errors import InvalidRequest

log = logging.getLogger("forkd.cgroups")

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
PARENT = "forkd"

# ``forkd`` parents this process created (and so may remove): one an operator made,
# perhaps with an overall limit or delegated to forkd's user, is left alone.
_parents_made: set[Path] = set()

V2_LIMIT_FILE = "memory.max"
V1_LIMIT_FILE = "memory.limit_in_bytes"

NEEDS = (
    "memory_limit_mib needs a writable cgroup memory controller: cgroup v2 with the "
    "'memory' controller (/sys/fs/cgroup/cgroup.controllers lists 'memory') or a cgroup v1 "
    "'memory' hierarchy mounted at /sys/fs/cgroup/memory, and a daemon running as root "
    "(or owning the delegated forkd cgroup)"
)


def validate_limit(limit_mib: object) -> int:
    MEMORY_LIMIT_MIB.check(limit_mib)
    assert isinstance(limit_mib, int)
    return limit_mib


@dataclass(frozen=True)
class Hierarchy:
    """A usable memory hierarchy and the ``forkd`` parent its sandbox cgroups go under."""

    version: str  # "v2" | "v1"
    mount: Path  # the hierarchy's root directory
    base: Path  # <...>/forkd

    @property
    def limit_file(self) -> str:
        return V2_LIMIT_FILE if self.version == "v2" else V1_LIMIT_FILE


def _own_v1_memory_cgroup(proc_self_cgroup: Path) -> str:
    """The daemon's cgroup in the v1 memory hierarchy ("/" if unknown)."""
    with contextlib.suppress(OSError):
        for line in proc_self_cgroup.read_text().splitlines():
            parts = line.split(":", 2)
            if len(parts) == 3 and "memory" in parts[1].split(","):
                return parts[2].strip() or "/"
    return "/"


def find_hierarchy(
    root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP
) -> Hierarchy | None:
    """The memory hierarchy forkd would use under ``root``, or None."""
    # Pure v2 mounts the unified tree at root; hybrid hosts at root/unified.
    for mount in (root, root / "unified"):
        with contextlib.suppress(OSError):
            if "memory" in (mount / "cgroup.controllers").read_text().split():
                return Hierarchy("v2", mount, mount / PARENT)
    v1 = root / "memory"
    if (v1 / V1_LIMIT_FILE).exists():
        own = _own_v1_memory_cgroup(proc_self_cgroup).strip("/")
        base = (v1 / own if own else v1) / PARENT
        if not base.parent.is_dir():  # our own cgroup is not visible here (cgroup namespaces)
            base = v1 / PARENT
        return Hierarchy("v1", v1, base)
    return None


def detect(root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP) -> str:
    """``"v2"``, ``"v1"`` or ``"none"``: which memory hierarchy the host offers."""
    h = find_hierarchy(root, proc_self_cgroup)
    return h.version if h else "none"


def _write(path: Path, text: str) -> None:
    # One write(2) per value: cgroup files parse each write separately.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _enable_memory(cgroup: Path) -> None:
    """Make the memory controller available to ``cgroup``'s children (v2)."""
    control = cgroup / "cgroup.subtree_control"
    with contextlib.suppress(FileNotFoundError):
        if "memory" in control.read_text().split():
            return
    _write(control, "+memory")


def _explain(exc: OSError, path: Path) -> InvalidRequest:
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        hint = ("run the daemon as root, or delegate the cgroup to its user "
                f"(chown -R <user> {path.parent})")
    elif exc.errno == errno.EBUSY:
        hint = ("the parent cgroup has processes in it, so cgroup v2 does not let it hand the "
                "memory controller to children (typical inside a container); run forkd where "
                "it can use the root of the cgroup tree")
    else:
        hint = NEEDS
    return InvalidRequest(f"cannot set up the memory cgroup {path}: {exc.strerror or exc}; {hint}")


@dataclass(frozen=True)
class CgroupHandle:
    path: Path
    version: str  # "v2" | "v1"

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    @property
    def limit_file(self) -> Path:
        return self.path / (V2_LIMIT_FILE if self.version == "v2" else V1_LIMIT_FILE)

    def limit_mib(self) -> int | None:
        text = self.limit_file.read_text().strip()
        return None if text == "max" else int(text) >> 20

    def pids(self) -> list[int]:
        with contextlib.suppress(OSError):
            return [int(p) for p in self.procs_file.read_text().split()]
        return []

    def add_pid(self, pid: int) -> None:
        try:
            _write(self.procs_file, str(pid))
        except OSError as exc:
            raise _explain(exc, self.path) from exc

    def oom_kills(self) -> int:
        """How many of its processes the kernel's OOM killer took (0 if unreadable).

        Counted in the cgroup itself whichever limit was hit, its own or an
        ancestor's (v2 ``memory.events``, v1 ``memory.oom_control``).
        """
        name = "memory.events" if self.version == "v2" else "memory.oom_control"
        with contextlib.suppress(OSError, ValueError):
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def launcher(self) -> list[str]:
        """An argv prefix that joins this cgroup and then execs the rest of the argv.

        The process keeps its pid through the exec, so the pid the caller records
        is the command's own, and it is in the cgroup before it allocates anything.
        """
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.procs_file)]

    def remove(self, wait: float = 2.0) -> bool:
        """rmdir the cgroup (its processes are dead by now). Never raises; True if gone."""
        deadline = time.monotonic() + wait
        while True:
            try:
                self.path.rmdir()
                return True
            except FileNotFoundError:
                return True
            except OSError as exc:
                # EBUSY while the kernel finishes tearing down a just-killed process.
                if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                    log.warning("cannot remove cgroup %s: %s", self.path, exc)
                    return False
                time.sleep(0.02)


def handle_for(path: str | Path) -> CgroupHandle:
    """A handle for a recorded cgroup path (to remove it after a restart)."""
    path = Path(path)
    version = "v1" if (path / V1_LIMIT_FILE).exists() else "v2"
    return CgroupHandle(path, version)


def remove_parent_if_empty(
    root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP
) -> bool:
    """rmdir the ``forkd`` parent if this process made it and no sandbox cgroup is left
    in it (the kernel refuses while any is): no empty directories left behind."""
    h = find_hierarchy(root, proc_self_cgroup)
    if h is None or h.base not in _parents_made:
        return False
    try:
        h.base.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        return False
    _parents_made.discard(h.base)
    return True


def create(
    sandbox_id: str, limit_mib: int, *, root: Path = CGROUP_ROOT,
    proc_self_cgroup: Path = PROC_SELF_CGROUP,
) -> CgroupHandle:
    """Make ``<base>/<sandbox_id>`` with a memory limit of ``limit_mib`` MiB."""
    limit_mib = validate_limit(limit_mib)
    if not sandbox_id or "/" in sandbox_id or sandbox_id.startswith("."):
        raise InvalidRequest(f"bad cgroup name {sandbox_id!r}")
    h = find_hierarchy(root, proc_self_cgroup)
    if h is None:
        raise InvalidRequest(f"{NEEDS}; this host has neither")
    path = h.base / sandbox_id
    try:
        if h.version == "v2":
            _enable_memory(h.mount)
        if not h.base.is_dir():
            h.base.mkdir(exist_ok=True)
            _parents_made.add(h.base)
        if h.version == "v2":
            _enable_memory(h.base)
        if path.is_dir():
            raise InvalidRequest(f"cgroup {path} already exists")
        try:
            path.mkdir()
        except FileNotFoundError:  # another daemon's close() removed the empty parent just now
            h.base.mkdir(exist_ok=True)
            if h.version == "v2":
                _enable_memory(h.base)
            path.mkdir()
    except OSError as exc:
        raise _explain(exc, path) from exc
    handle = CgroupHandle(path, h.version)
    if (path / "cgroup.procs").exists() and not handle.limit_file.exists():
        # A real cgroup without the limit file: the memory controller is not on for it.
        handle.remove(wait=0)
        raise InvalidRequest(
            f"the memory controller is not enabled for {h.base} (no {handle.limit_file.name} in "
            f"its children); {NEEDS}"
        )
    try:
        _write(handle.limit_file, str(limit_mib << 20))
    except OSError as exc:
        handle.remove(wait=0)
        raise _explain(exc, path) from exc
    return handle
