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

from forkd.bounds import CPU_LIMIT, MEMORY_LIMIT_MIB, PIDS_LIMIT
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
# CPU bandwidth: ``cpu_limit`` cores = quota/period. v2 ``cpu.max`` is "quota period";
# v1 splits it into cpu.cfs_quota_us / cpu.cfs_period_us.
CPU_PERIOD_US = 100_000
CONTROLLERS = ("memory", "cpu", "pids")

NEEDS = (
    "memory_limit_mib needs a writable cgroup memory controller: cgroup v2 with the "
    "'memory' controller (/sys/fs/cgroup/cgroup.controllers lists 'memory') or a cgroup v1 "
    "'memory' hierarchy mounted at /sys/fs/cgroup/memory, and a daemon running as root "
    "(or owning the delegated forkd cgroup)"
)


def needs(controller: str) -> str:
    """What a limit on ``controller`` needs from the host, and how to get it."""
    return (f"a {controller} limit needs a writable cgroup {controller} controller: cgroup v2 with "
            f"'{controller}' in /sys/fs/cgroup/cgroup.controllers, or a cgroup v1 '{controller}' "
            f"hierarchy mounted at /sys/fs/cgroup/{controller}, and a daemon running as root")


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


def _own_v1_cgroup(proc_self_cgroup: Path, controller: str = "memory") -> str:
    """The daemon's cgroup in the v1 ``controller`` hierarchy ("/" if unknown)."""
    with contextlib.suppress(OSError):
        for line in proc_self_cgroup.read_text().splitlines():
            parts = line.split(":", 2)
            if len(parts) == 3 and controller in parts[1].split(","):
                return parts[2].strip() or "/"
    return "/"


def find_controller(
    controller: str, root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP
) -> Hierarchy | None:
    """Where forkd would put a sandbox's ``controller`` cgroup (memory, cpu, pids), or None.

    v2 when the unified tree offers the controller; else its own v1 hierarchy
    (``root/<controller>``), nested under the daemon's cgroup there, as for memory.
    """
    if controller == "memory":
        return find_hierarchy(root, proc_self_cgroup)
    for mount in (root, root / "unified"):
        with contextlib.suppress(OSError):
            if controller in (mount / "cgroup.controllers").read_text().split():
                return Hierarchy("v2", mount, mount / PARENT)
    v1 = root / controller
    if (v1 / "cgroup.procs").exists():
        own = _own_v1_cgroup(proc_self_cgroup, controller).strip("/")
        base = (v1 / own if own else v1) / PARENT
        if not base.parent.is_dir():
            base = v1 / PARENT
        return Hierarchy("v1", v1, base)
    return None


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
        own = _own_v1_cgroup(proc_self_cgroup).strip("/")
        base = (v1 / own if own else v1) / PARENT
        if not base.parent.is_dir():  # our own cgroup is not visible here (cgroup namespaces)
            base = v1 / PARENT
        return Hierarchy("v1", v1, base)
    return None


def detect(root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP) -> str:
    """``"v2"``, ``"v1"`` or ``"none"``: which memory hierarchy the host offers."""
    h = find_hierarchy(root, proc_self_cgroup)
    return h.version if h else "none"


def detect_controller(
    controller: str, root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP
) -> str:
    """``"v2"``, ``"v1"`` or ``"none"``: where the host offers ``controller``."""
    h = find_controller(controller, root, proc_self_cgroup)
    return h.version if h else "none"


def _write(path: Path, text: str) -> None:
    # One write(2) per value: cgroup files parse each write separately.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _enable_memory(cgroup: Path, controllers: tuple[str, ...] = ("memory",)) -> None:
    """Make ``controllers`` available to ``cgroup``'s children (v2)."""
    control = cgroup / "cgroup.subtree_control"
    with contextlib.suppress(FileNotFoundError):
        on = control.read_text().split()
        controllers = tuple(c for c in controllers if c not in on)
    if controllers:  # one write: the kernel takes a space-separated list
        _write(control, " ".join(f"+{c}" for c in controllers))


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
    """A sandbox's cgroup: one directory on v2; on v1 one per controller hierarchy used.

    ``path`` is the memory cgroup when there is one (what older rows recorded);
    ``extra`` the other v1 directories (cpu, pids), joined and removed with it.
    """

    path: Path
    version: str  # "v2" | "v1"
    extra: tuple[Path, ...] = ()

    @property
    def paths(self) -> tuple[Path, ...]:
        return (self.path, *self.extra)

    def _file(self, name: str) -> Path | None:
        """The first of its directories that has ``name`` (the controller's own)."""
        for d in self.paths:
            if (d / name).exists():
                return d / name
        return None

    def cpu_limit(self) -> float | None:
        """The CPU bandwidth limit in cores (None: unlimited or no cpu cgroup)."""
        with contextlib.suppress(OSError, ValueError):
            if (f := self._file("cpu.max")) is not None:
                parts = f.read_text().split()
                period = int(parts[1]) if len(parts) > 1 else CPU_PERIOD_US
                return None if parts[0] == "max" else int(parts[0]) / period
            q, p = self._file("cpu.cfs_quota_us"), self._file("cpu.cfs_period_us")
            if q is not None and p is not None:
                quota_us = int(q.read_text())
                return None if quota_us < 0 else quota_us / int(p.read_text())
        return None

    def pids_limit(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            if (f := self._file("pids.max")) is not None:
                text = f.read_text().strip()
                return None if text == "max" else int(text)
        return None

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

    def throttled(self) -> int:
        """How many CPU periods its processes were held back by its ``cpu_limit`` (0 if unreadable;
        ``nr_throttled`` of ``cpu.stat``, in both versions)."""
        with contextlib.suppress(OSError, ValueError):
            if (f := self._file("cpu.stat")) is not None:
                for line in f.read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "nr_throttled":
                        return int(value)
        return 0

    def oom_kills(self) -> int:
        """How many of its processes the kernel's OOM killer took (0 if unreadable).

        Counted in the cgroup itself whichever limit was hit, its own or an
        ancestor's (v2 ``memory.events``, v1 ``memory.oom_control``).
        """
        name = "memory.events" if self.version == "v2" else "memory.oom_control"
        with contextlib.suppress(OSError, ValueError):
            for line in (self._file(name) or self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def launcher(self) -> list[str]:
        """An argv prefix that joins this cgroup and then execs the rest of the argv.

        The process keeps its pid through the exec, so the pid the caller records
        is the command's own, and it is in the cgroup before it allocates anything.
        """
        if not self.extra:
            return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.procs_file)]
        # v1 with several hierarchies: join each (their count first, then the files).
        procs = [str(d / "cgroup.procs") for d in self.paths]
        script = ('n=$0; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 1; shift; n=$((n-1)); done; '
                  'exec "$@"')
        return ["/bin/sh", "-c", script, str(len(procs)), *procs]

    def remove(self, wait: float = 2.0) -> bool:
        """rmdir every directory of the cgroup (its processes are dead by now). Never raises."""
        return all([_rmdir(d, wait) for d in self.paths])


def _rmdir(path: Path, wait: float) -> bool:
    """rmdir one cgroup directory, waiting out EBUSY; True if gone."""
    deadline = time.monotonic() + wait
    while True:
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            # EBUSY while the kernel finishes tearing down a just-killed process.
            if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                log.warning("cannot remove cgroup %s: %s", path, exc)
                return False
            time.sleep(0.02)


def handle_for(path: str | Path, extra: tuple[str | Path, ...] = ()) -> CgroupHandle:
    """A handle for recorded cgroup paths (to remove them after a restart)."""
    path = Path(path)
    others = tuple(Path(p) for p in extra)
    version = "v1" if others or (path / V1_LIMIT_FILE).exists() else "v2"
    return CgroupHandle(path, version, others)


def remove_parent_if_empty(
    root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP
) -> bool:
    """rmdir the ``forkd`` parent if this process made it and no sandbox cgroup is left
    in it (the kernel refuses while any is): no empty directories left behind."""
    for other in ("cpu", "pids"):  # v1 parents of the cpu and pids hierarchies, if made
        o = find_controller(other, root, proc_self_cgroup)
        if o is not None and o.base in _parents_made and o.version == "v1":
            with contextlib.suppress(OSError):
                o.base.rmdir()
                _parents_made.discard(o.base)
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


def _limit_file(controller: str, version: str) -> str:
    """The file whose presence says ``controller`` is on for a cgroup (and that takes its limit)."""
    if controller == "memory":
        return V2_LIMIT_FILE if version == "v2" else V1_LIMIT_FILE
    if controller == "cpu":
        return "cpu.max" if version == "v2" else "cpu.cfs_quota_us"
    return "pids.max"


def _make(h: Hierarchy, sandbox_id: str, controllers: tuple[str, ...]) -> Path:
    """mkdir ``<base>/<sandbox_id>`` in one hierarchy with ``controllers`` on for it."""
    path = h.base / sandbox_id
    try:
        if h.version == "v2":
            _enable_memory(h.mount, controllers)
        if not h.base.is_dir():
            h.base.mkdir(exist_ok=True)
            _parents_made.add(h.base)
        if h.version == "v2":
            _enable_memory(h.base, controllers)
        if path.is_dir():
            raise InvalidRequest(f"cgroup {path} already exists")
        try:
            path.mkdir()
        except FileNotFoundError:  # another daemon's close() removed the empty parent just now
            h.base.mkdir(exist_ok=True)
            if h.version == "v2":
                _enable_memory(h.base, controllers)
            path.mkdir()
    except OSError as exc:
        raise _explain(exc, path) from exc
    for c in controllers:
        name = _limit_file(c, h.version)
        if (path / "cgroup.procs").exists() and not (path / name).exists():
            # A real cgroup without the limit file: the controller is not on for it.
            _rmdir(path, 0)
            raise InvalidRequest(
                f"the {c} controller is not enabled for {h.base} (no {name} in its children); "
                f"{NEEDS if c == 'memory' else needs(c)}"
            )
    return path


def create(
    sandbox_id: str, limit_mib: int | None, *, cpu: float | None = None, pids: int | None = None,
    root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP,
) -> CgroupHandle:
    """Make the sandbox's cgroup: ``<base>/<sandbox_id>`` in each hierarchy a limit needs.

    ``limit_mib``: memory limit (MiB); ``cpu``: CPU bandwidth in cores (0.5 is
    half a core: quota 50000 per 100000 µs period); ``pids``: most tasks
    (processes and threads) in it. On v2 all go in one directory; on v1 each
    controller has its own hierarchy, so the handle holds one directory per
    controller, all named after the sandbox. Nothing is left behind on failure.
    """
    if limit_mib is not None:
        limit_mib = validate_limit(limit_mib)
    if cpu is not None:
        CPU_LIMIT.check(cpu)
    if pids is not None:
        PIDS_LIMIT.check(pids)
    if not sandbox_id or "/" in sandbox_id or sandbox_id.startswith("."):
        raise InvalidRequest(f"bad cgroup name {sandbox_id!r}")
    wanted = [c for c, v in (("memory", limit_mib), ("cpu", cpu), ("pids", pids)) if v is not None]
    if not wanted:
        raise InvalidRequest("a cgroup needs at least one limit")
    groups: dict[Path, tuple[Hierarchy, list[str]]] = {}
    for c in wanted:
        h = find_controller(c, root, proc_self_cgroup)
        if h is None:
            raise InvalidRequest(f"{NEEDS if c == 'memory' else needs(c)}; this host has neither")
        groups.setdefault(h.base, (h, []))[1].append(c)
    made: list[tuple[Path, str]] = []
    try:
        for h, controllers in groups.values():
            made.append((_make(h, sandbox_id, tuple(controllers)), h.version))
        for (path, version), (_, controllers) in zip(made, groups.values(), strict=True):
            try:
                if "memory" in controllers:
                    assert limit_mib is not None
                    _write(path / _limit_file("memory", version), str(limit_mib << 20))
                if "cpu" in controllers:
                    assert cpu is not None
                    quota = max(1000, round(cpu * CPU_PERIOD_US))  # the kernel's minimum is 1 ms
                    if version == "v2":
                        _write(path / "cpu.max", f"{quota} {CPU_PERIOD_US}")
                    else:
                        _write(path / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                        _write(path / "cpu.cfs_quota_us", str(quota))
                if "pids" in controllers:
                    _write(path / "pids.max", str(pids))
            except OSError as exc:
                raise _explain(exc, path) from exc
    except BaseException:
        for path, _ in made:
            _rmdir(path, 0)
        raise
    return CgroupHandle(made[0][0], made[0][1], tuple(p for p, _ in made[1:]))
